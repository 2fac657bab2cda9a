/**
 * A workspace in a root daemon's sandbox (docs/workspaces.md): a host folder mounted
 * copy-on-write. In the sandbox's own folder (`spec.dir/workspace`):
 *
 * - `lower`: the host folder again, idmapped (read-only, nosuid, nodev) so that its owner's
 *   uid/gid (or the local client's user's it was mounted for) are the sandbox's host uid: the sandbox's user owns what the host user owns (other
 *   uids show as nobody). Detached again once the overlay holds its own copy of it.
 * - `upper`, `work`: the overlay's upper layer (everything the sandbox writes) and work folder.
 * - `merged`: the overlay, mounted by the daemon for the sandbox's life. The sandbox binds it at
 *   its `path`; the daemon reads the sandbox's changes through it (never through
 *   `/proc/PID/root`, which a path resolution leaves for the daemon's own root at the first
 *   absolute link). Unmounted at kill (and at a hibernate, mounted again at the wake).
 *
 * The host folder is the overlay's lower layer: nothing the sandbox does writes it.
 */
import { execFile } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, statSync } from 'node:fs';
import { lchown, lstat, readdir, rename, rm } from 'node:fs/promises';
import { posix } from 'node:path';
import { promisify } from 'node:util';
import { SANDBOX_RUN_DIR, SANDBOX_RUNTIME_DIR } from '../../../runtime/protocol/constants.js';
import { InvalidArgumentError } from '../../errors.js';
import type { SandboxHandle, SandboxSpec } from '../provider.js';
import { detachMount, idmapMount } from './idmap.js';
import { mountsUnder, unmountUnder } from './volumes.js';
import { removeLayers } from './workspace-userns.js';

const execFileAsync = promisify(execFile);

/** Paths a workspace may not be mounted at, on or under (nor on one of their parents). */
export const WORKSPACE_FORBIDDEN = ['/proc', '/sys', '/dev', SANDBOX_RUN_DIR, SANDBOX_RUNTIME_DIR];

/** The folder of a sandbox's workspace mounts and layers, in the sandbox's own folder. */
export function workspaceDir(sandboxDir: string): string {
  return posix.join(sandboxDir, 'workspace');
}

/**
 * A workspace as asked (`from` a host folder, `path` where the sandbox sees it), checked: a
 * refusal is an InvalidArgumentError naming what is wrong and what to do.
 */
export function checkWorkspaceSpec(workspace: { from: unknown; path: unknown }): {
  from: string;
  path: string;
} {
  const { from, path } = workspace;
  if (typeof from !== 'string' || !from.startsWith('/') || from.includes('\0')) {
    throw new InvalidArgumentError(
      `workspace.from must be an absolute path of a host folder, not ${JSON.stringify(from)}`,
    );
  }
  const st = statSync(from, { throwIfNoEntry: false });
  if (!st?.isDirectory()) {
    throw new InvalidArgumentError(
      `workspace.from ${from} is not an existing directory on the daemon's host`,
    );
  }
  if (
    typeof path !== 'string' ||
    !path.startsWith('/') ||
    path.includes('\0') ||
    path === '/' ||
    posix.normalize(path) !== path ||
    path.endsWith('/')
  ) {
    throw new InvalidArgumentError(
      `workspace.path must be an absolute, canonical path other than / (no '.', '..', '//' or trailing '/'), not ${JSON.stringify(path)}`,
    );
  }
  for (const place of WORKSPACE_FORBIDDEN) {
    if (path === place || path.startsWith(`${place}/`) || place.startsWith(`${path}/`)) {
      throw new InvalidArgumentError(
        `workspace.path ${path} overlaps ${place}, the sandbox's own: mount it elsewhere (for example /home/user/workspace)`,
      );
    }
  }
  return { from, path };
}

/** What a mounted workspace is: the overlay on the host, its upper layer. */
export interface MountedWorkspace {
  merged: string;
  upper: string;
}

/**
 * A started sandbox's handle's `workspace`: what the control plane reads and applies (the local
 * and docker providers alike). `mounted.merged` is where the daemon reads the sandbox's view.
 */
export function workspaceHandle(
  spec: SandboxSpec,
  mounted: MountedWorkspace,
  mountedAt: number,
): SandboxHandle['workspace'] {
  const workspace = spec.workspace as NonNullable<SandboxSpec['workspace']>;
  return {
    from: workspace.from,
    path: workspace.path,
    view: mounted.merged,
    upper: mounted.upper,
    dir: workspaceDir(spec.dir),
    mountedAt,
    ...(workspace.user ? { uid: workspace.user.uid } : {}),
  };
}

/**
 * Mounts `from` copy-on-write in `dir` (see the file's comment) for a sandbox running as host uid
 * `uid`. `user`: mounted for a local client's user (control/workspace-access.ts): its uid, not
 * the folder's owner, is mapped to `uid`, and the folder mounted must be the one checked (its
 * `dev` and `ino`, when given). Whatever an earlier mount left in `dir` (a hibernate's wake) is unmounted first; the
 * upper layer, if there is one, is kept. On failure nothing stays mounted.
 */
