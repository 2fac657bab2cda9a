import { execFile, spawn } from 'node:child_process';
import {
  closeSync,
  existsSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { cp, lstat, rename, rm } from 'node:fs/promises';
import { request } from 'node:http';
import { basename, dirname, join } from 'node:path';
import type { Writable } from 'node:stream';
import { promisify } from 'node:util';
import {
  SANDBOX_HOME,
  SANDBOX_RUN_DIR,
  SANDBOX_RUNTIME_DIR,
} from '../../../runtime/protocol/constants.js';
import { ENVD_ROOT_SOCKET } from '../../../runtime/root/constants.js';
import { DEFAULT_DISK_BYTES } from '../../commands/template-runtime.js';
import type { EgressController } from '../../egress/controller.js';
import type { EgressPolicy } from '../../egress/policy.js';
import { enterArgs, proxyEnv, SANDBOX_RESOLV_CONF } from '../../egress/sandbox-net.js';
import { type KeptNet, SandboxNetworks } from '../../egress/sandbox-networks.js';
import type { EgressCounters, EgressPorts } from '../../egress/service.js';
import { sharedBundle, trustEnv } from '../../egress/trust.js';
import { InvalidArgumentError, SandboxStartError } from '../../errors.js';
import { dockerClient } from '../docker/engine.js';
import type { DockerEngine } from '../docker/engine-client.js';
import {
  type PortableRuntime,
  portableRuntime,
  portableSandboxNode,
  ROOT_PORTABLE_CACHE,
  SANDBOX_NODE,
  SANDBOX_NODE_DIR,
  SANDBOX_SUDO_DIR,
} from '../portable-runtime.js';
import {
  ENVD_NODE_OPTIONS,
  type EndCause,
  envdArguments,
  envdTokenFile,
  type IsolationReport,
  type SandboxHandle,
  type SandboxNode,
  type SandboxProvider,
  type SandboxSpec,
  type SandboxUsage,
  sandboxHome,
} from '../provider.js';
import { connectSandboxSocket } from '../sandbox-socket.js';
import {
  bwrapArgs,
  prlimitArgs,
  SANDBOX_HOME_TEMPLATE,
  SANDBOX_UID,
  SYSTEM_BUNDLE,
} from './bwrap-args.js';
import {
  type CgroupLimits,
  cgroupDirsOf,
  cgroupParent,
  cgroupPids,
  cgroupSupport,
  cgroupUsage,
  createCgroups,
  freezeCgroups,
  freezerSupport,
  oomKills,
  removeCgroups,
  type SandboxCgroups,
  sweepEmptyCgroups,
  thawCgroups,
} from './cgroups.js';
import {
  envdIdleMs,
  frontedEnvd,
  frontIn,
  imageHasShell,
  makeWakeFifo,
  sleepingEnvd,
} from './envd-sleep.js';
import { fileInImage, folderInImage, regularFileInImage } from './home-seed.js';
import { idmapMount } from './idmap.js';
import { imageRootfs, pruneRootfs, ROOTFS_ROOT } from './image-rootfs.js';
import { isSameProcess, processStartTime, processState, processTree } from './proc.js';
import { childPidOf, hostAccountIn, mapRootUserns, rootUidOf } from './root-userns.js';
import {
  createDiskImage,
  type HomeSeed,
  launchArgv,
  STAGED,
  sharedRuntime,
} from './sandbox-disk.js';
import { fenceSandboxFiles, liftSandboxFiles } from './sandbox-files.js';
import { localRuntimeCache, type NoImageNode, noImageNode, sandboxNodeOf } from './sandbox-node.js';
import { DEFAULT_UID_RANGE, SandboxUids, type UidRange, uidProcesses } from './sandbox-uids.js';
import { sandboxUsage } from './sandbox-usage.js';
import { compileSeccompFilter } from './seccomp.js';
import {
  LocalVolumes,
  releaseStage,
  sweepVolumeStages,
  VOLUME_STAGE_DIR,
  type VolumeBind,
} from './volumes.js';
import {
  checkWorkspaceSpec,
  copyLayer,
  type MountedWorkspace,
  mountWorkspace,
  remapOwners,
  stageWorkspace,
  unmountWorkspace,
  workspaceDir,
  workspaceHandle,
} from './workspace-mount.js';
import {
  rootlessOverlayUnavailable,
  rootlessWorkspace,
  rootlessWorkspaceView,
} from './workspace-userns.js';

/** An internet sandbox's trust files, in the order of their fds (8, 9, 10): see writeTrust. */
const TRUST_FILES = ['egress-ca.pem', 'ca-certificates.crt', 'system-ca.crt'] as const;

/** A root-allowing sandbox's bwrap --userns-block-fd and --info-fd (after the files, fds 3-10). */
const ROOT_BLOCK_FD = 11;
const ROOT_INFO_FD = 12;

/** The pids limit of a sandbox whose template sets no `processes`: a fork bomb stops there. */
export const DEFAULT_PROCESS_LIMIT = 4096;

export interface LocalProviderOptions {
  /** Host folder holding envd.cjs (the package's dist/runtime). */
  runtimeDir: string;
  /** How long a new sandbox's envd has to answer; default 15 s. */
  startTimeoutMs?: number;
  bwrapPath?: string;
  /**
   * `root`: every sandbox runs as a host uid of its own from `uidRange`, on a disk image of its
   * own (needs a root daemon). `rootless`: sandboxes run as the daemon's uid. Default: `root`
   * when the daemon is root, else `rootless`.
   */
  mode?: 'root' | 'rootless';
  /** Host uids for root mode; default 1500000000-1500999999 (or `ABX_UID_RANGE`). */
  uidRange?: UidRange;
  /**
   * Where portable runtimes (the daemon's Node at /opt/abx) are built and kept: image sandboxes,
   * and sandboxes without one on a host whose Node is not a supported line, run on one. Default:
   * `/run/abx-runtime` for root (readable by every sandbox uid), else `$XDG_RUNTIME_DIR/abx-runtime`
   * or `~/.cache/abx-runtime` (the daemon's own uid is the sandboxes' in rootless mode; never
   * under `$ABX_HOME`, whose path the bind would show inside: see `localRuntimeCache`).
   */
  runtimeCacheDir?: string;
  /**
   * The egress service of `internet` sandboxes; default: one started on first use, configured
   * from the environment (ABX_EGRESS_NETNS, ABX_EGRESS_HOSTS, ABX_EGRESS_PERMIT).
   */
  egress?: EgressController;
  /**
   * How long a sandbox's envd waits idle before it sleeps (exits until the next request wakes
   * it; envd-sleep.ts); 0: never. Default `ABX_ENVD_IDLE_MS`, else 60 s.
   */
  envdIdleMs?: number;
}

/** Where this daemon keeps portable runtimes (see {@link localRuntimeCache}). */
function defaultRuntimeCache(): { cacheDir?: string } {
  const dir = localRuntimeCache();
  return dir ? { cacheDir: dir } : {};
}

/** What a rootless sandbox's log keeps: its start and any early failure, not a flood. */
const LOG_CAP_BYTES = 1024 * 1024;

/**
 * A pipe whose reader appends what it gets to `file`, up to {@link LOG_CAP_BYTES}, and discards
 * the rest: a shell pipeline of its own, outside the sandbox, that outlives the daemon as the
 * sandbox does. The caller hands the write end to the sandbox and closes its own copy.
 */
function cappedLog(file: string): Writable {
  const reader = spawn(
    '/bin/sh',
    ['-c', 'head -c "$1" >> "$2"; exec cat > /dev/null', 'abx-log', String(LOG_CAP_BYTES), file],
    { detached: true, stdio: ['pipe', 'ignore', 'ignore'] },
  );
  reader.unref();
  return reader.stdin as Writable;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** GET /health on envd's socket: true on 200. */
export function envdHealthy(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const options = {
      socketPath,
      createConnection: () => connectSandboxSocket(socketPath),
      path: '/health',
      method: 'GET',
      timeout: 1000,
    };
    const req = request(options, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(false));
    req.end();
  });
}

