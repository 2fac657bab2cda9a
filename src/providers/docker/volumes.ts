/**
 * The docker provider's volumes: one Docker named volume per abx volume (`abx-vol-<hex>`, labelled
 * with the abx id, name and size), mounted into sandbox containers as `Mounts` of type `volume`.
 *
 * - Quota: when this daemon is root and the engine a root engine on a local socket, the volume is
 *   the local provider's ext4 disk image (see ../local/volumes.ts: `<dir>/disk.img`, loop-mounted
 *   at `<dir>/mnt`) and the named volume a bind of that mount (`local` driver, `type: none, o:
 *   bind`). A write past its size fails with ENOSPC.
 * - Plain: otherwise (the engine elsewhere or rootless, the daemon not root) a plain named volume
 *   on the engine's disk; its size is reported, not enforced.
 *
 * Ownership: a new volume's root is root's (Docker's and mkfs's default). It is given to uid 1000
 * once, when it is made, through the engine: a tar holding that one folder entry (uid 1000, 0755)
 * is unpacked (`putArchive`) into a throwaway container that mounts the volume and never runs.
 * The engine maps the owner as it maps its containers' users, so the sandbox user owns it under
 * `--userns-remap` too, and files are never made root's. Docker's copy-up (an empty volume takes
 * the owner, mode and content of the image's folder at its mount point) is turned off
 * (`NoCopy`): the folder is usually not in the image, a template's files must not land in a
 * volume, and a fork's image holds the mount point as an empty root-owned folder, which copy-up
 * would make the owner of an empty volume.
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { END_OF_ARCHIVE, entryHeader } from '../../../runtime/envd/tar-format.js';
import { SandboxError, SandboxStartError, UnavailableError } from '../../errors.js';
import { LocalVolumes } from '../local/volumes.js';
import type { VolumeMountSpec, VolumeSpec, VolumeStore, VolumeUsage } from '../provider.js';
import { dockerMessage, type EngineFacts, engineError, statusOf } from './engine.js';
import { type DockerEngine, followProgress, type MountSettings } from './engine-client.js';
import { SANDBOX_USER_ID } from './passwd.js';

/** Labels of a volume's Docker volume: its abx id, name and size in bytes. */
export const VOLUME_ID_LABEL = 'abx.volume';
export const VOLUME_NAME_LABEL = 'abx.volume-name';
export const VOLUME_SIZE_LABEL = 'abx.volume-size';
/** An image with no files, for the throwaway containers that give a new volume its owner. */
const EMPTY_IMAGE = 'abx-empty:1';
/** Where the throwaway container mounts the volume. */
const OWN_AT = 'volume';

/** The Docker volume of an abx volume (`vol_<hex>` → `abx-vol-<hex>`). */
export function dockerVolumeName(volume: Pick<VolumeSpec, 'id'>): string {
  return `abx-vol-${volume.id.replace(/^vol_/, '')}`;
}

/** The `Mounts` entry of a volume in a sandbox's container. */
export function volumeMount(mount: VolumeMountSpec): MountSettings {
  return {
    Type: 'volume',
    Source: dockerVolumeName(mount.volume),
    Target: mount.path,
    ReadOnly: mount.readOnly,
    VolumeOptions: { NoCopy: true },
  };
}

/** Whether a volume has a disk of its own (made in quota mode). */
function hasDisk(volume: VolumeSpec): boolean {
  return existsSync(join(volume.dir, 'disk.img'));
}

/** The device (`major:minor`) of the mount at `point` in a mountinfo text, the topmost one. */
export function mountDevice(mountinfo: string, point: string): string | undefined {
  let device: string | undefined;
  for (const line of mountinfo.split('\n')) {
    const fields = line.split(' ');
    const at = fields[4]?.replace(/\\(\d{3})/g, (_, octal: string) =>
      String.fromCharCode(Number.parseInt(octal, 8)),
    );
    if (at === point) device = fields[2];
  }
  return device;
}