export async function mountWorkspace(
  dir: string,
  from: string,
  uid: number,
  user?: { uid: number; dev?: number; ino?: number },
): Promise<MountedWorkspace> {
  const lower = posix.join(dir, 'lower');
  const upper = posix.join(dir, 'upper');
  const work = posix.join(dir, 'work');
  const merged = posix.join(dir, 'merged');
  await unmountUnder(dir);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const owner = statSync(from);
  for (const folder of [lower, work, merged]) mkdirSync(folder, { recursive: true, mode: 0o700 });
  if (!existsSync(upper)) {
    // The overlay's root folder is its upper layer's: the host folder's mode, the sandbox's uid.
    mkdirSync(upper, { mode: 0o700 });
    chmodSync(upper, owner.mode & 0o7777);
    chownSync(upper, uid, uid);
  }
  try {
    await idmapMount(from, lower, user?.uid ?? owner.uid, uid, true);
    if (user?.dev !== undefined) {
      // Mounted for a local client's user: it must be the folder that user was checked on
      // (control/workspace-access.ts), not one put at its path since.
      const mounted = statSync(lower);
      if (mounted.dev !== user.dev || mounted.ino !== user.ino) {
        throw new Error(
          `${from} is no longer the folder uid ${user.uid} was checked on (it was replaced meanwhile)`,
        );
      }
    }
    // No redirect_dir, index or metacopy: a folder rename copies, every change is in the upper
    // layer as what the core's upper-layer hint expects (docs/workspaces.md).
    await execFileAsync('mount', [
      '-t',
      'overlay',
      'overlay',
      '-o',
      `lowerdir=${lower},upperdir=${upper},workdir=${work},redirect_dir=off,index=off,metacopy=off,nosuid,nodev`,
      merged,
    ]);
  } catch (error) {
    await unmountUnder(dir).catch(() => undefined);
    const stderr = String((error as { stderr?: unknown }).stderr ?? '').trim();
    throw new Error(
      `its workspace (${from}) could not be mounted: ${stderr || (error as Error).message}`,
      {
        cause: error,
      },
    );
  } finally {
    // The overlay keeps a private copy of its lower layer: the idmapped mount is not needed.
    if (mountsUnder(lower).includes(lower)) detachMount(lower);
  }
  return { merged, upper };
}

/**
 * The merged overlay bound again in `stage` (in the root-only-writable, world-searchable
 * VOLUME_STAGE_DIR), where the sandbox's bwrap (its unprivileged uid) can reach it, for the
 * instant of its start: the caller releases the stage (releaseStage) once the sandbox's mount
 * namespace holds its copy. Returns the bind's source.
 */
export async function stageWorkspace(merged: string, stage: string): Promise<string> {
  mkdirSync(posix.dirname(stage), { recursive: true, mode: 0o711 });
  mkdirSync(stage, { recursive: true, mode: 0o711 });
  const source = posix.join(stage, 'workspace');
  mkdirSync(source, { recursive: true });
  await execFileAsync('mount', ['--bind', merged, source]);
  return source;
}

/** Unmounts a sandbox's workspace (`dir`); `remove`: its layers go too. Throws if one stays. */
export async function unmountWorkspace(dir: string, remove: boolean): Promise<void> {
  if (!existsSync(dir)) return;
  await unmountUnder(dir);
  // Never a removal across a mount (checked above): only the sandbox's own layers are removed.
  if (remove) removeLayers(dir);
}

/**
 * Copies an upper layer (`from`, not written meanwhile: its sandbox frozen or stopped) to `to`,
 * which must not exist, as the overlay needs it: whiteouts (character devices 0/0), the
 * `trusted.overlay.*` attributes of opaque folders, owners, modes and times. `cp -a
 * --preserve=all` as root keeps them all (coreutils copies every xattr but those
 * /etc/xattr.conf skips, none of them an overlay's). Written to a partial folder renamed into
 * place: `to` is whole or absent.
 */
export async function copyLayer(from: string, to: string): Promise<void> {
  const partial = `${to}.partial`;
  await rm(partial, { recursive: true, force: true });
  mkdirSync(posix.dirname(to), { recursive: true, mode: 0o700 });
  try {
    await execFileAsync('cp', ['-a', '--preserve=all', '--no-target-directory', from, partial]);
    await rename(partial, to);
  } catch (error) {
    await rm(partial, { recursive: true, force: true });
    const stderr = String((error as { stderr?: unknown }).stderr ?? '').trim();
    throw new Error(
      `its workspace's upper layer (${from}) could not be copied: ${stderr || (error as Error).message}`,
      { cause: error },
    );
  }
}

/**
 * Gives a copied upper layer's files to another sandbox's uids: every owner and group in `ids`
 * (old → new) becomes its new id, links included (never followed). Anything else (root's
 * whiteouts) stays as it is.
 */
export async function remapOwners(dir: string, ids: ReadonlyMap<number, number>): Promise<void> {
  const walk = async (path: string): Promise<void> => {
    const st = await lstat(path);
    const uid = ids.get(st.uid);
    const gid = ids.get(st.gid);
    if (uid !== undefined || gid !== undefined) await lchown(path, uid ?? st.uid, gid ?? st.gid);
    if (!st.isDirectory()) return;
    for (const name of await readdir(path)) await walk(posix.join(path, name));
  };
  await walk(dir);
}