function logTail(file: string, bytes = 2000): string {
  try {
    const text = readFileSync(file, 'utf8');
    return text.slice(-bytes).trim();
  } catch {
    return '';
  }
}

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // gone meanwhile
  }
}

function killPids(pids: Iterable<number>): void {
  for (const pid of pids) signal(pid, 'SIGKILL');
}

/** Where a rootless sandbox's hibernate copies its home and /tmp, in its folder. */
const HIBERNATED = 'hibernated';
const NO_LISTS: EgressPolicy = { allowOut: [], denyOut: [] };

/**
 * What a sandbox starts on besides a new disk: a hibernated one's kept disk (see
 * `LocalProvider.wake`), or a fork's copy of another's (see `LocalProvider.fork`). `uid`: the uid
 * to take back (a wake); `fromUid`: the uid the disk's files belong to, given to the uid it gets
 * when that is another (a fork, a wake whose uid was lost).
 */
interface Woken {
  uid?: number;
  fromUid?: number;
  ports?: EgressPorts;
}

const execFileAsync = promisify(execFile);

/**
 * Copies a running rootless sandbox's home and /tmp (tmpfs mounts, reached through its root) into
 * `to`/home and `to`/tmp, without sockets, FIFOs or devices, nor the mounts on them; the caller froze it, so nothing
 * changes under the copy. Written to a partial folder renamed into place.
 */
async function copyHomeAndTmp(pid: number, home: string, to: string): Promise<void> {
  const partial = `${to}.partial`;
  await rm(partial, { recursive: true, force: true });
  const root = `/proc/${pid}/root`;
  for (const [from, name] of [
    [home, 'home'],
    ['/tmp', 'tmp'],
  ] as const) {
    // Only the tmpfs itself: a folder of another file system is a mount on it (a volume, a
    // workspace), which keeps its own data and is mounted again at the wake.
    const dev = (await lstat(`${root}${from}`)).dev;
    await cp(`${root}${from}`, join(partial, name), {
      recursive: true,
      preserveTimestamps: true,
      verbatimSymlinks: true,
      filter: async (source) => {
        const stats = await lstat(source);
        if (stats.isDirectory()) return stats.dev === dev;
        return stats.isFile() || stats.isSymbolicLink();
      },
    });
  }
  await rm(to, { recursive: true, force: true });
  await rename(partial, to);
}

/** The home of a sandbox started as `spec`, inside it. */
/** Where a sandbox's workspace is staged for its bwrap, for the instant of its start. */
function workspaceStageOf(id: string): string {
  return join(VOLUME_STAGE_DIR, `${id}.ws`);
}

function homeOf(spec: SandboxSpec): string {
  return sandboxHome(spec.user);
}

/** Joins every cgroup folder given before `--`, then execs the rest (rootless mode). */
const JOIN_CGROUPS =
  'while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs"; shift; done; shift; exec "$@"';

/**
 * Sandboxes as bubblewrap namespaces on this host. The sandbox's first process (the pid
 * namespace's init, which bwrap forks) is what the handle names: killing it makes the kernel kill
 * every process of the namespace. It is started in a session of its own, not tied to the daemon,
 * so sandboxes outlive a daemon restart.
 *
 * A root daemon never runs a sandbox as root: each sandbox gets a host uid of its own (mapped to
 * uid 1000 inside), a disk image of its own for its home and /tmp, and cgroups it cannot write.
 */
export class LocalProvider implements SandboxProvider {
  readonly name = 'local';
  readonly mode: 'root' | 'rootless';
  private readonly uids: SandboxUids;
  private readonly seccomp = compileSeccompFilter();
  /** envd's folder as sandboxes bind it (root mode: a copy every sandbox uid may read). */
  private readonly runtimeDir: string;
  private report: IsolationReport | undefined;

  /** The internet networks of this provider's sandboxes (the egress service on first use). */
  readonly networks: SandboxNetworks;
  /** Volumes (`$ABX_HOME/volumes`): disk images idmapped into sandboxes, or plain folders. */
  readonly volumes: LocalVolumes;

  /** How long envd waits idle before it sleeps; 0: never (see envd-sleep.ts). */
  private readonly envdIdleMs: number;

  constructor(private readonly options: LocalProviderOptions) {
    this.networks = new SandboxNetworks(options.egress);
    const isRoot = process.getuid?.() === 0;
    this.mode = options.mode ?? (isRoot ? 'root' : 'rootless');
    if (this.mode === 'root' && !isRoot) {
      throw new SandboxStartError(
        'root isolation mode needs a root daemon (it gives each sandbox a host uid of its own)',
      );
    }
    if (this.mode === 'rootless' && isRoot) {
      throw new SandboxStartError(
        'rootless mode as root would run sandboxes as host uid 0: use root mode (the default for root)',
      );
    }
    this.uids = new SandboxUids(options.uidRange);
    this.envdIdleMs = options.envdIdleMs ?? envdIdleMs();
    // One host uid below the sandboxes' range owns every volume's files on disk.
    this.volumes = new LocalVolumes(this.mode, (options.uidRange ?? DEFAULT_UID_RANGE).first - 1);
    this.runtimeDir = this.mode === 'root' ? sharedRuntime(options.runtimeDir) : options.runtimeDir;
  }

  /** A client of the host's Docker engine, made on the first image sandbox. */
  private engine: { docker: DockerEngine; close: () => void } | undefined;
  private portable: Promise<PortableRuntime> | undefined;

  /**
   * What an image sandbox runs on: the image's file system (exported once from the host's Docker
   * engine) and the portable runtime (the image need not have Node). Root mode only: the overlay
   * over the image is a mount the launcher makes as root.
   */
  private async imageParts(
    spec: SandboxSpec,
    home: string,
  ): Promise<{ rootfs: string; runtimeDir: string; home?: string }> {
    if (this.mode !== 'root') {
      throw new SandboxStartError(
        `sandbox ${spec.id} runs image ${spec.image}: the local provider runs images only as a root daemon (an overlay mount per sandbox); run the daemon as root, or use the docker provider (abx daemon start --provider docker)`,
      );
    }
    if (spec.user === 'root') {
      throw new SandboxStartError(
        `sandbox ${spec.id} would run as root: the local provider never does (image builds run on the docker provider)`,
      );
    }
    this.engine ??= dockerClient();
    const [rootfs, portable] = await Promise.all([
      imageRootfs(this.engine.docker, spec.image as string),
      this.portableRuntime(),
    ]);
    const image = spec.image as string;
    // What the launcher makes (as root) in the overlay must not be a link out of it.
    const mountPoints = (spec.volumeMounts ?? []).map((mount) => mount.path);
    for (const dir of [
      '/proc',
      '/dev',
      '/tmp',
      '/run/abx',
      '/opt/abx',
      '/etc',
      spec.workdir,
      ...mountPoints,
    ]) {
      await folderInImage(rootfs, dir, image);
    }
    await fileInImage(rootfs, '/etc/resolv.conf', image);
    // A root sandbox's sudo is bound at /usr/bin/sudo: bwrap would follow a link on the way (the
    // launcher removes one at sudo itself, see sandbox-disk.ts), and cannot make the folder in
    // the image's root (its upper layer is host root's).
    if (spec.allowRoot && !(await folderInImage(rootfs, '/usr/bin', image))) {
      throw new SandboxStartError(
        `image ${image} has no /usr/bin, where a sandbox that allows root gets sudo; add the folder to the image (or leave allow_root out)`,
      );
    }
    const imageHome = await folderInImage(rootfs, home, image);
    return { rootfs, runtimeDir: portable.dir, ...(imageHome ? { home: imageHome } : {}) };
  }

