import { randomBytes } from 'node:crypto';
import {
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  fstatSync,
  lstatSync,
  openSync,
  read,
  readFileSync,
  renameSync,
  type Stats,
  statfsSync,
  unlinkSync,
  writev,
  writevSync,
} from 'node:fs';
import { posix } from 'node:path';
import { SANDBOX_RUN_DIR } from '../../../runtime/protocol/constants.js';
import { isEnvdCommandLine, type SandboxHandle } from '../provider.js';
import { isEnvdFront, isEnvdLoop } from './envd-sleep.js';
import { processStartTime, processTree } from './proc.js';

/**
 * A local sandbox's files reached by the daemon itself, for bulk transfers (issue 49): through
 * the sandbox's mount namespace (`/proc/INIT/root`), every path component opened relative to the
 * directory before it (`/proc/self/fd/DIR/NAME`) with `O_NOFOLLOW`, so that no symbolic link the
 * sandbox made is ever followed and `..` never leads out; only directories and regular files on
 * disk file systems are used, and only where the sandbox's own user may read (or create) them by
 * the file modes. Anything else (a link anywhere on the path, a FIFO, a device, /proc, a missing
 * parent, a mode the sandbox user does not pass, a read-only mount) makes the open return
 * `undefined`: envd, inside the sandbox, then answers the request as it always has. A new file is
 * created `O_EXCL|O_NOFOLLOW` in the directory held open, given to the sandbox's uid before a byte
 * is written, and renamed into place within that same directory, so a parent swapped for a link
 * mid-transfer changes nothing the daemon does. docs/security.md ("Direct file transfers").
 */

/** The host uid, gid, groups and umask the sandbox's envd runs with: whose rights are checked. */
export interface SandboxUser {
  uid: number;
  gid: number;
  groups: readonly number[];
  umask: number;
}

/**
 * How long a fence waits for the transfers it stopped to close their descriptors: each stops at
 * its next read or write, so this bounds only a write stuck in the kernel.
 */
export const FENCE_WAIT_MS = 10_000;

/** File systems a direct transfer may read or write (`statfs` magic numbers): disks and tmpfs. */
const DISK_FILE_SYSTEMS = new Set([
  0xef53, // ext2/3/4 (a sandbox's disk image)
  0x01021994, // tmpfs
  0x58465342, // xfs
  0x9123683e, // btrfs
  0x794c7630, // overlayfs (workspaces)
]);

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW, O_DIRECTORY, O_NONBLOCK, O_NOCTTY } =
  constants;
const O_CLOEXEC = 0o2000000;
const DIR_FLAGS = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
const READ_FLAGS = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
const CREATE_FLAGS = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC;

/** Whether `user` has the `want` bits (4 read, 2 write, 1 search) on `s` by its mode. */
function may(s: Stats, user: SandboxUser, want: number): boolean {
  if (s.uid === user.uid) return ((s.mode >> 6) & want) === want;
  if (s.gid === user.gid || user.groups.includes(s.gid)) return ((s.mode >> 3) & want) === want;
  return (s.mode & want) === want;
}

function closeQuietly(fd: number | undefined): void {
  if (fd === undefined) return;
  try {
    closeSync(fd);
  } catch {
    // closed already
  }
}

/** A file opened for a download: its descriptor and size (the answer's Content-Length). */
export interface FileToRead {
  fd: number;
  size: number;
  close(): void;
}

/** A new file being written for an upload: its temporary file in the directory held open. */
export interface FileToWrite {
  /** The path as the sandbox names it (for messages). */
  path: string;
  fd: number;
  /** Renames the finished temporary file over the path (atomic, in the held directory). */
  commit(): void;
  /** Removes the temporary file (the upload failed or was cut short). */
  discard(): void;
}

/** An fs error of a direct transfer, its `/proc/self/fd/N` names put back as the sandbox's path. */
function sandboxError(error: unknown, fdPath: string, dir: string): unknown {
  if (error instanceof Error) error.message = error.message.replaceAll(fdPath, dir);
  return error;
}

