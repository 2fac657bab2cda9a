/**
 * Workspaces through the control plane (docs/workspaces.md, "Workspaces in sandboxes"): a
 * create's `workspace: { from, path? }` checked and authorized, and a running sandbox's changes
 * and diff read from its workspace's merged view on the host.
 */
import { statSync } from 'node:fs';
import { posix } from 'node:path';
import { InvalidArgumentError } from '../errors.js';
import {
  type SandboxHandle,
  type SandboxProvider,
  workspaceUnavailableOn,
} from '../providers/provider.js';
import {
  type ApplyResult,
  apply as applyChanges,
  type WorkspaceChanges,
  type WorkspaceDiff,
  WorkspaceError,
  WorkspaceRefusedError,
  WorkspaceWriteError,
  changes as workspaceChanges,
  diff as workspaceDiff,
} from '../workspace/index.js';
import { checkMountPath, mountPathsOverlap } from './volume-service.js';
import { type WorkspaceUser, workspaceAccess, workspaceWriteRefusals } from './workspace-access.js';
import { applyAsUser } from './workspace-apply-as.js';
import { uploadedWorkspace } from './workspace-uploads.js';

/** Where a workspace appears in the sandbox when the create names no `path`. */
export function defaultWorkspacePath(home: string): string {
  return posix.join(home, 'workspace');
}

/**
 * A create's `workspace`, checked (undefined: none); who may mount it is authorizeWorkspace's.
 * The provider checks the folder itself (an existing directory) and refuses what it cannot mount.
 */
export function checkWorkspaceRequest(
  value: unknown,
  provider: SandboxProvider,
  home: string,
  volumePaths: readonly string[],
): { from: string; path: string } | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw new InvalidArgumentError(
      'workspace must be an object { from, path? }: from a host folder (absolute), path where the sandbox sees it',
    );
  }
  const { from, path, ...rest } = value as Record<string, unknown>;
  const unknown = Object.keys(rest);
  if (unknown.length > 0) {
    throw new InvalidArgumentError(`workspace.${unknown[0]} is not a workspace key (from, path)`);
  }
  if (typeof from !== 'string' || !from.startsWith('/') || from.includes('\0')) {
    throw new InvalidArgumentError(
      `workspace.from must be the absolute path of a folder on the daemon's host, not ${JSON.stringify(from)}`,
    );
  }
  const unavailable = workspaceUnavailableOn(provider);
  if (unavailable !== undefined) throw new InvalidArgumentError(`workspace: ${unavailable}`);
  const mountPath = checkMountPath(path ?? defaultWorkspacePath(home), home, 'workspace');
  const volume = volumePaths.find((other) => mountPathsOverlap(other, mountPath));
  if (volume !== undefined) {
    throw new InvalidArgumentError(
      `workspace.path ${mountPath} overlaps the path of a volume (${volume}): give each its own folder`,
    );
  }
  return { from, path: mountPath };
}

/**
 * Whether `who` (undefined: the daemon's own key) may mount the checked workspace's host folder,
 * from a local process of host uid `peerUid` (undefined: remote or unknown), by the rule of
 * workspace-access.ts: the workspace to mount (`from` as that uid resolved it, and `user`, the
 * uid mapped to the sandbox's user), or a 403 `workspace_denied`.
 */
export async function authorizeWorkspace(
  workspace: { from: string; path: string },
  who: { admin: boolean; name: string; keyId: string } | undefined,
  peerUid: number | undefined,
): Promise<{ from: string; path: string; user?: WorkspaceUser }> {
  const grant = await workspaceAccess(workspace.from, {
    admin: who === undefined || who.admin,
    ...(who ? { key: { name: who.name, keyId: who.keyId } } : {}),
    peerUid,
  });
  return { ...workspace, from: grant.from, ...(grant.user ? { user: grant.user } : {}) };
}

/** A running sandbox's workspace as its handle has it, or a 400 saying it has none. */
function workspaceOf(id: string, handle: SandboxHandle): NonNullable<SandboxHandle['workspace']> {
  if (!handle.workspace) {
    throw new InvalidArgumentError(
      `sandbox ${id} has no workspace: create it with workspace: { from, path? }`,
    );
  }
  return handle.workspace;
}

/** A core WorkspaceError as the API's 400 (a refusal lists every path refused and why). */
function asApiError(error: unknown): unknown {
  if (error instanceof WorkspaceRefusedError) {
    return new InvalidArgumentError(error.message, { code: 'workspace_refused' });
  }
  if (error instanceof WorkspaceWriteError) {
    const { path, written, rolledBack, notRestored } = error;
    return new InvalidArgumentError(error.message, {
      code: 'workspace_write_failed',
      details: { path, written, rolledBack, notRestored },
    });
  }
  if (error instanceof WorkspaceError) return new InvalidArgumentError(error.message);
  return error;
}