  /**
   * The portable runtime of the daemon's Node, built (or found in the cache) once per provider. A
   * failure is kept for a minute, not forever (patchelf may be installed meanwhile), and not
   * retried on every create either: each try copies and hashes a ~100 MB binary.
   */
  private portableRuntime(): Promise<PortableRuntime> {
    if (!this.portable) {
      const made = portableRuntime({
        runtimeDir: this.options.runtimeDir,
        ...(this.options.runtimeCacheDir
          ? { cacheDir: this.options.runtimeCacheDir }
          : defaultRuntimeCache()),
      });
      this.portable = made;
      made.catch(() => {
        setTimeout(() => {
          if (this.portable === made) this.portable = undefined;
        }, 60_000).unref();
      });
    }
    return this.portable;
  }

  /** Which Node a sandbox without an image runs now (the host's may be upgraded meanwhile). */
  private noImageNode(): Promise<NoImageNode> {
    return noImageNode({
      daemon: { path: process.execPath, version: process.version },
      portable: () => this.portableRuntime(),
    });
  }

  async close(): Promise<void> {
    this.engine?.close();
    this.engine = undefined;
  }

  /** Removes unpacked image file systems whose image is gone and that no sandbox runs on. */
  async pruneImages(): Promise<void> {
    if (this.mode !== 'root' || !existsSync(ROOTFS_ROOT)) return;
    this.engine ??= dockerClient();
    await pruneRootfs(this.engine.docker).catch(() => undefined);
  }

  create(spec: SandboxSpec): Promise<SandboxHandle> {
    return this.launch(spec);
  }

