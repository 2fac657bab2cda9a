import {
  type BigIntStats,
  closeSync,
  constants,
  fstatSync,
  lstatSync,
  openSync,
  readSync,
  type Stats,
} from 'node:fs';
import {
  cp,
  lchown,
  lstat,
  mkdir,
  open,
  readdir,
  readFile,
  readlink,
  realpath,
  rename,
  rm,
  stat,
} from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { MetadataError, metadataFromHeaders } from '../../protocol/file-metadata.js';
import { BadRequestError, EditMismatchError, FileOperationError } from '../errors.js';
import type { FileMetadataStore } from '../file-metadata.js';
import {
  fsAction,
  SMALL_FILE_BYTES,
  STREAM_BUFFER_BYTES,
  safePath,
  writeAtomic,
} from '../file-system.js';
import { Reply } from '../http.js';
import { defineGroup, type RouteGroup } from '../route-group.js';
import { identityFor } from '../users.js';
import { argList } from '../validate.js';
import { globToRegExp, walk } from '../walk.js';
import { FILE_TOOL_ROUTES } from './file-tools.js';
import { uploadRoute, type WriteOne } from './files-upload.js';

function kindOf(s: Stats | BigIntStats): string {
  if (s.isSymbolicLink()) return 'symlink';
  if (s.isDirectory()) return 'directory';
  return s.isFile() ? 'file' : 'other';
}

/** A path as the file routes describe it. */
export function describe(path: string, s: Stats | BigIntStats) {
  return {
    path,
    type: kindOf(s),
    size: Number(s.size),
    mode: `0${(Number(s.mode) & 0o7777).toString(8)}`,
    mtime: s.mtime.toISOString(),
  };
}

/**
 * {@link describe}, with a symlink's `target`: the absolute path it leads to (resolved all the
 * way where it can be, else its own text made absolute: a broken link still shows where it points).
 */
async function describeLink(path: string, s: Stats | BigIntStats) {
  const described = describe(path, s);
  if (!s.isSymbolicLink()) return described;
  const target = await realpath(path).catch(async () =>
    resolve(dirname(path), await readlink(path).catch(() => '')),
  );
  return { ...described, target };
}

/**
 * `mkdir -p`. Node's recursive mkdir answers ENOENT for some failures that are not a missing
 * parent (a read-only file system): then each missing level is made on its own, so the error is
 * the real one (EROFS, EACCES, ENOTDIR).
 */
async function makeDirectory(path: string): Promise<void> {
  try {
    await mkdir(path, { recursive: true });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
    const missing: string[] = [];
    for (let dir = path; ; dir = dirname(dir)) {
      if (
        await lstat(dir).then(
          () => true,
          () => false,
        )
      )
        break;
      missing.unshift(dir);
      if (dirname(dir) === dir) break;
    }
    // Made level by level, it either works (a parent came back meanwhile) or says why not.
    for (const dir of missing) await mkdir(dir);
  }
}

/** Files bigger than this are skipped by grep; they are rarely source and would stall it. */
const GREP_MAX_FILE_BYTES = 8 * 1024 * 1024;

function regexOf(pattern: string, flags: string): RegExp {
  try {
    return new RegExp(pattern, flags);
  } catch (error) {
    throw new BadRequestError(
      `pattern is not a valid regular expression: ${(error as Error).message}`,
    );
  }
}

async function mustNotExist(path: string, overwrite: boolean): Promise<void> {
  if (overwrite) return;
  const exists = await lstat(path).then(
    () => true,
    () => false,
  );
  if (exists) {
    throw new FileOperationError(`${path} exists already; pass overwrite: true to replace it`, {
      code: 'EEXIST',
    });
  }
}

/** Opening a file to read never waits: O_NONBLOCK (regular files read as usual with it). */
const READ_FLAGS = constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY;

/**
 * The range of a small regular file (SMALL_FILE_BYTES), read without the thread pool; undefined
 * for anything else, which the streamed path answers (with its errors). Opened non-blocking, so a
 * FIFO or a device never blocks the open; only a regular file is read.
 */
