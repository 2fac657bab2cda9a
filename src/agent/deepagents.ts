import { InvalidPathError } from '../errors.js';
import { shellQuote } from '../util/shell-quote.js';
import type { BaseSandbox } from './base-sandbox.js';
import type {
  ExecuteResponse,
  FileDownloadResponse,
  FileInfo,
  FileUploadResponse,
} from './types.js';

/** Options of {@link deepAgentsBackend}. */
export interface DeepAgentsBackendOptions {
  /**
   * The sandbox folder the model sees as `/` (created if missing). Default: the sandbox's working
   * directory (`/home/user` in an abx sandbox). `'/'` shows the whole sandbox with its real paths.
   */
  root?: string;
}

/**
 * Use an abx sandbox as the sandbox backend of LangChain deepagents (JS):
 *
 * ```ts
 * import { createDeepAgent } from 'deepagents';
 * import { Sandbox, deepAgentsBackend } from 'agent-sandbox';
 *
 * const sandbox = await Sandbox.create({ template: 'base' });
 * const backend = deepAgentsBackend(sandbox, { root: '/home/user/app' }); // the model's `/`
 * const agent = createDeepAgent({ model, backend });
 * ```
 *
 * **A virtual root.** deepagents' tools default to `/`, which in a sandbox is the whole machine
 * image. Here `/` is the project folder (`options.root`, default the sandbox's working directory),
 * as in deepagents' own filesystem backends in virtual mode: `/src/app.py` is `<root>/src/app.py`
 * in the sandbox, paths shown to the model are under `/` (glob's are relative to the folder
 * searched; a relative path asked for comes back relative), and a path that `..` takes out of the
 * root is refused. `execute` runs in the root folder, so relative paths mean the same there and in
 * the file tools; being a shell it can reach the whole sandbox: the root is the model's view, the
 * sandbox is the isolation.
 *
 * **deepagents' answers.** File operations are this project's {@link BaseSandbox} ones (small node
 * programs in the sandbox) translated to what deepagents JS's own `BaseSandbox` answers: snake_case
 * `FileInfo`, folders listed with a trailing `/`, a missing folder listed, searched or globbed as
 * empty, glob with deepagents' rules (`*` stays within a folder, dot-files match) returning folders
 * too, edit's "multiple occurrences" error, `[stderr] ` before each line of standard error in
 * `execute` output.
 *
 * The adapter is a plain object implementing deepagents' `SandboxBackendProtocolV2` (checked
 * structurally: nothing here imports deepagents, so it stays optional). It works for any
 * {@link BaseSandbox}, e.g. a `LocalShellSandbox` (rooted at its folder by default). The root is
 * resolved (and created) by one command on first use; a root that cannot be a folder makes that
 * call throw an `InvalidPathError`.
 */
