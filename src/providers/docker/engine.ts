import { readFileSync } from 'node:fs';
import { NotFoundError, SandboxError, UnavailableError } from '../../errors.js';
import { DockerEngine, EngineApiError } from './engine-client.js';

/** The engine's address: the client's socket, else `DOCKER_HOST`, or the default socket. */
export function engineAddress(docker?: DockerEngine): string {
  if (docker?.socketPath) return docker.socketPath;
  return process.env.DOCKER_HOST || '/var/run/docker.sock';
}

/**
 * A Docker client for `DOCKER_HOST` (unix:// or tcp://), or `/var/run/docker.sock`, with
 * connections of its own, which `close` ends: an idle keep-alive connection to the engine would
 * otherwise keep the daemon's process alive after it stopped.
 */
export function dockerClient(): { docker: DockerEngine; close: () => void } {
  const docker = new DockerEngine();
  return { docker, close: () => docker.close() };
}

/** Socket errors that mean the engine is not there (or not ours to use). */
const UNREACHABLE = new Set(['ENOENT', 'ECONNREFUSED', 'EACCES', 'EPERM', 'ECONNRESET', 'EPIPE']);

/**
 * What a Docker API failure means for abx: an engine that does not answer is an
 * UnavailableError saying where it was looked for and how to start one; anything else keeps
 * docker's own message under `what`.
 */
export function engineError(error: unknown, what: string, address = engineAddress()): SandboxError {
  if (error instanceof SandboxError) return error;
  const code = (error as NodeJS.ErrnoException).code ?? '';
  if (UNREACHABLE.has(code)) {
    const denied = code === 'EACCES' || code === 'EPERM';
    return new UnavailableError(
      `${what}: the Docker engine at ${address} ${denied ? 'refused this user (add it to the `docker` group, or run the daemon as root)' : 'does not answer'} (${code}); start it with \`sudo systemctl start docker\` or \`dockerd &\`, or point DOCKER_HOST at a running engine`,
      { cause: error },
    );
  }
  return new SandboxError(`${what}: ${dockerMessage(error)}`, { cause: error });
}

/** Docker's own words from an engine error (`No such container: ...`), else the error's message. */
export function dockerMessage(error: unknown): string {
  if (error instanceof EngineApiError) return error.engineMessage;
  const json = (error as { json?: { message?: string } }).json;
  if (json && typeof json.message === 'string') return json.message.trim();
  return ((error as Error).message ?? String(error))
    .replace(/^\(HTTP code \d+\) [^-]*- /, '')
    .trim();
}

/** The HTTP status of an engine error, if it got as far as an answer. */
export function statusOf(error: unknown): number | undefined {
  if (error instanceof EngineApiError) return error.statusCode;
  const status = (error as { statusCode?: unknown }).statusCode;
  return typeof status === 'number' ? status : undefined;
}

/** `image` is missing: what to do about it. */
export function imageNotFound(image: string, cause?: unknown): NotFoundError {
  return new NotFoundError(
    `image ${image} is not on this Docker engine; get it with \`docker pull ${image}\` or \`docker load -i file.tar\``,
    cause === undefined ? undefined : { cause },
  );
}

/** What the engine can do for sandboxes, from `GET /info` (and, for disk quotas, the host). */
export interface EngineFacts {
  version: string;
  cgroupDriver: string;
  cgroupVersion: string;
  memory: boolean;
  swap: boolean;
  cpu: boolean;
  pids: boolean;
  /** `StorageOpt.size` works (the writable layer has a quota), or why it does not. */
  diskQuota: { enforced: true; driver: string } | { enforced: false; why: string };
  seccomp: boolean;
  /** The engine remaps container uids to a subordinate range (`dockerd --userns-remap`). */
  usernsRemap: boolean;
  /**
   * With {@link usernsRemap}: the host uid the containers' root is (the engine's data root is
   * `…/<uid>.<gid>` then), so uid N inside is this plus N on the host.
   */
  usernsRoot?: number;
  /** The engine itself runs as an unprivileged user (rootless Docker). */
  rootless: boolean;
}

