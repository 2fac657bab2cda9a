/**
 * Volumes: storage that outlives every sandbox, made by the provider's {@link VolumeStore} and
 * mounted by sandboxes (`volumeMounts` on create). Each belongs to the API key that made it (the
 * daemon's own key: `null`), and its name is unique among that key's volumes. The registry keeps
 * the rows; the provider keeps the bytes, in `$ABX_HOME/volumes/<id>` where it keeps them here.
 */

import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { join, posix } from 'node:path';
import { InvalidArgumentError, VolumeConflictError, VolumeNotFoundError } from '../errors.js';
import type {
  SandboxProvider,
  VolumeFiles,
  VolumeMountSpec,
  VolumeSpec,
  VolumeUsage,
} from '../providers/provider.js';
import { parseSize } from '../util/size.js';
import type { Registry, VolumeMountRecord, VolumeRecord } from './registry.js';

/** What a volume's name may be: E2B's letters, digits, `_` and `-`, at most 63 of them. */
export const VOLUME_NAME = /^[A-Za-z0-9_-]{1,63}$/;
/** A volume's size when its create names none. */
export const DEFAULT_VOLUME_BYTES = 1024 ** 3;
/** The smallest and largest volumes (ext4 needs a few MiB for itself). */
export const MIN_VOLUME_BYTES = 16 * 1024 ** 2;
export const MAX_VOLUME_BYTES = 1024 ** 4;
/** The most volumes one sandbox mounts. */
export const MAX_VOLUME_MOUNTS = 16;

/** What `POST /v1/volumes` takes. */
export interface CreateVolumeRequest {
  name?: unknown;
  /** Bytes, or a size such as `512M` or `2GiB`; default 1 GiB. */
  size?: unknown;
}

/** A volume with what it holds now and who mounts it. */
export interface VolumeDetails {
  record: VolumeRecord;
  usage: VolumeUsage;
  /** Ids of the live sandboxes that mount it. */
  users: string[];
}

/** A volume's name, checked. */
export function checkVolumeName(name: unknown): string {
  if (typeof name !== 'string' || !VOLUME_NAME.test(name)) {
    throw new InvalidArgumentError(
      `a volume name is 1 to 63 letters, digits, _ and -, not ${JSON.stringify(name)}`,
      { code: 'invalid_volume_name' },
    );
  }
  return name;
}

function checkVolumeSize(size: unknown): number {
  if (size === undefined || size === null) return DEFAULT_VOLUME_BYTES;
  const bytes = typeof size === 'number' || typeof size === 'string' ? parseSize(size) : undefined;
  if (bytes === undefined || bytes < MIN_VOLUME_BYTES || bytes > MAX_VOLUME_BYTES) {
    throw new InvalidArgumentError(
      `size must be a number of bytes or a size such as 512M or 2G, from 16M to 1T, not ${JSON.stringify(size)}`,
    );
  }
  return bytes;
}

/**
 * The places a volume may be mounted in a sandbox whose home is `home`: a folder inside the home,
 * /tmp or /mnt (never one of those itself, nor the system's folders: they are read-only or the
 * sandbox's own).
 */
export function mountRoots(home: string): string[] {
  return [home, '/tmp', '/mnt'];
}

/**
 * Whether two mounts' paths (canonical, checkMountPath's) overlap: the same, or one inside the
 * other. Volumes and a workspace each need a folder of their own.
 */
export function mountPathsOverlap(a: string, b: string): boolean {
  return a === b || a.startsWith(`${b}/`) || b.startsWith(`${a}/`);
}

/**
 * A mount's path: absolute and canonical (no `.`, `..`, `//` or trailing `/`), inside one of
 * {@link mountRoots}, and printable.
 */
export function checkMountPath(path: unknown, home: string, where: string): string {
  if (typeof path !== 'string' || path === '') {
    throw new InvalidArgumentError(`${where}.path must be an absolute path such as /mnt/data`);
  }
  if (path.length > 1024 || [...path].some((c) => c.charCodeAt(0) < 0x20 || c === '\x7f')) {
    throw new InvalidArgumentError(
      `${where}.path holds a control character or is longer than 1024 characters`,
    );
  }
  if (!path.startsWith('/')) {
    throw new InvalidArgumentError(`${where}.path must be absolute, not ${JSON.stringify(path)}`);
  }
  if (posix.normalize(path) !== path || path.endsWith('/')) {
    throw new InvalidArgumentError(
      `${where}.path must not contain '.' or '..' parts, '//' or a trailing '/': ${JSON.stringify(path)}`,
    );
  }
  const roots = mountRoots(home);
  if (!roots.some((root) => path.startsWith(`${root}/`))) {
    throw new InvalidArgumentError(
      `${where}.path ${path} is not a place a volume can go: mount it in a folder inside ${roots.join(', ')} (for example /mnt/data); the system's folders are read-only and ${roots.join(', ')} themselves are the sandbox's own`,
    );
  }
  return path;
}