  /**
   * Starts a sandbox: a new one, or (`woken`) a hibernated one again on what it kept: its uid,
   * its disk image (root mode) or the copy of its home and /tmp (rootless), its egress ports.
   */
  private async launch(spec: SandboxSpec, woken?: Woken): Promise<SandboxHandle> {
    const root = this.mode === 'root';
    const home = homeOf(spec);
    if (spec.allowRoot && !spec.image) {
      throw new SandboxStartError(
        `sandbox ${spec.id} allows root, which only image sandboxes may: a sandbox without an image runs on the host's own /usr and /etc, which root inside would own; give the template an image (or leave allow_root out)`,
      );
    }
    const noRoot = spec.allowRoot ? this.rootUnavailable() : undefined;
    if (noRoot !== undefined) {
      throw new SandboxStartError(`sandbox ${spec.id} allows root, which ${noRoot}`);
    }
    if (spec.workspace) {
      const user = spec.workspace.user;
      if (!root && user && user.uid !== process.getuid?.()) {
        throw new InvalidArgumentError(
          `sandbox ${spec.id} mounts a workspace (${spec.workspace.from}) for uid ${user.uid}, and a rootless daemon can give a sandbox only its own uid's rights on a folder (it cannot map another's): mount it through a root daemon, or as the daemon's user`,
        );
      }
      checkWorkspaceSpec(spec.workspace);
    }
    const image = spec.image ? await this.imageParts(spec, home) : undefined;
    const hostNode = image
      ? undefined
      : await this.noImageNode().catch((error: Error) => {
          throw new SandboxStartError(`sandbox ${spec.id} did not start: ${error.message}`, {
            cause: error,
          });
        });
    const logFile = join(spec.dir, 'sandbox.log');
    mkdirSync(spec.dir, { recursive: true });
    if (hostNode?.fallback) {
      writeFileSync(
        logFile,
        `abx: warning: envd runs on ${hostNode.node} ${hostNode.version}: ${hostNode.why} (${hostNode.fallback})\n`,
        { flag: 'a' },
      );
    }
    // Where envd and its Node come from: an image's and (host's Node not supported) a sandbox
    // without one's is the portable runtime; else envd's bundle alone, on the host's /usr Node.
    const portableDir = image?.runtimeDir ?? hostNode?.portable?.dir;
    // Handed to bwrap as open files (fds 4-6), which copies them into the sandbox: the sandbox
    // never sees a host path for them. The token travels in a file, not the environment (a
    // process's initial environment stays readable in /proc/PID/environ); envd reads and deletes
    // it before it serves anything, and no other process of the sandbox exists before envd.
    const dataFiles = {
      passwd: `user:x:${SANDBOX_UID}:${SANDBOX_UID}::${SANDBOX_HOME}:/bin/sh\n`,
      group: `user:x:${SANDBOX_UID}:\n`,
      token: envdTokenFile(spec),
      'seccomp.bpf': this.seccomp,
      'resolv.conf': SANDBOX_RESOLV_CONF,
    };
    for (const [name, data] of Object.entries(dataFiles)) {
      writeFileSync(join(spec.dir, name), data, { mode: 0o600 });
    }

    const uid = root ? this.sandboxUid(spec, woken) : undefined;
    const limits: CgroupLimits = {
      ...(spec.resources.memory ? { memory: spec.resources.memory } : {}),
      ...(spec.resources.cpu ? { cpu: spec.resources.cpu } : {}),
      processes: spec.resources.processes ?? DEFAULT_PROCESS_LIMIT,
    };
    let cgroups: SandboxCgroups;
    try {
      cgroups = createCgroups(spec.id, limits);
    } catch (error) {
      this.uids.release(uid);
      throw new SandboxStartError(`sandbox ${spec.id} did not start: ${(error as Error).message}`, {
        cause: error,
      });
    }
    // An internet sandbox's namespace, its rules and its link exist before anything of the sandbox
    // runs in it (bwrap starts inside it below).
    let net: KeptNet | undefined;
    if (spec.network === 'internet') {
      try {
        // A woken sandbox's environment names its egress ports: it gets the same ones again.
        const ports = woken?.ports
          ? await this.networks.egress.add(spec.id, spec.egress ?? NO_LISTS, woken.ports)
          : undefined;
        net = await this.networks.start({
          id: spec.id,
          policy: spec.egress,
          rootless: !root,
          ...(ports ? { ports } : {}),
        });
      } catch (error) {
        await this.reclaim(cgroups.dirs, uid);
        // A policy egress refuses (its proxy's address) is the caller's to change.
        if (error instanceof InvalidArgumentError) throw error;
        throw new SandboxStartError(
          `sandbox ${spec.id} did not start: ${(error as Error).message}`,
          {
            cause: error,
          },
        );
      }
    }
    let argv: string[];
    let sleeps = false;
    let fronted = false;
    let volumes: { binds: VolumeBind[]; release: () => void } | undefined;
    let rootLower: { stage: string; rootUid: number } | undefined;
    let workspace: MountedWorkspace | undefined;
    let workspaceStage: string | undefined;
    let workspaceMountedAt = 0;
    // Rootless: the overlay is mounted by the launcher in a user namespace of its own.
    let rootlessWs: ReturnType<typeof rootlessWorkspace> | undefined;
    try {
      const trusted = net ? await this.writeTrust(spec, image?.rootfs) : undefined;
      if (spec.volumeMounts && spec.volumeMounts.length > 0) {
        volumes = await this.volumes.binds(spec.id, spec.volumeMounts, uid);
      }
      if (spec.workspace && uid !== undefined) {
        workspaceMountedAt = spec.workspace.since ?? Date.now();
        await this.workspaceLayer(spec, uid, woken);
        workspace = await mountWorkspace(
          workspaceDir(spec.dir),
          spec.workspace.from,
          uid,
          spec.workspace.user,
        );
        workspaceStage = await stageWorkspace(workspace.merged, workspaceStageOf(spec.id));
      } else if (spec.workspace) {
        workspaceMountedAt = spec.workspace.since ?? Date.now();
        await this.workspaceLayer(spec, undefined, woken);
        rootlessWs = rootlessWorkspace(workspaceDir(spec.dir), spec.workspace.from);
      }
      const binds: VolumeBind[] = [
        ...(volumes?.binds ?? []),
        ...(workspaceStage && spec.workspace
          ? [{ source: workspaceStage, dest: spec.workspace.path, readOnly: false }]
          : []),
        ...(rootlessWs && spec.workspace
          ? [{ source: rootlessWs.merged, dest: spec.workspace.path, readOnly: false }]
          : []),
      ];
      const asked = cgroups.unenforced.filter(
        (c) => c !== 'pids' || spec.resources.processes !== undefined,
      );
      if (asked.length > 0) {
        writeFileSync(
          logFile,
          `abx: warning: no writable ${asked.join(', ')} cgroup for this daemon; those limits are not enforced\n`,
          { flag: 'a' },
        );
      }
      const disk = spec.resources.disk ?? DEFAULT_DISK_BYTES;
      const envdArgs = [
        image ? SANDBOX_NODE : (hostNode as NoImageNode).node,
        ...envdArguments(`${SANDBOX_RUN_DIR}/token`, spec, image ? ['--home', home] : []),
      ];
      // envd sleeps when idle, not where root's envd runs beside it (root.cjs starts both: they
      // stay): under its front where the runtime has one for this machine (envd-sleep.ts; no
      // shell needed, no FIFO), else under a shell loop where the sandbox has a /bin/sh.
      const idles = this.envdIdleMs > 0 && !spec.allowRoot;
      fronted = idles && frontIn(portableDir ?? this.runtimeDir);
      sleeps =
        idles && !fronted && (image ? await imageHasShell(image.rootfs) : existsSync('/bin/sh'));
      const envdCommand = (command: string[]) =>
        fronted
          ? frontedEnvd(command, this.envdIdleMs)
          : sleeps
            ? sleepingEnvd(command, this.envdIdleMs)
            : command;
      const common = {
        hostname: spec.id,
        env: {
          // An image's own programs first; the runtime's (node, script) only where it has none.
          // Without an image, on the portable runtime: its `node` first (and only it), so what a
          // user's `node`, the command server and code contexts run is the Node envd runs on.
          PATH: `${hostNode?.portable ? `${SANDBOX_NODE_DIR}:` : ''}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${image ? `:${SANDBOX_RUNTIME_DIR}/bin` : ''}`,
          HOME: home,
          USER: spec.user ?? 'user',
          LANG: 'C.UTF-8',
          ...(net ? { ...proxyEnv(net.ports), ...trustEnv() } : {}),
          ...spec.env,
          ABX_SANDBOX_ID: spec.id,
        },
        workdir: spec.workdir,
        network: spec.network,
        seccompFd: 3,
        fds: {
          passwd: 4,
          group: 5,
          token: 6,
          resolv: 7,
          ...(trusted ? { egressCa: 8 } : {}),
          ...(trusted && !trusted.files ? { bundle: 9 } : {}),
          ...(trusted?.system && !trusted.files ? { systemBundle: 10 } : {}),
        },
        ...(trusted?.files ? { trustFiles: trusted.files } : {}),
        command: envdCommand(envdArgs),
        ...(binds.length > 0 ? { volumes: binds } : {}),
      };
      const bwrap = this.options.bwrapPath ?? 'bwrap';
      const rlimits = prlimitArgs(spec.resources, root);
      const prlimit = rlimits.length > 0 ? ['prlimit', ...rlimits, '--'] : [];
      if (root && uid !== undefined) {
        const diskImage = join(spec.dir, 'disk.img');
        if (!woken) await createDiskImage(diskImage, disk, homeSeed(spec, image));
        else if (!existsSync(diskImage)) {
          throw new Error(`its disk image ${diskImage} is gone: it cannot wake`);
        }
        // Root inside (image sandboxes only, checked above): the image's files root's through
        // an idmapped mount the launcher's namespace copies, bwrap as the root uid.
        if (image && spec.allowRoot) rootLower = await this.rootLower(spec.id, uid, image.rootfs);
        const inner = bwrapArgs({
          ...common,
          home: { bind: STAGED.home },
          tmp: { bind: STAGED.tmp },
          runtimeDir: portableDir ?? this.runtimeDir,
          ...(image ? { rootfs: STAGED.root, homePath: home } : {}),
          ...(rootLower
            ? {
                rootUserns: {
                  blockFd: ROOT_BLOCK_FD,
                  infoFd: ROOT_INFO_FD,
                  sudo: join(portableDir as string, basename(SANDBOX_SUDO_DIR), 'sudo'),
                },
                command: [
                  SANDBOX_NODE,
                  ...ENVD_NODE_OPTIONS,
                  `${SANDBOX_RUNTIME_DIR}/root.cjs`,
                  ...envdArgs,
                ],
              }
            : {}),
        });
        const runAs = rootLower?.rootUid ?? uid;
        argv = [
          ...(net ? enterArgs(net) : []),
          ...launchArgv(
            {
              image: diskImage,
              uid,
              cgroups: cgroups.dirs,
              ...(image
                ? { lower: rootLower?.stage ?? image.rootfs, home, workdir: spec.workdir }
                : {}),
              ...(woken?.fromUid !== undefined ? { fromUid: woken.fromUid } : {}),
              ...(image && binds.length > 0 ? { dirs: binds.map((bind) => bind.dest) } : {}),
              ...(rootLower
                ? {
                    root: {
                      to: rootLower.rootUid,
                      ...(woken?.fromUid !== undefined
                        ? { from: rootUidOf(woken.fromUid, this.uidRange) }
                        : {}),
                    },
                  }
                : {}),
            },
            [
              'setpriv',
              `--reuid=${runAs}`,
              `--regid=${runAs}`,
              '--clear-groups',
              '--no-new-privs',
              ...prlimit,
              bwrap,
              ...inner,
            ],
          ),
        ];
      } else {
        // No loop mounts without root: the home and /tmp are tmpfs mounts of the disk quota's
        // size each (memory-backed; see docs/security.md), and envd fills the home from the
        // template's, bound read-only, before it serves anything.
        // A woken sandbox's home and /tmp come back from the copy its hibernate made.
        const saved = woken ? join(spec.dir, HIBERNATED) : undefined;
        const inner = bwrapArgs({
          ...common,
          ...(saved
            ? {
                homeTemplate: saved,
                command: envdCommand([
                  ...envdArgs,
                  '--home-template',
                  `${SANDBOX_HOME_TEMPLATE}/home`,
                  '--tmp-template',
                  `${SANDBOX_HOME_TEMPLATE}/tmp`,
                ]),
              }
            : spec.baseHome
              ? {
                  homeTemplate: spec.baseHome,
                  command: envdCommand([...envdArgs, '--home-template', SANDBOX_HOME_TEMPLATE]),
                }
              : {}),
          home: { tmpfsBytes: disk },
          tmp: { tmpfsBytes: disk },
          // The portable runtime is the daemon's uid's (localRuntimeCache), which sandboxes run as.
          runtimeDir: portableDir ?? this.runtimeDir,
        });
        argv = [
          ...(net ? enterArgs(net) : []),
          ...prlimit,
          ...(rootlessWs?.prefix ?? []),
          bwrap,
          ...inner,
        ];
        if (cgroups.dirs.length > 0) {
          argv = ['/bin/sh', '-c', JOIN_CGROUPS, 'abx-join', ...cgroups.dirs, '--', ...argv];
        }
      }
    } catch (error) {
      volumes?.release();
      if (rootLower) releaseStage(dirname(rootLower.stage));
      if (spec.workspace) {
        releaseStage(workspaceStageOf(spec.id));
        await unmountWorkspace(workspaceDir(spec.dir), true).catch(() => undefined);
      }
      await this.networks.release(net);
      await this.reclaim(cgroups.dirs, uid);
      throw new SandboxStartError(`sandbox ${spec.id} did not start: ${(error as Error).message}`, {
        cause: error,
      });
    }
    try {
      const handle = await this.run(spec, argv, {
        logFile,
        root,
        uid,
        cgroups,
        net,
        sleeps,
        ...(rootLower && uid !== undefined ? { rootMap: { rootUid: rootLower.rootUid, uid } } : {}),
      });
      if (rootlessWs) {
        const view = rootlessWorkspaceView(handle.pid, rootlessWs.merged);
        if (!view) throw new SandboxStartError(`sandbox ${spec.id} ended as it started`);
        workspace = { merged: view, upper: rootlessWs.upper };
      }
      return workspace && spec.workspace
        ? { ...handle, workspace: workspaceHandle(spec, workspace, workspaceMountedAt) }
        : handle;
    } catch (error) {
      // A failed start leaves no mount and no layer of its workspace.
      if (workspace) await unmountWorkspace(workspaceDir(spec.dir), true).catch(() => undefined);
      throw error;
    } finally {
      // The sandbox's mount namespace has its copies of the volumes' mounts by now (or it failed).
      volumes?.release();
      if (rootLower) releaseStage(dirname(rootLower.stage));
      if (workspaceStage) releaseStage(workspaceStageOf(spec.id));
    }
  }

