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
      return globInSandbox(sandbox, pattern, real, path);
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

/** glob() returns at most this many entries (and sets `truncated`), as BaseSandbox's glob. */
const GLOB_MAX_RESULTS = 1000;
/** glob() stops walking after this long (and sets `truncated`). */
const GLOB_BUDGET_MS = 20_000;
/** Precedes the walker's answer in the command output. */
const GLOB_MARK = '__ABX_DEEPAGENTS_GLOB__';

/**
 * Walks the folder in the sandbox (breadth first, not into symlinked folders or the virtual file
 * systems) and prints the entries whose path relative to it matches: `[path, isDir, size,
 * mtimeMs]`. Plain JavaScript for whatever node the sandbox has (BaseSandbox's helpers need node
 * too), so that only matches cross the wire; its arguments come as one JSON argument.
 */
const GLOB_WALKER = `
const fs = require('fs');
const a = JSON.parse(process.argv[1]);
const re = new RegExp(a.regex);
const out = { files: [], truncated: false };
const started = Date.now();
const join = (dir, name) => (dir.endsWith('/') ? dir + name : dir + '/' + name);
try {
  if (!fs.statSync(a.base).isDirectory()) out.error = 'ENOTDIR';
} catch (e) {
  out.error = e.code || String(e);
}
const queue = out.error ? [] : [[a.base, '', 0]];
walk: for (let i = 0; i < queue.length; i++) {
  if (Date.now() - started > a.budgetMs) {
    out.truncated = true;
    break;
  }
  const [dir, rel, depth] = queue[i];
  let entries;
  try {
    entries = fs.readdirSync(dir, { withFileTypes: true });
  } catch (e) {
    continue;
  }
  for (const entry of entries) {
    const full = join(dir, entry.name);
    const path = rel ? rel + '/' + entry.name : entry.name;
    if (re.test(path)) {
      let stats;
      try {
        stats = fs.statSync(full);
      } catch (e) {
        stats = undefined;
      }
      if (stats) {
        if (out.files.length === a.maxResults) {
          out.truncated = true;
          break walk;
        }
        out.files.push([path, stats.isDirectory() ? 1 : 0, stats.size, stats.mtimeMs]);
      }
    }
    if (entry.isDirectory() && (a.maxDepth < 0 || depth + 1 < a.maxDepth) && a.prune.indexOf(full) < 0) {
      queue.push([full, path, depth + 1]);
    }
  }
}
process.stdout.write('\\n' + ${JSON.stringify(GLOB_MARK)} + JSON.stringify(out) + '\\n');
`;

/** deepagents' glob: entries (directories too) under `real`, paths relative to it. */
async function globInSandbox(
  sandbox: BaseSandbox,
  pattern: string,
  real: string,
  shownPath: string,
): Promise<{ files: DeepAgentsFileInfo[]; truncated: boolean } | Failure> {
  const compiled = compileGlob(pattern);
  try {
    new RegExp(compiled.regex);
  } catch {
    return { error: `Error finding files: invalid glob pattern '${pattern}'` };
  }
  const args = JSON.stringify({
    base: real,
    regex: compiled.regex,
    maxDepth: compiled.maxDepth ?? -1,
    maxResults: GLOB_MAX_RESULTS,
    budgetMs: GLOB_BUDGET_MS,
    prune: ['/proc', '/sys', '/dev', '/run'],
  });
  const interpreter = shellQuote(sandbox.interpreter);
  const result = await sandbox.execute(
    `${interpreter} -e ${shellQuote(GLOB_WALKER)} ${shellQuote(args)} 2>&1`,
    { timeoutMs: GLOB_BUDGET_MS + 30_000 },
  );
  const at = result.output.lastIndexOf(`\n${GLOB_MARK}`);
  if (at < 0) {
    const detail = result.output.trim().slice(0, 300) || '(no output)';
    const reason =
      result.exitCode === 127
        ? `the sandbox has no '${sandbox.interpreter}' on its PATH (glob runs a small node program)`
        : `unexpected answer from the sandbox (exit code ${result.exitCode}): ${detail}`;
    return { error: `Error finding files in '${shownPath}': ${reason}` };
  }
  let answer: { files: [string, 0 | 1, number, number][]; truncated: boolean; error?: string };
  try {
    answer = JSON.parse(result.output.slice(at + GLOB_MARK.length + 1).split('\n', 1)[0] ?? '');
  } catch {
    return { error: `Error finding files in '${shownPath}': the answer was cut short` };
  }
  if (answer.error !== undefined) {
    // deepagents finds nothing in a missing folder (or a file).
    if (answer.error === 'ENOENT' || answer.error === 'ENOTDIR') {
      return { files: [], truncated: false };
    }
    const reason = answer.error === 'EACCES' ? 'permission denied' : answer.error;
    return { error: `Error finding files in '${shownPath}': ${reason}` };
  }
  const files = answer.files.map(([path, isDir, size, mtimeMs]) => ({
    path,
    is_dir: isDir === 1,
    size,
    modified_at: new Date(mtimeMs).toISOString(),
  }));
  return {
    files: files.sort((a, b) => byPath(a, b)),
    truncated: answer.truncated,
  };
}