function readSmall(path: string, offset: number, wanted: number | undefined): Buffer | undefined {
  if (offset < 0 || (wanted ?? 0) < 0) return undefined;
  let fd: number;
  try {
    fd = openSync(path, READ_FLAGS);
  } catch {
    return undefined;
  }
  try {
    const s = fstatSync(fd);
    if (!s.isFile() || s.size > SMALL_FILE_BYTES) return undefined;
    const length = Math.max(0, Math.min(wanted ?? s.size, s.size - offset));
    const buffer = Buffer.allocUnsafe(length);
    let got = 0;
    while (got < length) {
      const n = readSync(fd, buffer, got, length - got, offset + got);
      if (n === 0) break;
      got += n;
    }
    return got === length ? buffer : buffer.subarray(0, got);
  } catch {
    return undefined;
  } finally {
    closeSync(fd);
  }
}

/** The `X-Metadata-*` headers of a write, checked (a bad set is a 400 naming the fault). */
function metadataOf(headers: Record<string, string | string[] | undefined>) {
  try {
    return metadataFromHeaders(Object.entries(headers));
  } catch (error) {
    if (error instanceof MetadataError)
      throw new BadRequestError(`invalid metadata: ${error.message}`);
    throw error;
  }
}

/** {@link describeLink} with the file's metadata when the server keeps some. */
async function describeWithMetadata(
  path: string,
  s: BigIntStats,
  store: FileMetadataStore | undefined,
) {
  const described = await describeLink(path, s);
  const metadata = await store?.metadataOf(path, s);
  return metadata ? { ...described, metadata } : described;
}

/**
 * Reading, writing and searching files, and BaseSandbox's file tools (file-tools.ts); paths are
 * resolved against the server's directory. With `metadata` (envd's), writes keep the
 * `X-Metadata-*` headers they carry and stat and list answer them; without (the command server),
 * a write with metadata is refused.
 */