/**
 * A local sandbox's files, for one sandbox process (its init's pid and start time): see the
 * module's comment. Each open is synchronous and bounded (no FIFO or device is ever opened
 * blocking; every component is on the sandbox's own mounts).
 */
export class SandboxFiles {
  constructor(
    /** The sandbox's init, whose root is the sandbox's `/`. */
    private readonly init: number,
    private readonly startTime: string,
    readonly user: SandboxUser,
  ) {}

  /** Whether the sandbox still runs (its init, not a process that took its pid since). */
  /**
   * Transfers under way on this sandbox's files, each with how to stop it and when its descriptor
   * is closed: a pause, a hibernate, a fork's copy of the disk or a kill waits for them
   * ({@link fence}), since the daemon's writes, unlike envd's, go on while the sandbox is frozen.
   */
  private readonly under = new Set<{ stop: () => void; closed: Promise<void> }>();
  /** While set (the sandbox frozen, its disk copied or its end under way), nothing is taken directly. */
  private fenced = false;

  /**
   * Stops the transfers under way (each fails as a dead sandbox's would) and refuses new ones
   * until {@link lift} (envd answers those: frozen, it answers once thawed, as before); resolves
   * once every descriptor they held is closed, or after {@link FENCE_WAIT_MS} at most.
   */
  async fence(): Promise<void> {
    this.fenced = true;
    const closing = [...this.under].map((transfer) => {
      transfer.stop();
      return transfer.closed;
    });
    if (closing.length === 0) return;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      Promise.all(closing),
      new Promise<void>((resolve) => {
        timer = setTimeout(resolve, FENCE_WAIT_MS);
      }),
    ]);
    clearTimeout(timer);
  }

  /** The sandbox runs again (thawed): direct transfers may be taken again. */
  lift(): void {
    this.fenced = false;
  }

  /** Tracks a transfer until `closed` is called; refused (false) while fenced. */
  private track(stop: () => void): (() => void) | undefined {
    if (this.fenced) return undefined;
    let done!: () => void;
    const entry = { stop, closed: new Promise<void>((resolve) => (done = resolve)) };
    this.under.add(entry);
    return () => {
      this.under.delete(entry);
      done();
    };
  }

  alive(): boolean {
    return !this.fenced && processStartTime(this.init) === this.startTime;
  }

  /**
   * The directory of `path` held open (every component walked, searchable by the sandbox's user,
   * on a disk file system), with the last component's name; undefined when the path cannot be
   * taken directly. `path` must be absolute (a relative one is envd's working directory's).
   */
  private openParent(path: string): { dir: number; stats: Stats; name: string } | undefined {
    if (this.fenced || !path.startsWith('/') || path.includes('\0')) return undefined;
    const parts = posix.resolve(path).split('/').filter(Boolean);
    const name = parts.pop();
    if (name === undefined) return undefined;
    let dir: number | undefined;
    try {
      dir = openSync(`/proc/${this.init}/root`, DIR_FLAGS & ~O_NOFOLLOW);
      // The pid is still that sandbox's (not one reused since): its root is the one opened.
      if (processStartTime(this.init) !== this.startTime) throw new Error('the sandbox ended');
      let stats = fstatSync(dir);
      for (const part of parts) {
        if (!stats.isDirectory() || !may(stats, this.user, 1)) throw new Error('not searchable');
        const next = openSync(`/proc/self/fd/${dir}/${part}`, DIR_FLAGS);
        closeSync(dir);
        dir = next;
        stats = fstatSync(dir);
      }
      if (!stats.isDirectory() || !may(stats, this.user, 1)) throw new Error('not searchable');
      if (!DISK_FILE_SYSTEMS.has(statfsSync(`/proc/self/fd/${dir}`).type)) {
        throw new Error('not a disk file system');
      }
      return { dir, stats, name };
    } catch {
      closeQuietly(dir);
      return undefined;
    }
  }

  /** A regular file the sandbox's user may read, open; undefined: envd answers instead. */
  openRead(path: string, stop: () => void): FileToRead | undefined {
    const parent = this.openParent(path);
    if (!parent) return undefined;
    let fd: number | undefined;
    try {
      const where = `/proc/self/fd/${parent.dir}/${parent.name}`;
      // Looked at before it is opened: nothing but a regular file is ever opened.
      const seen = lstatSync(where);
      if (!seen.isFile()) return undefined;
      fd = openSync(where, READ_FLAGS);
      const s = fstatSync(fd);
      // The same file as looked at (not one swapped in between), readable by the sandbox's user.
      if (!s.isFile() || s.ino !== seen.ino || s.dev !== seen.dev || !may(s, this.user, 4)) {
        closeQuietly(fd);
        return undefined;
      }
      const closed = this.track(stop);
      if (!closed) {
        closeQuietly(fd);
        return undefined;
      }
      const file = fd;
      let open = true;
      return {
        fd: file,
        size: s.size,
        close: () => {
          if (!open) return;
          open = false;
          closeQuietly(file);
          closed();
        },
      };
    } catch {
      closeQuietly(fd);
      return undefined;
    } finally {
      closeQuietly(parent.dir);
    }
  }

  /**
   * A new temporary file next to `path`, owned by the sandbox's user with its umask's mode, in a
   * directory that user may write; undefined (nothing created) when envd must answer instead: the
   * parent is missing (envd creates parents), the path is not a regular file, or the sticky bit
   * keeps the user from replacing it.
   */
  createWrite(path: string, stop: () => void): FileToWrite | undefined {
    if (this.user.uid === 0) return undefined;
    const euid = process.geteuid?.();
    // A daemon that cannot give the file to the sandbox's user leaves the write to envd.
    if (euid !== 0 && euid !== this.user.uid) return undefined;
    const parent = this.openParent(path);
    if (!parent) return undefined;
    const { dir, stats, name } = parent;
    const dirPath = posix.dirname(posix.resolve(path));
    const fdPath = `/proc/self/fd/${dir}`;
    let fd: number | undefined;
    let temp: string | undefined;
    try {
      if (!may(stats, this.user, 3)) throw new Error('not writable');
      let existing: Stats | undefined;
      try {
        existing = lstatSync(`${fdPath}/${name}`);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
      }
      if (existing && !existing.isFile()) throw new Error('not a regular file');
      const sticky = (stats.mode & 0o1000) !== 0;
      if (existing && sticky && existing.uid !== this.user.uid && stats.uid !== this.user.uid) {
        throw new Error('sticky');
      }
      temp = `.${name}.${randomBytes(6).toString('hex')}.tmp`;
      // 0600 until it is the sandbox user's: nobody else ever reads a file of root's there.
      fd = openSync(`${fdPath}/${temp}`, CREATE_FLAGS, 0o600);
      fchownSync(fd, this.user.uid, this.user.gid);
      fchmodSync(fd, 0o666 & ~this.user.umask);
    } catch {
      closeQuietly(fd);
      if (fd !== undefined && temp !== undefined) {
        try {
          unlinkSync(`${fdPath}/${temp}`);
        } catch {
          // gone
        }
      }
      closeQuietly(dir);
      return undefined;
    }
    const closed = this.track(stop);
    if (!closed) {
      closeQuietly(fd);
      try {
        unlinkSync(`${fdPath}/${temp}`);
      } catch {
        // gone
      }
      closeQuietly(dir);
      return undefined;
    }
    const file = fd;
    const tempName = temp;
    let open = true;
    const finish = () => {
      if (!open) return;
      open = false;
      closeQuietly(file);
    };
    return {
      path: posix.resolve(path),
      fd: file,
      commit() {
        finish();
        try {
          renameSync(`${fdPath}/${tempName}`, `${fdPath}/${name}`);
        } catch (error) {
          try {
            unlinkSync(`${fdPath}/${tempName}`);
          } catch {
            // gone
          }
          throw sandboxError(error, fdPath, dirPath);
        } finally {
          closeQuietly(dir);
          closed();
        }
      },
      discard() {
        finish();
        try {
          unlinkSync(`${fdPath}/${tempName}`);
        } catch {
          // gone (the sandbox may remove it itself)
        }
        closeQuietly(dir);
        closed();
      },
    };
  }
}