export function deepAgentsBackend(
  sandbox: BaseSandbox,
  options: DeepAgentsBackendOptions = {},
): DeepAgentsBackend {
  let pending: Promise<VirtualRoot> | undefined;
  // The root is found (and created) on first use, by one command in the sandbox.
  const rootOf = (): Promise<VirtualRoot> => {
    pending ??= resolveRoot(sandbox, options.root).catch((error: unknown) => {
      pending = undefined;
      throw error;
    });
    return pending;
  };

  return {
    get id() {
      return sandbox.id;
    },

    async execute(command) {
      const root = await rootOf();
      return sandbox.execute(markStderr(command, root.real));
    },

    async uploadFiles(files) {
      const root = await rootOf();
      const inside = files.flatMap(([path, content]) => {
        const real = root.toSandbox(path);
        return real === undefined ? [] : [[real, content] as [string, Uint8Array]];
      });
      const answers = inside.length > 0 ? await sandbox.uploadFiles(inside) : [];
      let next = 0;
      return files.map(([path]) => {
        if (root.toSandbox(path) === undefined) return { path, error: 'invalid_path' };
        const answer = answers[next++];
        return { path, error: answer ? answer.error : 'invalid_path' };
      });
    },

    async downloadFiles(paths) {
      const root = await rootOf();
      const inside = paths.flatMap((path) => root.toSandbox(path) ?? []);
      const answers = inside.length > 0 ? await sandbox.downloadFiles(inside) : [];
      let next = 0;
      return paths.map((path) => {
        if (root.toSandbox(path) === undefined) {
          return { path, content: null, error: 'invalid_path' };
        }
        const answer = answers[next++];
        return answer
          ? { path, content: answer.content, error: answer.error }
          : { path, content: null, error: 'invalid_path' };
      });
    },

    async ls(path) {
      const root = await rootOf();
      const real = root.toSandbox(path);
      if (real === undefined) return { error: outsideRoot('listing', path) };
      const result = await sandbox.ls(real);
      if (result.error !== undefined) {
        // deepagents lists a missing folder (or a file) as empty.
        if (isMissingOrNotDirectory(result.errorCode)) return { files: [] };
        return { error: root.text(result.error) };
      }
      const files = (result.entries ?? []).flatMap((entry) => {
        const shown = root.toModel(entry.path, isRelative(path));
        if (shown === undefined) return [];
        // deepagents marks directories in listings with a trailing slash.
        return [{ ...fileInfo(entry), path: entry.isDir ? `${withoutSlash(shown)}/` : shown }];
      });
      return { files: files.sort((a, b) => byPath(a, b)) };
    },

    async read(filePath, offset = 0, limit = 500) {
      const root = await rootOf();
      const real = root.toSandbox(filePath);
      if (real === undefined) return { error: outsideRoot('reading file', filePath) };
      const page = await sandbox.read(real, { offset, limit });
      if (page.error !== undefined || !page.fileData) {
        return { error: root.text(page.error ?? `Error: reading '${real}' gave no content`) };
      }
      if (page.fileData.encoding === 'base64') {
        return {
          content: new Uint8Array(Buffer.from(page.fileData.content, 'base64')),
          mimeType: binaryMimeType(filePath),
        };
      }
      return {
        content: page.fileData.content,
        mimeType: 'text/plain',
        ...(page.totalLines === undefined ? {} : { totalLines: page.totalLines }),
        ...(page.startLine === undefined ? {} : { startLine: page.startLine }),
        ...(page.endLine === undefined ? {} : { endLine: page.endLine }),
        // deepagents leaves nextOffset out at the end of the file; ours says null.
        ...(page.nextOffset == null ? {} : { nextOffset: page.nextOffset }),
      };
    },

    async readRaw(filePath) {
      const root = await rootOf();
      const real = root.toSandbox(filePath);
      if (real === undefined) return { error: outsideRoot('reading file', filePath) };
      const [response] = await sandbox.downloadFiles([real]);
      if (!response?.content) {
        const code = response?.error ?? 'no response';
        return {
          error:
            code === 'file_not_found'
              ? `File '${filePath}' not found`
              : `Error: cannot read '${filePath}': ${code}`,
        };
      }
      const now = new Date().toISOString();
      const text = decodeUtf8(response.content);
      return {
        data: {
          content: text ?? response.content,
          mimeType: text === undefined ? binaryMimeType(filePath) : 'text/plain',
          created_at: now,
          modified_at: now,
        },
      };
    },

    async write(filePath, content) {
      const root = await rootOf();
      const real = root.toSandbox(filePath);
      if (real === undefined) return { error: outsideRoot('writing file', filePath) };
      const result = await sandbox.write(real, content);
      return result.error !== undefined
        ? { error: root.text(result.error) }
        : { path: filePath, filesUpdate: null };
    },

    async edit(filePath, oldString, newString, replaceAll = false) {
      const root = await rootOf();
      const real = root.toSandbox(filePath);
      if (real === undefined) return { error: outsideRoot('editing file', filePath) };
      const result = await sandbox.edit(real, oldString, newString, { replaceAll });
      if (result.error !== undefined) {
        if (result.errorCode === 'multiple') {
          return { error: multipleOccurrences(oldString, result.occurrences ?? 0) };
        }
        return { error: root.text(result.error) };
      }
      return {
        path: filePath,
        filesUpdate: null,
        ...(result.occurrences === undefined ? {} : { occurrences: result.occurrences }),
      };
    },

    async delete(filePath) {
      const root = await rootOf();
      const real = root.toSandbox(filePath);
      if (real === undefined) return { error: outsideRoot('deleting', filePath) };
      // As in deepagents' virtual mode, deleting `/` empties the root and keeps it.
      if (real === root.real && root.real !== '/') {
        const listed = await sandbox.ls(real);
        if (listed.error !== undefined) return { error: root.text(listed.error) };
        for (const entry of listed.entries ?? []) {
          const removed = await sandbox.delete(entry.path);
          if (removed.error !== undefined) return { error: root.text(removed.error) };
        }
        return { path: filePath, filesUpdate: null };
      }
      const result = await sandbox.delete(real);
      return result.error !== undefined
        ? { error: root.text(result.error) }
        : { path: filePath, filesUpdate: null };
    },

    async grep(pattern, path, glob, maxCount) {
      const root = await rootOf();
      const real = root.toSandbox(path ?? '/');
      if (real === undefined) return { error: outsideRoot('searching', path ?? '/') };
      const result = await sandbox.grep(pattern, {
        path: real,
        ...(glob ? { glob } : {}),
        ...(maxCount ? { maxCount } : {}),
      });
      if (result.error !== undefined) {
        // deepagents finds nothing in a missing folder.
        if (isMissingOrNotDirectory(result.errorCode)) return { matches: [], truncated: false };
        return { error: root.text(result.error) };
      }
      const matches = (result.matches ?? []).flatMap((match) => {
        const shown = root.toModel(match.path, isRelative(path ?? '/'));
        return shown === undefined ? [] : [{ ...match, path: shown }];
      });
      return { matches, truncated: result.truncated };
    },

    async glob(pattern, path = '/') {
      const root = await rootOf();
      const real = root.toSandbox(path);
      if (real === undefined) return { error: outsideRoot('searching', path) };
      // deepagents JS answers as fast-glob with `dot: true`: folders too, relative paths.
      const result = await sandbox.glob(pattern, {
        path: real,
        style: 'path',
        includeDirs: true,
        relative: true,
      });
      if (result.error !== undefined) {
        // deepagents finds nothing in a missing folder (or a file).
        if (isMissingOrNotDirectory(result.errorCode)) return { files: [], truncated: false };
        if (result.errorCode === 'invalid_pattern') {
          return { error: `Error finding files: invalid glob pattern '${pattern}'` };
        }
        return { error: root.text(result.error) };
      }
      return { files: (result.matches ?? []).map(fileInfo), truncated: result.truncated };
    },
  };
}

