/**
 * E2B's volumes on abx's (docs/volumes.md): `POST /volumes`, `GET /volumes`, `GET` and `DELETE
 * /volumes/{volumeID}`, and a create's `volumeMounts`, checked as E2B's server checks them (one
 * `invalid mounts:` message listing every bad mount) with abx's rule of where a volume may go.
 * Ids are abx's (`vol_…`); a key sees its own volumes only. See docs/e2b.md.
 */
import { posix } from 'node:path';
import { InvalidArgumentError, VolumeConflictError } from '../../errors.js';
import type {
  E2bBackend,
  E2bCaller,
  E2bTemplateTraits,
  E2bVolume,
  E2bVolumeMount,
} from './backend.js';

/** What a volume route gets: the caller, its path's parameters and its JSON body. */
export interface VolumeCall {
  params: Record<string, string>;
  body: Record<string, unknown>;
  caller: E2bCaller;
  backend: E2bBackend;
}

/** A status and a JSON body (undefined: none). */
export interface VolumeAnswer {
  status: number;
  body: unknown;
}

/**
 * `VolumeAndToken`: `domain` is the gateway's host, as a sandbox's is, so the SDK's content calls
 * go to `https://api.{domain}` (this daemon) unless `E2B_VOLUME_API_URL` names where.
 */
function withToken(volume: E2bVolume, backend: E2bBackend) {
  return {
    volumeID: volume.id,
    name: volume.name,
    token: backend.volumeToken(volume.id),
    domain: backend.domain(),
  };
}

/** `Volume.create(name)`: **201** VolumeAndToken; a taken name is 400, as at E2B. */
export async function createVolume(call: VolumeCall): Promise<VolumeAnswer> {
  try {
    const volume = await call.backend.createVolume(call.body.name, call.caller);
    return { status: 201, body: withToken(volume, call.backend) };
  } catch (error) {
    if (error instanceof VolumeConflictError && error.code === 'volume_exists') {
      throw new InvalidArgumentError(error.message, { code: error.code });
    }
    throw error;
  }
}

/** `Volume.list()`: the caller's volumes, `[{ volumeID, name }]`. */
export async function listVolumes(call: VolumeCall): Promise<VolumeAnswer> {
  const volumes = await call.backend.listVolumes(call.caller);
  return { status: 200, body: volumes.map((v) => ({ volumeID: v.id, name: v.name })) };
}

/** `Volume.getInfo(id)`, `Volume.connect(id)`: VolumeAndToken; 404 for none. */
export async function getVolume(call: VolumeCall): Promise<VolumeAnswer> {
  const volume = await call.backend.getVolume(call.params.id as string, call.caller);
  return { status: 200, body: withToken(volume, call.backend) };
}

/** `Volume.destroy(id)`: **204**; 404 (the SDK's `false`); 409 while a sandbox mounts it. */
export async function removeVolume(call: VolumeCall): Promise<VolumeAnswer> {
  await call.backend.removeVolume(call.params.id as string, call.caller);
  return { status: 204, body: undefined };
}

/**
 * Why a mount path is refused, or undefined: E2B's rules (absolute, clean) in E2B's words, then
 * abx's (printable, inside one of `roots`).
 */
function pathProblem(path: unknown, roots: readonly string[]): string | undefined {
  if (path === undefined || path === null || path === '') return 'path cannot be empty';
  if (typeof path !== 'string') return `path must be a string, not ${JSON.stringify(path)}`;
  if (!path.startsWith('/')) return 'path must be absolute';
  if (posix.normalize(path) !== path || (path.endsWith('/') && path !== '/')) {
    return "path must not contain any '.' or '..' components";
  }
  if (path.length > 1024 || [...path].some((c) => c.charCodeAt(0) < 0x20 || c === '\x7f')) {
    return 'path holds a control character or is longer than 1024 characters';
  }
  if (!roots.some((root) => path.startsWith(`${root}/`))) {
    return `path '${path}' is not a place abx mounts a volume: use a folder inside ${roots.join(', ')} (for example /mnt/data); the system's folders are read-only and ${roots.join(', ')} themselves are the sandbox's own`;
  }
  return undefined;
}

/**
 * A create's `volumeMounts` (`[{ name, path }]`, what the SDK makes of `{ '/mnt/x': volume }`),
 * every mount checked before one is refused, as E2B's server does: 400 `invalid mounts:` with a
 * line per bad mount. Undefined when there are none.
 */
export async function volumeMountsOf(
  value: unknown,
  template: E2bTemplateTraits,
  caller: E2bCaller,
  backend: E2bBackend,
): Promise<(E2bVolumeMount & { readOnly?: unknown })[] | undefined> {
  if (value === undefined || value === null) return undefined;
  if (!Array.isArray(value)) {
    throw new InvalidArgumentError(
      `volumeMounts must be a list of { name, path } such as [{ "name": "data", "path": "/mnt/data" }], not ${JSON.stringify(value)}`,
    );
  }
  if (value.length === 0) return undefined;
  const owned = new Set((await backend.listVolumes(caller)).map((volume) => volume.name));
  const problems: string[] = [];
  const used: string[] = [];
  const mounts: (E2bVolumeMount & { readOnly?: unknown })[] = [];
  for (const [index, item] of value.entries()) {
    const problem = (reason: string) => problems.push(`\t- volume mount #${index}: ${reason}`);
    if (typeof item !== 'object' || item === null || Array.isArray(item)) {
      problem(`must be an object { name, path }, not ${JSON.stringify(item)}`);
      continue;
    }
    const { name, path, readOnly } = item as Record<string, unknown>;
    if (typeof name !== 'string' || !owned.has(name)) {
      problem(
        typeof name === 'string'
          ? `volume '${name}' not found`
          : `name must be a volume's name, not ${JSON.stringify(name)}`,
      );
      continue;
    }
    const reason = pathProblem(path, template.mountRoots);
    if (reason !== undefined) {
      problem(reason);
      continue;
    }
    const at = path as string;
    const other = used.find((p) => p === at || at.startsWith(`${p}/`) || p.startsWith(`${at}/`));
    if (other !== undefined) {
      problem(
        other === at
          ? `path '${at}' is already used`
          : `path '${at}' overlaps '${other}', the path of another mount: give each volume a folder of its own`,
      );
      continue;
    }
    used.push(at);
    // `readOnly` is abx's (E2B's mounts have none); the native create checks it.
    mounts.push({ name, path: at, ...(readOnly === undefined ? {} : { readOnly }) });
  }
  if (problems.length > 0) {
    throw new InvalidArgumentError(`invalid mounts:\n${problems.join('\n')}`);
  }
  return mounts;
}
