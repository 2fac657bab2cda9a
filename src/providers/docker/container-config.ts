import { createHash } from 'node:crypto';
import { SANDBOX_RUN_DIR, SANDBOX_RUNTIME_DIR } from '../../../runtime/protocol/constants.js';
import { proxyEnv } from '../../egress/sandbox-net.js';
import type { EgressPorts } from '../../egress/service.js';
import { SANDBOX_BUNDLE_FILE, SANDBOX_CA_FILE, trustEnv } from '../../egress/trust.js';
import { DEFAULT_PROCESS_LIMIT } from '../local/local-provider.js';
import { SANDBOX_NODE } from '../portable-runtime.js';
import { envdArguments, type SandboxSpec } from '../provider.js';
import type { EngineFacts } from './engine.js';
import type { ContainerCreateOptions, HostConfig, MountSettings, Ulimit } from './engine-client.js';
import { SANDBOX_USER_ID } from './passwd.js';
import { TOKEN_FILE } from './sandbox-archive.js';
import { sandboxCgroupParent } from './sandbox-cgroups.js';
import { volumeMount } from './volumes.js';

/** Label naming the sandbox a container is. */
export const SANDBOX_LABEL = 'abx.sandbox';
/** Label naming (a hash of) the folder the sandbox's own folder is in, for `sweepOrphans`. */
export const SANDBOXES_DIR_LABEL = 'abx.sandboxes-dir';
/** Room for envd's socket and the port sockets (each a tmpfs of the sandbox's own). */
const RUN_DIR_BYTES = 1024 * 1024;
/** What docker keeps of a sandbox's own output (envd's log): its start and early failures. */
const LOG_MAX = '1m';
const BASE_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** The value of {@link SANDBOXES_DIR_LABEL}: 16 hex digits of the folder's SHA-256. */
export function sandboxesDirHash(dir: string): string {
  return createHash('sha256').update(dir).digest('hex').slice(0, 16);
}

/** Who runs the sandbox: the template's user (uid 1000), or root for an image template's build. */
export function sandboxUser(spec: SandboxSpec): { name: string; uid: number; home: string } {
  const name = spec.user ?? 'user';
  return name === 'root'
    ? { name, uid: 0, home: '/root' }
    : { name, uid: SANDBOX_USER_ID, home: `/home/${name}` };
}

/** What the container of a sandbox is made with, beyond the spec. */
export interface ContainerContext {
  image: string;
  /** The image's own `PATH`, if it sets one: the runtime's folder is appended to it. */
  imagePath?: string;
  /** Host folder of the portable runtime, bound read-only at /opt/abx. */
  runtimeDir: string;
  /** The folder holding the sandbox's folder (`dirname(spec.dir)`). */
  sandboxesDir: string;
  engine: EngineFacts;
  /** An internet sandbox's egress ports (its proxy variables name them). */
  egress?: EgressPorts;
  /** Its workspace's bind: the overlay the daemon mounted on the host (see workspace.ts). */
  workspace?: MountSettings;
}

/**
 * The Docker create options of one sandbox. Every sandbox: no-new-privileges, Docker's default
 * seccomp profile (never `unconfined`), its own pid, ipc, uts and cgroup namespaces, `docker-init`
 * as pid 1 (envd is its only child; when envd ends the container ends), no network but its
 * loopback unless `network: host`, the runtime read-only at /opt/abx, envd's run folder and its
 * ports folder as small tmpfs mounts of its own, its volumes, limits as cgroups and rlimits, a
 * capped log.
 * A normal sandbox runs as uid 1000 with every capability dropped; only an image template's build
 * sandbox (`user: root`) keeps Docker's default set, which apt needs.
 */
