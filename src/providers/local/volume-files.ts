/**
 * A local volume's files from the daemon's side (E2B's volume content API), without a sandbox.
 *
 * Sandboxes write to a volume while the daemon (root, in root mode) works on it, so a sandbox may
 * swap any folder for a link to `/etc` at any instant. No path is therefore ever resolved by name
 * from the host: the volume's root is opened, and every step goes from an open folder to one
 * name in it (`/proc/self/fd/N/name`: the kernel takes N as the folder itself), refusing links
 * (`O_NOFOLLOW`). Nothing a sandbox puts in the volume leads the daemon out of it.
 */
import { randomBytes } from 'node:crypto';
import { constants, type Stats } from 'node:fs';
import {
  type FileHandle,
  link,
  lstat,
  mkdir,
  open,
  readdir,
  readlink,
  rename,
  rmdir,
  unlink,
} from 'node:fs/promises';
import { posix } from 'node:path';
import { Readable } from 'node:stream';
import {
  FileOperationError,
  NotFoundError,
  PermissionDeniedError,
  SandboxError,
} from '../../errors.js';
import type { VolumeEntry, VolumeFiles, VolumeOwnership, VolumeSpec } from '../provider.js';
import { SANDBOX_UID } from './bwrap-args.js';

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_DIRECTORY, O_NOFOLLOW, O_NONBLOCK } = constants;
/** A folder, never through a link. */
const DIR = O_RDONLY | O_DIRECTORY | O_NOFOLLOW;
/** A file or folder itself, never through a link; a pipe a sandbox left does not block the open. */
const ENTRY = O_RDONLY | O_NOFOLLOW | O_NONBLOCK;
/** What a sandbox sees as the owner of a file that is not its user's: the kernel's overflow id. */
const OVERFLOW_ID = 65534;
const DEFAULT_DIR_MODE = 0o755;
const DEFAULT_FILE_MODE = 0o644;
/** The longest path taken, in characters. */
const MAX_PATH = 4096;
/** The most entries one listing answers, so a huge volume cannot fill the daemon's memory. */
export const MAX_LIST_ENTRIES = 100_000;
/** Bytes of an upload gathered per write. */
const WRITE_BATCH_BYTES = 1024 * 1024;
/** How deep a removal goes: each level holds a descriptor open. */
const MAX_REMOVE_DEPTH = 256;

/** A path in a volume, canonical: `..` stops at the volume's root, as E2B's server cleans it. */
export function volumePath(path: unknown): { path: string; parts: string[] } {
  if (typeof path !== 'string') {
    throw new FileOperationError('path is required: a path in the volume such as /data/file.txt', {
      code: 'EINVAL',
    });
  }
  if (path.includes('\0') || path.length > MAX_PATH) {
    throw new FileOperationError(`path holds a NUL byte or is longer than ${MAX_PATH} characters`, {
      code: 'EINVAL',
    });
  }
  const parts = posix
    .normalize(`/${path}`)
    .split('/')
    .filter((part) => part !== '' && part !== '.' && part !== '..');
  return { path: `/${parts.join('/')}`, parts };
}

const errnoOf = (error: unknown) => (error as NodeJS.ErrnoException | undefined)?.code;

/** A name in an open folder: only `name` is looked up, nothing above it. */
function at(dir: FileHandle, name?: string): string {
  return name === undefined ? `/proc/self/fd/${dir.fd}` : `/proc/self/fd/${dir.fd}/${name}`;
}

const join = (base: string, name: string) => (base === '/' ? `/${name}` : `${base}/${name}`);

export class LocalVolumeFiles implements VolumeFiles {
  constructor(
    /** The host folder a volume's files are in (a root daemon's mounted disk). */
    private readonly rootOf: (volume: VolumeSpec) => Promise<string>,
    /** The host uid and gid that sandboxes see as their user's. */
    private readonly owner: { uid: number; gid: number },
  ) {}

  async stat(volume: VolumeSpec, path: string): Promise<VolumeEntry> {
    const target = volumePath(path);
    return this.inParent(volume, target, async (parent, name) => {
      if (parent === undefined) return this.entry(target.path, await this.rootStat(volume));
      const stats = await lstat(at(parent, name));
      return this.entry(target.path, stats, await this.linkTarget(parent, name, stats));
    });
  }