/**
 * A glob pattern as deepagents matches it against paths relative to the folder searched: `*`
 * and `?` stay within a name (and match a leading dot), `**` spans folders (`**\/` also none),
 * `[a-z]`/`[!x]` are classes; `{a,b}` alternatives too (as fast-glob in deepagents'
 * FilesystemBackend). A leading `/` or `./` is dropped. `maxDepth`: how deep a match can lie
 * (undefined with `**`).
 */
function compileGlob(pattern: string): { regex: string; maxDepth: number | undefined } {
  const trimmed = pattern.replace(/^(\.?\/)+/, '').replace(/\/+$/, '');
  const alternatives = expandBraces(trimmed);
  let maxDepth: number | undefined = 0;
  const sources = alternatives.map((alternative) => {
    if (alternative.includes('**')) maxDepth = undefined;
    else if (maxDepth !== undefined) {
      maxDepth = Math.max(maxDepth, alternative.split('/').length);
    }
    return globToRegex(alternative);
  });
  return { regex: `^(?:${sources.join('|')})$`, maxDepth };
}

function globToRegex(pattern: string): string {
  let out = '';
  for (let i = 0; i < pattern.length; ) {
    const c = pattern[i] as string;
    if (c === '*') {
      if (pattern[i + 1] === '*') {
        i += 2;
        if (pattern[i] === '/') {
          out += '(?:.*/)?';
          i++;
        } else {
          out += '.*';
        }
      } else {
        out += '[^/]*';
        i++;
      }
    } else if (c === '?') {
      out += '[^/]';
      i++;
    } else if (c === '[') {
      // `]` right after `[` (or `[!`) belongs to the class.
      const first = pattern[i + 1] === '!' || pattern[i + 1] === '^' ? i + 2 : i + 1;
      const end = pattern.indexOf(']', first + 1);
      if (end < 0) {
        out += '\\[';
        i++;
        continue;
      }
      const negated = first === i + 2;
      const body = pattern.slice(first, end).replace(/[\\\]^[]/g, '\\$&');
      out += `[${negated ? '^' : ''}${body}]`;
      i = end + 1;
    } else {
      out += c.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
      i++;
    }
  }
  return out;
}

/** The alternatives of the first `{a,b}` group, expanded recursively (at most 256). */
function expandBraces(pattern: string): string[] {
  const open = pattern.indexOf('{');
  if (open < 0) return [pattern];
  let depth = 0;
  let start = open + 1;
  const options: string[] = [];
  for (let i = open; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === '{') depth++;
    else if (c === '}' && --depth === 0) {
      options.push(pattern.slice(start, i));
      if (options.length < 2) break;
      const rest = pattern.slice(i + 1);
      const expanded = options.flatMap((option) =>
        expandBraces(pattern.slice(0, open) + option + rest),
      );
      return expanded.slice(0, 256);
    } else if (c === ',' && depth === 1) {
      options.push(pattern.slice(start, i));
      start = i + 1;
    }
  }
  // No closed group of two or more: the braces are literal.
  return [pattern];
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
