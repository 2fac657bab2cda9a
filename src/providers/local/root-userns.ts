/**
 * Root inside an image sandbox (issue 46), the containment half: a user namespace in which the
 * sandbox has a uid 0 of its own that is never host root. Root daemon only (it writes maps of
 * two uids, which only CAP_SETUID in the initial namespace may do). Not wired into sandbox starts
 * yet: see docs/security.md, "Root inside image sandboxes".
 *
 * - uid 0 inside is {@link rootUidOf} the sandbox's uid, another unprivileged host uid outside the
 *   allocation range; uid 1000 inside stays the sandbox's own uid, so its home, volumes and
 *   everything a sandbox without root has keep their owners.
 * - bwrap runs as that root uid (its real uid is the one it maps to itself) and waits on
 *   `--userns-block-fd` until the daemon wrote both maps ({@link mapRootUserns}); its `--uid 0`
 *   keeps only {@link ROOT_CAPS} (bounding, effective and ambient sets).
 * - bwrap's `--disable-userns` maps one uid only, so the daemon sets the namespace's own
 *   `user.max_user_namespaces` to 0 instead; changing it needs CAP_SYS_RESOURCE there, which is
 *   not in the set.
 * - The image's file system is laid under the overlay through an idmapped mount (idmap.ts) in
 *   which host root's files are the root uid's, so root inside owns the image and writes land in
 *   the upper layer as that uid; the image itself is never written.
 */
import { spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync, statSync, writeSync } from 'node:fs';
import { SANDBOX_UID } from './bwrap-args.js';
import { DEFAULT_UID_RANGE, type UidRange } from './sandbox-uids.js';

/**
 * What root inside may do: own and change any file of the sandbox's (chown, mode, set-id bits,
 * which nosuid mounts make inert), switch to the default user and back (setuid, setgid), signal
 * the sandbox's processes, bind ports below 1024. Docker's default set minus NET_RAW, MKNOD,
 * AUDIT_WRITE, SYS_CHROOT and SETFCAP; never SYS_ADMIN (mounts), NET_ADMIN (the network
 * namespace, nftables), SYS_RESOURCE (the nested-namespace limit), SYS_PTRACE or SYS_MODULE.
 */
export const ROOT_CAPS = [
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_FOWNER',
  'CAP_FSETID',
  'CAP_KILL',
  'CAP_SETGID',
  'CAP_SETUID',
  'CAP_SETPCAP',
  'CAP_NET_BIND_SERVICE',
] as const;

/** How long the daemon waits for a child's maps to be written (nsenter included). */
const MAP_TIMEOUT_MS = 5000;

/**
 * The first account of the host's /etc/passwd whose uid is in [from, to), or undefined: root
 * inside runs as such uids, which must belong to no one (a custom ABX_UID_RANGE could put them on
 * real accounts).
 */
export function hostAccountIn(
  from: number,
  to: number,
  passwd = '/etc/passwd',
): { name: string; uid: number } | undefined {
  // Read once per version of the file: the answer keys on everything it read (the file's
  // identity, size and change time, and the range).
  let key: string;
  try {
    const st = statSync(passwd);
    key = `${passwd}\0${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}:${st.ctimeMs}\0${from}-${to}`;
  } catch {
    return undefined;
  }
  if (accountCache?.key === key) return accountCache.found;
  let text: string;
  try {
    text = readFileSync(passwd, 'utf8');
  } catch {
    return undefined;
  }
  let found: { name: string; uid: number } | undefined;
  for (const line of text.split('\n')) {
    const [name, , uidText] = line.split(':');
    const uid = Number(uidText);
    if (name && uidText && Number.isInteger(uid) && uid >= from && uid < to) {
      found = { name, uid };
      break;
    }
  }
  accountCache = { key, found };
  return found;
}

let accountCache: { key: string; found: { name: string; uid: number } | undefined } | undefined;

/**
 * The host uid of root inside the sandbox whose own uid is `uid`: the same offset in the range
 * above the allocation range, so the lock of `uid` holds it too and it is never 0.
 */
export function rootUidOf(uid: number, range: UidRange = DEFAULT_UID_RANGE): number {
  if (uid < range.first || uid >= range.first + range.count) {
    throw new RangeError(`uid ${uid} is not a sandbox uid of ${range.first}+${range.count}`);
  }
  const root = uid + range.count;
  if (root > 0xfffffffe) throw new RangeError(`ABX_UID_RANGE leaves no room for root uids`);
  return root;
}

/**
 * bwrap options for a root sandbox, replacing `--unshare-user --uid 1000 --gid 1000
 * --disable-userns`: bwrap makes the user namespace, tells its child's pid on `infoFd` and waits
 * on `blockFd` for {@link mapRootUserns}.
 */
export function rootBwrapArgs(blockFd: number, infoFd: number): string[] {
  return [
    '--unshare-user',
    '--userns-block-fd',
    String(blockFd),
    '--info-fd',
    String(infoFd),
    '--uid',
    '0',
    '--gid',
    '0',
    ...ROOT_CAPS.flatMap((cap) => ['--cap-add', cap]),
  ];
}

/** The child pid in bwrap's `--info-fd` JSON. */
export function childPidOf(info: string): number {
  const pid = (JSON.parse(info) as { 'child-pid'?: unknown })['child-pid'];
  if (typeof pid !== 'number' || !Number.isSafeInteger(pid) || pid <= 1) {
    throw new Error(`bwrap's info names no child pid: ${info.slice(0, 200)}`);
  }
  return pid;
}

/** Writes `text` to a /proc map file in one write (the kernel takes a map once, whole). */
function writeMap(file: string, text: string): void {
  const fd = openSync(file, 'w');
  try {
    writeSync(fd, text);
  } finally {
    closeSync(fd);
  }
}

/**
 * Maps uid and gid 0 of bwrap's new user namespace (its child `pid`) to `rootUid` and 1000 to
 * `userUid`, and sets that namespace's `user.max_user_namespaces` to 0 (from inside it, through
 * nsenter: the sysctl is per namespace). Then the caller unblocks bwrap.
 */
export async function mapRootUserns(pid: number, rootUid: number, userUid: number): Promise<void> {
  const map = `0 ${rootUid} 1\n${SANDBOX_UID} ${userUid} 1\n`;
  writeMap(`/proc/${pid}/uid_map`, map);
  writeMap(`/proc/${pid}/gid_map`, map);
  await new Promise<void>((resolve, reject) => {
    const child = spawn(
      'nsenter',
      [
        '--user',
        `--target=${pid}`,
        '--',
        '/bin/sh',
        '-c',
        'echo 0 > /proc/sys/user/max_user_namespaces',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'], timeout: MAP_TIMEOUT_MS },
    );
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      if (code === 0) resolve();
      else
        reject(
          new Error(
            `setting max_user_namespaces in sandbox ${pid}'s namespace failed (${signal ?? `exit ${code}`}): ${stderr.trim()}`,
          ),
        );
    });
  });
}