  /**
   * A workspace's upper layer before its mount: a snapshot's copied in at the first start; one
   * whose files are another uid's (a fork's copy, a snapshot's, a wake that lost its uid) given
   * to `uid` (and its root uid to this sandbox's root uid).
   */
  private async workspaceLayer(
    spec: SandboxSpec,
    uid: number | undefined,
    woken?: Woken,
  ): Promise<void> {
    const upper = join(workspaceDir(spec.dir), 'upper');
    const layer = spec.workspace?.layer;
    let from = woken?.fromUid;
    if (layer && !existsSync(upper)) {
      if (!existsSync(layer.dir)) {
        throw new Error(`the workspace layer it starts from (${layer.dir}) is gone`);
      }
      await copyLayer(layer.dir, upper);
      from = layer.uid;
    }
    // Rootless (no uid of its own): every file is the daemon's uid's already.
    if (uid === undefined || from === undefined || from === uid || !existsSync(upper)) return;
    const ids = new Map([[from, uid]]);
    try {
      ids.set(rootUidOf(from, this.uidRange), rootUidOf(uid, this.uidRange));
    } catch {
      // `from` is not a sandbox uid of this range (a snapshot of another daemon's): no root uid.
    }
    await remapOwners(upper, ids);
  }

  private get uidRange(): UidRange {
    return this.options.uidRange ?? DEFAULT_UID_RANGE;
  }

  /**
   * The image's file system idmapped (read-only, nosuid, nodev) so that host root's files are the
   * sandbox's root uid's: the overlay's lower layer of a root-allowing sandbox. In a stage of its
   * own that the caller releases once the sandbox's mount namespace holds its copy.
   */
  private async rootLower(
    id: string,
    uid: number,
    rootfs: string,
  ): Promise<{ stage: string; rootUid: number }> {
    const rootUid = rootUidOf(uid, this.uidRange);
    const stage = join(VOLUME_STAGE_DIR, `${id}.root`);
    mkdirSync(VOLUME_STAGE_DIR, { recursive: true, mode: 0o711 });
    mkdirSync(stage, { recursive: true, mode: 0o711 });
    const lower = join(stage, 'lower');
    mkdirSync(lower, { recursive: true });
    try {
      await idmapMount(rootfs, lower, 0, rootUid, true);
    } catch (error) {
      releaseStage(stage);
      throw error;
    }
    return { stage: lower, rootUid };
  }

  /**
   * Where the shared trust bundles are kept: beside the portable runtimes, a folder every sandbox
   * uid may read (root: /run/abx-runtime; rootless: the daemon's uid's, which sandboxes run as).
   * None (each sandbox gets copies) where there is no such folder.
   */
  private trustShareDir(): string | undefined {
    const cache =
      this.options.runtimeCacheDir ??
      (this.mode === 'root' ? ROOT_PORTABLE_CACHE : localRuntimeCache());
    return cache ? join(cache, 'trust') : undefined;
  }

  /**
   * Writes an internet sandbox's trust for bwrap to copy in (fds 8-10): the egress CA, the bundle
   * with it, and (`system`) the same over the system's bundle, where the sandbox has one to bind
   * over: the host's without an image; an image's own, read without following a link, plus the
   * CA. The files are removed once bwrap has them open. The bundles are one shared file per
   * content where there is a folder every sandbox uid may read (trustShareDir): bound, not
   * copied into each sandbox.
   */
  private async writeTrust(
    spec: SandboxSpec,
    rootfs?: string,
  ): Promise<{ system: boolean; files?: { bundle: string; systemBundle?: string } }> {
    const base = rootfs
      ? await regularFileInImage(rootfs, SYSTEM_BUNDLE)
      : lstatSync(SYSTEM_BUNDLE, { throwIfNoEntry: false })?.isFile()
        ? readFileSync(SYSTEM_BUNDLE, 'utf8')
        : undefined;
    const { ca, bundle } = await this.networks.trust(base);
    const [caFile, bundleFile, systemFile] = TRUST_FILES;
    writeFileSync(join(spec.dir, caFile), ca, { mode: 0o600 });
    const shareIn = this.trustShareDir();
    if (shareIn) {
      const file = sharedBundle(shareIn, bundle);
      return {
        system: base !== undefined,
        files: { bundle: file, ...(base !== undefined ? { systemBundle: file } : {}) },
      };
    }
    writeFileSync(join(spec.dir, bundleFile), bundle, { mode: 0o600 });
    if (base !== undefined) writeFileSync(join(spec.dir, systemFile), bundle, { mode: 0o600 });
    return { system: base !== undefined };
  }