/** The identity of envd's process `pid` (host ids, as the daemon sees them). */
function userOf(pid: number): SandboxUser | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const uid = /^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)/m.exec(status);
    const gid = /^Gid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)/m.exec(status);
    const groups = /^Groups:(.*)$/m.exec(status)?.[1]?.trim() ?? '';
    const umask = /^Umask:\s+([0-7]+)/m.exec(status)?.[1];
    if (!uid || !gid || umask === undefined) return undefined;
    // Real, effective, saved and file-system ids all alike: a plain process of one user.
    if (new Set(uid.slice(1)).size !== 1 || new Set(gid.slice(1)).size !== 1) return undefined;
    return {
      uid: Number(uid[1]),
      gid: Number(gid[1]),
      groups: groups === '' ? [] : groups.split(/\s+/).map(Number),
      umask: Number.parseInt(umask, 8),
    };
  } catch {
    return undefined;
  }
}

/** envd's `--socket` for the sandbox's default user (root's envd has a socket of its own). */
const USER_ENVD_SOCKET = `${SANDBOX_RUN_DIR}/envd.sock`;

/** The user's envd among the sandbox's processes (its init's tree). */
function userEnvd(init: number): number | undefined {
  for (const pid of processTree(init)) {
    try {
      let argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      // envd's sleep loop (envd-sleep.ts) runs as envd does, with its umask: it is there while
      // envd sleeps.
      if (isEnvdLoop(argv)) argv = argv.slice(4);
      // envd's front holds the user's envd socket, and runs as envd does.
      if (isEnvdFront(argv)) return pid;
      if (!isEnvdCommandLine(argv)) continue;
      const at = argv.indexOf('--socket');
      if (at > 0 && argv[at + 1] === USER_ENVD_SOCKET) return pid;
    } catch {
      // ended meanwhile
    }
  }
  return undefined;
}

