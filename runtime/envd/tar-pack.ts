import { constants, type Stats } from 'node:fs';
import { type FileHandle, lstat, open, readdir, readlink } from 'node:fs/promises';
import { fsError } from '../server/errors.js';
import {
  END_OF_ARCHIVE,
  entryBytes,
  entryHeader,
  padding,
  type TarEntry,
  type TarType,
} from './tar-format.js';

/** Bytes read from a file at a time. */
const CHUNK = 256 * 1024;
const SLASH = Buffer.from('/');
/** Never through a symbolic link, never blocking on a FIFO swapped in for a file. */
const READ_FLAGS = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;

/** Errors that mean "this changed while we walked": the entry is left out, as if removed. */
const VANISHED = new Set(['ENOENT', 'ENOTDIR', 'ELOOP', 'EINVAL']);

function vanished(error: unknown): boolean {
  return VANISHED.has((error as NodeJS.ErrnoException).code ?? '');
}

interface Found {
  /** Path inside the archive, raw bytes. */
  rel: Buffer;
  /** Path on disk, raw bytes (names need not be UTF-8). */
  abs: Buffer;
  stats: Stats;
}

/**
 * The directories, files and symbolic links under `root`, depth first, each directory before what
 * it holds; names sorted, so the same tree gives the same archive. Symbolic links are listed,
 * never followed. Other kinds (FIFOs, sockets, devices) are left out. What disappears during the
 * walk is left out too; an unreadable directory is an error.
 */
async function* walk(root: string, device?: number): AsyncGenerator<Found> {
  const stack: { rel: Buffer; abs: Buffer }[] = [];
  const push = async (rel: Buffer, abs: Buffer) => {
    let names: Buffer[];
    try {
      names = await readdir(abs, { encoding: 'buffer' });
    } catch (error) {
      if (vanished(error)) return;
      throw fsError(error, `list ${abs.toString()}`);
    }
    names.sort(Buffer.compare);
    for (let i = names.length - 1; i >= 0; i--) {
      const name = names[i] as Buffer;
      stack.push({
        rel: rel.length === 0 ? name : Buffer.concat([rel, SLASH, name]),
        abs: Buffer.concat([abs, SLASH, name]),
      });
    }
  };
  await push(Buffer.alloc(0), Buffer.from(root));
  for (let next = stack.pop(); next !== undefined; next = stack.pop()) {
    let stats: Stats;
    try {
      stats = await lstat(next.abs);
    } catch (error) {
      if (vanished(error)) continue;
      throw fsError(error, `stat ${next.abs.toString()}`);
    }
    if (!stats.isFile() && !stats.isDirectory() && !stats.isSymbolicLink()) continue;
    yield { ...next, stats };
    // `device`: only the root's file system (a folder mounted below is listed, not entered).
    if (stats.isDirectory() && (device === undefined || stats.dev === device)) {
      await push(next.rel, next.abs);
    }
  }
}

function tarEntry(rel: Buffer, type: TarType, stats: Stats, size = 0, link?: Buffer): TarEntry {
  return {
    name: type === '5' ? Buffer.concat([rel, SLASH]) : rel,
    type,
    mode: stats.mode,
    uid: stats.uid,
    gid: stats.gid,
    size,
    mtime: Math.floor(stats.mtimeMs / 1000),
    link,
  };
}

/** The root entry `./`, so that an empty directory still gives an archive with one entry. */
function rootEntry(stats: Stats): TarEntry {
  return tarEntry(Buffer.from('.'), '5', stats);
}

/**
 * Checks, before an answer starts, that the tree under `root` can be packed (every directory
 * listed, every file readable), and returns the size its archive will have if nothing changes
 * meanwhile. An error here is a plain error answer naming the path; once the archive streams,
 * an error can only cut it short.
 */
export async function surveyTree(
  root: string,
  rootStats: Stats,
  oneFileSystem = false,
): Promise<number> {
  let bytes = entryBytes(rootEntry(rootStats)) + END_OF_ARCHIVE.length;
  for await (const { rel, abs, stats } of walk(root, oneFileSystem ? rootStats.dev : undefined)) {
    if (stats.isFile()) {
      // Opened as the packing will open it (access() would follow a link swapped in meanwhile).
      try {
        await (await open(abs, READ_FLAGS)).close();
      } catch (error) {
        if (vanished(error)) continue;
        throw fsError(error, `read ${abs.toString()}`);
      }
      bytes += entryBytes(tarEntry(rel, '0', stats, stats.size));
    } else if (stats.isSymbolicLink()) {
      bytes += entryBytes(tarEntry(rel, '2', stats, 0, Buffer.alloc(stats.size)));
    } else {
      bytes += entryBytes(tarEntry(rel, '5', stats));
    }
  }
  return bytes;
}

/** Exactly `size` bytes of an open file: a file that shrank meanwhile is padded with zeros. */
async function* fileBody(handle: FileHandle, size: number): AsyncGenerator<Buffer> {
  let position = 0;
  while (position < size) {
    const buffer = Buffer.allocUnsafe(Math.min(CHUNK, size - position));
    const { bytesRead } = await handle.read(buffer, 0, buffer.length, position);
    if (bytesRead === 0) {
      yield Buffer.alloc(size - position);
      return;
    }
    position += bytesRead;
    yield bytesRead === buffer.length ? buffer : buffer.subarray(0, bytesRead);
  }
}

/**
 * A regular file's entry, read from one open file description: opened without following a
 * symbolic link and without blocking on a FIFO, then checked with fstat, so a file swapped for
 * something else after the walk saw it is left out rather than followed.
 */
async function* fileEntry(found: Found): AsyncGenerator<Buffer> {
  let handle: FileHandle;
  try {
    handle = await open(
      found.abs,
      constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK,
    );
  } catch (error) {
    if (vanished(error)) return;
    throw fsError(error, `read ${found.abs.toString()}`);
  }
  try {
    const stats = await handle.stat();
    if (!stats.isFile()) return;
    yield entryHeader(tarEntry(found.rel, '0', stats, stats.size));
    yield* fileBody(handle, stats.size);
    yield padding(stats.size);
  } finally {
    await handle.close();
  }
}

/**
 * The tree under `root` as a tar stream (ustar with GNU long names; see tar-format.ts): the root
 * as `./`, then directories, regular files and symbolic links with their modes, owners and
 * mtimes, each directory before its content. Made here rather than by a `tar` process so that
 * nothing in the sandbox (no PATH lookup, no temporary archive) stands between the files and
 * the answer, and only those three kinds of entry are ever written.
 */
export async function* packTree(
  root: string,
  rootStats: Stats,
  oneFileSystem = false,
): AsyncGenerator<Buffer> {
  yield entryHeader(rootEntry(rootStats));
  for await (const found of walk(root, oneFileSystem ? rootStats.dev : undefined)) {
    const { rel, abs, stats } = found;
    if (stats.isDirectory()) {
      yield entryHeader(tarEntry(rel, '5', stats));
    } else if (stats.isSymbolicLink()) {
      let target: Buffer;
      try {
        target = await readlink(abs, { encoding: 'buffer' });
      } catch (error) {
        if (vanished(error)) continue;
        throw fsError(error, `read link ${abs.toString()}`);
      }
      yield entryHeader(tarEntry(rel, '2', stats, 0, target));
    } else {
      yield* fileEntry(found);
    }
  }
  yield END_OF_ARCHIVE;
}