  /** Spawns a sandbox's launch command and resolves with its handle once its envd answers. */
  private async run(
    spec: SandboxSpec,
    argv: string[],
    started: {
      logFile: string;
      root: boolean;
      uid: number | undefined;
      cgroups: SandboxCgroups;
      net: KeptNet | undefined;
      /** envd runs under the sleep loop: its wake FIFO is checked (made, if the loop could not) once it answers. */
      sleeps: boolean;
      /** A root-allowing sandbox: the maps its user namespace gets (see root-userns.ts). */
      rootMap?: { rootUid: number; uid: number };
    },
  ): Promise<SandboxHandle> {
    const { logFile, root, uid, cgroups, net, rootMap, sleeps } = started;
    const [command, ...args] = argv as [string, ...string[]];

    // Root mode: the log belongs to root, so the sandbox cannot reopen envd's stdout through
    // /proc and write to the host's disk. Rootless, it would own it: the log goes through a pipe
    // to a reader outside the sandbox that keeps the first MiB and discards the rest.
    const log = root ? openSync(logFile, 'a') : cappedLog(logFile);
    const fds = [
      'seccomp.bpf',
      'passwd',
      'group',
      'token',
      'resolv.conf',
      ...TRUST_FILES.filter((name) => existsSync(join(spec.dir, name))),
    ].map((name) => openSync(join(spec.dir, name), 'r'));
    rmSync(join(spec.dir, 'token'));
    for (const name of TRUST_FILES) rmSync(join(spec.dir, name), { force: true });
    const child = spawn(command, args, {
      detached: true,
      // fd 3: the seccomp filter (`--seccomp 3`); 4, 5, 6: /etc/passwd, /etc/group, the token;
      // 7: an internet sandbox's /etc/resolv.conf; 8-10: its trust (writeTrust).
      stdio: [
        'ignore',
        log,
        log,
        ...fds,
        // fds 11 and 12 of a root-allowing sandbox: bwrap's --userns-block-fd and --info-fd.
        ...(rootMap
          ? [
              ...Array<'ignore'>(ROOT_BLOCK_FD - 3 - fds.length).fill('ignore'),
              'pipe' as const,
              'pipe' as const,
            ]
          : []),
      ],
      // bwrap's own processes (the sandbox's pid 1) keep this environment: nothing of the host's.
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
    });
    if (typeof log === 'number') closeSync(log);
    else log.destroy();
    for (const fd of fds) closeSync(fd);
    const mapped = rootMap ? this.mapRoot(child, rootMap) : undefined;
    // Awaited in the loop below (with the start's deadline); a failure is the start's.
    let mapFailure: string | undefined;
    mapped?.catch((error: Error) => {
      mapFailure = error.message;
    });
    let exited: string | undefined;
    child.on('exit', (code, signal) => {
      exited = signal ? `signal ${signal}` : `exit code ${code}`;
    });
    child.on('error', (error) => {
      exited = error.message;
    });
    child.unref();

    const handleOf = (init: number, startTime: string): SandboxHandle => ({
      provider: this.name,
      pid: init,
      startTime,
      // The sandbox's own /run/abx, reached through its root (see sandbox-socket.ts).
      envdSocket: `/proc/${init}/root${SANDBOX_RUN_DIR}/envd.sock`,
      ...(rootMap ? { envdRootSocket: `/proc/${init}/root${ENVD_ROOT_SOCKET}` } : {}),
      portsDir: `/proc/${init}/root${SANDBOX_RUN_DIR}/ports`,
      ...(uid !== undefined ? { uid } : {}),
      ...(cgroups.dirs.length > 0 ? { cgroups: cgroups.dirs } : {}),
      ...(net ? { net } : {}),
    });
    const timeoutMs = this.options.startTimeoutMs ?? 15_000;
    const deadline = Date.now() + timeoutMs;
    const fail = async (why: string) => {
      // What started may still be mounting or copying as root: all of it is in the cgroups.
      if (child.pid) this.killTree(child.pid);
      await this.networks.release(net);
      await this.reclaim(cgroups.dirs, uid);
      const tail = logTail(logFile);
      return new SandboxStartError(
        `sandbox ${spec.id} did not start: ${why}${tail ? `\n--- sandbox log ---\n${tail}` : ''}`,
      );
    };
    let init: number | undefined;
    while (Date.now() < deadline) {
      if (exited) throw await fail(`bubblewrap ended (${exited})`);
      if (mapFailure) throw await fail(`its root's user namespace: ${mapFailure}`);
      init ??= this.initPid(child.pid);
      if (
        init &&
        (await envdHealthy(`/proc/${init}/root${SANDBOX_RUN_DIR}/envd.sock`)) &&
        (!rootMap || (await envdHealthy(`/proc/${init}/root${ENVD_ROOT_SOCKET}`)))
      ) {
        const startTime = processStartTime(init);
        if (startTime) {
          // Before it is handed out: nothing of the sandbox's but envd runs yet.
          if (sleeps) {
            try {
              await makeWakeFifo(init, uid);
            } catch (error) {
              throw await fail(`its wake FIFO: ${(error as Error).message}`);
            }
          }
          return handleOf(init, startTime);
        }
      }
      await sleep(init ? 5 : 2);
    }
    throw await fail(`envd did not answer within ${timeoutMs} ms`);
  }

  /**
   * Reads the pid bwrap's --info-fd names, writes the maps of its user namespace and unblocks it
   * (see root-userns.ts). Rejects when bwrap names no child (it failed: the start says why).
   */
  private async mapRoot(
    child: ReturnType<typeof spawn>,
    map: { rootUid: number; uid: number },
  ): Promise<void> {
    const stdio = child.stdio as unknown as (Writable & NodeJS.ReadableStream)[];
    const block = stdio[ROOT_BLOCK_FD] as Writable;
    const info = stdio[ROOT_INFO_FD] as NodeJS.ReadableStream;
    let text = '';
    const pid = await new Promise<number>((resolve, reject) => {
      info.on('data', (chunk) => {
        text += chunk;
        try {
          resolve(childPidOf(text));
        } catch {
          // not whole yet
        }
      });
      info.on('error', reject);
      info.on('end', () => reject(new Error(`bwrap named no child (${text.slice(0, 200)})`)));
    });
    try {
      await mapRootUserns(pid, map.rootUid, map.uid);
    } finally {
      block.end('x');
      (info as unknown as { destroy(): void }).destroy();
    }
  }

  /** A root-mode sandbox's uid: a new one, or a woken sandbox's own (its files are that uid's). */
  private sandboxUid(spec: SandboxSpec, woken: Woken | undefined): number {
    if (woken?.uid !== undefined && this.uids.reclaim(woken.uid, spec.id, spec.dir)) {
      return woken.uid;
    }
    // Its lock was lost (a reboot empties /run): a new uid, given the home by the launcher.
    return this.uids.allocate(spec.id, spec.dir);
  }

  isAlive(handle: SandboxHandle): boolean {
    return isSameProcess(handle.pid, handle.startTime);
  }

  /**
   * With the cgroup freezer where the sandbox has one this daemon may write (a root daemon: v1's
   * freezer cgroup or v2's cgroup.freeze); else SIGSTOP to each of its processes, until none is
   * left running (a fork in between is stopped on the next round).
   */
  async freeze(handle: SandboxHandle): Promise<void> {
    if (!this.isAlive(handle)) throw new Error('its processes ended');
    // The gateway's own transfers of its files stop first: frozen, nothing may write its disk.
    await fenceSandboxFiles(handle);
    if (await freezeCgroups(cgroupsOf(handle))) return;
    for (let round = 0; round < 100; round++) {
      const running = this.processesOf(handle).filter((pid) => {
        const state = processState(pid);
        return state !== undefined && state !== 'T' && state !== 't' && state !== 'Z';
      });
      if (running.length === 0) return;
      for (const pid of running) signal(pid, 'SIGSTOP');
      await sleep(Math.min(1 + round, 10));
    }
    await this.thaw(handle);
    throw new Error('its processes kept starting new ones faster than SIGSTOP stopped them');
  }

  async thaw(handle: SandboxHandle): Promise<void> {
    if (!thawCgroups(cgroupsOf(handle))) {
      for (const pid of this.processesOf(handle)) signal(pid, 'SIGCONT');
    }
    liftSandboxFiles(handle);
  }

  /**
   * Root mode: its processes end and its disk image (home, /tmp, an image's overlay) stays in its
   * folder with its uid. Rootless: the home and /tmp are tmpfs mounts that end with it, so they
   * are copied first (frozen, so nothing changes under the copy) into its folder, without
   * sockets, FIFOs or devices, for `wake` to fill the new ones from.
   */
  async hibernate(handle: SandboxHandle, spec: SandboxSpec): Promise<void> {
    if (this.mode === 'rootless' && this.isAlive(handle)) {
      await this.freeze(handle);
      await copyHomeAndTmp(handle.pid, homeOf(spec), join(spec.dir, HIBERNATED));
    }
    await this.end(handle, false);
  }

  async wake(handle: SandboxHandle, spec: SandboxSpec): Promise<SandboxHandle> {
    // What the hibernate left of it (a daemon that died mid-way) goes first.
    await this.end(handle, false);
    if (this.mode === 'rootless' && !existsSync(join(spec.dir, HIBERNATED))) {
      throw new SandboxStartError(
        `sandbox ${spec.id} cannot wake: the copy of its home its hibernate made (${join(spec.dir, HIBERNATED)}) is gone`,
      );
    }
    const woken = await this.launch(spec, {
      ...(handle.uid !== undefined ? { uid: handle.uid, fromUid: handle.uid } : {}),
      ...(handle.net ? { ports: handle.net.ports } : {}),
    });
    // envd filled the new home and /tmp: the copy is not needed any more.
    await rm(join(spec.dir, HIBERNATED), { recursive: true, force: true });
    return woken;
  }

  /** Copies of running sandboxes' disks under way, by source pid: one freeze at a time each. */
  private readonly copying = new Map<number, Promise<unknown>>();