export function containerOptions(
  spec: SandboxSpec,
  context: ContainerContext,
): ContainerCreateOptions {
  const user = sandboxUser(spec);
  const { resources } = spec;
  const env: Record<string, string> = {
    // The runtime's node comes last: the image's own programs win.
    PATH: `${context.imagePath ?? BASE_PATH}:${SANDBOX_RUNTIME_DIR}/bin`,
    HOME: user.home,
    USER: user.name,
    LANG: 'C.UTF-8',
    ...(context.egress ? { ...proxyEnv(context.egress), ...trustEnv() } : {}),
    ...spec.env,
    ABX_SANDBOX_ID: spec.id,
  };
  const ulimits: Ulimit[] = [];
  if (resources.openFiles) {
    ulimits.push({ Name: 'nofile', Soft: resources.openFiles, Hard: resources.openFiles });
  }
  if (resources.fileSize) {
    ulimits.push({ Name: 'fsize', Soft: resources.fileSize, Hard: resources.fileSize });
  }
  const tmpfs = (uid: number) =>
    `rw,nosuid,nodev,noexec,size=${RUN_DIR_BYTES},mode=0755,uid=${uid},gid=${uid}`;
  const hostConfig: HostConfig = {
    // A cgroup namespace of its own (API 1.41).
    CgroupnsMode: 'private',
    Init: true,
    NetworkMode: spec.network === 'host' ? 'host' : 'none',
    IpcMode: 'private',
    SecurityOpt: ['no-new-privileges'],
    ...(user.uid === 0 ? {} : { CapDrop: ['ALL'] }),
    PidsLimit: resources.processes ?? DEFAULT_PROCESS_LIMIT,
    ...(resources.memory
      ? {
          Memory: resources.memory,
          // Memory and swap together: no swapping past the limit.
          ...(context.engine.swap ? { MemorySwap: resources.memory } : {}),
        }
      : {}),
    ...(resources.cpu ? { NanoCpus: Math.round(resources.cpu * 1e9) } : {}),
    ...(ulimits.length > 0 ? { Ulimits: ulimits } : {}),
    ...(resources.disk && context.engine.diskQuota.enforced
      ? { StorageOpt: { size: String(resources.disk) } }
      : {}),
    ...(context.engine.cgroupDriver === 'cgroupfs'
      ? { CgroupParent: sandboxCgroupParent(spec.id) }
      : {}),
    Binds: [
      `${context.runtimeDir}:${SANDBOX_RUNTIME_DIR}:ro`,
      // An internet sandbox's resolver: egress's DNS (every DNS packet goes there anyway).
      ...(spec.network === 'internet'
        ? [
            `${spec.dir}/resolv.conf:/etc/resolv.conf:ro`,
            // The egress CA, alone and in a bundle, which the trust variables name.
            `${spec.dir}/egress-ca.pem:${SANDBOX_CA_FILE}:ro`,
            `${spec.dir}/ca-certificates.crt:${SANDBOX_BUNDLE_FILE}:ro`,
          ]
        : []),
    ],
    // The volumes (named volumes, see volumes.ts), read-write or read-only, and the workspace.
    ...(spec.volumeMounts?.length || context.workspace
      ? {
          Mounts: [
            ...(spec.volumeMounts ?? []).map(volumeMount),
            ...(context.workspace ? [context.workspace] : []),
          ],
        }
      : {}),
    Tmpfs: {
      [SANDBOX_RUN_DIR]: tmpfs(user.uid),
      [`${SANDBOX_RUN_DIR}/ports`]: tmpfs(user.uid),
    },
    LogConfig: { Type: 'json-file', Config: { 'max-size': LOG_MAX, 'max-file': '1' } },
  };
  return {
    name: `abx-${spec.id}`,
    Image: context.image,
    Hostname: spec.id,
    User: `${user.uid}:${user.uid}`,
    WorkingDir: spec.workdir,
    Env: Object.entries(env).map(([key, value]) => `${key}=${value}`),
    Entrypoint: [SANDBOX_NODE],
    Cmd: envdArguments(TOKEN_FILE, spec),
    Labels: {
      [SANDBOX_LABEL]: spec.id,
      [SANDBOXES_DIR_LABEL]: sandboxesDirHash(context.sandboxesDir),
    },
    HostConfig: hostConfig,
  };
}