  async list(volume: VolumeSpec, path: string, depth: number): Promise<VolumeEntry[]> {
    const target = volumePath(path);
    try {
      const dir = await this.openDir(volume, target.parts);
      try {
        const found: VolumeEntry[] = [];
        await this.listIn(dir, target.path, depth, found);
        return found;
      } finally {
        await dir.close();
      }
    } catch (error) {
      throw this.failure(error, target.path, volume);
    }
  }

  private async listIn(dir: FileHandle, base: string, depth: number, found: VolumeEntry[]) {
    for (const name of (await readdir(at(dir))).sort()) {
      const stats = await lstat(at(dir, name)).catch(gone);
      // Removed by a sandbox while this listing ran: not there any more.
      if (!stats) continue;
      if (found.length >= MAX_LIST_ENTRIES) {
        throw new FileOperationError(
          `more than ${MAX_LIST_ENTRIES} entries: list a folder further down, or with a smaller depth`,
          { code: 'E2BIG' },
        );
      }
      const path = join(base, name);
      found.push(this.entry(path, stats, await this.linkTarget(dir, name, stats)));
      if (depth <= 1 || !stats.isDirectory()) continue;
      const sub = await open(at(dir, name), DIR).catch(gone);
      if (!sub) continue;
      try {
        await this.listIn(sub, path, depth - 1, found);
      } finally {
        await sub.close();
      }
    }
  }

  async makeDir(
    volume: VolumeSpec,
    path: string,
    options: VolumeOwnership & { parents: boolean },
  ): Promise<VolumeEntry> {
    const ids = this.ids(options);
    const mode = this.mode(options.mode, DEFAULT_DIR_MODE);
    const target = volumePath(path);
    return this.inParent(
      volume,
      target,
      async (parent, name) => {
        if (parent === undefined) {
          if (options.parents) return this.entry('/', await this.rootStat(volume));
          throw Object.assign(new Error('the root exists'), { code: 'EEXIST' });
        }
        try {
          await mkdir(at(parent, name), 0o700);
        } catch (error) {
          if (errnoOf(error) !== 'EEXIST' || !options.parents) throw error;
          // As E2B's: with `force`, a folder there already is the answer, unchanged.
          const stats = await lstat(at(parent, name));
          if (!stats.isDirectory()) throw error;
          return this.entry(target.path, stats);
        }
        const made = await open(at(parent, name), DIR);
        try {
          await made.chown(ids.uid, ids.gid);
          // Again after the mkdir: the daemon's umask would have narrowed it.
          await made.chmod(mode);
          return this.entry(target.path, await made.stat());
        } finally {
          await made.close();
        }
      },
      options.parents ? ids : undefined,
    );
  }

  async read(volume: VolumeSpec, path: string): Promise<{ size: number; stream: Readable }> {
    const target = volumePath(path);
    const file = await this.inParent(volume, target, async (parent, name) => {
      if (parent === undefined) throw Object.assign(new Error('a folder'), { code: 'EISDIR' });
      return open(at(parent, name), ENTRY);
    });
    try {
      const stats = await file.stat();
      if (stats.isDirectory()) throw Object.assign(new Error('a folder'), { code: 'EISDIR' });
      if (!stats.isFile()) throw Object.assign(new Error('not a file'), { code: 'ENXIO' });
      if (stats.size === 0) {
        await file.close();
        return { size: 0, stream: Readable.from([]) };
      }
      // Its size when opened: a file a sandbox grows meanwhile is sent as it was.
      return {
        size: stats.size,
        stream: file.createReadStream({ start: 0, end: stats.size - 1 }),
      };
    } catch (error) {
      await file.close();
      throw this.failure(error, target.path, volume);
    }
  }

