import type { VolumeInfo } from '../../runtime/protocol/wire.js';
import type { ConnectionOptions } from '../installation/daemon-connection.js';
import {
  createVolume,
  getVolume,
  listVolumes,
  openControl,
  removeVolume,
  type VolumeMountRequest,
} from './sandbox-api.js';

export type { VolumeInfo };

/**
 * Storage that outlives every sandbox (docs/volumes.md): made once, mounted by any number of
 * sandboxes at once (`volumeMounts` on `Sandbox.create`), read-write or read-only, its files the
 * sandbox user's in each. Its size is a quota. Names belong to the API key that made them.
 *
 * @example
 * const data = await Volume.create('data', { size: '2G' });
 * const a = await Sandbox.create({ volumeMounts: [{ name: 'data', path: '/mnt/data' }] });
 * const b = await Sandbox.create({ volumeMounts: { '/mnt/data': data } }); // E2B's form
 */
export class Volume {
  private constructor(
    readonly info: VolumeInfo,
    private readonly options: ConnectionOptions,
  ) {}

  /** Its name, unique among its key's volumes. */
  get name(): string {
    return this.info.name;
  }

  /** Its id (`vol_…`), never reused. */
  get volumeId(): string {
    return this.info.volumeId;
  }

  /**
   * Makes a volume. `size`: bytes, or `512M`, `2G` (16 MiB to 1 TiB; default 1 GiB). A name taken
   * already is a VolumeConflictError (`volume_exists`).
   */
  static async create(
    name: string,
    options: ConnectionOptions & { size?: number | string } = {},
  ): Promise<Volume> {
    const { size, ...connection } = options;
    const { client } = await openControl(connection);
    return new Volume(await createVolume(client, name, size), connection);
  }

  /** A volume by name, with what it holds now and the sandboxes that mount it. */
  static async get(name: string, options: ConnectionOptions = {}): Promise<Volume> {
    const { client } = await openControl(options);
    return new Volume(await getVolume(client, name), options);
  }

  /** The caller's volumes, by name (without their use: {@link Volume.get} has it). */
  static async list(options: ConnectionOptions = {}): Promise<VolumeInfo[]> {
    return listVolumes((await openControl(options)).client);
  }

  /**
   * Removes a volume and every file in it; false when there was none of that name. Refused
   * (VolumeConflictError, `volume_in_use`, naming them) while running or paused sandboxes mount it.
   */
  static async remove(name: string, options: ConnectionOptions = {}): Promise<boolean> {
    return removeVolume((await openControl(options)).client, name);
  }

  /** Removes this volume (see {@link Volume.remove}). */
  remove(): Promise<boolean> {
    return Volume.remove(this.name, this.options);
  }
}

/** A create's `volumeMounts`: a list, or E2B's map of path to volume (or its name). */
export type VolumeMounts =
  | readonly { name: string | Volume; path: string; readOnly?: boolean }[]
  | Readonly<Record<string, string | Volume>>;

/** The list the API takes. */
export function volumeMountList(mounts: VolumeMounts | undefined): VolumeMountRequest[] {
  if (!mounts) return [];
  const nameOf = (volume: string | Volume) => (typeof volume === 'string' ? volume : volume.name);
  if (Array.isArray(mounts)) {
    return (mounts as Exclude<VolumeMounts, Readonly<Record<string, string | Volume>>>).map(
      ({ name, path, readOnly }) => ({
        name: nameOf(name),
        path,
        ...(readOnly === undefined ? {} : { readOnly }),
      }),
    );
  }
  return Object.entries(mounts as Readonly<Record<string, string | Volume>>).map(
    ([path, volume]) => ({ name: nameOf(volume), path }),
  );
}
