/**
 * Idmapped mounts (Linux 5.12+: `open_tree`, `mount_setattr(MOUNT_ATTR_IDMAP)`, `move_mount`),
 * which util-linux 2.38's `mount` cannot make: called through koffi, a maintained FFI with
 * prebuilt binaries, so no compiler is needed on the host. Root only (CAP_SYS_ADMIN).
 *
 * An idmapped mount of a folder shows its files' owner `from` as `to` and writes `to`'s files as
 * `from`: a volume whose files belong to one reserved host uid appears, to each sandbox, owned by
 * that sandbox's own uid (its uid 1000 inside), and what the sandbox writes lands on the volume
 * as the reserved uid.
 */
import { spawn } from 'node:child_process';
import { closeSync, openSync, readlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { setTimeout as sleep } from 'node:timers/promises';

const SYS_OPEN_TREE = 428;
const SYS_MOVE_MOUNT = 429;
const SYS_MOUNT_SETATTR = 442;
const AT_FDCWD = -100;
const AT_EMPTY_PATH = 0x1000;
const OPEN_TREE_CLONE = 1;
const OPEN_TREE_CLOEXEC = 0o2000000;
const MOUNT_ATTR_RDONLY = 0x1;
const MOUNT_ATTR_NOSUID = 0x2;
const MOUNT_ATTR_NODEV = 0x4;
const MOUNT_ATTR_IDMAP = 0x100000;
const MOVE_MOUNT_F_EMPTY_PATH = 0x4;
const MNT_DETACH = 0x2;
/** How long a helper process has to enter its new user namespace. */
const USERNS_TIMEOUT_MS = 5000;

interface Libc {
  syscall: (...args: unknown[]) => number | bigint;
  umount2: (target: string, flags: number) => number;
  errno: () => number;
}

let libc: Libc | undefined;

/** libc through koffi, loaded on first use (the CLI never pays for it). */
function loadLibc(): Libc {
  if (libc) return libc;
  const require = createRequire(import.meta.url);
  const koffi = require('koffi') as typeof import('koffi');
  const lib = koffi.load('libc.so.6');
  const syscall = lib.func('long syscall(long nr, ...)');
  const umount2 = lib.func('int umount2(const char *target, int flags)');
  const errnoLocation = lib.func('int *__errno_location()');
  libc = {
    syscall: (...args) => syscall(...args) as number | bigint,
    umount2: (target, flags) => umount2(target, flags) as number,
    errno: () => koffi.decode(errnoLocation(), 'int') as number,
  };
  return libc;
}

/** An Error naming a failed system call and its errno. */
function failed(what: string, errno: number): Error {
  const names: Record<number, string> = {
    1: 'EPERM',
    2: 'ENOENT',
    13: 'EACCES',
    16: 'EBUSY',
    22: 'EINVAL',
    38: 'ENOSYS',
    95: 'EOPNOTSUPP',
  };
  return Object.assign(new Error(`${what} failed: ${names[errno] ?? `errno ${errno}`}`), {
    code: names[errno],
  });
}

/**
 * A user namespace whose only mapping is `from` → `to` (uids and gids), as an open file: a short
 * `unshare --user` process made it, and the daemon (root) wrote its maps. The caller closes it.
 */
async function mappingNamespace(from: number, to: number): Promise<number> {
  const child = spawn('unshare', ['--user', '--', 'sleep', '60'], { stdio: 'ignore' });
  try {
    const own = readlinkSync('/proc/self/ns/user');
    const deadline = Date.now() + USERNS_TIMEOUT_MS;
    for (;;) {
      if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) {
        throw new Error('unshare --user ended before it made a user namespace');
      }
      try {
        if (readlinkSync(`/proc/${child.pid}/ns/user`) !== own) break;
      } catch {
        // not started yet
      }
      if (Date.now() > deadline) {
        throw new Error(`unshare --user made no user namespace in ${USERNS_TIMEOUT_MS} ms`);
      }
      await sleep(1);
    }
    writeFileSync(`/proc/${child.pid}/uid_map`, `${from} ${to} 1\n`);
    writeFileSync(`/proc/${child.pid}/setgroups`, 'deny');
    writeFileSync(`/proc/${child.pid}/gid_map`, `${from} ${to} 1\n`);
    return openSync(`/proc/${child.pid}/ns/user`, 'r');
  } finally {
    child.kill('SIGKILL');
  }
}

/**
 * Mounts `source` (a mounted folder) again at `target` (an empty folder), idmapped so that files
 * of `from` show as `to`; `readOnly` makes the new mount read-only. Always nosuid and nodev.
 */
export async function idmapMount(
  source: string,
  target: string,
  from: number,
  to: number,
  readOnly: boolean,
): Promise<void> {
  const c = loadLibc();
  const userns = await mappingNamespace(from, to);
  try {
    const tree = Number(
      c.syscall(
        SYS_OPEN_TREE,
        'int',
        AT_FDCWD,
        'str',
        source,
        'uint',
        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
      ),
    );
    if (tree < 0) throw failed(`open_tree(${source})`, c.errno());
    try {
      // struct mount_attr { u64 attr_set, attr_clr, propagation, userns_fd; }
      const attr = Buffer.alloc(32);
      attr.writeBigUInt64LE(
        BigInt(
          MOUNT_ATTR_IDMAP |
            MOUNT_ATTR_NOSUID |
            MOUNT_ATTR_NODEV |
            (readOnly ? MOUNT_ATTR_RDONLY : 0),
        ),
        0,
      );
      attr.writeBigUInt64LE(BigInt(userns), 24);
      const set = Number(
        c.syscall(
          SYS_MOUNT_SETATTR,
          'int',
          tree,
          'str',
          '',
          'uint',
          AT_EMPTY_PATH,
          'void *',
          attr,
          'size_t',
          attr.length,
        ),
      );
      if (set < 0) throw failed(`mount_setattr(${source}, idmap ${from}:${to})`, c.errno());
      const moved = Number(
        c.syscall(
          SYS_MOVE_MOUNT,
          'int',
          tree,
          'str',
          '',
          'int',
          AT_FDCWD,
          'str',
          target,
          'uint',
          MOVE_MOUNT_F_EMPTY_PATH,
        ),
      );
      if (moved < 0) throw failed(`move_mount(${target})`, c.errno());
    } finally {
      closeSync(tree);
    }
  } finally {
    closeSync(userns);
  }
}

/** Detaches the mount at `target` (lazily: a process still in it keeps its copy). */
export function detachMount(target: string): void {
  const c = loadLibc();
  if (c.umount2(target, MNT_DETACH) < 0) {
    const errno = c.errno();
    // EINVAL: not a mount point (detached already); ENOENT: gone.
    if (errno !== 22 && errno !== 2) throw failed(`umount2(${target})`, errno);
  }
}