  async write(
    volume: VolumeSpec,
    path: string,
    data: AsyncIterable<Uint8Array>,
    options: VolumeOwnership & { overwrite: boolean },
  ): Promise<VolumeEntry> {
    const ids = this.ids(options);
    const mode = this.mode(options.mode, DEFAULT_FILE_MODE);
    const target = volumePath(path);
    return this.inParent(
      volume,
      target,
      async (parent, name) => {
        if (parent === undefined) throw Object.assign(new Error('a folder'), { code: 'EISDIR' });
        if (!options.overwrite && (await lstat(at(parent, name)).catch(gone))) {
          throw Object.assign(new Error('exists'), { code: 'EEXIST' });
        }
        // Written aside and put in place whole: a failed upload (a full volume, a client that
        // went away) leaves nothing, and a sandbox never reads half a file.
        const temp = `.${name.slice(0, 200)}.abx-upload-${randomBytes(6).toString('hex')}`;
        const file = await open(at(parent, temp), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600);
        let placed = false;
        try {
          // The body's chunks (16 to 64 KiB) gathered to a MiB per write: one call to the
          // thread pool each, not dozens.
          let batch: Uint8Array[] = [];
          let batched = 0;
          const flush = async () => {
            const whole = Buffer.concat(batch, batched);
            batch = [];
            batched = 0;
            for (let done = 0; done < whole.length; ) {
              done += (await file.write(whole, done)).bytesWritten;
            }
          };
          for await (const chunk of data) {
            batch.push(chunk);
            batched += chunk.length;
            if (batched >= WRITE_BATCH_BYTES) await flush();
          }
          if (batched > 0) await flush();
          await file.chown(ids.uid, ids.gid);
          await file.chmod(mode);
          await file.sync();
          const stats = await file.stat();
          if (options.overwrite) {
            await rename(at(parent, temp), at(parent, name));
          } else {
            // link() fails when the name is taken, where rename would replace it.
            await link(at(parent, temp), at(parent, name));
            await unlink(at(parent, temp)).catch(() => undefined);
          }
          placed = true;
          return this.entry(target.path, stats);
        } finally {
          await file.close();
          if (!placed) await unlink(at(parent, temp)).catch(() => undefined);
        }
      },
      options.overwrite ? ids : undefined,
    );
  }

  async update(volume: VolumeSpec, path: string, changes: VolumeOwnership): Promise<VolumeEntry> {
    const chown = changes.uid !== undefined || changes.gid !== undefined;
    const ids = this.ids(changes);
    const mode = changes.mode === undefined ? undefined : this.mode(changes.mode, 0);
    const target = volumePath(path);
    return this.inParent(volume, target, async (parent, name) => {
      const handle =
        parent === undefined
          ? await open(await this.rootOf(volume), DIR)
          : await open(at(parent, name), ENTRY);
      try {
        if (mode !== undefined) await handle.chmod(mode);
        if (chown) {
          await handle.chown(
            changes.uid === undefined ? -1 : ids.uid,
            changes.gid === undefined ? -1 : ids.gid,
          );
        }
        return this.entry(target.path, await handle.stat());
      } finally {
        await handle.close();
      }
    });
  }

  async remove(volume: VolumeSpec, path: string): Promise<void> {
    const target = volumePath(path);
    await this.inParent(volume, target, async (parent, name) => {
      if (parent === undefined) {
        throw new FileOperationError(
          `the root of volume ${volume.name} cannot be removed: remove what is in it, or the volume itself (Volume.destroy)`,
          { code: 'EINVAL' },
        );
      }
      const stats = await lstat(at(parent, name));
      if (stats.isDirectory()) await this.removeTree(parent, name, 0);
      else await unlink(at(parent, name));
    });
  }