export class DockerVolumes implements VolumeStore {
  /** The quota mode's disks and host mounts: the local provider's, root-owned until given away. */
  private readonly disks = new LocalVolumes('root', 0);
  private empty: Promise<void> | undefined;

  constructor(
    private readonly docker: DockerEngine,
    /** What the engine offers (the provider's probe). */
    private readonly engine: () => Promise<EngineFacts>,
    /** The engine's address: a path or `unix://` is a socket of this host. */
    private readonly address: string,
  ) {}

  unavailable(): string | undefined {
    return undefined;
  }

  /**
   * Whether a volume made now gets a disk of its own: this daemon is root (it makes loop mounts)
   * and the engine is a root one on this host (it binds a folder of this host's).
   */
  async quota(): Promise<boolean> {
    return this.quotaWith(await this.engine());
  }

  /** {@link quota} for an engine that offers `facts`. */
  quotaWith(facts: EngineFacts): boolean {
    const local = this.address.startsWith('/') || this.address.startsWith('unix://');
    return process.getuid?.() === 0 && local && !facts.rootless;
  }

  async create(volume: VolumeSpec): Promise<void> {
    const name = dockerVolumeName(volume);
    const what = `volume ${volume.name} could not be made`;
    let quota: boolean;
    try {
      quota = await this.quota();
    } catch (error) {
      throw engineError(error, what, this.address);
    }
    const mnt = join(volume.dir, 'mnt');
    try {
      // The disk and its host mount (the local provider's: nothing is left when it fails).
      if (quota) await this.disks.create(volume);
      await this.docker.createVolume({
        Name: name,
        Driver: 'local',
        DriverOpts: quota ? { type: 'none', o: 'bind', device: mnt } : {},
        Labels: {
          [VOLUME_ID_LABEL]: volume.id,
          [VOLUME_NAME_LABEL]: volume.name,
          [VOLUME_SIZE_LABEL]: String(volume.sizeBytes),
        },
      });
      await this.giveToUser(name);
      // The engine reached the disk only if it sees this daemon's mount (one mount namespace).
      if (quota && statSync(mnt).uid === 0) {
        throw new Error(
          `the Docker engine does not see ${mnt} mounted (it runs in another mount namespace than this daemon); run the daemon in the engine's mount namespace`,
        );
      }
    } catch (error) {
      await this.remove(volume).catch(() => undefined);
      if (error instanceof SandboxError) throw error;
      const mapped = engineError(error, what, this.address);
      if (mapped instanceof UnavailableError) throw mapped;
      throw new SandboxStartError(`${what}: ${dockerMessage(error)}`, { cause: error });
    }
  }

  /**
   * Makes the volume's root uid 1000's (0755) through the engine: a folder entry unpacked into a
   * throwaway container that mounts it (created, never started, then removed).
   */
  private async giveToUser(name: string): Promise<void> {
    await this.emptyImage();
    const container = await this.docker.createContainer({
      Image: EMPTY_IMAGE,
      Entrypoint: ['/none'],
      Cmd: [],
      NetworkDisabled: true,
      Labels: { [VOLUME_ID_LABEL]: name },
      HostConfig: {
        NetworkMode: 'none',
        Mounts: [
          {
            Type: 'volume',
            Source: name,
            Target: `/${OWN_AT}`,
            ReadOnly: false,
            VolumeOptions: { NoCopy: true },
          },
        ],
      },
    });
    try {
      const root = entryHeader({
        name: Buffer.from(`${OWN_AT}/`),
        type: '5',
        mode: 0o755,
        uid: SANDBOX_USER_ID,
        gid: SANDBOX_USER_ID,
        size: 0,
        mtime: Math.floor(Date.now() / 1000),
      });
      await container.putArchive(Readable.from([root, END_OF_ARCHIVE]), { path: '/' });
    } finally {
      await container.remove({ force: true }).catch(() => undefined);
    }
  }