/** A volume as the API shows it. */
export function volumeJson(volume: VolumeRecord, details?: Omit<VolumeDetails, 'record'>) {
  return {
    volumeId: volume.id,
    name: volume.name,
    sizeBytes: volume.sizeBytes,
    createdAt: new Date(volume.createdAt).toISOString(),
    ...(details
      ? {
          usedBytes: details.usage.used,
          totalBytes: details.usage.total,
          quotaEnforced: details.usage.enforced,
          usedBy: details.users,
        }
      : {}),
  };
}

export class VolumeService {
  /** Removals of this daemon under way, one at a time per volume. */
  private readonly busy = new Map<string, Promise<unknown>>();

  constructor(
    private readonly registry: Registry,
    private readonly provider: SandboxProvider,
    /** `$ABX_HOME/volumes`: one folder per volume, its storage where the provider keeps it. */
    private readonly volumesDir: string,
  ) {}

  /** The provider's volumes, or why there are none here. */
  private store() {
    const store = this.provider.volumes;
    const why = store ? store.unavailable() : `the ${this.provider.name} provider has no volumes`;
    if (!store || why !== undefined) {
      throw new InvalidArgumentError(`volumes are not available: ${why}`, {
        code: 'volumes_unavailable',
      });
    }
    return store;
  }

  /** What the provider needs of a volume. */
  spec(volume: VolumeRecord): VolumeSpec {
    return {
      id: volume.id,
      name: volume.name,
      sizeBytes: volume.sizeBytes,
      dir: join(this.volumesDir, volume.id),
    };
  }

  private one<T>(key: string, work: () => Promise<T>): Promise<T> {
    const before = this.busy.get(key) ?? Promise.resolve();
    const run = before.then(work, work);
    const settled = run.catch(() => undefined);
    this.busy.set(key, settled);
    settled.then(() => {
      if (this.busy.get(key) === settled) this.busy.delete(key);
    });
    return run;
  }

  /**
   * Makes a volume for `owner`: its row first (so two creates of one name never both make
   * storage), then its storage; a failure removes the row again.
   */
  async create(owner: string | null, request: CreateVolumeRequest): Promise<VolumeRecord> {
    const name = checkVolumeName(request.name);
    const sizeBytes = checkVolumeSize(request.size);
    const store = this.store();
    const record: VolumeRecord = {
      id: `vol_${randomBytes(10).toString('hex')}`,
      name,
      owner,
      sizeBytes,
      createdAt: Date.now(),
    };
    if (!(await this.registry.insertVolume(record))) {
      throw new VolumeConflictError(
        `a volume named ${name} exists already; pick another name, or remove it first (abx volume rm ${name})`,
        { code: 'volume_exists' },
      );
    }
    try {
      await store.create(this.spec(record));
    } catch (error) {
      await this.registry.removeVolume(record.id).catch(() => undefined);
      rmSync(this.spec(record).dir, { recursive: true, force: true });
      throw error;
    }
    return record;
  }

  /** The volumes of `owner` (null: the daemon's own key), by name. */
  list(owner: string | null): Promise<VolumeRecord[]> {
    return this.registry.listVolumes(owner);
  }

  /** The volume `name` of `owner`, or VolumeNotFoundError. */
  async get(owner: string | null, name: string): Promise<VolumeRecord> {
    const volume = await this.registry.findVolume(owner, checkVolumeName(name));
    if (!volume) {
      throw new VolumeNotFoundError(
        `no volume named ${name}; make it first (abx volume create ${name}), or see abx volume ls`,
      );
    }
    return volume;
  }

  /**
   * The volume of id `id` if it is `owner`'s (undefined: anyone's), or VolumeNotFoundError
   * (another key's too).
   */
  async byId(owner: string | null | undefined, id: string): Promise<VolumeRecord> {
    const volume = await this.registry.getVolume(id);
    if (!volume || (owner !== undefined && volume.owner !== owner)) {
      throw new VolumeNotFoundError(
        `no volume has the id ${JSON.stringify(id.slice(0, 100))} among this key's volumes; see abx volume ls, or make one`,
      );
    }
    return volume;
  }