/**
 * What changed in a running sandbox's workspace: base = the host folder, view = the merged
 * overlay the daemon mounted, with its upper layer as the hint (only it is walked).
 */
export async function sandboxWorkspaceChanges(
  id: string,
  handle: SandboxHandle,
  options: { includeGit?: boolean } = {},
): Promise<WorkspaceChanges> {
  const workspace = workspaceOf(id, handle);
  try {
    return await workspaceChanges(workspace.from, workspace.view, {
      upper: workspace.upper,
      ...(options.includeGit ? { includeGit: true } : {}),
    });
  } catch (error) {
    throw asApiError(error);
  }
}

/** The git patch of a running sandbox's workspace changes. */
export async function sandboxWorkspaceDiff(
  id: string,
  handle: SandboxHandle,
  options: { includeGit?: boolean } = {},
): Promise<WorkspaceDiff> {
  const found = await sandboxWorkspaceChanges(id, handle, options);
  try {
    return await workspaceDiff(found);
  } catch (error) {
    throw asApiError(error);
  }
}

/** `POST …/workspace/apply`'s body, checked. */
export function checkApplyRequest(body: unknown): {
  paths?: string[];
  dryRun?: boolean;
  force?: boolean;
} {
  if (body === undefined || body === null) return {};
  if (typeof body !== 'object' || Array.isArray(body)) {
    throw new InvalidArgumentError('the body must be a JSON object { paths?, dryRun?, force? }');
  }
  const { paths, dryRun, force, ...rest } = body as Record<string, unknown>;
  const unknown = Object.keys(rest);
  if (unknown.length > 0) {
    throw new InvalidArgumentError(`${unknown[0]} is not an apply key (paths, dryRun, force)`);
  }
  if (
    paths !== undefined &&
    (!Array.isArray(paths) || paths.some((p) => typeof p !== 'string' || p === ''))
  ) {
    throw new InvalidArgumentError('paths must be a list of relative paths (files or folders/)');
  }
  for (const [name, flag] of [
    ['dryRun', dryRun],
    ['force', force],
  ] as const) {
    if (flag !== undefined && typeof flag !== 'boolean') {
      throw new InvalidArgumentError(`${name} must be true or false, not ${JSON.stringify(flag)}`);
    }
  }
  return {
    ...(paths ? { paths: paths as string[] } : {}),
    ...(dryRun === undefined ? {} : { dryRun: dryRun as boolean }),
    ...(force === undefined ? {} : { force: force as boolean }),
  };
}

/**
 * Applies a running sandbox's workspace changes to its host folder; `since` (when the sandbox
 * was created) makes a host edit made meanwhile a conflict.
 */
export async function sandboxWorkspaceApply(
  id: string,
  handle: SandboxHandle,
  since: number,
  body: unknown,
): Promise<ApplyResult> {
  const options = checkApplyRequest(body);
  if (uploadedWorkspace(workspaceOf(id, handle).from)) {
    throw new InvalidArgumentError(
      `sandbox ${id}'s workspace was uploaded by a client: its changes are applied on the client's machine (sandbox.workspace.applyLocal(), abx apply ${id} --local DIR), not to the daemon's copy`,
    );
  }
  const found = await sandboxWorkspaceChanges(id, handle);
  try {
    const uid = handle.workspace?.uid;
    let plan: ApplyResult | undefined;
    if (uid !== undefined) {
      // Mounted for a local client's user: validated first, then refused wherever that user
      // could not write (workspace-access.ts); nothing is written if anything is refused.
      plan = await applyChanges(found, { since, ...options, dryRun: true });
      const refused = await workspaceWriteRefusals(uid, found.base, found.view, plan.applied);
      if (refused.length > 0) throw new WorkspaceRefusedError(refused);
      if (options.dryRun) return plan;
    }
    // Written as that user, or the folder's owner, never as root (workspace-apply-as.ts): a
    // root daemon checks first, then a process of that user writes.
    const writer = uid ?? statSync(found.base).uid;
    if (process.getuid?.() === 0 && writer !== 0) {
      plan ??= await applyChanges(found, { since, ...options, dryRun: true });
      if (options.dryRun) return plan;
      return await applyAsUser(writer, found, plan, { since, ...options });
    }
    return await applyChanges(found, { since, ...options });
  } catch (error) {
    throw asApiError(error);
  }
}
