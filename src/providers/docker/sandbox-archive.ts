import { constants } from 'node:fs';
import { type FileHandle, lstat, open, readdir, readlink, stat } from 'node:fs/promises';
import { join, posix } from 'node:path';
import {
  END_OF_ARCHIVE,
  entryHeader,
  padding,
  type TarEntry,
  type TarType,
} from '../../../runtime/envd/tar-format.js';

/** Where envd finds its token at start, in a folder only the sandbox's user can enter. */
export const TOKEN_DIR = '/run/abx-token';
export const TOKEN_FILE = `${TOKEN_DIR}/token`;

const CHUNK = 256 * 1024;

/** What goes into a new container's file system before it starts. */
export interface SandboxFiles {
  /** The uid (and gid) the sandbox runs as: owner of the token, the home and what is made in it. */
  uid: number;
  /** envd's access token, written to {@link TOKEN_FILE} (0600). */
  token: string;
  /** The sandbox user's home (`/home/<user>`), made or reset to the user's ownership; none for root. */
  home?: string;
  /** A template's home whose content is copied into `home`, owned by `uid`. */
  baseHome?: string;
  /** Folders to make, owned by `uid` (a workdir and its parents below the home). */
  dirs?: string[];
  /**
   * Volume mount points: nothing is written at or under them (the engine unpacks with the
   * container's volumes mounted, so a template's files would land in a volume).
   */
  skip?: string[];
}

function entry(
  name: string,
  type: TarType,
  mode: number,
  uid: number,
  size = 0,
  link?: Buffer,
  gid = uid,
) {
  const rel = name.replace(/^\/+/, '');
  const tar: TarEntry = {
    name: Buffer.from(type === '5' ? `${rel.replace(/\/+$/, '')}/` : rel),
    type,
    mode,
    uid,
    gid,
    size,
    mtime: Math.floor(Date.now() / 1000),
    ...(link ? { link } : {}),
  };
  return entryHeader(tar);
}

/**
 * A copy of `dir` under `to` in the archive: folders, regular files and symbolic links only,
 * owned by `uid` (and `gid`), with permission bits alone (no set-id or sticky bits). Symbolic
 * links are copied as links, never followed; other kinds are left out.
 */
async function* treeEntries(
  dir: string,
  to: string,
  uid: number,
  gid = uid,
  skip: (inside: string) => boolean = () => false,
): AsyncGenerator<Buffer> {
  const names = (await readdir(dir)).sort();
  for (const name of names) {
    const path = join(dir, name);
    const inside = posix.join(to, name);
    if (skip(inside)) continue;
    const stats = await lstat(path);
    const mode = stats.mode & 0o777;
    if (stats.isDirectory()) {
      yield entry(inside, '5', mode, uid, 0, undefined, gid);
      yield* treeEntries(path, inside, uid, gid, skip);
    } else if (stats.isSymbolicLink()) {
      yield entry(inside, '2', 0o777, uid, 0, await readlink(path, { encoding: 'buffer' }), gid);
    } else if (stats.isFile()) {
      const file = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW);
      try {
        const size = (await file.stat()).size;
        yield fileEntry(inside, mode, uid, gid, size);
        yield* fileBody(file, size);
      } finally {
        await file.close();
      }
    }
  }
}

function fileEntry(name: string, mode: number, uid: number, gid: number, size: number) {
  return entry(name, '0', mode, uid, size, undefined, gid);
}

/** A regular file's `size` bytes and the padding after them (zeros if it shrank meanwhile). */
async function* fileBody(file: FileHandle, size: number): AsyncGenerator<Buffer> {
  let position = 0;
  while (position < size) {
    const buffer = Buffer.alloc(Math.min(CHUNK, size - position));
    const { bytesRead } = await file.read(buffer, 0, buffer.length, position);
    if (bytesRead === 0) {
      // Shrank meanwhile: the header promised `size` bytes.
      yield Buffer.alloc(size - position);
      break;
    }
    position += bytesRead;
    yield bytesRead === buffer.length ? buffer : buffer.subarray(0, bytesRead);
  }
  yield padding(size);
}

/**
 * A host file or folder as a tar stream to unpack at `/` (a build's copy step, through the
 * engine's archive upload: nothing is needed in the image). A folder's content lands in `to`,
 * which is made (or given) to `owner`; a file lands as `to`. Owners come from the headers, modes
 * keep permission bits only; a missing parent folder is made root's, 0755.
 */
export async function* copyArchive(
  from: string,
  to: string,
  owner: { uid: number; gid: number },
): AsyncGenerator<Buffer> {
  const { uid, gid } = owner;
  const dest = posix.normalize(to);
  // The step names it: a link to a folder is that folder (as `abx cp` takes it).
  const stats = await stat(from);
  if (stats.isDirectory()) {
    if (dest !== '/') yield entry(dest, '5', stats.mode & 0o777, uid, 0, undefined, gid);
    yield* treeEntries(from, dest, uid, gid);
  } else {
    const file = await open(from, constants.O_RDONLY);
    try {
      const found = await file.stat();
      yield fileEntry(dest, found.mode & 0o777, uid, gid, found.size);
      yield* fileBody(file, found.size);
    } finally {
      await file.close();
    }
  }
  yield END_OF_ARCHIVE;
}

/**
 * The tar stream to unpack at `/` of a created container before it starts. Docker unpacks it as
 * root, inside the container's root file system: owners and modes come from these headers, and
 * a missing parent folder is made root's, 0755. `/tmp` is (re)made sticky and world-writable,
 * which some minimal images lack.
 */
export async function* sandboxArchive(files: SandboxFiles): AsyncGenerator<Buffer> {
  const { uid } = files;
  const skipped = (path: string) =>
    (files.skip ?? []).some((point) => path === point || path.startsWith(`${point}/`));
  yield entry('/tmp', '5', 0o1777, 0);
  yield entry(TOKEN_DIR, '5', 0o700, uid);
  const token = Buffer.from(files.token);
  yield entry(TOKEN_FILE, '0', 0o600, uid, token.length);
  yield token;
  yield padding(token.length);
  if (files.home) {
    yield entry(files.home, '5', 0o700, uid);
    if (files.baseHome) yield* treeEntries(files.baseHome, files.home, uid, uid, skipped);
  }
  for (const dir of files.dirs ?? []) if (!skipped(dir)) yield entry(dir, '5', 0o755, uid);
  yield END_OF_ARCHIVE;
}

/**
 * The folders from `home` (exclusive) down to `workdir` (inclusive) when the workdir lies in the
 * home: made as the sandbox user's, so commands can write where they start.
 */
export function workdirChain(home: string, workdir: string): string[] {
  const rel = posix.relative(home, posix.normalize(workdir));
  if (!rel || rel.startsWith('..') || posix.isAbsolute(rel)) return [];
  const parts = rel.split('/');
  return parts.map((_, index) => posix.join(home, ...parts.slice(0, index + 1)));
}
