import { posix } from 'node:path';
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
   * Opt-in virtual mode: the sandbox folder the model sees as `/` (created if missing), as in
   * deepagents' filesystem backends with `virtualMode`. Without it (the default) the file tools
   * use the sandbox's real paths, the same ones `execute` sees. Caveat: `execute` is a shell
   * and is not confined to the root (it runs there, but can reach the whole sandbox), so an
   * absolute path in a command means the real one, not the model's: `write_file('/app.py')`
   * then `execute('python3 /app.py')` fails; `execute('python3 app.py')` works.
   */
  root?: string;
  /**
   * How long `grep` and `glob` may search before answering with what they found and
   * `truncated: true`; default {@link DEEPAGENTS_SEARCH_BUDGET_MS} (2 s), so that a search of
   * the whole sandbox (`/`, deepagents' default path) answers within seconds. 0 stops at once.
   */
  searchTimeBudgetMs?: number;
}

/** How long grep and glob search by default before answering what they found (`truncated`). */
export const DEEPAGENTS_SEARCH_BUDGET_MS = 2000;

/**
 * Use an abx sandbox as the sandbox backend of LangChain deepagents (JS):
 *
 * ```ts
 * import { createDeepAgent } from 'deepagents';
 * import { Sandbox, deepAgentsBackend } from 'abx-sandbox';
 *
 * const sandbox = await Sandbox.create({ template: 'base' });
 * const agent = createDeepAgent({ model, backend: deepAgentsBackend(sandbox) });
 * ```
 *
 * **One file system.** The file tools and `execute` see the same paths, as in deepagents' other
 * sandbox backends: an absolute path is that path in the sandbox, a relative one is relative to
 * the sandbox's working directory (where `execute` runs; `~` is its `$HOME`), so
 * `write_file('/app/main.py')` then `execute('python3 /app/main.py')` runs that file. Paths come
 * back as the model gave them (absolute, or relative to the working directory when it asked
 * with a relative path; glob's are relative to the folder searched, as deepagents' own
 * `BaseSandbox` answers). Deleting `/` is refused.
 *
 * **Searching `/`.** deepagents' `grep` and `glob` default to `/`, the whole sandbox. They never
 * walk into `/proc`, `/sys`, `/dev` or `/run`, search files as they find them (name order, the
 * working directory's `/home` before `/usr`), and stop early with `truncated: true` at a bound:
 * grep at its match cap (`max_count`, 1000 by default in deepagents' tool) or after
 * `searchTimeBudgetMs` (2 s); glob at 1000 results or after the same time.
 *
 * **A virtual root** (`{ root }`, opt-in): `/` is that folder, `/src/app.py` is
 * `<root>/src/app.py`, paths shown to the model are under `/`, a path that `..` takes out of the
 * root is refused, and `execute` runs in the root, so relative paths mean the same there and in
 * the file tools. The shell is not confined to the root (see {@link DeepAgentsBackendOptions.root}).
 *
 * **deepagents' answers.** File operations are this project's {@link BaseSandbox} ones (envd
 * answers them on a `Sandbox`: no process per call) translated to what deepagents JS's own
 * `BaseSandbox` answers: snake_case `FileInfo`, folders listed with a trailing `/`, a missing
 * folder listed, searched or globbed as empty, glob with deepagents' rules (`*` stays within a
 * folder, dot-files match) returning folders too, edit's "multiple occurrences" error,
 * `[stderr] ` before each line of standard error in `execute` output, `invalid_path` for a path
 * that cannot be one (empty, a NUL byte; in virtual mode, out of the root).
 *
 * The adapter is a plain object implementing deepagents' `SandboxBackendProtocolV2` (checked
 * structurally: nothing here imports deepagents, so it stays optional). It works for any
 * {@link BaseSandbox}, e.g. a `LocalShellSandbox` (whose working directory is its folder). The
 * working directory is read by one command, the first time a relative path is used; a virtual
 * root is resolved (and created) by one command on first use, and one that cannot be a folder
 * makes that call throw an `InvalidPathError`.
 */
