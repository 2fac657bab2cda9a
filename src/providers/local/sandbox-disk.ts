import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const execFileAsync = promisify(execFile);

/**
 * A mount point every root-daemon sandbox uses in a mount namespace of its own: a tmpfs goes
 * there first, then the sandbox's disk, run folder and runtime. The host's copy stays empty; the
 * sandbox's bwrap (an unprivileged uid) reaches its folders through it even when they live under
 * a folder only root may enter, such as /root/.abx.
 */
export const STAGE_DIR = '/run/abx-stage';

/**
 * Runs as root in the sandbox's new mount namespace: joins the sandbox's cgroups, mounts its disk
 * image and folders under the stage, fills a new home from the template's, and execs the rest of
 * its arguments (setpriv → prlimit → bwrap). Values arrive as positional parameters, never as
 * shell text. The mounts live only in this namespace: the kernel drops them, and frees the loop
 * device, when the sandbox's last process ends.
 */
const LAUNCH_SCRIPT = `set -eu
stage=$1 image=$2 uid=$3 runtime=$4 base=$5
shift 5
while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs"; shift; done
shift
mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev,noexec abx-stage "$stage"
mkdir "$stage/disk" "$stage/runtime"
mount -o loop,nosuid,nodev "$image" "$stage/disk"
mkdir -m 0700 "$stage/disk/home"
mkdir -m 1777 "$stage/disk/tmp"
if [ -n "$base" ]; then cp -a "$base/." "$stage/disk/home/"; fi
chown -R -h "$uid:$uid" "$stage/disk/home"
mount --bind "$runtime" "$stage/runtime"
exec "$@"`;

export interface LaunchPaths {
  image: string;
  uid: number;
  runtimeDir: string;
  baseHome?: string;
  cgroups: string[];
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
    paths.runtimeDir,
    paths.baseHome ?? '',
    ...paths.cgroups,
    '--',
    ...command,
  ];
}

/** Where the sandbox's folders appear to its bwrap, inside its mount namespace. */
export const STAGED = {
  home: `${STAGE_DIR}/disk/home`,
  tmp: `${STAGE_DIR}/disk/tmp`,
  runtime: `${STAGE_DIR}/runtime`,
};

/**
 * A sparse file holding an empty ext4 filesystem of `bytes`: the sandbox's home and /tmp, so a
 * full disk is ENOSPC inside and nothing outside. No journal (the disk dies with the sandbox), no
 * reserved blocks, lazy inode tables: ~10 ms whatever the size.
 */
export async function createDiskImage(file: string, bytes: number): Promise<void> {
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
    file,
  ]);
}
