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
import { SandboxStartError } from '../../errors.js';
import { runtimeFileMode } from '../portable-runtime.js';
import { copyHomeTree } from './home-seed.js';

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
 * image on the stage, gives the home (seeded in the disk already) to the sandbox's uid, then
 * execs the rest of its arguments (setpriv → prlimit → bwrap). Values arrive as positional
 * parameters, never as shell text. The mount lives only in this namespace: the kernel drops it,
 * and frees the loop device, when the sandbox's last process ends. The paths it makes in an
 * image's overlay were checked for symbolic links first (see home-seed.ts): the image is
 * read-only, and a link the sandbox left on one of those paths (or their parents) in the upper
 * layer it keeps across a hibernate or a fork is removed before the overlay is mounted, so what
 * was checked is what it meets.
 * `from`: the uid the disk's files belonged to when it was another sandbox's (a fork's copy, a
 * wake that lost its uid): what that uid owns in /tmp and the overlay's upper layer is given to
 * the new uid (`-h`: a link itself, never what it points to; `-xdev`: never past the disk), and
 * nothing else there (the upper layer holds the image's own root-owned folders too).
 */
const LAUNCH_SCRIPT = `set -eu
stage=$1 image=$2 uid=$3 lower=$4 home=$5 workdir=$6 from=$7 dirs=$8 rootfrom=$9 rootto=\${10}
shift 10
nl='
'
while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs"; shift; done
shift
mount -o loop,nosuid,nodev "$image" "$stage"
chown -R -h "$uid:$uid" "$stage/home"
if [ -n "$from" ] && [ "$from" != "$uid" ]; then
  for d in "$stage/tmp" "$stage/upper"; do
    [ -d "$d" ] || continue
    find "$d" -xdev -user "$from" -exec chown -h "$uid" {} +
    find "$d" -xdev -group "$from" -exec chgrp -h "$uid" {} +
  done
fi
if [ -n "$rootfrom" ] && [ "$rootfrom" != "$rootto" ]; then
  for d in "$stage/tmp" "$stage/upper" "$stage/home"; do
    [ -d "$d" ] || continue
    find "$d" -xdev -user "$rootfrom" -exec chown -h "$rootto" {} +
    find "$d" -xdev -group "$rootfrom" -exec chgrp -h "$rootto" {} +
  done
fi
if [ -n "$lower" ]; then
  mkdir -p "$stage/upper" "$stage/work" "$stage/root"
  # A kept upper layer (a wake, a fork) holds what the sandbox wrote: a link of its own on a path
  # made below would be followed here, as root, out of the sandbox. Each goes first (the link
  # itself), so those paths are the image's again, which were checked.
  set -f
  nolinks() {
    p=$stage/upper
    IFS=/
    for part in $1; do
      [ -n "$part" ] || continue
      p=$p/$part
      if [ -L "$p" ]; then rm -f "$p"; fi
    done
    unset IFS
  }
  # usr/bin/sudo and the system bundle: bwrap binds over them (a root sandbox's sudo, an internet
  # sandbox's trust) and would follow a link there, even one to /oldroot/..., the host's root.
  for d in proc dev tmp run run/abx opt opt/abx "\${home#/}" "\${workdir#/}" etc etc/resolv.conf \
    usr/bin/sudo etc/ssl/certs/ca-certificates.crt; do
    nolinks "$d"
  done
  IFS=$nl
  for d in $dirs; do nolinks "$d"; done
  unset IFS
  mount -t overlay overlay -o "lowerdir=$lower,upperdir=$stage/upper,workdir=$stage/work,nosuid,nodev" "$stage/root"
  for d in proc dev tmp run/abx opt/abx "\${home#/}" "\${workdir#/}" etc; do mkdir -p "$stage/root/$d"; done
  IFS=$nl
  for d in $dirs; do mkdir -p "$stage/root$d"; done
  unset IFS
  set +f
  [ -e "$stage/root/etc/resolv.conf" ] || : > "$stage/root/etc/resolv.conf"
  # A root sandbox's sudo is bound over the image's: an image's link there goes (a whiteout in the
  # upper layer), and bwrap makes a plain file in its place (its parents were checked).
  if [ -n "$rootto" ] && [ -L "$stage/root/usr/bin/sudo" ]; then rm -f "$stage/root/usr/bin/sudo"; fi
fi
exec "$@"`;

export interface LaunchPaths {
  image: string;
  uid: number;
  cgroups: string[];
  /**
   * An image's file system: laid read-only under an overlay whose writable layer lives on the
   * sandbox's disk image (so it counts against the disk quota), mounted at {@link STAGED.root}.
   */
  lower?: string;
  /** The sandbox's home and working directory, made in the overlay for bwrap to mount on. */
  home?: string;
  workdir?: string;
  /** The uid the disk's files belonged to, when another (see LAUNCH_SCRIPT's `from`). */
  fromUid?: number;
  /**
   * Absolute paths to make in an image's overlay (volumes' mount points), checked for links as
   * the home is; never holding a newline (mount paths have no control characters).
   */
  dirs?: string[];
  /**
   * A root-allowing sandbox's root uid (`to`), and the one the disk's files of root belonged to
   * when another sandbox's (`from`: a fork's copy, a wake that lost its uid).
   */
  root?: { from?: number; to: number };
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
    paths.lower ?? '',
    paths.home ?? '',
    paths.workdir ?? '',
    paths.fromUid === undefined ? '' : String(paths.fromUid),
    (paths.dirs ?? []).join('\n'),
    paths.root?.from === undefined ? '' : String(paths.root.from),
    paths.root ? String(paths.root.to) : '',
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
    for (const name of files) chmodSync(join(partial, name), runtimeFileMode(name));
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

/**
 * Formats an ext4 filesystem of `bytes` into a new sparse file, holding what `content` holds
 * (`home` and `tmp`; mkfs copies owners and modes). A home too big for it is a SandboxStartError.
 */
async function formatDisk(file: string, bytes: number, content: string): Promise<void> {
  await execFileAsync('truncate', ['-s', String(bytes), file]);
  try {
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
      content,
      file,
    ]);
  } catch (error) {
    const stderr = String((error as { stderr?: unknown }).stderr ?? '').trim();
    throw new SandboxStartError(
      /allocate|No space|inode/i.test(stderr)
        ? `the template's home does not fit a disk of ${bytes} bytes: raise the template's resources.disk (${stderr.split('\n')[0]})`
        : `formatting a sandbox disk failed: ${stderr || (error as Error).message}`,
      { cause: error },
    );
  }
}