  /**
   * A new sandbox (`spec`: its own id, folder, tokens) on a copy of `source`'s disk: its home,
   * /tmp and an image's overlay layer; not its processes. A running source is frozen for the
   * copy only (one copy at a time per source); a frozen one (`paused`) stays frozen; a
   * hibernated one's kept disk is copied. Root: the disk image, by reflink where the file system
   * has it, else sparse; the fork gets a uid of its own, given the copied files at its start.
   * Rootless: the home and /tmp copied out of the source's tmpfs mounts (or its hibernated copy)
   * fill the fork's new ones, as a wake's do.
   */
  async fork(
    source: SandboxHandle,
    sourceSpec: SandboxSpec,
    spec: SandboxSpec,
    paused?: 'frozen' | 'hibernated',
  ): Promise<SandboxHandle> {
    const live = paused !== 'hibernated';
    if (live && !this.isAlive(source)) {
      throw new SandboxStartError(`sandbox ${sourceSpec.id} cannot be forked: its processes ended`);
    }
    mkdirSync(spec.dir, { recursive: true });
    const copy = async () => {
      // Its workspace's changes: each fork gets a layer of its own over the same host folder.
      if (sourceSpec.workspace) {
        await copyLayer(
          join(workspaceDir(sourceSpec.dir), 'upper'),
          join(workspaceDir(spec.dir), 'upper'),
        );
      }
      if (this.mode === 'root') {
        // The disk is mounted in the source: what its file system holds in memory goes to the
        // image file first (its processes are frozen: nothing is written meanwhile).
        if (live) await execFileAsync('sync', ['-f', `/proc/${source.pid}/root/tmp`]);
        await execFileAsync('cp', [
          '--reflink=auto',
          '--sparse=always',
          join(sourceSpec.dir, 'disk.img'),
          join(spec.dir, 'disk.img'),
        ]);
      } else if (live) {
        await copyHomeAndTmp(source.pid, homeOf(sourceSpec), join(spec.dir, HIBERNATED));
      } else {
        await cp(join(sourceSpec.dir, HIBERNATED), join(spec.dir, HIBERNATED), {
          recursive: true,
          preserveTimestamps: true,
          verbatimSymlinks: true,
        });
      }
    };
    try {
      if (paused) await copy();
      else await this.frozenFor(source, copy);
    } catch (error) {
      throw new SandboxStartError(
        `sandbox ${sourceSpec.id} could not be forked: copying its disk failed: ${(error as Error).message}`,
        { cause: error },
      );
    }
    const forked = await this.launch(spec, {
      ...(source.uid !== undefined ? { fromUid: source.uid } : {}),
    });
    // envd filled the new home and /tmp (rootless): the copy is not needed any more.
    await rm(join(spec.dir, HIBERNATED), { recursive: true, force: true });
    return forked;
  }

  async copyWorkspaceLayer(handle: SandboxHandle, to: string): Promise<void> {
    if (!handle.workspace) throw new Error('it has no workspace');
    await copyLayer(handle.workspace.upper, to);
  }

  /** Runs `work` with a running sandbox frozen, after other such work on it; thaws it after. */
  private frozenFor(handle: SandboxHandle, work: () => Promise<void>): Promise<void> {
    const before = this.copying.get(handle.pid) ?? Promise.resolve();
    const next = before
      .catch(() => undefined)
      .then(async () => {
        await this.freeze(handle);
        try {
          await work();
        } finally {
          await this.thaw(handle);
        }
      });
    this.copying.set(handle.pid, next);
    const clear = () => {
      if (this.copying.get(handle.pid) === next) this.copying.delete(handle.pid);
    };
    next.then(clear, clear);
    return next;
  }

  /** The processes of a sandbox: its cgroups' members, else its uid's or its init's tree. */
  private processesOf(handle: SandboxHandle): number[] {
    const pids = cgroupPids(cgroupsOf(handle));
    if (pids.length > 0) return pids;
    if (!this.isAlive(handle)) return [];
    return handle.uid === undefined ? processTree(handle.pid) : uidProcesses(handle.uid);
  }

  endCause(handle: SandboxHandle): EndCause {
    return oomKills(cgroupsOf(handle)) > 0 ? 'oom' : 'exited';
  }

  kill(handle: SandboxHandle): Promise<void> {
    return this.end(handle, true);
  }

  /**
   * Kills every process of the sandbox (a frozen one too) and removes its cgroups and network;
   * `release`: its uid is freed too (a hibernate keeps it, as its disk's files are that uid's).
   */
  private async end(handle: SandboxHandle, release: boolean): Promise<void> {
    // The gateway's transfers of its files stop and close first: a descriptor the daemon holds
    // would keep its disk mounted after its processes (a hibernated disk mounted twice on wake).
    await fenceSandboxFiles(handle);
    const cgroups = cgroupsOf(handle);
    // SIGKILL is not refused, but a process in uninterruptible sleep takes its time: 5 s at most.
    const deadline = Date.now() + 5000;
    const until = async (done: () => boolean) => {
      for (let wait = 1; !done() && Date.now() < deadline; wait = Math.min(wait * 2, 20)) {
        await sleep(wait);
      }
    };
    if (this.isAlive(handle)) {
      killPids([handle.pid]);
      // A frozen process dies of SIGKILL only once thawed (the v1 freezer).
      thawCgroups(cgroups);
      // The kernel kills the rest of the pid namespace once its init is gone; wait for that.
      await until(() => !isSameProcess(handle.pid, handle.startTime));
    }
    await this.reclaim(cgroups, handle.uid, deadline, release);
    await this.networks.release(handle.net);
    // Its workspace's overlay: unmounted (a wake mounts it again); a kill removes its layers.
    if (handle.workspace) await unmountWorkspace(handle.workspace.dir, release);
  }

  /**
   * From its cgroups where it has them (CPU time, memory charged, limits), else from /proc (the
   * CPU time and resident memory of its processes); the disk from the file system its home is on
   * (root: the ext4 image that holds home and /tmp; rootless: the home's tmpfs).
   */
  async metrics(handle: SandboxHandle): Promise<SandboxUsage> {
    const dirs = cgroupsOf(handle);
    let pids = cgroupPids(dirs);
    if (pids.length === 0) {
      pids = handle.uid === undefined ? processTree(handle.pid) : uidProcesses(handle.uid);
    }
    return sandboxUsage(cgroupUsage(dirs), pids, handle.pid);
  }

  /**
   * Root inside needs a root daemon (it writes user namespace maps of two host uids and idmaps
   * the image), and a uid range whose root uids (rootUidOf) are no account of this host.
   */
  rootUnavailable(): string | undefined {
    if (this.mode !== 'root') {
      return 'a rootless daemon cannot give: it has one host uid, and root inside needs a second one (run the daemon as root)';
    }
    const { first, count } = this.uidRange;
    const taken = hostAccountIn(first + count, first + 2 * count);
    return taken === undefined
      ? undefined
      : `this host cannot give: root inside would run as host uid ${taken.uid}, which is the account '${taken.name}' in /etc/passwd (ABX_UID_RANGE ${first}+${count} leaves the uids above it, ${first + count}-${first + 2 * count - 1}, for root inside: choose a range with no accounts above it)`;
  }

  /** A workspace needs a root daemon: an idmapped mount and an overlay of the host folder. */
  workspaceUnavailable(): string | undefined {
    // Rootless: an overlay in a user namespace of the daemon's own (workspace-userns.ts).
    return this.mode === 'root' ? undefined : rootlessOverlayUnavailable();
  }

  internetUnavailable(): string | undefined {
    const support = this.networks.support();
    return support.enforced ? undefined : support.how;
  }

  setNetwork(handle: SandboxHandle, policy: EgressPolicy): Promise<SandboxHandle> {
    return this.networks.setPolicy(handle, policy);
  }

  denyEgressTo(cidrs: string[]): void {
    this.networks.denyListeners(cidrs);
  }

  networkStats(handle: SandboxHandle): Promise<EgressCounters> {
    return this.networks.stats(handle);
  }

  egressAudit(epoch: string | undefined, after: number, harvest?: string) {
    return this.networks.audit(epoch, after, harvest);
  }

  adopt(handle: SandboxHandle): Promise<void> {
    return this.networks.adopt(handle);
  }

