/**
 * Workspaces on the Docker provider (docs/workspaces.md, "On the Docker provider"): the daemon
 * mounts the overlay on the host as the local provider does (../local/workspace-mount.ts: the
 * host folder idmapped read-only as the lower layer, upper and work in the sandbox's folder, the
 * overlay at `merged`), its lower mapping the folder's owner to the host uid of the container's
 * user, and the engine binds `merged` into the container at the workspace's path. The daemon
 * reads the changes through its own mount of `merged`, as on the local provider.
 */
import { readFileSync } from 'node:fs';
import type { EngineFacts } from './engine.js';
import type { MountSettings } from './engine-client.js';
import { mountDevice } from './volumes.js';

/**
 * Why this daemon cannot mount a workspace in a container of the engine at `address` (undefined:
 * it can). `facts`: the engine's, when known (a rootless engine, or an unknown userns-remap
 * range, is only refused once it is).
 */
export function dockerWorkspaceUnavailable(
  address: string,
  facts: EngineFacts | undefined,
): string | undefined {
  if (process.getuid?.() !== 0) {
    return 'the docker provider mounts a workspace only for a root daemon for now (the daemon mounts an idmapped copy of the folder and an overlay on the host, which the engine binds into the container): run the daemon as root';
  }
  if (!(address.startsWith('/') || address.startsWith('unix://'))) {
    return `the docker provider mounts a workspace only with the Docker engine on the daemon's host (the overlay is mounted on this host), and the engine at ${address} is not reached through a socket of this host`;
  }
  if (facts?.rootless) {
    return "the docker provider mounts a workspace only with a root Docker engine: a rootless engine's containers run in a user namespace of its own, which the folder's owner is not mapped into";
  }
  if (facts?.usernsRemap && facts.usernsRoot === undefined) {
    return "the docker provider cannot tell which host uid a container's user is: the engine remaps uids (userns-remap) and its data root does not name the range (…/<uid>.<gid>)";
  }
  return undefined;
}

/** The host uid of the container's user `uid` (its root is another under userns-remap). */
export function workspaceHostUid(facts: EngineFacts, uid: number): number {
  return (facts.usernsRemap ? (facts.usernsRoot ?? 0) : 0) + uid;
}

/** The bind of the host's merged overlay at the workspace's path, writable. */
export function workspaceBind(merged: string, path: string): MountSettings {
  return { Type: 'bind', Source: merged, Target: path, ReadOnly: false };
}

/**
 * Why the container whose init is `pid` does not see the overlay at `merged` at `path` (an
 * engine in another mount namespace than the daemon's would bind the empty folder under it), or
 * undefined when it does: the two mounts' devices are compared, no path is resolved.
 */
export function workspaceMissing(pid: number, merged: string, path: string): string | undefined {
  const host = mountDevice(readFileSync('/proc/self/mountinfo', 'utf8'), merged);
  const inside = mountDevice(readFileSync(`/proc/${pid}/mountinfo`, 'utf8'), path);
  if (host && inside === host) return undefined;
  return `its workspace at ${path} is not the overlay ${merged} in the container (the Docker engine runs in another mount namespace than this daemon?); run the daemon in the engine's mount namespace`;
}
