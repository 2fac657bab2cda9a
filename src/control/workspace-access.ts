/**
 * Who may mount which host folder as a workspace, and what an apply may then write back
 * (docs/workspaces.md, "Who may mount what"). A host folder is the host's data:
 *
 * - an **admin key**, or the daemon's own key (`$ABX_HOME/api-key`, a keyless local daemon): any
 *   folder; the folder's owner is the uid mapped to the sandbox's user;
 * - **another key, from a local process** (a loopback connection whose client socket belongs to
 *   host uid U, peer-uid.ts): a folder U can read and search, checked as U really would (a child
 *   run as U, U's groups, symlinks in the path resolved as U). Then **U** is the uid mapped to the
 *   sandbox's user, whoever owns the folder: the sandbox has U's rights on the tree (files of
 *   other uids show as nobody), and an apply writes only where U may write;
 * - anything else (a remote client, a uid that cannot read the folder): 403 `workspace_denied`.
 */
import { execFile } from 'node:child_process';
import { lstat } from 'node:fs/promises';
import { posix } from 'node:path';
import { promisify } from 'node:util';
import { InvalidArgumentError, PermissionDeniedError } from '../errors.js';
import type { Refusal, WorkspaceChange } from '../workspace/index.js';

const execFileAsync = promisify(execFile);

/** How long a check run as the client's uid may take (a hung network folder), in ms. */
export const ACCESS_CHECK_TIMEOUT_MS = 10_000;

/** Who asks for a workspace. */
export interface WorkspaceAsker {
  /** An admin key, or the daemon's own key. */
  admin: boolean;
  /** The key, for messages (undefined: the daemon's own). */
  key?: { name: string; keyId: string };
  /** The host uid of the local process that sent the request; undefined: remote or unknown. */
  peerUid: number | undefined;
}

/**
 * A workspace mounted for a local client's uid: that uid is mapped to the sandbox's user (not
 * the folder's owner), and the folder checked (`dev`, `ino`) is the one that must be mounted.
 */
export interface WorkspaceUser {
  uid: number;
  dev: number;
  ino: number;
}

/** What may be mounted: the folder (as U resolved it, for U) and, for a local client, U. */
export interface WorkspaceGrant {
  from: string;
  user?: WorkspaceUser;
}

/**
 * The rule: whether `who` may mount the host folder `from` (absolute), and as whom. Refuses
 * with 403 `workspace_denied` naming the folder, the uid and what to do; a folder that does not
 * exist as the client sees it is 400.
 */
export async function workspaceAccess(from: string, who: WorkspaceAsker): Promise<WorkspaceGrant> {
  if (who.admin) return { from };
  const key = who.key ? `the key '${who.key.name}' (${who.key.keyId})` : 'this key';
  if (who.peerUid === undefined) {
    throw new PermissionDeniedError(
      `workspace.from ${from}: ${key} is not an admin key, and this request did not come from a process on the daemon's host (over loopback to its API), whose user could be checked: a remote client sends its folder instead (an upload, docs/workspaces.md), or asks an admin of the control plane`,
      { code: 'workspace_denied' },
    );
  }
  const uid = who.peerUid;
  const seen = await asUser(uid, FOLDER_CHECK, [from]);
  if (seen.code === 3 || seen.code === 4) {
    throw new InvalidArgumentError(
      `workspace.from ${from} is not an existing directory (as uid ${uid}, the user of the client, sees it)`,
    );
  }
  const [real, ids] = seen.stdout.split('\n');
  const [dev, ino] = (ids ?? '').split(' ').map(Number);
  if (
    seen.code !== 0 ||
    !real?.startsWith('/') ||
    !Number.isSafeInteger(dev) ||
    !Number.isSafeInteger(ino)
  ) {
    throw new PermissionDeniedError(
      `workspace.from ${from}: uid ${uid}, the user the client runs as, cannot read and search it, and ${key} is not an admin key: mount a folder that user can read (or give it read and search rights: chmod, setfacl), run the client as a user who can, or ask an admin key`,
      { code: 'workspace_denied' },
    );
  }
  return { from: real, user: { uid, dev: dev as number, ino: ino as number } };
}

/**
 * Run as U with the folder as $1: exit 3 if it does not exist, 4 if it is no folder, 5 if U
 * cannot read and search it; else prints its real path (symlinks resolved as U) and `dev ino`.
 * Everything after the `cd` is of the folder the `cd` reached, whatever is renamed meanwhile.
 */
const FOLDER_CHECK = `test -e "$1" || exit 3
test -d "$1" || exit 4
cd -P "$1" 2>/dev/null && test -r . && test -x . || exit 5
pwd -P && stat -c '%d %i' .`;

/**
 * Run as U with `d:FOLDER` and `f:FILE` arguments: prints (NUL-terminated) each that U may not
 * write: a folder U cannot write and search, a file U cannot write.
 */
const WRITE_CHECK = `for p; do case "$p" in
d:*) d="\${p#d:}"; { test -d "$d" && test -w "$d" && test -x "$d"; } || printf '%s\\0' "$p";;
f:*) f="\${p#f:}"; test -w "$f" || printf '%s\\0' "$p";;
esac; done`;

/** U's primary gid (from the account database, NSS included), or undefined for no account. */
async function primaryGid(uid: number): Promise<number | undefined> {
  try {
    const { stdout } = await execFileAsync('getent', ['passwd', String(uid)], {
      timeout: ACCESS_CHECK_TIMEOUT_MS,
    });
    const gid = Number(stdout.split(':')[3]);
    return Number.isSafeInteger(gid) ? gid : undefined;
  } catch {
    return undefined;
  }
}