  /**
   * Kills whatever is left in a sandbox's cgroups (or, without cgroups, of its uid), waits until
   * it is gone (until `deadline`, 5 s by default), removes the cgroups and frees the uid.
   */
  private async reclaim(
    cgroups: readonly string[],
    uid: number | undefined,
    deadline = Date.now() + 5000,
    releaseUid = true,
  ): Promise<void> {
    // Every process of a sandbox is in its pids cgroup: watching that is cheaper than scanning
    // /proc for the uid, which is the fallback when the host gave it no cgroup.
    for (let wait = 1; Date.now() < deadline; wait = Math.min(wait * 2, 20)) {
      const left = cgroupPids(cgroups);
      if (left.length === 0) break;
      killPids(left);
      await sleep(wait);
    }
    if (uid !== undefined && cgroups.length === 0) await this.waitUidGone(uid);
    thawCgroups(cgroups);
    for (let i = 0; i < 200 && !removeCgroups(cgroups); i++) await sleep(10);
    if (releaseUid) this.uids.release(uid);
  }

  async sweepOrphans(sandboxesDir: string, running: ReadonlySet<string>): Promise<string[]> {
    // Host-wide leftovers of sandboxes whose installation is gone: empty cgroups, free uids.
    sweepEmptyCgroups();
    if (this.mode === 'root') {
      this.uids.sweepStale();
      // A daemon killed while it started a sandbox with volumes left their idmapped mounts.
      sweepVolumeStages(4 * (this.options.startTimeoutMs ?? 15_000));
    }
    await this.pruneImages();
    const orphans = new Map<string, number[]>();
    const ours = (id: string | undefined): id is string =>
      !!id && /^[\w.-]+$/.test(id) && !running.has(id) && existsSync(join(sandboxesDir, id));
    for (const entry of readdirSync('/proc')) {
      if (!/^\d+$/.test(entry)) continue;
      let argv: string[];
      try {
        argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      } catch {
        continue;
      }
      // Both bwrap processes of a sandbox carry its id as the hostname, and its folder is ours.
      if (!argv[0]?.endsWith('bwrap')) continue;
      const id = argv[argv.indexOf('--hostname') + 1];
      if (argv.includes('--hostname') && ours(id)) {
        orphans.set(id, [...(orphans.get(id) ?? []), Number(entry)]);
      }
    }
    for (const pids of orphans.values()) killPids(pids);
    // Network holders and slirp4netns of sandboxes that do not run (a crash mid-create, a kill
    // that a SIGKILLed daemon did not finish).
    killPids(this.networks.orphans(ours));
    // Root mode: a uid handed to a sandbox of ours that is not running is freed.
    if (this.mode === 'root') {
      for (const lock of this.uids.held()) {
        if (lock.dir !== join(sandboxesDir, lock.sandbox) || !ours(lock.sandbox)) continue;
        killPids(uidProcesses(lock.uid));
        await this.waitUidGone(lock.uid);
        this.uids.release(lock.uid);
        if (!orphans.has(lock.sandbox)) orphans.set(lock.sandbox, []);
      }
    }
    for (const id of orphans.keys()) {
      const dirs = cgroupDirsOf(id);
      killPids(cgroupPids(dirs));
      removeCgroups(dirs);
    }
    return [...orphans.keys()];
  }

  async sandboxNode(image: boolean): Promise<SandboxNode> {
    if (image) return portableSandboxNode();
    return sandboxNodeOf(await this.noImageNode(), process.execPath);
  }

  isolation(): IsolationReport {
    if (this.report) return this.report;
    const support = cgroupSupport();
    const root = this.mode === 'root';
    const cgroup = (controller: 'memory' | 'cpu' | 'pids', file: string) => ({
      enforced: support[controller],
      how: support[controller]
        ? `${controller} cgroup (${file}) under ${cgroupParent()}/, owned by the daemon`
        : `not enforced: no writable ${controller} cgroup for this daemon (see docs/security.md)`,
    });
    const limits: IsolationReport['limits'] = {
      processes: cgroup('pids', 'pids.max'),
      memory: cgroup('memory', 'memory.max / memory.limit_in_bytes'),
      cpu: cgroup('cpu', 'cpu.max / cpu.cfs_quota_us'),
      disk: root
        ? { enforced: true, how: 'an ext4 disk image per sandbox holds its home and /tmp' }
        : {
            enforced: true,
            how: 'rootless: the home and /tmp are tmpfs mounts of the quota each (memory-backed)',
          },
      open_files: { enforced: true, how: 'RLIMIT_NOFILE' },
      file_size: { enforced: true, how: 'RLIMIT_FSIZE' },
      egress: this.networks.support(),
      pause: freezerSupport()
        ? { enforced: true, how: 'the cgroup freezer (a pause keeps memory, uses no CPU)' }
        : {
            enforced: true,
            how: 'SIGSTOP to each process (no freezer cgroup this daemon may write): a process of the sandbox sees SIGCONT on resume',
          },
      volume_quota: root
        ? {
            enforced: true,
            how: 'an ext4 disk image per volume, idmapped into each sandbox that mounts it (its files the sandbox user’s, one reserved host uid’s on disk)',
          }
        : {
            enforced: false,
            how: 'rootless: a volume is a folder of the daemon’s uid, its size reported but not enforced (no loop mounts without root)',
          },
    };
    const warnings = Object.entries(limits)
      .filter(([, limit]) => !limit.enforced)
      .map(([name, limit]) => `${name}: ${limit.how}`);
    if (!root) {
      warnings.unshift(
        'rootless: sandboxes run as the daemon’s own uid (isolated by namespaces, seccomp and no /sys); run the daemon as root to give each sandbox a uid of its own',
      );
    }
    this.report = { mode: this.mode, limits, warnings };
    return this.report;
  }

  /**
   * bwrap forks the namespace's init; it is the only child of the bwrap we started. Before our
   * process has become bwrap (root mode runs a launcher first) its children are not the init.
   */
  private initPid(bwrapPid: number | undefined): number | undefined {
    if (!bwrapPid) return undefined;
    try {
      const argv0 = readFileSync(`/proc/${bwrapPid}/cmdline`, 'utf8').split('\0')[0];
      if (!argv0?.endsWith('bwrap')) return undefined;
      const children = readFileSync(`/proc/${bwrapPid}/task/${bwrapPid}/children`, 'utf8')
        .trim()
        .split(/\s+/)
        .filter(Boolean)
        .map(Number);
      return children.length === 1 ? children[0] : undefined;
    } catch {
      return undefined;
    }
  }

  private killTree(bwrapPid: number): void {
    killPids([this.initPid(bwrapPid), bwrapPid].filter((pid): pid is number => !!pid));
  }

  /** Waits (up to 5 s) until no process runs as `uid`, so it can be handed out again. */
  private async waitUidGone(uid: number): Promise<void> {
    const deadline = Date.now() + 5000;
    for (let wait = 5; Date.now() < deadline; wait = Math.min(wait * 2, 100)) {
      const left = uidProcesses(uid);
      if (left.length === 0) return;
      killPids(left);
      await sleep(wait);
    }
  }
}

/**
 * What a root-mode sandbox's home starts with: the template's built home (a host template's
 * setup, a snapshot's), else its image's /home/<user>; each seeds a formatted disk once, named by
 * the folder's identity (a rebuilt template's home is a new folder) or by the image's id.
 */
function homeSeed(
  spec: SandboxSpec,
  image: { rootfs: string; home?: string } | undefined,
): HomeSeed | undefined {
  if (spec.baseHome) {
    const stats = statSync(spec.baseHome);
    return {
      from: spec.baseHome,
      disk: `${spec.baseHome}-disk-${stats.ino}-${Math.floor(stats.mtimeMs)}`,
    };
  }
  if (image?.home) {
    return { from: image.home, disk: join(dirname(image.rootfs), `home-${spec.user ?? 'user'}`) };
  }
  return undefined;
}

function cgroupsOf(handle: SandboxHandle): string[] {
  return handle.cgroups ?? (handle.cgroup ? [handle.cgroup] : []);
}