/** Fields of `GET /info` this module reads. */
interface EngineInfo {
  ServerVersion?: string;
  Driver?: string;
  DriverStatus?: [string, string][];
  DockerRootDir?: string;
  CgroupDriver?: string;
  CgroupVersion?: string;
  MemoryLimit?: boolean;
  SwapLimit?: boolean;
  CpuCfsQuota?: boolean;
  PidsLimit?: boolean;
  SecurityOptions?: string[];
}

/**
 * The mount holding `path` on this host, from /proc/self/mountinfo: its file system type and
 * every mount option (per-mount and superblock).
 */
function mountOf(path: string): { type: string; options: string[] } | undefined {
  let best: { point: string; type: string; options: string[] } | undefined;
  let text: string;
  try {
    text = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    return undefined;
  }
  for (const line of text.split('\n')) {
    const [left, right] = line.split(' - ');
    if (!left || !right) continue;
    const fields = left.split(' ');
    const point = (fields[4] ?? '').replace(/\\040/g, ' ');
    const [type = '', , superOptions = ''] = right.split(' ');
    const inside = path === point || path.startsWith(point === '/' ? '/' : `${point}/`);
    if (inside && (!best || point.length >= best.point.length)) {
      best = {
        point,
        type,
        options: [...(fields[5] ?? '').split(','), ...superOptions.split(',')],
      };
    }
  }
  return best && { type: best.type, options: best.options };
}

/**
 * Whether this engine can give a container's writable layer a size (`StorageOpt.size`): overlay2
 * only on xfs mounted with project quotas (`pquota`/`prjquota`), btrfs and zfs always; the rest
 * (overlay2 on ext4, the usual case, vfs, fuse-overlayfs) cannot.
 */
function diskQuotaOf(info: EngineInfo): EngineFacts['diskQuota'] {
  const driver = info.Driver ?? 'unknown';
  if (driver === 'btrfs' || driver === 'zfs') return { enforced: true, driver };
  if (driver !== 'overlay2') {
    return { enforced: false, why: `the ${driver} storage driver has no size option` };
  }
  const backing = info.DriverStatus?.find(([key]) => key === 'Backing Filesystem')?.[1];
  if (backing !== 'xfs') {
    return {
      enforced: false,
      why: `overlay2 on ${backing ?? 'this file system'} has no quota (it needs xfs mounted with pquota)`,
    };
  }
  const mount = mountOf(info.DockerRootDir ?? '/var/lib/docker');
  const quota = mount?.options.some((option) => /^(pquota|prjquota)$/.test(option));
  return quota
    ? { enforced: true, driver: 'overlay2 on xfs with project quotas' }
    : { enforced: false, why: 'overlay2 on xfs without the pquota mount option' };
}

/** Reads what the engine offers; an engine that does not answer is an UnavailableError. */
export async function probeEngine(docker: DockerEngine): Promise<EngineFacts> {
  let info: EngineInfo;
  try {
    info = (await docker.info()) as EngineInfo;
  } catch (error) {
    throw engineError(error, 'cannot use Docker', engineAddress(docker));
  }
  const security = info.SecurityOptions ?? [];
  const usernsRemap = security.some((option) => option.includes('name=userns'));
  const remapRoot = /\/(\d+)\.\d+$/.exec(info.DockerRootDir ?? '')?.[1];
  return {
    version: info.ServerVersion ?? 'unknown',
    cgroupDriver: info.CgroupDriver ?? 'cgroupfs',
    cgroupVersion: info.CgroupVersion ?? '1',
    memory: info.MemoryLimit !== false,
    swap: info.SwapLimit !== false,
    cpu: info.CpuCfsQuota !== false,
    pids: info.PidsLimit !== false,
    diskQuota: diskQuotaOf(info),
    seccomp: security.some((option) => option.includes('name=seccomp')),
    usernsRemap,
    ...(usernsRemap && remapRoot ? { usernsRoot: Number(remapRoot) } : {}),
    rootless: security.some((option) => option.includes('name=rootless')),
  };
}