  /** Removes folder `name` of `parent` and all it holds, never through a link. */
  private async removeTree(parent: FileHandle, name: string, depth: number): Promise<void> {
    if (depth >= MAX_REMOVE_DEPTH) {
      throw new FileOperationError(
        `the folder goes deeper than ${MAX_REMOVE_DEPTH} levels: remove it from a sandbox that mounts the volume (rm -rf)`,
        { code: 'ELOOP' },
      );
    }
    // A sandbox may add files while this runs: a folder that is not empty yet is emptied again.
    for (let round = 0; ; round++) {
      let dir: FileHandle | undefined;
      try {
        dir = await open(at(parent, name), DIR);
      } catch (error) {
        const code = errnoOf(error);
        if (code === 'ENOENT') return;
        // Swapped for a file or a link meanwhile: that is removed, never followed.
        if (code === 'ENOTDIR' || code === 'ELOOP') return unlink(at(parent, name));
        throw error;
      }
      try {
        for (const entry of await readdir(at(dir))) {
          const stats = await lstat(at(dir, entry)).catch(gone);
          if (!stats) continue;
          if (stats.isDirectory()) await this.removeTree(dir, entry, depth + 1);
          else await unlink(at(dir, entry)).catch(ignoreGone);
        }
      } finally {
        await dir.close();
      }
      try {
        await rmdir(at(parent, name));
        return;
      } catch (error) {
        if (errnoOf(error) === 'ENOENT') return;
        if (errnoOf(error) !== 'ENOTEMPTY' || round >= 2) throw error;
      }
    }
  }

  /**
   * Runs `work` with the open folder holding the path's last part (undefined for the volume's
   * root) and that part's name; `create` makes the missing folders above it, theirs that owner.
   * Every error leaves as one of the volume's (see {@link failure}).
   */
  private async inParent<T>(
    volume: VolumeSpec,
    target: { path: string; parts: string[] },
    work: (parent: FileHandle | undefined, name: string) => Promise<T>,
    create?: { uid: number; gid: number },
  ): Promise<T> {
    const name = target.parts.at(-1);
    try {
      if (name === undefined) return await work(undefined, '/');
      const parent = await this.openDir(volume, target.parts.slice(0, -1), create);
      try {
        return await work(parent, name);
      } finally {
        await parent.close();
      }
    } catch (error) {
      throw this.failure(error, target.path, volume);
    }
  }

  /** The folder at `parts`, walked from the volume's root one name at a time. */
  private async openDir(
    volume: VolumeSpec,
    parts: readonly string[],
    create?: { uid: number; gid: number },
  ): Promise<FileHandle> {
    let dir = await open(await this.rootOf(volume), DIR);
    try {
      for (const [index, part] of parts.entries()) {
        let next: FileHandle;
        try {
          next = await open(at(dir, part), DIR);
        } catch (error) {
          const code = errnoOf(error);
          const where = `/${parts.slice(0, index + 1).join('/')}`;
          if (code === 'ENOTDIR' || code === 'ELOOP') {
            const stats = await lstat(at(dir, part)).catch(() => undefined);
            throw stats?.isSymbolicLink() ? linkRefused(where) : notFolder(where);
          }
          if (code !== 'ENOENT' || !create) throw error;
          next = await this.madeDir(dir, part, create);
        }
        await dir.close();
        dir = next;
      }
      return dir;
    } catch (error) {
      await dir.close();
      throw error;
    }
  }

  /** A folder made on the way to a path (E2B's `force`), the owner's, of the default mode. */
  private async madeDir(
    parent: FileHandle,
    name: string,
    ids: { uid: number; gid: number },
  ): Promise<FileHandle> {
    let made = true;
    try {
      await mkdir(at(parent, name), 0o700);
    } catch (error) {
      // Made meanwhile by a sandbox: used as it is.
      if (errnoOf(error) !== 'EEXIST') throw error;
      made = false;
    }
    const dir = await open(at(parent, name), DIR);
    if (made) {
      await dir.chown(ids.uid, ids.gid);
      await dir.chmod(DEFAULT_DIR_MODE);
    }
    return dir;
  }

  private async rootStat(volume: VolumeSpec): Promise<Stats> {
    const root = await open(await this.rootOf(volume), DIR);
    try {
      return await root.stat();
    } finally {
      await root.close();
    }
  }

  private async linkTarget(dir: FileHandle, name: string, stats: Stats) {
    return stats.isSymbolicLink() ? readlink(at(dir, name)).catch(() => undefined) : undefined;
  }

  /**
   * The host ids for a request's `uid` and `gid`, which are as a sandbox sees them: every sandbox
   * sees the volume's files as its user's (1000), and no other owner would be its own anywhere.
   */
  private ids(request: VolumeOwnership): { uid: number; gid: number } {
    for (const field of ['uid', 'gid'] as const) {
      const value = request[field];
      if (value !== undefined && value !== SANDBOX_UID) {
        throw new FileOperationError(
          `${field} ${value}: a volume's files belong to the sandbox's user (${field} ${SANDBOX_UID}) in every sandbox that mounts it, and abx gives them no other owner; leave ${field} out or give ${SANDBOX_UID}`,
          { code: 'EINVAL' },
        );
      }
    }
    return this.owner;
  }