  /** The provider's way to a volume's files without a sandbox, or why there is none. */
  files(): VolumeFiles {
    const files = this.store().files;
    if (!files) {
      throw new InvalidArgumentError(
        `the ${this.provider.name} provider does not reach a volume's files from the daemon: read and write them in a sandbox that mounts the volume`,
        { code: 'volume_files_unavailable' },
      );
    }
    return files;
  }

  /** A volume with what it holds and who mounts it. */
  async details(volume: VolumeRecord): Promise<VolumeDetails> {
    const [usage, users] = await Promise.all([
      this.store().usage(this.spec(volume)),
      this.registry.volumeUsers(volume.id),
    ]);
    return { record: volume, usage, users };
  }

  /**
   * Removes a volume and everything in it, refused (VolumeConflictError, `volume_in_use`) while
   * a live sandbox mounts it; false when it was gone already.
   */
  async remove(volume: VolumeRecord): Promise<boolean> {
    return this.one(volume.id, async () => {
      const { removed, users } = await this.registry.removeVolume(volume.id);
      if (users.length > 0) {
        throw new VolumeConflictError(
          `volume ${volume.name} is mounted by ${users.length === 1 ? 'sandbox' : 'sandboxes'} ${users.join(', ')}: kill ${users.length === 1 ? 'it' : 'them'} first (abx kill ${users.join(' ')})`,
          { code: 'volume_in_use', details: { users } },
        );
      }
      if (!removed) return false;
      // The row is gone first: no create can mount it any more; then its storage.
      await this.store().remove(this.spec(volume));
      rmSync(this.spec(volume).dir, { recursive: true, force: true });
      return true;
    });
  }

  /**
   * A create's `volumeMounts` (`[{ name, path, readOnly? }]`) for `owner`'s sandbox whose home is
   * `home`: every volume exists, every path is allowed, and no two paths are one or inside one
   * another. Returns what the registry keeps and what the provider mounts.
   */
  async mounts(
    value: unknown,
    owner: string | null,
    home: string,
  ): Promise<{ records: VolumeMountRecord[]; specs: VolumeMountSpec[] }> {
    if (value === undefined || value === null) return { records: [], specs: [] };
    if (!Array.isArray(value)) {
      throw new InvalidArgumentError(
        'volumeMounts must be a list of { name, path, readOnly? } such as [{ "name": "data", "path": "/mnt/data" }]',
      );
    }
    if (value.length === 0) return { records: [], specs: [] };
    if (value.length > MAX_VOLUME_MOUNTS) {
      throw new InvalidArgumentError(
        `a sandbox mounts at most ${MAX_VOLUME_MOUNTS} volumes, not ${value.length}`,
      );
    }
    this.store();
    const records: VolumeMountRecord[] = [];
    const specs: VolumeMountSpec[] = [];
    for (const [index, item] of value.entries()) {
      const where = `volumeMounts[${index}]`;
      if (typeof item !== 'object' || item === null || Array.isArray(item)) {
        throw new InvalidArgumentError(`${where} must be an object { name, path, readOnly? }`);
      }
      const { name, path, readOnly, ...rest } = item as Record<string, unknown>;
      const unknown = Object.keys(rest);
      if (unknown.length > 0) {
        throw new InvalidArgumentError(
          `${where}.${unknown[0]} is not a mount key (name, path, readOnly)`,
        );
      }
      if (readOnly !== undefined && typeof readOnly !== 'boolean') {
        throw new InvalidArgumentError(`${where}.readOnly must be true or false`);
      }
      const mountPath = checkMountPath(path, home, where);
      for (const other of records) {
        if (mountPathsOverlap(other.path, mountPath)) {
          throw new InvalidArgumentError(
            `${where}.path ${mountPath} ${other.path === mountPath ? 'is' : 'overlaps'} the path of another mount (${other.path}): give each volume a folder of its own`,
          );
        }
      }
      const volume = await this.registry.findVolume(owner, checkVolumeName(name));
      if (!volume) {
        throw new VolumeNotFoundError(
          `${where}: no volume named ${name as string}; make it first (abx volume create ${name as string})`,
        );
      }
      records.push({
        id: volume.id,
        name: volume.name,
        path: mountPath,
        readOnly: readOnly === true,
      });
      specs.push({ volume: this.spec(volume), path: mountPath, readOnly: readOnly === true });
    }
    return { records, specs };
  }

  /** Whether every volume of `mounts` still exists (a create that lost a race to a removal). */
  async allExist(mounts: readonly VolumeMountRecord[]): Promise<boolean> {
    const found = await Promise.all(mounts.map((m) => this.registry.getVolume(m.id)));
    return found.every(Boolean);
  }
}