/** The root folder and the translation between the model's paths and the sandbox's. */
class VirtualRoot {
  private readonly mention: RegExp | undefined;

  /** `real`: an absolute sandbox path without a trailing slash (or `/`). */
  constructor(readonly real: string) {
    const escaped = real.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    // The root as a whole path in a message: not inside a longer name, followed by `/` or an end.
    this.mention =
      real === '/' ? undefined : new RegExp(`(?<![\\w.~/-])${escaped}(?=(/)|[^\\w.~-]|$)`, 'g');
  }

  /** The sandbox path of a path the model gave, or undefined when `..` leaves the root. */
  toSandbox(path: string): string | undefined {
    const parts: string[] = [];
    for (const part of path.split('/')) {
      if (part === '' || part === '.') continue;
      if (part === '..') {
        if (parts.pop() === undefined) return undefined;
        continue;
      }
      parts.push(part);
    }
    if (parts.length === 0) return this.real;
    return this.real === '/' ? `/${parts.join('/')}` : `${this.real}/${parts.join('/')}`;
  }

  /**
   * The model's path for a sandbox path (without the leading `/` when `relative`: the form the
   * model asked with), or undefined when it lies outside the root.
   */
  toModel(path: string, relative = false): string | undefined {
    let shown: string | undefined;
    if (this.real === '/') shown = path;
    else if (path === this.real) shown = '/';
    else if (path.startsWith(`${this.real}/`)) shown = path.slice(this.real.length);
    if (shown === undefined || !relative) return shown;
    return shown === '/' ? '.' : shown.slice(1);
  }

  /** A message of BaseSandbox with the sandbox paths under the root written as the model's. */
  text(message: string): string {
    if (!this.mention) return message;
    return message.replace(this.mention, (_whole, slash: string | undefined) => (slash ? '' : '/'));
  }
}

async function resolveRoot(sandbox: BaseSandbox, root: string | undefined): Promise<VirtualRoot> {
  if (root === '/') return new VirtualRoot('/');
  const command =
    root === undefined
      ? 'pwd'
      : `mkdir -p -- ${shellQuote(root)} && cd -- ${shellQuote(root)} && pwd`;
  const result = await sandbox.execute(command);
  const dir = result.output.trim().split('\n').at(-1) ?? '';
  if (result.exitCode !== 0 || !dir.startsWith('/')) {
    const which = root === undefined ? 'the working directory' : `'${root}'`;
    throw new InvalidPathError(
      `deepAgentsBackend: cannot use ${which} of sandbox ${sandbox.id} as the root: ${result.output.trim() || `exit code ${result.exitCode}`}`,
    );
  }
  return new VirtualRoot(dir === '/' ? '/' : withoutSlash(dir));
}

/** deepagents' wording for a path that `..` takes out of the root. */
function outsideRoot(doing: string, path: string): string {
  return `Error ${doing} '${path}': Path traversal not allowed (paths start at the root, /)`;
}

/** BaseSandbox's codes for a path that is not there or is not a folder (ls, grep). */
function isMissingOrNotDirectory(code: string | undefined): boolean {
  return code === 'file_not_found' || code === 'not_a_directory';
}

/** deepagents' wording for an edit whose string occurs several times. */
function multipleOccurrences(oldString: string, count: number): string {
  return `Error: String '${oldString}' has multiple occurrences (appears ${count} times) in file. Use replace_all=True to replace all instances, or provide a more specific string with surrounding context.`;
}