/** Per sandbox process (`init:startTime`): its files, or null where they cannot be reached. */
const known = new Map<string, SandboxFiles | null>();

/**
 * The files of a local sandbox (bubblewrap: its envd socket is under `/proc/INIT/root`), or
 * undefined for any other (a container, a pod, a sandbox whose envd is not found yet). The user
 * is read from its envd's process once per sandbox process.
 */
export function sandboxFilesOf(handle: SandboxHandle): SandboxFiles | undefined {
  if (handle.provider !== 'local') return undefined;
  if (!handle.envdSocket.startsWith(`/proc/${handle.pid}/root/`)) return undefined;
  const key = `${handle.pid}:${handle.startTime}`;
  const cached = known.get(key);
  if (cached !== undefined) return cached ?? undefined;
  if (processStartTime(handle.pid) !== handle.startTime) return undefined;
  const envd = userEnvd(handle.pid);
  const user = envd === undefined ? undefined : userOf(envd);
  // Not found yet (envd starting): asked again next time.
  if (!user) return undefined;
  if (known.size > 10_000) known.clear();
  const files = new SandboxFiles(handle.pid, handle.startTime, user);
  known.set(key, files);
  return files;
}

/**
 * The direct transfers of a sandbox process stopped and refused ({@link SandboxFiles.fence}),
 * before it is frozen, its disk copied or its processes ended; `lift` after a thaw.
 */
export function fenceSandboxFiles(handle: SandboxHandle): Promise<void> {
  return known.get(`${handle.pid}:${handle.startTime}`)?.fence() ?? Promise.resolve();
}

export function liftSandboxFiles(handle: SandboxHandle): void {
  known.get(`${handle.pid}:${handle.startTime}`)?.lift();
}