  /** {@link EMPTY_IMAGE}, imported from an empty tar when the engine lacks it. */
  private emptyImage(): Promise<void> {
    this.empty ??= (async () => {
      try {
        await this.docker.getImage(EMPTY_IMAGE).inspect();
        return;
      } catch (error) {
        if (statusOf(error) !== 404) throw error;
      }
      const [repo, tag] = EMPTY_IMAGE.split(':') as [string, string];
      const progress = await this.docker.importImage(Readable.from([END_OF_ARCHIVE]), {
        repo,
        tag,
      });
      await followProgress(progress).catch((error: Error) => {
        throw new Error(`docker import ${EMPTY_IMAGE} failed: ${error.message}`, { cause: error });
      });
    })().finally(() => {
      // Checked again next time: someone may remove it (docker image prune -a).
      this.empty = undefined;
    });
    return this.empty;
  }

  async remove(volume: VolumeSpec): Promise<void> {
    const name = dockerVolumeName(volume);
    try {
      await this.docker.getVolume(name).remove();
    } catch (error) {
      if (statusOf(error) !== 404) {
        const mapped = engineError(
          error,
          `volume ${volume.name} could not be removed`,
          this.address,
        );
        if (mapped instanceof UnavailableError) throw mapped;
        throw new SandboxError(
          `volume ${volume.name} could not be removed: docker volume rm ${name}: ${dockerMessage(error)}`,
          { cause: error },
        );
      }
    }
    // Unmounted before its folder goes (never a recursive removal across the mount).
    await this.disks.remove(volume);
  }

  async usage(volume: VolumeSpec): Promise<VolumeUsage> {
    if (hasDisk(volume)) return this.disks.usage(volume);
    const name = dockerVolumeName(volume);
    let df: { Volumes?: { Name: string; UsageData?: { Size?: number } }[] };
    try {
      // `type=volume` (API 1.42) spares newer engines the images' and containers' sizes.
      df = await this.docker.systemDf({ type: ['volume'] });
    } catch (error) {
      throw engineError(error, `volume ${volume.name}'s usage`, this.address);
    }
    const found = df.Volumes?.find((entry) => entry.Name === name);
    if (!found) {
      throw new SandboxError(
        `volume ${volume.name}'s Docker volume ${name} is not on the engine (removed outside abx?); remove the volume (abx volume rm ${volume.name}) and make it again`,
      );
    }
    return {
      used: Math.max(0, found.UsageData?.Size ?? 0),
      total: volume.sizeBytes,
      enforced: false,
    };
  }

  /**
   * Before a container that mounts `mounts` starts: each quota volume's disk mounted on the host
   * (again after a reboot), each Docker volume there (the engine would make a missing one anew,
   * empty and unbounded).
   */
  async prepare(mounts: readonly VolumeMountSpec[]): Promise<void> {
    for (const { volume } of mounts) {
      if (hasDisk(volume)) await this.disks.mounted(volume);
      const name = dockerVolumeName(volume);
      try {
        await this.docker.getVolume(name).inspect();
      } catch (error) {
        if (statusOf(error) !== 404) throw error;
        throw new Error(
          `volume ${volume.name}'s Docker volume ${name} is not on the engine (removed outside abx?); remove the volume (abx volume rm ${volume.name}) and make it again`,
        );
      }
    }
  }

  /**
   * Why the container whose init is `pid` does not have a quota volume's disk at its mount point,
   * or undefined when every one is there: the engine binds the daemon's host mount only when
   * both see one mount namespace.
   */
  missingDisk(pid: number, mounts: readonly VolumeMountSpec[]): string | undefined {
    const withDisk = mounts.filter(({ volume }) => hasDisk(volume));
    if (withDisk.length === 0) return undefined;
    const host = readFileSync('/proc/self/mountinfo', 'utf8');
    const inside = readFileSync(`/proc/${pid}/mountinfo`, 'utf8');
    for (const { volume, path } of withDisk) {
      const disk = mountDevice(host, join(volume.dir, 'mnt'));
      if (!disk || mountDevice(inside, path) !== disk) {
        return `volume ${volume.name} at ${path} is not its disk ${join(volume.dir, 'mnt')} in the container (the Docker engine runs in another mount namespace than this daemon?); run the daemon in the engine's mount namespace`;
      }
    }
    return undefined;
  }
}