/**
 * `command` run in `root` by its own `/bin/sh`, each line of its standard error prefixed with
 * `[stderr] ` (deepagents' marking) and its exit code kept. Standard output goes straight through;
 * standard error passes `sed` (fd 4 is the original standard output, fd 3 carries the exit code).
 */
function markStderr(command: string, root: string): string {
  const run = `/bin/sh -c ${shellQuote(command)} 2>&1 1>&4 3>&- 4>&-`;
  return [
    `cd -- ${shellQuote(root)} || exit 1`,
    'exec 4>&1',
    `status=$( { { ${run}; printf %s "$?" >&3; } | sed 's/^/[stderr] /' >&4 3>&-; } 3>&1 )`,
    '[ -n "$status" ] || status=1',
    'exit "$status"',
  ].join('\n');
}

function fileInfo(entry: FileInfo): DeepAgentsFileInfo {
  return {
    path: entry.path,
    is_dir: entry.isDir,
    ...(entry.size === undefined ? {} : { size: entry.size }),
    ...(entry.modifiedAt === undefined ? {} : { modified_at: entry.modifiedAt }),
  };
}

/** Code-unit order, the same on every machine (localeCompare depends on the locale). */
function byPath(a: { path: string }, b: { path: string }): number {
  return a.path < b.path ? -1 : a.path > b.path ? 1 : 0;
}

/** A path the model gave relative to `/` (deepagents' tools pass absolute ones). */
function isRelative(path: string): boolean {
  return path !== '' && !path.startsWith('/');
}

function withoutSlash(path: string): string {
  return path.length > 1 && path.endsWith('/') ? path.replace(/\/+$/, '') || '/' : path;
}

function decodeUtf8(bytes: Uint8Array): string | undefined {
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    return undefined;
  }
}

/** deepagents picks how to show binary content (image block, file block...) by MIME type. */
const MIME_TYPES: Record<string, string> = {
  png: 'image/png',
  jpg: 'image/jpeg',
  jpeg: 'image/jpeg',
  gif: 'image/gif',
  webp: 'image/webp',
  bmp: 'image/bmp',
  pdf: 'application/pdf',
  mp3: 'audio/mpeg',
  wav: 'audio/wav',
  ogg: 'audio/ogg',
  mp4: 'video/mp4',
  webm: 'video/webm',
};

function binaryMimeType(path: string): string {
  const dot = path.lastIndexOf('.');
  const ext = dot > path.lastIndexOf('/') ? path.slice(dot + 1).toLowerCase() : '';
  return MIME_TYPES[ext] ?? 'application/octet-stream';
}

/** deepagents' `FileInfo` (snake_case). */
export interface DeepAgentsFileInfo {
  path: string;
  is_dir?: boolean;
  size?: number;
  modified_at?: string;
}

type Failure = { error: string };

/**
 * The subset of deepagents' `SandboxBackendProtocolV2` that {@link deepAgentsBackend} implements:
 * all of it. Declared here so this package needs no deepagents types.
 */
export interface DeepAgentsBackend {
  readonly id: string;
  execute(command: string): Promise<ExecuteResponse>;
  uploadFiles(files: [string, Uint8Array][]): Promise<FileUploadResponse[]>;
  downloadFiles(paths: string[]): Promise<FileDownloadResponse[]>;
  ls(path: string): Promise<{ files: DeepAgentsFileInfo[] } | Failure>;
  read(
    filePath: string,
    offset?: number,
    limit?: number,
  ): Promise<
    | {
        content: string | Uint8Array;
        mimeType: string;
        totalLines?: number;
        startLine?: number;
        endLine?: number;
        nextOffset?: number;
      }
    | Failure
  >;
  readRaw(filePath: string): Promise<
    | {
        data: {
          content: string | Uint8Array;
          mimeType: string;
          created_at: string;
          modified_at: string;
        };
      }
    | Failure
  >;
  write(filePath: string, content: string): Promise<{ path: string; filesUpdate: null } | Failure>;
  edit(
    filePath: string,
    oldString: string,
    newString: string,
    replaceAll?: boolean,
  ): Promise<{ path: string; filesUpdate: null; occurrences?: number } | Failure>;
  delete(filePath: string): Promise<{ path: string; filesUpdate: null } | Failure>;
  grep(
    pattern: string,
    path?: string | null,
    glob?: string | null,
    maxCount?: number | null,
  ): Promise<
    { matches: { path: string; line: number; text: string }[]; truncated: boolean } | Failure
  >;
  glob(
    pattern: string,
    path?: string,
  ): Promise<{ files: DeepAgentsFileInfo[]; truncated: boolean } | Failure>;
}
