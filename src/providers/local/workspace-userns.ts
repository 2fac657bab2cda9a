/**
 * A workspace on a rootless daemon (docs/workspaces.md, "On a rootless daemon"). The daemon may
 * not mount on the host, but a user namespace of its own may (Linux 5.11 and newer): the
 * sandbox's launcher enters a new user and mount namespace (`unshare --user --map-root-user
 * --mount`), mounts the overlay there (`userxattr`: its whiteouts are character devices 0/0 the
 * kernel lets an unprivileged user make, its opaque folders a `user.overlay.opaque` attribute),
 * and execs bwrap inside, which binds the overlay at the workspace's path. The host folder is the
 * overlay's lower layer as it is: the daemon's uid is root in that namespace and the sandbox's
 * uid in bwrap's, so the sandbox owns what the daemon's user owns and sees others' files as
 * `nobody` (no idmapped mount is needed, nor possible). The upper layer is in the sandbox's folder,
 * the daemon's.
 *
 * The daemon reads the sandbox's view through the root of bwrap's first process, which lives in
 * that mount namespace: `/proc/PID/root` followed by the overlay's path in the sandbox's folder.
 * Every folder of that path is the daemon's (not the sandbox's, whose root is another), so the
 * sandbox cannot turn one into a link; below it, the workspace core follows nothing.
 */
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';

/**
 * The script `unshare` runs: in the workspace's folder ($1), mount the overlay (options $2) on
 * `merged`, then exec the rest (bwrap and its arguments). The layers are named relative to that
 * folder, which is how the sandbox's /proc/self/mountinfo shows them: the daemon's home (its
 * path) does not show inside.
 */
const MOUNT_THEN_EXEC =
  'cd "$1" && mount -t overlay overlay -o "$2" merged && cd / && shift 2 && exec "$@"';

/**
 * The folders of a rootless sandbox's workspace in `dir` (made here; an upper layer that exists,
 * a hibernate's or a fork's, is kept) and the launcher prefix that mounts its overlay before
 * `bwrap`. The overlay is at `merged` inside the launcher's mount namespace only.
 */
export function rootlessWorkspace(
  dir: string,
  from: string,
): { merged: string; upper: string; prefix: string[] } {
  const upper = posix.join(dir, 'upper');
  const work = posix.join(dir, 'work');
  const merged = posix.join(dir, 'merged');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  for (const folder of [work, merged]) mkdirSync(folder, { recursive: true, mode: 0o700 });
  // The overlay's root folder is its upper layer's: the host folder's mode.
  const mode = statSync(from).mode & 0o777;
  mkdirSync(upper, { recursive: true, mode });
  const options = `lowerdir=${escapeOption(from)},upperdir=upper,workdir=work,userxattr,nosuid,nodev`;
  return {
    merged,
    upper,
    prefix: [
      'unshare',
      '--user',
      '--map-root-user',
      '--mount',
      '--propagation',
      'private',
      '/bin/sh',
      '-c',
      MOUNT_THEN_EXEC,
      'abx-workspace',
      dir,
      options,
    ],
  };
}

/**
 * A folder as an overlay option's value: its commas and backslashes escaped (overlayfs splits
 * options at unescaped commas), a colon escaped (it separates lower layers).
 */
function escapeOption(path: string): string {
  return path.replace(/[\\,:]/g, (c) => `\\${c}`);
}

/**
 * Where the daemon reads a rootless sandbox's workspace: its overlay through the root of the
 * process that holds the launcher's mount namespace, bwrap's first process, the parent of the
 * sandbox's init (`init`, its pid on the host). Undefined if that process is gone.
 */
export function rootlessWorkspaceView(init: number, merged: string): string | undefined {
  let status: string;
  try {
    status = readFileSync(`/proc/${init}/status`, 'utf8');
  } catch {
    return undefined;
  }
  const parent = /^PPid:\s+(\d+)$/m.exec(status)?.[1];
  return parent ? `/proc/${parent}/root${merged}` : undefined;
}

/** The probe's answer, once per daemon: undefined (it can), or why not. */
let probed: { why: string | undefined } | undefined;

/**
 * Why this daemon's uid cannot mount an overlay in a user namespace of its own (undefined: it
 * can). Tried once per daemon, with empty folders in the temporary folder, in 10 s at most.
 */
export function rootlessOverlayUnavailable(): string | undefined {
  if (probed) return probed.why;
  const dir = mkdtempSync(join(tmpdir(), 'abx-overlay-probe-'));
  try {
    for (const name of ['lower', 'upper', 'work', 'merged']) mkdirSync(join(dir, name));
    const lower = join(dir, 'lower');
    const tried = spawnSync(
      'unshare',
      [
        '--user',
        '--map-root-user',
        '--mount',
        '/bin/sh',
        '-c',
        MOUNT_THEN_EXEC,
        'abx-probe',
        dir,
        `lowerdir=${lower},upperdir=upper,workdir=work,userxattr`,
        'true',
      ],
      { encoding: 'utf8', timeout: 10_000 },
    );
    const failure = tried.error?.message ?? (tried.status === 0 ? undefined : tried.stderr.trim());
    probed = {
      why:
        failure === undefined
          ? undefined
          : `a rootless daemon mounts a workspace's overlay in a user namespace of its own, which this host refused (${failure || `exit ${tried.status}`}): it needs Linux 5.11 or newer with unprivileged user namespaces, or a root daemon`,
    };
  } finally {
    removeLayers(dir);
  }
  return probed.why;
}

/**
 * Removes a workspace's folder (its layers). Root removes anything; the daemon's uid first gives
 * itself every folder in it (never through a link): the overlay's `work/work` is mode 0, and a
 * sandbox of a rootless daemon, which is that uid, may have left folders it cannot enter.
 */
export function removeLayers(dir: string): void {
  if (process.getuid?.() !== 0) openFolders(dir);
  rmSync(dir, { recursive: true, force: true });
}

function openFolders(dir: string): void {
  let st: ReturnType<typeof lstatSync>;
  try {
    st = lstatSync(dir);
  } catch {
    return;
  }
  if (!st.isDirectory()) return;
  if ((st.mode & 0o700) !== 0o700) chmodSync(dir, (st.mode & 0o7777) | 0o700);
  for (const name of readdirSync(dir)) openFolders(posix.join(dir, name));
}
