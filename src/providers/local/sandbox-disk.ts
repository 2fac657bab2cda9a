import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  cpSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
} from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';

const execFileAsync = promisify(execFile);

/**
 * An empty host folder every root-daemon sandbox mounts its disk image on, in a mount namespace of
 * its own: the sandbox's bwrap (an unprivileged uid) reaches its home and /tmp through it even when
 * the image lives under a folder only root may enter, such as /root/.abx.
 */
export const STAGE_DIR = '/run/abx-stage';
/** Root-owned copies of the runtime (envd), one per content, readable by every sandbox uid. */
const RUNTIME_ROOT = '/run/abx-runtime';

/**
 * Runs as root in the sandbox's new mount namespace: joins the sandbox's cgroups, mounts its disk
 * image on the stage, fills the home from the template's and gives it to the sandbox's uid, then
 * execs the rest of its arguments (setpriv → prlimit → bwrap). Values arrive as positional
 * parameters, never as shell text. The mount lives only in this namespace: the kernel drops it,
 * and frees the loop device, when the sandbox's last process ends.
 */
const LAUNCH_SCRIPT = `set -eu
stage=$1 image=$2 uid=$3 base=$4 lower=$5 home=$6 workdir=$7
shift 7
while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs"; shift; done
shift
mount -o loop,nosuid,nodev "$image" "$stage"
if [ -n "$base" ]; then cp -a "$base/." "$stage/home/"; fi
chown -R -h "$uid:$uid" "$stage/home"
if [ -n "$lower" ]; then
  mkdir -p "$stage/upper" "$stage/work" "$stage/root"
  mount -t overlay overlay -o "lowerdir=$lower,upperdir=$stage/upper,workdir=$stage/work,nosuid,nodev" "$stage/root"
  for d in proc dev tmp run/abx opt/abx "\${home#/}" "\${workdir#/}" etc; do mkdir -p "$stage/root/$d"; done
  [ -e "$stage/root/etc/resolv.conf" ] || : > "$stage/root/etc/resolv.conf"
fi
exec "$@"`;

export interface LaunchPaths {
  image: string;
  uid: number;
  baseHome?: string;
  cgroups: string[];
  /**
   * An image's file system: laid read-only under an overlay whose writable layer lives on the
   * sandbox's disk image (so it counts against the disk quota), mounted at {@link STAGED.root}.
   */
  lower?: string;
  /** The sandbox's home and working directory, made in the overlay for bwrap to mount on. */
  home?: string;
  workdir?: string;
}

/** The argv that starts `command` (run as the sandbox's uid) in the sandbox's mount namespace. */
export function launchArgv(paths: LaunchPaths, command: string[]): string[] {
  return [
    'unshare',
    '--mount',
    '--propagation',
    'private',
    '--',
    '/bin/sh',
    '-c',
    LAUNCH_SCRIPT,
    'abx-launch',
    STAGE_DIR,
    paths.image,
    String(paths.uid),
    paths.baseHome ?? '',
    paths.lower ?? '',
    paths.home ?? '',
    paths.workdir ?? '',
    ...paths.cgroups,
    '--',
    ...command,
  ];
}

/** Where the sandbox's home and /tmp appear to its bwrap, inside its mount namespace. */
export const STAGED = {
  home: `${STAGE_DIR}/home`,
  tmp: `${STAGE_DIR}/tmp`,
  /** The overlay of an image sandbox's file system. */
  root: `${STAGE_DIR}/root`,
};

/**
 * A copy of the runtime folder that any uid may read, for root mode: the package may sit where a
 * sandbox's uid cannot enter (under /root). Shared by content, made once per daemon.
 */
export function sharedRuntime(runtimeDir: string): string {
  const hash = createHash('sha256');
  const files = readdirSync(runtimeDir).sort();
  for (const name of files) hash.update(name).update(readFileSync(join(runtimeDir, name)));
  const dir = join(RUNTIME_ROOT, hash.digest('hex').slice(0, 16));
  if (!existsSync(dir)) {
    const partial = `${dir}.${randomBytes(4).toString('hex')}`;
    mkdirSync(RUNTIME_ROOT, { recursive: true, mode: 0o755 });
    chmodSync(RUNTIME_ROOT, 0o755);
    cpSync(runtimeDir, partial, { recursive: true });
    chmodSync(partial, 0o755);
    for (const name of files) chmodSync(join(partial, name), 0o644);
    try {
      renameSync(partial, dir);
    } catch {
      // another daemon made the same copy meanwhile
      rmSync(partial, { recursive: true, force: true });
    }
  }
  mkdirSync(STAGE_DIR, { recursive: true, mode: 0o755 });
  return dir;
}