export function fileOps(options: { metadata?: FileMetadataStore } = {}): RouteGroup {
  const store = options.metadata;
  /**
   * Writes one file atomically with the metadata it is to keep (refused, before a byte is written,
   * when this server keeps none or the set does not fit); answers what a write route returns.
   */
  const writeOne: WriteOne = async (path, content, metadata) => {
    const hasMetadata = Object.keys(metadata).length > 0;
    if (hasMetadata && !store) {
      throw new BadRequestError(
        'this server keeps no file metadata: send X-Metadata-* headers to envd (port 49983), or leave them out',
      );
    }
    if (store) await store.admit(path, metadata);
    const replaced = await store?.replacing(path);
    let written: BigIntStats | undefined;
    const noteWritten = (temp: string) => {
      written = lstatSync(temp, { bigint: true });
    };
    const size = await writeAtomic(path, content, hasMetadata ? noteWritten : undefined);
    await store?.written(path, written, metadata, replaced);
    return hasMetadata ? { path, size, metadata } : { path, size };
  };
  return defineGroup('FILE_OPS', '/files', 'file read/write/list/search/edit', [
    {
      method: 'GET',
      path: '/files/read',
      summary: 'Raw bytes of a file (`offset`, `length` for a range), as application/octet-stream.',
      args: argList({ path: 'str', 'offset?': ['int', 0], 'length?': 'int' }),
      handler: async ({ args }) => {
        const path = safePath(args.path as string);
        const small = readSmall(path, args.offset as number, args.length as number | undefined);
        if (small) return new Reply(200, small, { 'content-length': String(small.length) });
        // Opened before the answer starts, so an unreadable file is a 403/404, not a reset stream.
        // Non-blocking: a FIFO (or a device) would hold the open until a writer came.
        const handle = await fsAction(`read ${path}`, () => open(path, READ_FLAGS));
        const s = await handle.stat();
        if (!s.isFile()) {
          await handle.close();
          throw new FileOperationError(`${path} is not a regular file`, {
            code: s.isDirectory() ? 'EISDIR' : 'not_a_regular_file',
          });
        }
        const start = args.offset as number;
        const wanted = args.length as number | undefined;
        if (start < 0 || (wanted ?? 0) < 0) {
          await handle.close();
          throw new BadRequestError('offset and length must not be negative');
        }
        const length = Math.max(0, Math.min(wanted ?? s.size, s.size - start));
        if (length === 0) await handle.close();
        // createReadStream refuses an empty range, so an empty answer is a plain empty buffer.
        const body =
          length === 0
            ? Buffer.alloc(0)
            : handle.createReadStream({
                start,
                end: start + length - 1,
                highWaterMark: Math.min(length, STREAM_BUFFER_BYTES),
              });
        return new Reply(200, body, { 'content-length': String(length) });
      },
    },
    {
      method: 'PUT',
      path: '/files/write',
      summary:
        "Writes the raw request body to `?path=` atomically (temp file + rename), creating parents; `X-Metadata-<key>` headers become the new file's metadata.",
      body: 'stream',
      args: argList({ path: 'str', 'user?': 'str' }),
      handler: async ({ args, wholeIfSmall, headers }) => {
        const path = safePath(args.path as string);
        const identity = identityFor(args.user as string | undefined);
        // Checked before a byte is written: a refused set leaves the file as it was.
        const metadata = metadataOf(headers);
        // A small body is read whole and written without the thread pool (SMALL_FILE_BYTES).
        const written = await writeOne(path, await wholeIfSmall(SMALL_FILE_BYTES), metadata);
        // An image build's copy step: the file belongs to the step's user.
        if (identity)
          await fsAction(`chown ${path}`, () => lchown(path, identity.uid, identity.gid));
        return written;
      },
    },
    uploadRoute(writeOne, metadataOf),
    {
      method: 'GET',
      path: '/files/list',
      summary: 'Entries of a directory with type, size and mtime.',
      args: argList({ 'path?': ['str', '.'] }),
      handler: async ({ args }) => {
        const path = safePath(args.path as string);
        const names = await fsAction(`list ${path}`, () => readdir(path));
        const entries = await Promise.all(
          names.sort().map(async (name) => {
            const s = await lstat(join(path, name), { bigint: true }).catch(() => undefined);
            return s
              ? { name, ...(await describeWithMetadata(join(path, name), s, store)) }
              : { name, type: 'gone' };
          }),
        );
        return { path, entries };
      },
    },
    {
      method: 'GET',
      path: '/files/stat',
      summary:
        "Type, size, mode and mtime of a path (symlinks are not followed: a link's `target` is where it leads).",
      args: argList({ path: 'str' }),
      handler: async ({ args }) => {
        const path = safePath(args.path as string);
        const s = await fsAction(`stat ${path}`, () => lstat(path, { bigint: true }));
        return describeWithMetadata(path, s, store);
      },
    },
    {
      method: 'POST',
      path: '/files/mkdir',
      summary: 'Creates a directory and its parents; an existing directory is fine.',
      args: argList({ path: 'str' }),
      handler: async ({ args }) => {
        const path = safePath(args.path as string);
        await fsAction(`create directory ${path}`, () => makeDirectory(path));
        return { path };
      },
    },
    {
      method: 'POST',
      path: '/files/move',
      summary: 'Renames a file or directory; refuses to replace one unless `overwrite`.',
      args: argList({ from: 'str', to: 'str', 'overwrite?': ['bool', false] }),
      handler: async ({ args }) => {
        const from = safePath(args.from as string, 'from');
        const to = safePath(args.to as string, 'to');
        await mustNotExist(to, args.overwrite as boolean);
        const move = () =>
          fsAction(`move ${from} to ${to}`, async () => {
            await mkdir(join(to, '..'), { recursive: true });
            await rename(from, to);
          });
        await (store ? store.moving(from, to, move) : move());
        return { from, to };
      },
    },
    {
      method: 'POST',
      path: '/files/copy',
      summary: 'Copies a file or a directory tree; refuses to replace unless `overwrite`.',
      args: argList({ from: 'str', to: 'str', 'overwrite?': ['bool', false] }),
      handler: async ({ args }) => {
        const from = safePath(args.from as string, 'from');
        const to = safePath(args.to as string, 'to');
        await mustNotExist(to, args.overwrite as boolean);
        await fsAction(`copy ${from} to ${to}`, () =>
          cp(from, to, { recursive: true, force: true, errorOnExist: false }),
        );
        return { from, to };
      },
    },
    {
      method: 'POST',
      path: '/files/delete',
      summary: 'Deletes a file, or a directory with `recursive`.',
      args: argList({ path: 'str', 'recursive?': ['bool', false] }),
      handler: async ({ args }) => {
        const path = safePath(args.path as string);
        const s = await fsAction(`delete ${path}`, () => lstat(path));
        if (s.isDirectory() && !args.recursive) {
          throw new FileOperationError(
            `${path} is a directory; pass recursive: true to delete it`,
            {
              code: 'EISDIR',
            },
          );
        }
        await fsAction(`delete ${path}`, () => rm(path, { recursive: true }));
        await store?.deleted(path);
        return { path, deleted: true };
      },
    },
    {
      method: 'GET',
      path: '/files/glob',
      summary: 'Paths under `cwd` matching a glob (`**`, `*`, `?`, `{a,b}`), up to `limit`.',
      args: argList({ pattern: 'str', 'cwd?': ['str', '.'], 'limit?': ['int', 1000] }),
      handler: async ({ args }) => {
        const cwd = safePath(args.cwd as string, 'cwd');
        const regex = globToRegExp(args.pattern as string);
        const matches: string[] = [];
        let truncated = false;
        for await (const entry of walk(cwd)) {
          if (!regex.test(entry.path)) continue;
          if (matches.length >= (args.limit as number)) {
            truncated = true;
            break;
          }
          matches.push(entry.path);
        }
        return { cwd, matches, truncated };
      },
    },
    {
      method: 'GET',
      path: '/files/grep',
      summary: 'Lines matching a regular expression in a file or the files under a directory.',
      args: argList({
        pattern: 'str',
        'path?': ['str', '.'],
        'glob?': 'str',
        'ignore_case?': ['bool', false],
        'limit?': ['int', 500],
      }),
      handler: async ({ args }) => {
        const root = safePath(args.path as string);
        const regex = regexOf(args.pattern as string, args.ignore_case ? 'i' : '');
        const only = args.glob === undefined ? undefined : globToRegExp(args.glob as string);
        const rootStat = await fsAction(`search ${root}`, () => stat(root));
        const files = rootStat.isDirectory() ? walk(root) : [{ path: '', dir: false }];
        const matches: { path: string; line: number; text: string }[] = [];
        for await (const entry of files) {
          if (entry.dir || (only && !only.test(entry.path))) continue;
          const full = entry.path === '' ? root : join(root, entry.path);
          const s = await stat(full).catch(() => undefined);
          if (!s?.isFile() || s.size > GREP_MAX_FILE_BYTES) continue;
          const bytes = await readFile(full).catch(() => undefined);
          if (!bytes || bytes.subarray(0, 8192).includes(0)) continue; // binary
          const lines = bytes.toString('utf8').split('\n');
          for (const [i, text] of lines.entries()) {
            if (!regex.test(text)) continue;
            if (matches.length >= (args.limit as number)) return { matches, truncated: true };
            matches.push({ path: full, line: i + 1, text });
          }
        }
        return { matches, truncated: false };
      },
    },
    {
      method: 'POST',
      path: '/files/edit',
      summary: 'Replaces exact text in a file (once, or every time with `all`), atomically.',
      args: argList({ path: 'str', old: 'str', new: 'str', 'all?': ['bool', false] }),
      handler: async ({ args }) => {
        const path = safePath(args.path as string);
        const [old, replacement] = [args.old as string, args.new as string];
        if (old === '') throw new BadRequestError('old is empty; give the exact text to replace');
        const text = await fsAction(`read ${path}`, () => readFile(path, 'utf8'));
        const count = text.split(old).length - 1;
        if (count === 0)
          throw new EditMismatchError(`the text to replace does not occur in ${path}`);
        if (count > 1 && !args.all) {
          throw new EditMismatchError(
            `the text to replace occurs ${count} times in ${path}; give more context or pass all: true`,
          );
        }
        const edited = args.all
          ? text.split(old).join(replacement)
          : text.replace(old, () => replacement);
        await writeAtomic(path, Buffer.from(edited, 'utf8'));
        return { path, replacements: args.all ? count : 1 };
      },
    },
    ...FILE_TOOL_ROUTES,
  ]);
}

/** {@link fileOps} without file metadata: the command server's. */
export const FILE_OPS = fileOps();
