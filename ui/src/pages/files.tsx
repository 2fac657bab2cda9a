import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { SANDBOX_HOME } from '../../../runtime/protocol/constants.js';
import { EmptyRow, Failure, TableHead } from '../components/table.js';
import { bytes, errorText, time } from '../format.js';
import { sandboxFetch, sandboxJson } from '../gateway.js';

interface Entry {
  name: string;
  path: string;
  type: 'file' | 'directory' | 'symlink' | 'other';
  size: number;
  mode: string;
  mtime: string;
  target?: string;
}

/** The largest file the page shows inline. */
const VIEW_LIMIT = 2 * 1024 * 1024;
/** Images shown with `<img src=blob:>`; SVG is shown as text. */
const IMAGE_TYPES: Record<string, string> = {
  png: 'image/png',
  jpg: 'image/jpeg',
  jpeg: 'image/jpeg',
  gif: 'image/gif',
  webp: 'image/webp',
  bmp: 'image/bmp',
  ico: 'image/x-icon',
  avif: 'image/avif',
};

type View =
  | { kind: 'text'; path: string; text: string }
  | { kind: 'image'; path: string; url: string }
  | { kind: 'binary'; path: string; size: number };

function parentOf(path: string): string {
  const trimmed = path.replace(/\/+$/, '');
  const at = trimmed.lastIndexOf('/');
  return at <= 0 ? '/' : trimmed.slice(0, at);
}

function join(dir: string, name: string): string {
  return `${dir.replace(/\/+$/, '')}/${name}`;
}