/** What a new disk holds: `home` (0700, given to the sandbox's uid at start) and `tmp` (1777). */
function skeleton(): string {
  const dir = join(RUNTIME_ROOT, 'disk-skeleton');
  if (!existsSync(join(dir, 'tmp'))) {
    mkdirSync(join(dir, 'home'), { recursive: true, mode: 0o700 });
    mkdirSync(join(dir, 'tmp'), { recursive: true });
    chmodSync(join(dir, 'tmp'), 0o1777);
  }
  return dir;
}

/** Formats an ext4 filesystem of `bytes` with an empty home and /tmp into a new sparse file. */
async function formatDisk(file: string, bytes: number): Promise<void> {
  await execFileAsync('truncate', ['-s', String(bytes), file]);
  await execFileAsync('mkfs.ext4', [
    '-q',
    '-F',
    '-O',
    '^has_journal',
    '-m',
    '0',
    '-E',
    'lazy_itable_init=1,lazy_journal_init=1,nodiscard',
    '-d',
    skeleton(),
    file,
  ]);
}

/** A formatted disk: its file, and (when filefrag could map it) every byte that is not zero. */
interface PristineDisk {
  path: string;
  data?: { offset: number; bytes: Buffer }[];
}

const pristine = new Map<number, Promise<PristineDisk>>();

/** ext4's block, and filefrag's unit below. */
const BLOCK = 4096;

/**
 * The blocks of a sparse file that hold something other than zeros: the extents `filefrag`
 * (e2fsprogs, beside mkfs.ext4) maps after syncing the file, read back and cut into runs of
 * non-zero blocks. Undefined when filefrag cannot say (another file system, no FIEMAP).
 */
async function dataOf(path: string): Promise<PristineDisk['data']> {
  let map: string;
  try {
    map = (await execFileAsync('filefrag', ['-s', '-e', `-b${BLOCK}`, path])).stdout;
  } catch {
    return undefined;
  }
  // "   0:        0..     257:    5868747..   5869004:    258:            "
  const extents = [...map.matchAll(/^\s*\d+:\s*(\d+)\.\.\s*(\d+):/gm)].map((m) => ({
    first: Number(m[1]),
    last: Number(m[2]),
  }));
  if (extents.length === 0 || !/\d+ extents? found/.test(map)) return undefined;
  const data: { offset: number; bytes: Buffer }[] = [];
  const zero = Buffer.alloc(BLOCK);
  const file = await open(path, 'r');
  try {
    for (const { first, last } of extents) {
      const bytes = Buffer.alloc((last - first + 1) * BLOCK);
      const { bytesRead } = await file.read(bytes, 0, bytes.length, first * BLOCK);
      // Runs of non-zero blocks: an unwritten (preallocated) extent reads as zeros and adds none.
      for (let at = 0; at < bytesRead; ) {
        const end = Math.min(at + BLOCK, bytesRead);
        if (bytes.subarray(at, end).equals(zero.subarray(0, end - at))) {
          at = end;
          continue;
        }
        let runEnd = end;
        while (runEnd < bytesRead) {
          const next = Math.min(runEnd + BLOCK, bytesRead);
          if (bytes.subarray(runEnd, next).equals(zero.subarray(0, next - runEnd))) break;
          runEnd = next;
        }
        data.push({ offset: first * BLOCK + at, bytes: bytes.subarray(at, runEnd) });
        at = runEnd;
      }
    }
  } finally {
    await file.close();
  }
  return data;
}

/**
 * A sparse file holding an ext4 filesystem of `bytes` with an empty home and /tmp: a full disk is
 * ENOSPC inside and nothing outside. No journal (the disk dies with the sandbox), no reserved
 * blocks, lazy inode tables. Formatted once per size; each disk is a sparse copy of that one
 * (~1 MiB of metadata: half the work of mkfs), written from memory by the thread pool: a `cp` per
 * sandbox was a fork of the daemon each time, on its event loop (its costliest call in a burst
 * of creates). Where filefrag cannot map the formatted file, `cp --sparse=always` copies it.
 */
export async function createDiskImage(file: string, bytes: number): Promise<void> {
  let source = pristine.get(bytes);
  if (!source) {
    source = (async () => {
      const path = join(RUNTIME_ROOT, `disk-${bytes}.img`);
      if (!existsSync(path)) {
        const partial = `${path}.${randomBytes(4).toString('hex')}`;
        mkdirSync(RUNTIME_ROOT, { recursive: true, mode: 0o755 });
        await formatDisk(partial, bytes);
        renameSync(partial, path);
      }
      const data = await dataOf(path);
      return data ? { path, data } : { path };
    })();
    source.catch(() => pristine.delete(bytes));
    pristine.set(bytes, source);
  }
  const { path, data } = await source;
  if (!data) {
    await execFileAsync('cp', ['--sparse=always', path, file]);
    return;
  }
  const disk = await open(file, 'wx', 0o644);
  try {
    await disk.truncate(bytes);
    for (const { offset, bytes: block } of data) await disk.write(block, 0, block.length, offset);
  } catch (error) {
    await disk.close();
    rmSync(file, { force: true });
    throw error;
  }
  await disk.close();
}