/** Chunks are gathered to at least this many bytes before a write starts. */
const COALESCE_BYTES = 1024 * 1024;
/** At most this many bytes wait for the write in flight; past it, the body waits. */
const HELD_BYTES = 4 * 1024 * 1024;
/** What is left at the end of an upload is written on the event loop up to this many bytes. */
const SYNC_REST_BYTES = 64 * 1024;

/** Writes every byte of `buffers` at the descriptor's position, going round on a short write. */
function writeAll(fd: number, buffers: Buffer[]): void {
  let rest = buffers;
  while (rest.length > 0) {
    let written = writevSync(fd, rest);
    if (written === 0) throw new Error('the file took no more bytes (a write of 0)');
    const next: Buffer[] = [];
    for (const buffer of rest) {
      if (written >= buffer.length) {
        written -= buffer.length;
        continue;
      }
      next.push(written > 0 ? buffer.subarray(written) : buffer);
      written = 0;
    }
    rest = next;
  }
}

/**
 * Writes what it is given to a file descriptor in `writev` batches of 1 to 4 MiB, one in flight
 * (as envd's streamed writes do): `push` returns false when the caller should wait for
 * {@link drained}; `finish` resolves with the bytes written once all are on the file.
 */
export class FileSink {
  private batch: Buffer[] = [];
  private batchBytes = 0;
  private inFlight: Promise<void> | undefined;
  private failed: { error: unknown } | undefined;
  private waiters: (() => void)[] = [];
  size = 0;

  constructor(private readonly fd: number) {}

  /** Takes a chunk (kept, not copied); false: wait for {@link drained} before more. */
  push(chunk: Buffer): boolean {
    if (chunk.length === 0) return true;
    this.size += chunk.length;
    this.batch.push(chunk);
    this.batchBytes += chunk.length;
    if (this.batchBytes >= COALESCE_BYTES && !this.inFlight) this.start();
    return this.batchBytes < HELD_BYTES;
  }

  /** Resolves once fewer than 4 MiB wait. */
  drained(): Promise<void> {
    if (this.batchBytes < HELD_BYTES || !this.inFlight) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  private start(): void {
    const buffers = this.batch;
    this.batch = [];
    this.batchBytes = 0;
    const written = new Promise<void>((resolve) => {
      writev(this.fd, buffers, (error) => {
        if (error) this.failed ??= { error };
        resolve();
      });
    });
    this.inFlight = written;
    void written.then(() => {
      this.inFlight = undefined;
      if (this.batchBytes >= COALESCE_BYTES && !this.failed) this.start();
      if (this.batchBytes < HELD_BYTES || !this.inFlight) {
        const waiters = this.waiters;
        this.waiters = [];
        for (const wake of waiters) wake();
      }
    });
  }

  /**
   * Writes what is left; rejects with the first write's error. A small rest (a whole small file,
   * or the end of a large one) is written at once on this thread: a write into the page cache of
   * up to {@link SYNC_REST_BYTES} takes microseconds, and a trip through libuv's thread pool
   * cost a 2-byte `files.write` more than the write itself (issue 49).
   */
  async finish(): Promise<number> {
    while (this.inFlight) await this.inFlight;
    if (!this.failed && this.batchBytes > 0) {
      if (this.batchBytes <= SYNC_REST_BYTES) {
        const buffers = this.batch;
        this.batch = [];
        this.batchBytes = 0;
        try {
          writeAll(this.fd, buffers);
        } catch (error) {
          this.failed ??= { error };
        }
      } else {
        this.start();
      }
    }
    while (this.inFlight) await this.inFlight;
    if (this.failed) throw this.failed.error;
    return this.size;
  }

  /** Waits for the write in flight (before the file is closed). */
  async settle(): Promise<void> {
    while (this.inFlight) await this.inFlight;
  }
}

/** Reads up to `length` bytes at `position` into `buffer`; resolves with the bytes read. */
export function readInto(
  fd: number,
  buffer: Buffer,
  length: number,
  position: number,
): Promise<number> {
  return new Promise((resolve, reject) => {
    read(fd, buffer, 0, length, position, (error, bytes) => {
      if (error) reject(error);
      else resolve(bytes);
    });
  });
}