/** A formatted disk: its file, and (when filefrag could map it) every byte that is not zero. */
interface PristineDisk {
  path: string;
  data?: { offset: number; bytes: Buffer }[];
}

/** Formatted disks by file: the empty ones (one per size) and the seeded ones (see below). */
const pristine = new Map<string, Promise<PristineDisk>>();
/** Seeded disks whose blocks stay in memory at most (oldest forgotten first: rebuilt templates). */
const SEEDS_KEPT = 8;
/** A seeded disk with more data than this is copied from its file each time, not kept in memory. */
const MAX_KEPT_BYTES = 64 * 1024 * 1024;

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
 * Where a sandbox's home starts from, in root mode: a folder (a template's built home, a
 * snapshot's, or an image's /home/<user>) copied once into a formatted disk kept at
 * `${disk}-${size}.img`; every sandbox's disk is then a copy of that one. `disk` names the
 * content: a new content needs a new name (the caller puts the folder's identity in it).
 */
export interface HomeSeed {
  from: string;
  disk: string;
}

/** Makes `path` once: formats it in a partial file renamed into place (concurrent daemons agree). */
async function formatOnce(
  path: string,
  bytes: number,
  fill: (content: string) => Promise<void>,
): Promise<void> {
  if (existsSync(path)) return;
  const partial = `${path}.${randomBytes(4).toString('hex')}`;
  const content = `${partial}.d`;
  try {
    await fill(content);
    await formatDisk(partial, bytes, content);
    renameSync(partial, path);
  } finally {
    rmSync(content, { recursive: true, force: true });
    rmSync(partial, { force: true });
  }
}

/** The formatted disk for `bytes` (and `seed`), made on first use, its data read once. */
function pristineDisk(bytes: number, seed: HomeSeed | undefined): Promise<PristineDisk> {
  const path = seed ? `${seed.disk}-${bytes}.img` : join(RUNTIME_ROOT, `disk-${bytes}.img`);
  let source = pristine.get(path);
  if (source) return source;
  source = (async () => {
    mkdirSync(RUNTIME_ROOT, { recursive: true, mode: 0o755 });
    // What a disk holds: `home` (0700, given to the sandbox's uid at start) and `tmp` (1777).
    await formatOnce(path, bytes, async (content) => {
      if (seed) await copyHomeTree(seed.from, join(content, 'home'), bytes);
      else mkdirSync(join(content, 'home'), { recursive: true });
      chmodSync(join(content, 'home'), 0o700);
      mkdirSync(join(content, 'tmp'));
      chmodSync(join(content, 'tmp'), 0o1777);
    });
    const data = await dataOf(path);
    const size = data?.reduce((sum, run) => sum + run.bytes.length, 0) ?? 0;
    return data && size <= MAX_KEPT_BYTES ? { path, data } : { path };
  })();
  source.catch(() => pristine.delete(path));
  pristine.set(path, source);
  if (seed) {
    const seeds = [...pristine.keys()].filter((key) => !key.startsWith(RUNTIME_ROOT));
    for (const old of seeds.slice(0, Math.max(0, seeds.length - SEEDS_KEPT))) pristine.delete(old);
  }
  return source;
}

/**
 * A sparse file holding an ext4 filesystem of `bytes` with a home (empty, or a copy of `seed`'s
 * folder) and /tmp: a full disk is ENOSPC inside and nothing outside. No journal (the disk dies
 * with the sandbox), no reserved blocks, lazy inode tables. Formatted once per size and seed;
 * each disk is a sparse copy of that one (~1 MiB of metadata for an empty home: half the work of
 * mkfs; a seeded home costs its own data once more, never a walk of its files), written from
 * memory by the thread pool: a `cp` per sandbox was a fork of the daemon each time, on its event
 * loop (its costliest call in a burst of creates). Where filefrag cannot map the formatted file,
 * or a seeded one holds more than {@link MAX_KEPT_BYTES}, `cp --sparse=always` copies it.
 */
export async function createDiskImage(file: string, bytes: number, seed?: HomeSeed): Promise<void> {
  const { path, data } = await pristineDisk(bytes, seed);
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