/**
 * `setpriv`'s options that make a process host uid `uid` with its primary gid and supplementary
 * groups (a uid with no account: gid 65534, no groups).
 */
export async function setprivIds(uid: number): Promise<string[]> {
  if (!Number.isSafeInteger(uid) || uid < 0) throw new Error(`no uid: ${uid}`);
  const gid = await primaryGid(uid);
  return gid === undefined
    ? [`--reuid=${uid}`, '--regid=65534', '--clear-groups']
    : [`--reuid=${uid}`, `--regid=${gid}`, '--init-groups'];
}

/**
 * Runs a shell script as host uid `uid` with its primary gid and supplementary groups (a uid
 * with no account: gid 65534, no groups), no capabilities; its exit code and output.
 */
async function asUser(
  uid: number,
  script: string,
  args: string[],
): Promise<{ code: number; stdout: string }> {
  const ids = await setprivIds(uid);
  try {
    const { stdout } = await execFileAsync(
      'setpriv',
      [...ids, '--inh-caps=-all', '--', '/bin/sh', '-c', script, 'sh', ...args],
      {
        timeout: ACCESS_CHECK_TIMEOUT_MS,
        killSignal: 'SIGKILL',
        env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin', LC_ALL: 'C' },
        maxBuffer: 64 * 1024 * 1024,
        cwd: '/',
      },
    );
    return { code: 0, stdout };
  } catch (error) {
    const failed = error as { code?: unknown; stdout?: string; killed?: boolean };
    if (typeof failed.code !== 'number' || failed.killed) {
      throw new Error(
        `the check of what uid ${uid} may read or write did not finish${failed.killed ? ` in ${ACCESS_CHECK_TIMEOUT_MS / 1000} s` : ''}: ${(error as Error).message}`,
      );
    }
    return { code: failed.code, stdout: failed.stdout ?? '' };
  }
}

async function lstatOrNull(path: string) {
  return lstat(path).catch(() => null);
}

/**
 * Why an apply of `chosen` (validated changes of the folder `base`, the view `view`) would write
 * where uid `uid` may not (none: it may write all of it). Each path it writes, creates or
 * removes must be one U could: its parent folder (the nearest one that exists, for a path whose
 * folders the apply makes) writable and searchable by U, a file it replaces writable by U, and in
 * a sticky folder (/tmp's kind) a file U or the folder's owner owns; a folder the apply removes
 * once emptied, the same of its parent. Checked as U, one child per 200 paths.
 */
export async function workspaceWriteRefusals(
  uid: number,
  base: string,
  view: string,
  chosen: readonly WorkspaceChange[],
): Promise<Refusal[]> {
  /** What U must be allowed (`d:` or `f:` and an absolute path) → the change paths needing it. */
  const needs = new Map<string, Set<string>>();
  const refusals: Refusal[] = [];
  const need = (check: string, path: string) => {
    const set = needs.get(check) ?? new Set<string>();
    set.add(path);
    needs.set(check, set);
  };
  /** A path replaced or removed in its folder: the folder's rights, the file's, the sticky bit. */
  const touch = async (rel: string, path: string, replaced: boolean) => {
    let folder = posix.dirname(rel);
    // The nearest folder that exists: where the apply creates the first missing one.
    while (folder !== '.' && !(await lstatOrNull(posix.join(base, folder)))?.isDirectory()) {
      folder = posix.dirname(folder);
    }
    const parent = posix.join(base, folder);
    need(`d:${parent}`, path);
    const entry = await lstatOrNull(posix.join(base, rel));
    if (!entry) return;
    if (replaced && entry.isFile()) need(`f:${posix.join(base, rel)}`, path);
    const ps = await lstatOrNull(parent);
    if (ps && ps.mode & 0o1000 && entry.uid !== uid && ps.uid !== uid) {
      refusals.push({
        path,
        reason: `uid ${uid} (the user the workspace was mounted for) may not replace or remove it: its folder is sticky and neither is that user's`,
      });
    }
  };
  for (const c of chosen) {
    if (c.status === 'deleted') {
      await touch(c.path, c.path, false);
      // The folders it empties go too, up to the first the view still has.
      let folder = posix.dirname(c.path);
      while (folder !== '.' && !(await lstatOrNull(posix.join(view, folder)))?.isDirectory()) {
        need(`d:${posix.join(base, posix.dirname(folder))}`, c.path);
        folder = posix.dirname(folder);
      }
      continue;
    }
    if (c.status === 'renamed' && c.from !== undefined) await touch(c.from, c.path, false);
    await touch(c.path, c.path, true);
  }
  const checks = [...needs.keys()];
  for (let at = 0; at < checks.length; at += 200) {
    const { code, stdout } = await asUser(uid, WRITE_CHECK, checks.slice(at, at + 200));
    if (code !== 0) throw new Error(`the check of what uid ${uid} may write failed (exit ${code})`);
    for (const failed of stdout.split('\0').filter(Boolean)) {
      const what = failed.startsWith('d:') ? 'write and search the folder' : 'write the file';
      for (const path of needs.get(failed) ?? []) {
        refusals.push({
          path,
          reason: `uid ${uid} (the user the workspace was mounted for) may not ${what} ${failed.slice(2)}`,
        });
      }
    }
  }
  return refusals;
}
