/**
 * The local provider's volumes, in `$ABX_HOME/volumes/<id>`.
 *
 * - Root daemon: an ext4 disk image of the volume's size (`disk.img`, sparse, with a journal:
 *   it outlives sandboxes and daemons), loop-mounted once on the host at `mnt`, its files owned
 *   by one reserved host uid (the first of the sandbox uid range, minus one). A sandbox gets an
 *   idmapped mount of it (see idmap.ts) in which that uid is the sandbox's own uid, so every
 *   sandbox sees the files as its user's (uid 1000) while no two sandboxes share a host uid. The
 *   disk is the quota: a write past it fails with ENOSPC.
 * - Rootless daemon: a folder (`data`) of the daemon's uid, which every sandbox's user namespace
 *   maps to its uid 1000; a plain bind mount. Nothing bounds its size (no loop mounts without
 *   root): the size is reported, not enforced, and the volume's info says so.
 */
import { execFile } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
  statSync,
} from 'node:fs';
import { statfs } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { SandboxStartError } from '../../errors.js';
import type { VolumeMountSpec, VolumeSpec, VolumeStore, VolumeUsage } from '../provider.js';
import { detachMount, idmapMount } from './idmap.js';
import { LocalVolumeFiles } from './volume-files.js';

const execFileAsync = promisify(execFile);

/** Where a root daemon puts a sandbox's idmapped volume mounts for the instant of its start. */
export const VOLUME_STAGE_DIR = '/run/abx-volumes';

/** A bind of a volume into a sandbox: a host folder, where it goes, how. */
export interface VolumeBind {
  source: string;
  dest: string;
  readOnly: boolean;
}

/** The mount points of this process's namespace at or under `dir` (deepest first). */
export function mountsUnder(dir: string): string[] {
  const found: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    // id parent major:minor root mountpoint ...; the mount point escapes space as \040.
    const point = line
      .split(' ')[4]
      ?.replace(/\\(\d{3})/g, (_, octal: string) => String.fromCharCode(Number.parseInt(octal, 8)));
    if (point && (point === dir || point.startsWith(`${dir}/`))) found.push(point);
  }
  return found.sort((a, b) => b.length - a.length);
}

/** Unmounts everything at or under `dir`; throws when something stays mounted. */
export async function unmountUnder(dir: string): Promise<void> {
  for (let round = 0; round < 3; round++) {
    const points = mountsUnder(dir);
    if (points.length === 0) return;
    for (const point of points) {
      await execFileAsync('umount', [point]).catch(() => detachMount(point));
    }
  }
  const left = mountsUnder(dir);
  if (left.length > 0) throw new Error(`${left.join(', ')} stay mounted`);
}

/**
 * Detaches a sandbox's stage of idmapped mounts and removes its empty folders. Never a recursive
 * removal: a folder still mounted holds the volume's files.
 */
export function releaseStage(stage: string): void {
  if (!existsSync(stage)) return;
  for (const point of mountsUnder(stage)) detachMount(point);
  for (const entry of readdirSync(stage)) {
    try {
      rmdirSync(join(stage, entry));
    } catch {
      // still mounted or not empty: left for the next sweep, never emptied
    }
  }
  try {
    rmdirSync(stage);
  } catch {
    // as above
  }
}

/**
 * Detaches the stages in {@link VOLUME_STAGE_DIR} older than `ageMs`: a daemon that died while
 * it started a sandbox left them (a start takes seconds; another daemon's start is younger).
 */
export function sweepVolumeStages(ageMs: number, now = Date.now()): void {
  if (!existsSync(VOLUME_STAGE_DIR)) return;
  for (const entry of readdirSync(VOLUME_STAGE_DIR)) {
    const stage = join(VOLUME_STAGE_DIR, entry);
    try {
      if (now - statSync(stage).mtimeMs < ageMs) continue;
    } catch {
      continue;
    }
    releaseStage(stage);
  }
}

export class LocalVolumes implements VolumeStore {
  /** Mounts under way, by volume id: two starts never mount one disk twice. */
  private readonly mounting = new Map<string, Promise<string>>();
  /** Its files from the daemon's side: on the mounted disk, or the rootless folder. */
  readonly files: LocalVolumeFiles;
  /**
   * Volumes being removed (or removed): never mounted again, so a files call that raced the
   * removal cannot mount the disk under the folder being removed.
   */
  private readonly removed = new Set<string>();

  constructor(
    private readonly mode: 'root' | 'rootless',
    /** The host uid that owns a root daemon's volume files on disk. */
    private readonly volumeUid: number,
  ) {
    this.files = new LocalVolumeFiles(
      async (volume) => (mode === 'root' ? this.mounted(volume) : this.folder(volume)),
      // A rootless sandbox's user namespace maps its user onto the daemon's own ids.
      mode === 'root'
        ? { uid: volumeUid, gid: volumeUid }
        : { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 },
    );
  }

  unavailable(): string | undefined {
    if (this.mode === 'rootless') return undefined;
    if (!existsSync('/proc/self/mountinfo')) return 'this host has no /proc/self/mountinfo';
    return undefined;
  }