  private mode(mode: number | undefined, fallback: number): number {
    if (mode === undefined) return fallback;
    if (!Number.isInteger(mode) || mode < 0 || mode > 0o777) {
      throw new FileOperationError(
        `mode ${mode}: permission bits from 0 to 0o777 (511), such as 0o644 (420) or 0o755 (493)`,
        { code: 'EINVAL' },
      );
    }
    return mode;
  }

  private entry(path: string, stats: Stats, target?: string): VolumeEntry {
    const type = stats.isDirectory()
      ? 'directory'
      : stats.isFile()
        ? 'file'
        : stats.isSymbolicLink()
          ? 'symlink'
          : 'unknown';
    return {
      name: path === '/' ? '/' : posix.basename(path),
      path,
      type,
      size: stats.size,
      mode: stats.mode & 0o777,
      uid: stats.uid === this.owner.uid ? SANDBOX_UID : OVERFLOW_ID,
      gid: stats.gid === this.owner.gid ? SANDBOX_UID : OVERFLOW_ID,
      atime: stats.atimeMs,
      mtime: stats.mtimeMs,
      ctime: stats.ctimeMs,
      ...(target === undefined ? {} : { target }),
    };
  }

  /** An error of the file system as one of the volume's, naming the path and what to do. */
  private failure(error: unknown, path: string, volume: VolumeSpec): Error {
    if (error instanceof SandboxError) return error;
    const code = errnoOf(error);
    const where = `${path} in volume ${volume.name}`;
    switch (code) {
      case 'ENOENT':
        return new NotFoundError(`${where} does not exist`, { code });
      case 'EEXIST':
        return new FileOperationError(
          `${where} exists already: give force (overwrite) to replace a file, or remove it first`,
          { code, status: 409 },
        );
      case 'ELOOP':
        return linkRefused(path);
      case 'ENOTDIR':
        return notFolder(path);
      case 'EISDIR':
        return new FileOperationError(`${where} is a folder: list it, or name a file in it`, {
          code,
        });
      case 'ENXIO':
        return new FileOperationError(
          `${where} is neither a file nor a folder (a pipe or a socket a sandbox made)`,
          { code },
        );
      case 'ENOTEMPTY':
        return new FileOperationError(`${where} kept changing while it was removed: try again`, {
          code,
          status: 409,
        });
      case 'ENAMETOOLONG':
        return new FileOperationError(`a name in ${path} is longer than 255 bytes`, { code });
      case 'ENOSPC':
      case 'EDQUOT':
        return new FileOperationError(
          `volume ${volume.name} is full (${volume.sizeBytes} bytes): remove files from it, or keep the data in a larger volume`,
          { code, status: 507 },
        );
      case 'EACCES':
      case 'EPERM':
        return new PermissionDeniedError(
          `${where} may not be changed by the daemon (${code}): a sandbox made it unreadable; change its mode from a sandbox that mounts the volume`,
          { code },
        );
      default:
        return error instanceof Error ? error : new Error(String(error));
    }
  }
}

function linkRefused(path: string): FileOperationError {
  return new FileOperationError(
    `${path} is a symbolic link, or passes through one: the volume API follows no link (a link resolves inside each sandbox that mounts the volume); use the path it points to`,
    { code: 'ELOOP' },
  );
}

function notFolder(path: string): FileOperationError {
  return new FileOperationError(`${path} is a file, not a folder`, { code: 'ENOTDIR' });
}

/** undefined for a path removed meanwhile; any other error is thrown. */
function gone(error: unknown): undefined {
  const code = errnoOf(error);
  if (code === 'ENOENT' || code === 'ENOTDIR' || code === 'ELOOP') return undefined;
  throw error;
}

function ignoreGone(error: unknown): void {
  if (errnoOf(error) !== 'ENOENT') throw error;
}
