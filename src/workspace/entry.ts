import { createHash } from 'node:crypto';
import { closeSync, constants, lstatSync, openSync, readSync, type Stats } from 'node:fs';
import { lstat, open, readlink } from 'node:fs/promises';
import { WorkspaceError } from './errors.js';
import type { EntryKind, EntryState } from './types.js';

/** Git's rule for binary: a NUL byte among the first 8000 bytes (xdiff's FIRST_FEW_BYTES). */
export const BINARY_PROBE_BYTES = 8000;
const CHUNK = 1 << 16;

export function kindOf(st: Stats): EntryKind | 'dir' | undefined {
  if (st.isFile()) return 'file';
  if (st.isDirectory()) return 'dir';
  if (st.isSymbolicLink()) return 'symlink';
  if (st.isFIFO()) return 'fifo';
  if (st.isSocket()) return 'socket';
  if (st.isCharacterDevice()) return 'char-device';
  if (st.isBlockDevice()) return 'block-device';
  return undefined;
}

export async function lstatOrNull(path: string): Promise<Stats | null> {
  try {
    return await lstat(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    if ((err as NodeJS.ErrnoException).code === 'ENOTDIR') return null;
    throw err;
  }
}

/** {@link lstatOrNull} without the thread-pool round trip (microseconds, for tree walks). */
export function lstatOrNullSync(path: string): Stats | null {
  try {
    return lstatSync(path, { throwIfNoEntry: false }) ?? null;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOTDIR') return null;
    throw err;
  }
}

/** Opens a file for reading without following a link in its last component. */
export function openNoFollow(path: string) {
  return open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
}

/** Reads a file's content hashes and binary mark, streaming; `size` is from its lstat. */
export async function hashFile(
  path: string,
  size: number,
): Promise<{ sha256: string; oid: string; binary: boolean }> {
  const fh = await openNoFollow(path);
  try {
    const sha256 = createHash('sha256');
    const sha1 = createHash('sha1').update(`blob ${size}\0`);
    const buf = Buffer.allocUnsafe(CHUNK);
    let total = 0;
    let binary = false;
    for (;;) {
      const { bytesRead } = await fh.read(buf, 0, CHUNK, null);
      if (bytesRead === 0) break;
      const chunk = buf.subarray(0, bytesRead);
      if (total < BINARY_PROBE_BYTES && !binary) {
        binary = chunk.subarray(0, BINARY_PROBE_BYTES - total).includes(0);
      }
      sha256.update(chunk);
      sha1.update(chunk);
      total += bytesRead;
    }
    if (total !== size) {
      throw new WorkspaceError(`${path} changed while it was read (${size} bytes, read ${total})`);
    }
    return { sha256: sha256.digest('hex'), oid: sha1.digest('hex'), binary };
  } finally {
    await fh.close();
  }
}

/** The hashes of a link's target text, as git stores a link (the target, no newline). */
export function hashTarget(target: Buffer): { sha256: string; oid: string } {
  return {
    sha256: createHash('sha256').update(target).digest('hex'),
    oid: createHash('sha1').update(`blob ${target.length}\0`).update(target).digest('hex'),
  };
}

/** The state of a non-directory entry at `path`, with its hashes (files and links). */
export async function entryState(path: string, st: Stats): Promise<EntryState> {
  const kind = kindOf(st);
  if (kind === undefined || kind === 'dir') {
    throw new WorkspaceError(`${path} is not a file, link or special file`);
  }
  const mode = st.mode & 0o7777;
  if (kind === 'file') {
    return { kind, mode, size: st.size, ...(await hashFile(path, st.size)) };
  }
  if (kind === 'symlink') {
    const target = await readlink(path, { encoding: 'buffer' });
    return {
      kind,
      mode,
      size: target.length,
      ...hashTarget(target),
      target: target.toString('utf8'),
    };
  }
  return { kind, mode, size: 0 };
}

/** Whether two regular files of the same size have the same bytes (stops at the first difference). */
export async function sameContent(a: string, b: string, size: number): Promise<boolean> {
  if (size <= SMALL_FILE) return sameSmallContent(a, b, size);
  const [fa, fb] = await Promise.all([openNoFollow(a), openNoFollow(b)]);
  try {
    const ba = Buffer.allocUnsafe(CHUNK);
    const bb = Buffer.allocUnsafe(CHUNK);
    for (;;) {
      const [ra, rb] = await Promise.all([
        fa.read(ba, 0, CHUNK, null),
        fb.read(bb, 0, CHUNK, null),
      ]);
      if (ra.bytesRead !== rb.bytesRead) return false;
      if (ra.bytesRead === 0) return true;
      if (!ba.subarray(0, ra.bytesRead).equals(bb.subarray(0, rb.bytesRead))) return false;
    }
  } finally {
    await Promise.all([fa.close(), fb.close()]);
  }
}

/**
 * Files up to this size are compared with synchronous reads: a thread-pool round trip per
 * read costs more than the read (a 100 000-file walk is several times faster), and each call
 * holds the event loop for microseconds only.
 */
const SMALL_FILE = 64 * 1024;
const FLAGS = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;

function sameSmallContent(a: string, b: string, size: number): boolean {
  const fa = openSync(a, FLAGS);
  try {
    const fb = openSync(b, FLAGS);
    try {
      // One byte more than the size: a file that grew meanwhile differs.
      const ba = Buffer.allocUnsafe(size + 1);
      const bb = Buffer.allocUnsafe(size + 1);
      const ra = readFull(fa, ba);
      const rb = readFull(fb, bb);
      return ra === rb && ba.subarray(0, ra).equals(bb.subarray(0, rb));
    } finally {
      closeSync(fb);
    }
  } finally {
    closeSync(fa);
  }
}

function readFull(fd: number, buf: Buffer): number {
  let total = 0;
  for (;;) {
    const n = readSync(fd, buf, total, buf.length - total, null);
    if (n === 0 || total + n === buf.length) return total + n;
    total += n;
  }
}

/** Git's mode for an entry: 100644, 100755 (the owner's x bit decides) or 120000. */
export function gitMode(state: EntryState): string {
  if (state.kind === 'symlink') return '120000';
  return state.mode & 0o100 ? '100755' : '100644';
}

/**
 * The first parent of `path` under `root` that is not a real directory (a link, a file, or
 * missing), if any: so that no read or write through `root/path` follows a link on the way.
 */
export async function linkedParent(root: string, path: string): Promise<string | undefined> {
  const parts = path.split('/');
  for (let i = 1; i < parts.length; i++) {
    const prefix = parts.slice(0, i).join('/');
    const st = await lstatOrNull(`${root}/${prefix}`);
    if (!st?.isDirectory()) return prefix;
  }
  return undefined;
}