  private folder(volume: VolumeSpec): string {
    return join(volume.dir, this.mode === 'root' ? 'mnt' : 'data');
  }

  async create(volume: VolumeSpec): Promise<void> {
    mkdirSync(volume.dir, { recursive: true, mode: 0o700 });
    try {
      if (this.mode === 'rootless') {
        mkdirSync(this.folder(volume), { mode: 0o755 });
        return;
      }
      const image = join(volume.dir, 'disk.img');
      await execFileAsync('truncate', ['-s', String(volume.sizeBytes), image]);
      await execFileAsync('mkfs.ext4', [
        '-q',
        '-F',
        '-m',
        '0',
        '-L',
        volume.name.slice(0, 16),
        '-E',
        `root_owner=${this.volumeUid}:${this.volumeUid},lazy_itable_init=1,lazy_journal_init=1,nodiscard`,
        image,
      ]);
      const mnt = await this.mounted(volume);
      // Nobody may use lost+found (root's, and shown as nobody): the volume starts empty.
      rmSync(join(mnt, 'lost+found'), { recursive: true, force: true });
    } catch (error) {
      await this.remove(volume).catch(() => undefined);
      const stderr = String((error as { stderr?: unknown }).stderr ?? '').trim();
      throw new SandboxStartError(
        `volume ${volume.name} could not be made: ${stderr || (error as Error).message}`,
        { cause: error },
      );
    }
  }

  /**
   * A root daemon's volume mounted on the host (after a reboot, mounted again); the docker
   * provider's volumes bind it too.
   */
  mounted(volume: VolumeSpec): Promise<string> {
    const mnt = this.folder(volume);
    const running = this.mounting.get(volume.id);
    if (running) return running;
    const work = (async () => {
      if (this.removed.has(volume.id)) throw new Error(`volume ${volume.name} is being removed`);
      if (mountsUnder(mnt).includes(mnt)) return mnt;
      const image = join(volume.dir, 'disk.img');
      if (!existsSync(image)) throw new Error(`its disk ${image} is gone`);
      mkdirSync(mnt, { recursive: true, mode: 0o700 });
      await execFileAsync('mount', ['-o', 'loop,nosuid,nodev', image, mnt]);
      return mnt;
    })();
    this.mounting.set(volume.id, work);
    return work.finally(() => this.mounting.delete(volume.id));
  }

  async remove(volume: VolumeSpec): Promise<void> {
    this.removed.add(volume.id);
    if (!existsSync(volume.dir)) return;
    // Never a recursive removal across a mount: that would empty the volume's disk through it.
    await unmountUnder(volume.dir);
    rmSync(volume.dir, { recursive: true, force: true });
  }

  async usage(volume: VolumeSpec): Promise<VolumeUsage> {
    if (this.mode === 'root') {
      const stats = await statfs(await this.mounted(volume));
      return {
        used: (stats.blocks - stats.bfree) * stats.bsize,
        total: stats.blocks * stats.bsize,
        enforced: true,
      };
    }
    const { stdout } = await execFileAsync('du', ['-s', '-B1', this.folder(volume)]);
    return { used: Number(stdout.split('\t')[0]) || 0, total: volume.sizeBytes, enforced: false };
  }

  /**
   * The binds a sandbox starting as host uid `uid` (root mode; rootless: undefined) gets for its
   * mounts, and a `release` to call once it started (or failed to): root mode makes an idmapped
   * mount per volume in {@link VOLUME_STAGE_DIR}, which the sandbox's mount namespace copies when
   * it is made; the host's own is detached again at `release`.
   */
  async binds(
    sandboxId: string,
    mounts: readonly VolumeMountSpec[],
    uid: number | undefined,
  ): Promise<{ binds: VolumeBind[]; release: () => void }> {
    if (uid === undefined) {
      const binds = mounts.map((mount) => {
        const source = this.folder(mount.volume);
        if (!existsSync(source)) {
          throw new Error(`volume ${mount.volume.name}'s folder ${source} is gone`);
        }
        return { source, dest: mount.path, readOnly: mount.readOnly };
      });
      return { binds, release: () => {} };
    }
    const stage = join(VOLUME_STAGE_DIR, sandboxId);
    const release = () => releaseStage(stage);
    mkdirSync(VOLUME_STAGE_DIR, { recursive: true, mode: 0o711 });
    mkdirSync(stage, { recursive: true, mode: 0o711 });
    const binds: VolumeBind[] = [];
    try {
      for (const [index, mount] of mounts.entries()) {
        const mnt = await this.mounted(mount.volume);
        const owner = statSync(mnt).uid;
        const source = join(stage, String(index));
        mkdirSync(source);
        await idmapMount(mnt, source, owner, uid, mount.readOnly);
        binds.push({ source, dest: mount.path, readOnly: mount.readOnly });
      }
    } catch (error) {
      release();
      throw error;
    }
    return { binds, release };
  }
}