export function deepAgentsBackend(
  sandbox: BaseSandbox,
  options: DeepAgentsBackendOptions = {},
): DeepAgentsBackend {
  const budget = options.searchTimeBudgetMs ?? DEEPAGENTS_SEARCH_BUDGET_MS;
  // Each found by one command in the sandbox on first need, and found again after a failure.
  const once = <T>(find: () => Promise<T>): (() => Promise<T>) => {
    let pending: Promise<T> | undefined;
    return () => {
      pending ??= find().catch((error: unknown) => {
        pending = undefined;
        throw error;
      });
      return pending;
    };
  };
  const virtualRoot = once(() => resolveRoot(sandbox, options.root));
  const workdir = once(async () => new RealPaths(await resolveWorkdir(sandbox)));
  const absolute = new RealPaths(undefined);
  /** The translation of paths for a call with these paths of the model's. */
  const viewOf = (...paths: (string | null | undefined)[]): Promise<PathView> => {
    if (options.root !== undefined) return virtualRoot();
    return paths.every((path) => path == null || path === '' || path.startsWith('/'))
      ? Promise.resolve(absolute)
      : workdir();
  };

  return {
    get id() {
      return sandbox.id;
    },

    async execute(command) {
      const cwd = options.root === undefined ? undefined : (await virtualRoot()).real;
      return sandbox.execute(markStderr(command, cwd));
    },

    async uploadFiles(files) {
      const view = await viewOf(...files.map(([path]) => path));
      const inside = files.flatMap(([path, content]) => {
        const real = view.toSandbox(path);
        return real === undefined ? [] : [[real, content] as [string, Uint8Array]];
      });
      const answers = inside.length > 0 ? await sandbox.uploadFiles(inside) : [];
      let next = 0;
      return files.map(([path]) => {
        if (view.toSandbox(path) === undefined) return { path, error: 'invalid_path' };
        const answer = answers[next++];
        return { path, error: answer ? answer.error : 'invalid_path' };
      });
    },

    async downloadFiles(paths) {
      const view = await viewOf(...paths);
      const inside = paths.flatMap((path) => view.toSandbox(path) ?? []);
      const answers = inside.length > 0 ? await sandbox.downloadFiles(inside) : [];
      let next = 0;
      return paths.map((path) => {
        if (view.toSandbox(path) === undefined) {
          return { path, content: null, error: 'invalid_path' };
        }
        const answer = answers[next++];
        return answer
          ? { path, content: answer.content, error: answer.error }
          : { path, content: null, error: 'invalid_path' };
      });
    },

    async ls(path) {
      const view = await viewOf(path);
      const real = view.toSandbox(path);
      if (real === undefined) return { error: view.refused('listing', path) };
      const result = await sandbox.ls(real);
      if (result.error !== undefined) {
        // deepagents lists a missing folder (or a file) as empty.
        if (isMissingOrNotDirectory(result.errorCode)) return { files: [] };
        return { error: view.text(result.error) };
      }
      const files = (result.entries ?? []).flatMap((entry) => {
        const shown = view.toModel(entry.path, path);
        if (shown === undefined) return [];
        // deepagents marks directories in listings with a trailing slash.
        return [{ ...fileInfo(entry), path: entry.isDir ? `${withoutSlash(shown)}/` : shown }];
      });
      return { files: files.sort((a, b) => byPath(a, b)) };
    },

    async read(filePath, offset = 0, limit = 500) {
      const view = await viewOf(filePath);
      const real = view.toSandbox(filePath);
      if (real === undefined) return { error: view.refused('reading file', filePath) };
      const page = await sandbox.read(real, { offset, limit });
      if (page.error !== undefined || !page.fileData) {
        return { error: view.text(page.error ?? `Error: reading '${real}' gave no content`) };
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
      const view = await viewOf(filePath);
      const real = view.toSandbox(filePath);
      if (real === undefined) return { error: view.refused('reading file', filePath) };
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
      const view = await viewOf(filePath);
      const real = view.toSandbox(filePath);
      if (real === undefined) return { error: view.refused('writing file', filePath) };
      const result = await sandbox.write(real, content);
      return result.error !== undefined
        ? { error: view.text(result.error) }
        : { path: filePath, filesUpdate: null };
    },

    async edit(filePath, oldString, newString, replaceAll = false) {
      const view = await viewOf(filePath);
      const real = view.toSandbox(filePath);
      if (real === undefined) return { error: view.refused('editing file', filePath) };
      const result = await sandbox.edit(real, oldString, newString, { replaceAll });
      if (result.error !== undefined) {
        if (result.errorCode === 'multiple') {
          return { error: multipleOccurrences(oldString, result.occurrences ?? 0) };
        }
        return { error: view.text(result.error) };
      }
      return {
        path: filePath,
        filesUpdate: null,
        ...(result.occurrences === undefined ? {} : { occurrences: result.occurrences }),
      };
    },

    async delete(filePath) {
      const view = await viewOf(filePath);
      const real = view.toSandbox(filePath);
      if (real === undefined) return { error: view.refused('deleting', filePath) };
      if (real === '/' && view instanceof RealPaths) {
        return { error: `Error deleting '${filePath}': the sandbox's root folder is not deleted` };
      }
      // As in deepagents' virtual mode, deleting `/` empties the root and keeps it.
      if (view instanceof VirtualRoot && real === view.real) {
        const listed = await sandbox.ls(real);
        if (listed.error !== undefined) return { error: view.text(listed.error) };
        for (const entry of listed.entries ?? []) {
          const removed = await sandbox.delete(entry.path);
          if (removed.error !== undefined) return { error: view.text(removed.error) };
        }
        return { path: filePath, filesUpdate: null };
      }
      const result = await sandbox.delete(real);
      return result.error !== undefined
        ? { error: view.text(result.error) }
        : { path: filePath, filesUpdate: null };
    },

    async grep(pattern, path, glob, maxCount) {
      const asked = path ?? '/';
      const view = await viewOf(asked);
      const real = view.toSandbox(asked);
      if (real === undefined) return { error: view.refused('searching', asked) };
      const result = await sandbox.grep(pattern, {
        path: real,
        ...(glob ? { glob } : {}),
        ...(maxCount ? { maxCount } : {}),
        timeBudgetMs: budget,
      });
      if (result.error !== undefined) {
        // deepagents finds nothing in a missing folder.
        if (isMissingOrNotDirectory(result.errorCode)) return { matches: [], truncated: false };
        return { error: view.text(result.error) };
      }
      const matches = (result.matches ?? []).flatMap((match) => {
        const shown = view.toModel(match.path, asked);
        return shown === undefined ? [] : [{ ...match, path: shown }];
      });
      return { matches, truncated: result.truncated };
    },

    async glob(pattern, path = '/') {
      const view = await viewOf(path);
      const real = view.toSandbox(path);
      if (real === undefined) return { error: view.refused('searching', path) };
      // deepagents JS answers as fast-glob with `dot: true`: folders too, relative paths.
      const result = await sandbox.glob(pattern, {
        path: real,
        style: 'path',
        includeDirs: true,
        relative: true,
        timeBudgetMs: budget,
      });
      if (result.error !== undefined) {
        // deepagents finds nothing in a missing folder (or a file).
        if (isMissingOrNotDirectory(result.errorCode)) return { files: [], truncated: false };
        if (result.errorCode === 'invalid_pattern') {
          return { error: `Error finding files: invalid glob pattern '${pattern}'` };
        }
        return { error: view.text(result.error) };
      }
      return { files: (result.matches ?? []).map(fileInfo), truncated: result.truncated };
    },
  };
}

/** How the model's paths become the sandbox's, and back. */
interface PathView {
  /** The sandbox path of a path the model gave, or undefined when it cannot be used. */
  toSandbox(path: string): string | undefined;
  /** The model's path for a sandbox path found under `asked` (a path the model gave). */
  toModel(path: string, asked: string): string | undefined;
  /** A message of BaseSandbox with sandbox paths written as the model's. */
  text(message: string): string;
  /** Why {@link toSandbox} refused `path`, for the model. */
  refused(doing: string, path: string): string;
}

/** The sandbox's working directory and home, for relative paths and `~`. */
interface Workdir {
  cwd: string;
  home: string;
}

/**
 * The default: real paths. Absolute ones are taken as they are (normalized); relative ones and
 * `~` need the {@link Workdir} (undefined while no relative path was given).
 */
class RealPaths implements PathView {
  constructor(private readonly workdir: Workdir | undefined) {}

  toSandbox(path: string): string | undefined {
    if (path === '' || path.includes('\0')) return undefined;
    let full = path;
    if (!path.startsWith('/')) {
      if (!this.workdir) return undefined; // not reached: relative paths get a Workdir
      const { cwd, home } = this.workdir;
      if (path === '~' || path.startsWith('~/')) full = `${home}/${path.slice(2)}`;
      else full = `${cwd}/${path}`;
    }
    return withoutSlash(posix.normalize(full));
  }

  toModel(path: string, asked: string): string {
    if (!this.workdir || asked.startsWith('/') || asked.startsWith('~')) return path;
    return posix.relative(this.workdir.cwd, path) || '.';
  }

  text(message: string): string {
    return message;
  }

  refused(doing: string, path: string): string {
    return `Error ${doing} '${path}': invalid path (empty, or holding a NUL byte)`;
  }
}

/** Opt-in virtual mode: the root folder, which the model sees as `/`. */
class VirtualRoot implements PathView {
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
   * The model's path for a sandbox path (without the leading `/` when the model asked with a
   * relative path), or undefined when it lies outside the root.
   */
  toModel(path: string, asked: string): string | undefined {
    const relative = asked !== '' && !asked.startsWith('/');
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

  /** deepagents' wording for a path that `..` takes out of the root. */
  refused(doing: string, path: string): string {
    return `Error ${doing} '${path}': Path traversal not allowed (paths start at the root, /)`;
  }
}

/** The virtual root `root` (created if missing; relative to the working directory). */
async function resolveRoot(sandbox: BaseSandbox, root: string | undefined): Promise<VirtualRoot> {
  if (root === '/') return new VirtualRoot('/');
  const folder = root ?? '.';
  const result = await sandbox.execute(
    `mkdir -p -- ${shellQuote(folder)} && cd -- ${shellQuote(folder)} && pwd`,
  );
  const dir = result.output.trim().split('\n').at(-1) ?? '';
  if (result.exitCode !== 0 || !dir.startsWith('/')) {
    throw new InvalidPathError(
      `deepAgentsBackend: cannot use '${folder}' of sandbox ${sandbox.id} as the root: ${result.output.trim() || `exit code ${result.exitCode}`}`,
    );
  }
  return new VirtualRoot(dir === '/' ? '/' : withoutSlash(dir));
}

/** The sandbox's working directory (where `execute` runs) and `$HOME`, by one command. */
async function resolveWorkdir(sandbox: BaseSandbox): Promise<Workdir> {
  const result = await sandbox.execute('pwd && printf "%s\\n" "$HOME"');
  const [cwd = '', home = ''] = result.output.trim().split('\n').slice(-2);
  if (result.exitCode !== 0 || !cwd.startsWith('/')) {
    throw new InvalidPathError(
      `deepAgentsBackend: cannot read the working directory of sandbox ${sandbox.id} (for a relative path): ${result.output.trim() || `exit code ${result.exitCode}`}`,
    );
  }
  return {
    cwd: withoutSlash(cwd),
    home: home.startsWith('/') ? withoutSlash(home) : withoutSlash(cwd),
  };
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
 * `command` run by its own `/bin/sh` (in `cwd` when given), each line of its standard error
 * prefixed with `[stderr] ` (deepagents' marking) and its exit code kept. Standard output goes
 * straight through; standard error passes `sed` (fd 4 is the original standard output, fd 3
 * carries the exit code).
 */
function markStderr(command: string, cwd: string | undefined): string {
  const run = `/bin/sh -c ${shellQuote(command)} 2>&1 1>&4 3>&- 4>&-`;
  return [
    ...(cwd === undefined ? [] : [`cd -- ${shellQuote(cwd)} || exit 1`]),
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