/** Saves bytes as a download: a blob typed application/octet-stream through `<a download>`. */
function saveBytes(data: ArrayBuffer, name: string): void {
  const url = URL.createObjectURL(new Blob([data], { type: 'application/octet-stream' }));
  const link = document.createElement('a');
  link.href = url;
  link.download = name || 'download';
  link.rel = 'noopener';
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** A file browser over envd's files API: list, download, upload (input or drop), view. */
export function FilesTab({ id }: { id: string }) {
  const [dir, setDir] = useState(SANDBOX_HOME);
  const [pathInput, setPathInput] = useState(SANDBOX_HOME);
  const [entries, setEntries] = useState<Entry[] | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const [status, setStatus] = useState<string | null>(null);
  const [view, setView] = useState<View | null>(null);
  const [dragging, setDragging] = useState(false);
  const fileInput = useRef<HTMLInputElement>(null);

  const load = useCallback(
    async (path: string) => {
      setFailure(null);
      try {
        const { entries } = await sandboxJson<{ entries: Entry[] }>(id, 'GET', '/files/list', {
          query: { path },
        });
        entries.sort((a, b) =>
          a.type === 'directory' && b.type !== 'directory'
            ? -1
            : b.type === 'directory' && a.type !== 'directory'
              ? 1
              : a.name.localeCompare(b.name),
        );
        setEntries(entries);
        setDir(path);
        setPathInput(path);
      } catch (error) {
        setFailure(errorText(error));
      }
    },
    [id],
  );

  useEffect(() => {
    void load(SANDBOX_HOME);
  }, [load]);

  // An image's blob URL lives as long as its view.
  useEffect(
    () => () => {
      if (view?.kind === 'image') URL.revokeObjectURL(view.url);
    },
    [view],
  );

  const read = async (path: string): Promise<ArrayBuffer> =>
    (await sandboxFetch(id, 'GET', '/files/read', { query: { path } })).arrayBuffer();

  const download = async (entry: Entry) => {
    setFailure(null);
    try {
      saveBytes(await read(entry.path), entry.name);
      setStatus(`Downloaded ${entry.name}`);
    } catch (error) {
      setFailure(errorText(error));
    }
  };

  const open = async (entry: Entry) => {
    setFailure(null);
    if (entry.size > VIEW_LIMIT) {
      setView({ kind: 'binary', path: entry.path, size: entry.size });
      return;
    }
    try {
      const data = await read(entry.path);
      const ext = entry.name.split('.').pop()?.toLowerCase() ?? '';
      const imageType = IMAGE_TYPES[ext];
      if (imageType) {
        setView({
          kind: 'image',
          path: entry.path,
          url: URL.createObjectURL(new Blob([data], { type: imageType })),
        });
        return;
      }
      try {
        const text = new TextDecoder('utf-8', { fatal: true }).decode(data);
        setView({ kind: 'text', path: entry.path, text });
      } catch {
        setView({ kind: 'binary', path: entry.path, size: data.byteLength });
      }
    } catch (error) {
      setFailure(errorText(error));
    }
  };

  const upload = async (files: FileList | File[]) => {
    const list = [...files];
    if (list.length === 0) return;
    setFailure(null);
    let done = 0;
    for (const file of list) {
      setStatus(`Uploading ${file.name} (${done + 1} of ${list.length})…`);
      try {
        await sandboxFetch(id, 'PUT', '/files/write', {
          query: { path: join(dir, file.name) },
          body: file,
          raw: true,
          headers: { 'content-type': 'application/octet-stream' },
        });
        done++;
      } catch (error) {
        setFailure(`${file.name}: ${errorText(error)}`);
        break;
      }
    }
    setStatus(`Uploaded ${done} file${done === 1 ? '' : 's'} to ${dir}`);
    await load(dir);
  };

  return (
    <section aria-labelledby="files-title">
      <h2 id="files-title">Files</h2>
      <form
        class="toolbar"
        onSubmit={(e) => {
          e.preventDefault();
          void load(pathInput.trim() || SANDBOX_HOME);
        }}
      >
        <label for="files-path">Folder</label>
        <input
          id="files-path"
          class="mono grow"
          value={pathInput}
          onInput={(e) => setPathInput((e.target as HTMLInputElement).value)}
        />
        <button type="submit">Open</button>
        <button type="button" onClick={() => void load(parentOf(dir))} disabled={dir === '/'}>
          Up
        </button>
        <button type="button" onClick={() => void load(dir)}>
          Refresh
        </button>
      </form>
      {/* biome-ignore lint/a11y/noStaticElementInteractions: the drop zone is a shortcut; its file input is the keyboard's way */}
      <div
        class={dragging ? 'dropzone over' : 'dropzone'}
        onDragOver={(e) => {
          e.preventDefault();
          setDragging(true);
        }}
        onDragLeave={() => setDragging(false)}
        onDrop={(e) => {
          e.preventDefault();
          setDragging(false);
          if (e.dataTransfer?.files) void upload(e.dataTransfer.files);
        }}
      >
        <label for="files-upload">Upload to {dir}: drop files here or choose them</label>
        <input
          id="files-upload"
          ref={fileInput}
          type="file"
          multiple
          onChange={(e) => {
            const input = e.target as HTMLInputElement;
            if (input.files) void upload(input.files).then(() => (input.value = ''));
          }}
        />
      </div>
      {status && (
        <p class="status" role="status">
          {status}
        </p>
      )}
      <Failure text={failure} />
      {entries && (
        <div class="table-wrap">
          <table class="files">
            <TableHead columns={['Name', 'Size', 'Mode', 'Modified']} actions />
            <tbody>
              {entries.map((entry) => (
                <tr key={entry.path}>
                  <td class="mono">
                    {entry.type === 'directory' ? (
                      <button type="button" class="link" onClick={() => void load(entry.path)}>
                        {entry.name}/
                      </button>
                    ) : entry.type === 'file' ? (
                      <button type="button" class="link" onClick={() => void open(entry)}>
                        {entry.name}
                      </button>
                    ) : (
                      <span>
                        {entry.name}
                        {entry.target ? ` → ${entry.target}` : ''}
                      </span>
                    )}
                  </td>
                  <td>{entry.type === 'directory' ? '' : bytes(entry.size)}</td>
                  <td class="mono">{entry.mode}</td>
                  <td>{time(entry.mtime)}</td>
                  <td>
                    {entry.type === 'file' && (
                      <button
                        type="button"
                        onClick={() => void download(entry)}
                        aria-label={`Download ${entry.name}`}
                      >
                        Download
                      </button>
                    )}
                  </td>
                </tr>
              ))}
              {entries.length === 0 && <EmptyRow columns={5}>This folder is empty.</EmptyRow>}
            </tbody>
          </table>
        </div>
      )}
      {view && (
        <section class="viewer" aria-labelledby="viewer-title">
          <div class="toolbar">
            <h3 id="viewer-title" class="mono">
              {view.path}
            </h3>
            <button type="button" onClick={() => setView(null)}>
              Close
            </button>
          </div>
          {view.kind === 'text' && <pre class="file-text">{view.text}</pre>}
          {view.kind === 'image' && <img src={view.url} alt={view.path} class="file-image" />}
          {view.kind === 'binary' && (
            <p>
              Not shown here ({bytes(view.size)},{' '}
              {view.size > VIEW_LIMIT ? 'too large' : 'not text'}): download it instead.
            </p>
          )}
        </section>
      )}
    </section>
  );
}
