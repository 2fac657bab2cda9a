import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingMessage } from 'node:http';
import { dirname, join, posix } from 'node:path';
import { Readable } from 'node:stream';
import { SANDBOX_RUN_DIR } from '../../../runtime/protocol/constants.js';
import type { EgressPolicy } from '../../egress/policy.js';
import { SANDBOX_RESOLV_CONF } from '../../egress/sandbox-net.js';
import { type KeptNet, SandboxNetworks } from '../../egress/sandbox-networks.js';
import type { EgressCounters, EgressPorts } from '../../egress/service.js';
import {
  InvalidArgumentError,
  SandboxError,
  SandboxStartError,
  UnavailableError,
} from '../../errors.js';
import { cgroupPids, cgroupUsage, oomKills, removeCgroups } from '../local/cgroups.js';
import { envdHealthy } from '../local/local-provider.js';
import { isSameProcess, processStartTime, processTree } from '../local/proc.js';
import { sandboxUsage } from '../local/sandbox-usage.js';
import {
  checkWorkspaceSpec,
  copyLayer,
  type MountedWorkspace,
  mountWorkspace,
  remapOwners,
  unmountWorkspace,
  workspaceDir,
  workspaceHandle,
} from '../local/workspace-mount.js';
import { type PortableRuntime, portableRuntime, portableSandboxNode } from '../portable-runtime.js';
import {
  type EndCause,
  envdTokenFile,
  type IsolationReport,
  type SandboxHandle,
  type SandboxNode,
  type SandboxProvider,
  type SandboxSpec,
  type SandboxUsage,
} from '../provider.js';
import {
  containerOptions,
  SANDBOX_LABEL,
  SANDBOXES_DIR_LABEL,
  sandboxesDirHash,
  sandboxUser,
} from './container-config.js';
import {
  dockerClient,
  dockerMessage,
  type EngineFacts,
  engineAddress,
  engineError,
  probeEngine,
  statusOf,
} from './engine.js';
import {
  type ContainerInfo,
  type DockerEngine,
  type EngineContainer,
  logText,
} from './engine-client.js';
import { DockerImageStore } from './image-store.js';
import { sandboxArchive, workdirChain } from './sandbox-archive.js';
import { adoptMemory, prepareMemoryCgroup, sandboxCgroupDirs } from './sandbox-cgroups.js';
import { DockerVolumes } from './volumes.js';
import {
  dockerWorkspaceUnavailable,
  workspaceBind,
  workspaceHostUid,
  workspaceMissing,
} from './workspace.js';

/** The image sandboxes of templates without an image start from (with the user added). */
export const DEFAULT_BASE_IMAGE = 'debian:bookworm-slim';

export interface DockerProviderOptions {
  /** Host folder holding envd.cjs and server.cjs (the package's dist/runtime). */
  runtimeDir: string;
  /** Where the portable runtime is built (default: /run/abx-runtime for root; else required). */
  runtimeCacheDir?: string;
  /** How long a new sandbox's envd has to answer, from the call; default 15 s. */
  startTimeoutMs?: number;
  /** The image of templates without one; default {@link DEFAULT_BASE_IMAGE}. */
  baseImage?: string;
  /** The engine's client; default: `DOCKER_HOST`, else /var/run/docker.sock. */
  docker?: DockerEngine;
}

/** The repository of fork images, tagged with the fork's id, and their label (the same id). */
const FORK_IMAGE = 'abx-fork';
const FORK_LABEL = 'abx.fork';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
/** How long `kill` waits for the engine to remove a container. */
const KILL_MS = 5000;

/** Rejects with `what` when `promise` takes longer than `ms`. */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new SandboxError(`${what} took over ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Best effort: the end of a container's own output (envd's complaints), for start errors. */
async function logTail(container: EngineContainer): Promise<string> {
  try {
    const raw = await container.logs({ stdout: true, stderr: true, tail: 40 });
    return logText(raw).trim().slice(-2000);
  } catch {
    return '';
  }
}

/**
 * Sandboxes as Docker containers, one each, on an engine of this host: the image's file system,
 * envd on the portable runtime (bound read-only at /opt/abx, so the image needs neither Node nor
 * glibc), docker-init as pid 1. The handle names the container and its init as the host sees it
 * (`State.Pid` and its start time), so liveness is a /proc read like the local provider's, and
 * envd's socket is reached through `/proc/<init>/root/run/abx` (a tmpfs of the container's own),
 * walked without following anything the sandbox controls.
 */
export class DockerProvider implements SandboxProvider {
  readonly name = 'docker';
  /** The internet networks of this provider's sandboxes (the egress service on first use). */
  readonly networks = new SandboxNetworks();
  readonly images: DockerImageStore;
  /** Volumes: Docker named volumes, each a bind of an ext4 disk of its size where it can be. */
  readonly volumes: DockerVolumes;
  private readonly docker: DockerEngine;
  private facts: EngineFacts | undefined;
  private probing: Promise<EngineFacts> | undefined;
  private runtime: Promise<PortableRuntime> | undefined;
  private readonly bases = new Map<string, Promise<string>>();
  /** OOM kills learnt from the engine (events, or an inspect in `kill`), by container id. */
  private readonly oomKilled = new Map<string, boolean>();
  private events: IncomingMessage | undefined;
  private closed = false;
  private readonly address: string;
  /** Releases the client this provider made (its connections to the engine). */
  private closeClient: () => void = () => undefined;
  /** Why the base image cannot be used, when the probe found it missing. */
  private baseMissing: string | undefined;

  constructor(private readonly options: DockerProviderOptions) {
    if (options.docker) this.docker = options.docker;
    else {
      const client = dockerClient();
      this.docker = client.docker;
      this.closeClient = client.close;
    }
    this.address = engineAddress(this.docker);
    this.images = new DockerImageStore(this.docker);
    this.volumes = new DockerVolumes(this.docker, () => this.engine(), this.address);
    // isolation() is synchronous: learn what the engine offers early (failures come again later).
    this.engine().catch(() => undefined);
  }

  /** What the engine offers, probed once (again after a failure). */
  engine(): Promise<EngineFacts> {
    this.probing ??= probeEngine(this.docker).then(
      async (facts) => {
        const base = this.options.baseImage ?? DEFAULT_BASE_IMAGE;
        this.baseMissing = await this.images.inspectImage(base).then(
          () => undefined,
          (error: Error) => error.message,
        );
        this.facts = facts;
        // Where the kernel's count is out of reach (see sandbox-cgroups.ts), the engine's word.
        if (facts.cgroupDriver !== 'cgroupfs' || process.getuid?.() !== 0) this.watchOomEvents();
        return facts;
      },
      (error: unknown) => {
        this.probing = undefined;
        throw error;
      },
    );
    return this.probing;
  }

  async create(spec: SandboxSpec): Promise<SandboxHandle> {
    if (spec.network === 'internet' && process.getuid?.() !== 0) {
      // Denied rather than allowed: a sandbox that asked for a policy never runs without one.
      throw new SandboxStartError(
        `sandbox ${spec.id} did not start: the internet network on docker needs a root daemon (it configures the container's network namespace); run the daemon as root, or use the local provider (docs/network.md)`,
      );
    }
    if (spec.workspace) {
      const why = this.workspaceUnavailable();
      if (why) {
        throw new InvalidArgumentError(
          `sandbox ${spec.id} cannot mount its workspace (${spec.workspace.from}): ${why}`,
        );
      }
      checkWorkspaceSpec(spec.workspace);
    }
    const timeoutMs = this.options.startTimeoutMs ?? 15_000;
    const deadline = Date.now() + timeoutMs;
    const user = sandboxUser(spec);
    mkdirSync(spec.dir, { recursive: true });
    if (spec.network === 'internet')
      writeFileSync(join(spec.dir, 'resolv.conf'), SANDBOX_RESOLV_CONF);
    let net: KeptNet | undefined;
    let egress: EgressPorts | undefined;
    let container: EngineContainer | undefined;
    let workspace: MountedWorkspace | undefined;
    let workspaceMountedAt = 0;

    const fail = async (why: string, cause?: unknown): Promise<SandboxStartError> => {
      const tail = container ? await logTail(container) : '';
      await this.networks.release(net ?? (egress ? { id: spec.id } : undefined));
      if (container) await this.removeContainer(container.id).catch(() => undefined);
      await this.removeSandboxCgroups(spec.id);
      // A failed start leaves no mount and no layer of its workspace.
      if (spec.workspace) {
        await unmountWorkspace(workspaceDir(spec.dir), true).catch(() => undefined);
      }
      return new SandboxStartError(
        `sandbox ${spec.id} did not start: ${why}${tail ? `\n--- sandbox log ---\n${tail}` : ''}`,
        cause === undefined ? undefined : { cause },
      );
    };
    const late = () => `envd did not answer within ${timeoutMs} ms`;
    const step = async <T>(what: string, work: () => Promise<T>): Promise<T> => {
      if (Date.now() >= deadline) throw await fail(late());
      try {
        return await work();
      } catch (error) {
        if (error instanceof SandboxStartError) throw error;
        // A policy egress refuses (its proxy's address) is the caller's to change.
        if (error instanceof InvalidArgumentError) {
          await fail(what);
          throw error;
        }
        const mapped = engineError(error, what, this.address);
        if (mapped instanceof UnavailableError) {
          await fail(what);
          throw mapped;
        }
        throw await fail(`${what}: ${dockerMessage(error)}`, error);
      }
    };

    const engine = await step('the Docker engine', () => this.engine());
    const runtime = await step('the portable runtime', () => this.portableRuntime());
    const image = await step('its image', () =>
      spec.image ? Promise.resolve(spec.image) : this.baseImage(),
    );
    const imageInfo = await step('its image', () => this.images.inspectImage(image));
    const imagePath = imageInfo.Config?.Env?.find((entry) => entry.startsWith('PATH='))?.slice(5);
    const mounts = spec.volumeMounts ?? [];
    if (mounts.length > 0) await step('its volumes', () => this.volumes.prepare(mounts));
    if (spec.network === 'internet') {
      egress = await step('egress', () => this.networks.serve(spec.id, spec.egress, false));
      // What the container trusts beside its image's CAs (see container-config.ts): the host's
      // bundle with the egress CA, since the image's own is not read from here.
      const trust = await step('egress', () => this.networks.trust());
      writeFileSync(join(spec.dir, 'egress-ca.pem'), trust.ca, { mode: 0o644 });
      writeFileSync(join(spec.dir, 'ca-certificates.crt'), trust.bundle, { mode: 0o644 });
    }
    if (spec.workspace) {
      const why = dockerWorkspaceUnavailable(this.address, engine);
      if (why) {
        await fail(why);
        throw new InvalidArgumentError(
          `sandbox ${spec.id} cannot mount its workspace (${spec.workspace.from}): ${why}`,
        );
      }
      workspaceMountedAt = spec.workspace.since ?? Date.now();
      try {
        await this.workspaceLayer(spec, workspaceHostUid(engine, user.uid));
        workspace = await mountWorkspace(
          workspaceDir(spec.dir),
          spec.workspace.from,
          workspaceHostUid(engine, user.uid),
          spec.workspace.user,
        );
      } catch (error) {
        throw await fail((error as Error).message, error);
      }
    }
    const options = containerOptions(spec, {
      ...(egress ? { egress } : {}),
      ...(workspace && spec.workspace
        ? { workspace: workspaceBind(workspace.merged, spec.workspace.path) }
        : {}),
      image: imageInfo.Id,
      ...(imagePath ? { imagePath } : {}),
      runtimeDir: runtime.dir,
      sandboxesDir: dirname(spec.dir),
      engine,
    });
    const cgroupfs = engine.cgroupDriver === 'cgroupfs';
    const ownMemory = cgroupfs && prepareMemoryCgroup(spec.id, spec.resources.memory);
    container = await step('docker could not create its container', () =>
      this.docker.createContainer(options),
    );
    const made = container;
    // The workdir: below the home it is made as the user's; elsewhere only when the image lacks it.
    const dirs = user.uid === 0 ? [] : workdirChain(user.home, spec.workdir);
    if (dirs.length === 0 && !(await this.exists(made, spec.workdir))) {
      dirs.push(posix.normalize(spec.workdir));
    }
    // The folders above a volume or the workspace in the home are the user's (the engine would
    // make them root's); nothing is written in either.
    const mounted = [
      ...mounts.map((mount) => mount.path),
      ...(spec.workspace ? [spec.workspace.path] : []),
    ];
    for (const path of user.uid === 0 ? [] : mounted) {
      for (const dir of workdirChain(user.home, posix.dirname(path))) {
        if (!dirs.includes(dir)) dirs.push(dir);
      }
    }
    await step('docker could not copy its files in', () =>
      made.putArchive(
        Readable.from(
          sandboxArchive({
            uid: user.uid,
            token: envdTokenFile(spec),
            ...(user.uid === 0 ? {} : { home: user.home }),
            ...(spec.baseHome && user.uid !== 0 ? { baseHome: spec.baseHome } : {}),
            dirs,
            skip: mounted,
          }),
        ),
        { path: '/' },
      ),
    );
    await step('docker could not start it', () => made.start());
    if (ownMemory) adoptMemory(spec.id, made.id);
    const info = await step('docker could not inspect it', () => made.inspect());
    const pid = info.State.Pid;
    const startTime = pid > 0 ? processStartTime(pid) : undefined;
    if (!startTime) {
      throw await fail(
        info.State.Running
          ? `its init (pid ${pid}) is not a process of this host: the Docker engine must run on the daemon's host`
          : `it ended at once (exit code ${info.State.ExitCode}${info.State.Error ? `: ${info.State.Error}` : ''})`,
      );
    }
    const missing =
      this.volumes.missingDisk(pid, mounts) ??
      (workspace && spec.workspace
        ? workspaceMissing(pid, workspace.merged, spec.workspace.path)
        : undefined);
    if (missing) throw await fail(missing);
    if (spec.network === 'internet') {
      // The container started with no network (NetworkMode none): it gets its rules, then its
      // only link, before create returns and anything of the user's runs in it.
      try {
        net = await this.networks.start({
          id: spec.id,
          policy: spec.egress,
          rootless: false,
          existing: pid,
          ...(egress ? { ports: egress } : {}),
        });
      } catch (error) {
        throw await fail((error as Error).message, error);
      }
    }
    const socket = `/proc/${pid}/root${SANDBOX_RUN_DIR}/envd.sock`;
    while (Date.now() < deadline) {
      if (!isSameProcess(pid, startTime)) throw await fail('envd ended before it answered');
      if (await envdHealthy(socket)) {
        return {
          provider: this.name,
          pid,
          startTime,
          envdSocket: socket,
          portsDir: `/proc/${pid}/root${SANDBOX_RUN_DIR}/ports`,
          container: made.id,
          ...(cgroupfs ? { cgroups: sandboxCgroupDirs(spec.id) } : {}),
          ...(net ? { net } : {}),
          ...(workspace && spec.workspace
            ? { workspace: workspaceHandle(spec, workspace, workspaceMountedAt) }
            : {}),
        };
      }
      await sleep(5);
    }
    throw await fail(late());
  }

  isAlive(handle: SandboxHandle): boolean {
    return isSameProcess(handle.pid, handle.startTime);
  }

  /** `docker pause`: the engine's cgroup freezer holds every process of the container. */
  async freeze(handle: SandboxHandle): Promise<void> {
    const container = this.containerOf(handle);
    await this.engineCall('docker pause', async () => {
      const info = await container.inspect();
      if (!info.State.Running) throw new SandboxError('its container is not running');
      if (!info.State.Paused) await container.pause();
    });
  }

  async thaw(handle: SandboxHandle): Promise<void> {
    const container = this.containerOf(handle);
    await this.engineCall('docker unpause', async () => {
      const info = await container.inspect();
      if (info.State.Paused) await container.unpause();
    });
  }

  /**
   * A stop that keeps the container: its writable layer (home, /tmp, everything written outside
   * them) stays on the engine's disk; its network ends (`wake` serves it on the same ports).
   */
  async hibernate(handle: SandboxHandle): Promise<void> {
    const container = this.containerOf(handle);
    await this.engineCall('docker stop', async () => {
      const info = await container.inspect();
      if (info.State.Paused) await container.unpause();
      // No grace: a hibernate keeps the disk, not the processes (as a kill would end them).
      if (info.State.Running) await container.stop({ t: 0 });
    });
    await this.networks.release(handle.net);
    // Its workspace's overlay: unmounted, its layers kept (the wake mounts it again).
    if (handle.workspace) await unmountWorkspace(handle.workspace.dir, false);
  }

  /**
   * `docker start` of the kept container, with envd's token put back first (envd deletes it once
   * read), then its network again on the same egress ports (its environment names them).
   */
  async wake(handle: SandboxHandle, spec: SandboxSpec): Promise<SandboxHandle> {
    const container = this.containerOf(handle);
    const deadline = Date.now() + (this.options.startTimeoutMs ?? 15_000);
    const user = sandboxUser(spec);
    const info = await this.engineCall('docker start', async () => {
      await container.putArchive(
        Readable.from(sandboxArchive({ uid: user.uid, token: envdTokenFile(spec) })),
        { path: '/' },
      );
      // A quota volume's disk is mounted on the host again (after a reboot) before the engine binds it.
      await this.volumes.prepare(spec.volumeMounts ?? []);
      if (handle.cgroups) prepareMemoryCgroup(spec.id, spec.resources.memory);
      // The workspace's overlay again, over the kept upper layer, before the engine binds it.
      if (handle.workspace) {
        const facts = await this.engine();
        await mountWorkspace(
          handle.workspace.dir,
          handle.workspace.from,
          workspaceHostUid(facts, user.uid),
          // Mounted for a local client's user: that uid again (control/workspace-access.ts).
          handle.workspace.uid === undefined ? undefined : { uid: handle.workspace.uid },
        );
      }
      await container.start();
      if (handle.cgroups) adoptMemory(spec.id, container.id);
      return container.inspect();
    });
    const pid = info.State.Pid;
    const startTime = pid > 0 ? processStartTime(pid) : undefined;
    if (!startTime) {
      throw new SandboxStartError(
        `sandbox ${spec.id} did not wake: its container ended at once (exit code ${info.State.ExitCode})`,
      );
    }
    const missing =
      this.volumes.missingDisk(pid, spec.volumeMounts ?? []) ??
      (handle.workspace
        ? workspaceMissing(pid, handle.workspace.view, handle.workspace.path)
        : undefined);
    if (missing) {
      await container.stop({ t: 0 }).catch(() => undefined);
      if (handle.workspace)
        await unmountWorkspace(handle.workspace.dir, false).catch(() => undefined);
      throw new SandboxStartError(`sandbox ${spec.id} did not wake: ${missing}`);
    }
    let net: KeptNet | undefined;
    if (handle.net) {
      const ports = await this.networks.egress.add(spec.id, handle.net.policy, handle.net.ports);
      net = await this.networks.start({
        id: spec.id,
        policy: handle.net.policy,
        rootless: false,
        existing: pid,
        ports,
      });
    }
    const socket = `/proc/${pid}/root${SANDBOX_RUN_DIR}/envd.sock`;
    while (Date.now() < deadline) {
      if (!isSameProcess(pid, startTime)) break;
      if (await envdHealthy(socket)) {
        return {
          ...handle,
          pid,
          startTime,
          envdSocket: socket,
          portsDir: `/proc/${pid}/root${SANDBOX_RUN_DIR}/ports`,
          ...(net ? { net } : {}),
        };
      }
      await sleep(5);
    }
    const tail = await logTail(container);
    await container.stop({ t: 0 }).catch(() => undefined);
    await this.networks.release(net);
    if (handle.workspace)
      await unmountWorkspace(handle.workspace.dir, false).catch(() => undefined);
    throw new SandboxStartError(
      `sandbox ${spec.id} did not wake: envd did not answer${tail ? `\n--- sandbox log ---\n${tail}` : ''}`,
    );
  }

  /**
   * `docker commit` of the source's container (paused by the engine for the commit; a paused or
   * stopped one as it is) to a throwaway image `abx-fork:<fork id>`, labelled {@link FORK_LABEL},
   * and a sandbox created from it as `create` does (its token, egress, limits): the source's
   * whole writable layer (home, /tmp, everything it changed) comes along, not its processes.
   * The image goes when the fork is killed (`kill`), or at the next orphan sweep when it is left.
   * A workspace's upper layer is copied for the fork (the commit leaves bind mounts out).
   */
  async fork(
    source: SandboxHandle,
    sourceSpec: SandboxSpec,
    spec: SandboxSpec,
  ): Promise<SandboxHandle> {
    const container = this.containerOf(source);
    let paused = false;
    let committed: { Id?: string };
    try {
      if (source.workspace) {
        // A commit leaves bind mounts out: the fork gets its own copy of the source's upper
        // layer (the same host uid's), taken with its disk while the source is paused.
        const info = await this.engineCall('docker inspect', () => container.inspect());
        if (info.State.Running && !info.State.Paused) {
          await this.freeze(source);
          paused = true;
        }
        await this.copyWorkspaceLayer(source, join(workspaceDir(spec.dir), 'upper'));
      }
      committed = await this.engineCall('docker commit', () =>
        container.commit({
          repo: FORK_IMAGE,
          tag: spec.id,
          pause: true,
          changes: `LABEL ${FORK_LABEL}=${spec.id}`,
        }),
      );
    } catch (error) {
      rmSync(workspaceDir(spec.dir), { recursive: true, force: true });
      throw new SandboxStartError(
        `sandbox ${sourceSpec.id} could not be forked: ${(error as Error).message}`,
        { cause: error },
      );
    } finally {
      if (paused) await this.thaw(source);
    }
    const image = committed.Id ?? `${FORK_IMAGE}:${spec.id}`;
    try {
      return await this.create({ ...spec, image });
    } catch (error) {
      await this.docker
        .getImage(image)
        .remove()
        .catch(() => undefined);
      throw error;
    }
  }

  /** Copies a sandbox's workspace upper layer to `to` (not there yet); the caller paused it. */
  async copyWorkspaceLayer(handle: SandboxHandle, to: string): Promise<void> {
    if (!handle.workspace) throw new SandboxError('it has no workspace');
    await copyLayer(handle.workspace.upper, to);
  }

  /**
   * A snapshot's upper layer (`spec.workspace.layer`), copied in at the first start, its files
   * given to the host uid `uid` of this sandbox's user.
   */
  private async workspaceLayer(spec: SandboxSpec, uid: number): Promise<void> {
    const layer = spec.workspace?.layer;
    const upper = join(workspaceDir(spec.dir), 'upper');
    if (!layer || existsSync(upper)) return;
    if (!existsSync(layer.dir)) {
      throw new Error(`the workspace layer it starts from (${layer.dir}) is gone`);
    }
    await copyLayer(layer.dir, upper);
    if (layer.uid !== uid) await remapOwners(upper, new Map([[layer.uid, uid]]));
  }

  private containerOf(handle: SandboxHandle): EngineContainer {
    if (!handle.container) throw new SandboxError('the sandbox has no container');
    return this.docker.getContainer(handle.container);
  }

  /** An engine call, with the engine's failures in abx's words (an unreachable engine: 503). */
  private async engineCall<T>(what: string, work: () => Promise<T>): Promise<T> {
    try {
      return await within(work(), KILL_MS * 2, what);
    } catch (error) {
      if (error instanceof SandboxError) throw error;
      const mapped = engineError(error, what, this.address);
      if (mapped instanceof UnavailableError) throw mapped;
      throw new SandboxError(`${what}: ${dockerMessage(error)}`, { cause: error });
    }
  }

  /**
   * From the sandbox's parent cgroups (cgroupfs driver): their usage counts the container's cgroup
   * below them, whose limits Docker set. Without them (the systemd driver), from /proc: the
   * container's init and its descendants. The disk: the file system of its home (the container's
   * overlay, on the engine's disk; its size is the engine's disk, not a StorageOpt quota).
   */
  async metrics(handle: SandboxHandle): Promise<SandboxUsage> {
    const parents = handle.cgroups ?? [];
    const container = handle.container;
    const inner = container
      ? parents.map((dir) => join(dir, container)).filter((dir) => existsSync(dir))
      : [];
    const own = cgroupUsage(parents);
    const limits = cgroupUsage(inner);
    const pids = cgroupPids([...parents, ...inner]);
    return sandboxUsage(
      {
        ...own,
        ...(limits.cpuLimit === undefined ? {} : { cpuLimit: limits.cpuLimit }),
        ...(limits.memLimit === undefined || (own.memLimit ?? Infinity) < limits.memLimit
          ? {}
          : { memLimit: limits.memLimit }),
      },
      pids.length > 0 ? pids : processTree(handle.pid),
      handle.pid,
    );
  }

  endCause(handle: SandboxHandle): EndCause {
    if (handle.cgroups && oomKills(handle.cgroups) > 0) return 'oom';
    return handle.container && this.oomKilled.get(handle.container) ? 'oom' : 'exited';
  }

  async kill(handle: SandboxHandle): Promise<void> {
    const deadline = Date.now() + KILL_MS;
    let unreachable: UnavailableError | undefined;
    if (handle.container) {
      try {
        const info = await within(
          this.docker.getContainer(handle.container).inspect(),
          KILL_MS,
          'docker inspect',
        );
        if (info.State.OOMKilled) this.oomKilled.set(handle.container, true);
        await this.removeContainer(handle.container, deadline);
        // A fork's image (see `fork`) goes with it; one a fork of it still uses stays, for the
        // orphan sweep.
        if (info.Config.Labels?.[FORK_LABEL]) {
          await this.docker
            .getImage(info.Image)
            .remove()
            .catch(() => undefined);
        }
      } catch (error) {
        const failure =
          statusOf(error) === 404 ? undefined : engineError(error, 'kill', this.address);
        if (failure instanceof UnavailableError) unreachable = failure;
      }
    }
    // Without the engine (or past its deadline) the init is killed here: the kernel then kills
    // every process of the container's pid namespace.
    if (this.isAlive(handle)) {
      try {
        process.kill(handle.pid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
      while (this.isAlive(handle) && Date.now() < deadline) await sleep(10);
    }
    const id = this.sandboxIdOf(handle);
    const cgroups = [...new Set([...(handle.cgroups ?? []), ...(id ? sandboxCgroupDirs(id) : [])])];
    while (!removeCgroups(cgroups) && Date.now() < deadline) await sleep(10);
    await this.networks.release(handle.net);
    // Its workspace: the container that bound it is gone; the overlay and its layers go too.
    if (handle.workspace) await unmountWorkspace(handle.workspace.dir, true);
    if (unreachable) throw unreachable;
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

  async sweepOrphans(sandboxesDir: string, running: ReadonlySet<string>): Promise<string[]> {
    let containers: ContainerInfo[];
    try {
      containers = await this.docker.listContainers({
        all: true,
        filters: { label: [`${SANDBOXES_DIR_LABEL}=${sandboxesDirHash(sandboxesDir)}`] },
      });
    } catch (error) {
      throw engineError(error, 'cannot list sandbox containers', this.address);
    }
    const orphans: string[] = [];
    for (const found of containers) {
      const id = found.Labels?.[SANDBOX_LABEL];
      if (!id || running.has(id)) continue;
      await this.removeContainer(found.Id).catch(() => undefined);
      await this.removeSandboxCgroups(id);
      // Its workspace's overlay, before the caller removes its folder (never across a mount).
      if (/^[\w.-]+$/.test(id)) {
        await unmountWorkspace(workspaceDir(join(sandboxesDir, id)), true).catch(() => undefined);
      }
      orphans.push(id);
    }
    // Fork images (see `fork`) of this installation that no container uses any more.
    const images = await this.docker
      .listImages({
        filters: {
          label: [FORK_LABEL, `${SANDBOXES_DIR_LABEL}=${sandboxesDirHash(sandboxesDir)}`],
        },
      })
      .catch(() => []);
    for (const image of images) {
      const id = image.Labels?.[FORK_LABEL];
      if (id && !running.has(id)) {
        await this.docker
          .getImage(image.Id)
          .remove()
          .catch(() => undefined);
      }
    }
    // slirp4netns of sandboxes that do not run (tagged with their id; their folder is ours).
    for (const pid of this.networks.orphans(
      (id) => !running.has(id) && /^[\w.-]+$/.test(id) && existsSync(join(sandboxesDir, id)),
    )) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    return orphans;
  }

  private egressSupport(): { enforced: boolean; how: string } {
    return process.getuid?.() === 0
      ? this.networks.support(false)
      : {
          enforced: false,
          how: "internet network unavailable: it needs a root daemon to configure a container's namespace; such sandboxes do not start, and templates that name no network run offline",
        };
  }

  /**
   * Why a workspace cannot be mounted here (undefined: it can): it needs a root daemon beside a
   * root engine on this host (see workspace.ts).
   */
  workspaceUnavailable(): string | undefined {
    return dockerWorkspaceUnavailable(this.address, this.facts);
  }

  internetUnavailable(): string | undefined {
    const support = this.egressSupport();
    return support.enforced ? undefined : support.how;
  }

  /** Every docker sandbox runs envd on the portable runtime: the daemon's own Node. */
  sandboxNode(): Promise<SandboxNode> {
    return Promise.resolve(portableSandboxNode());
  }

  isolation(): IsolationReport {
    const facts = this.facts;
    if (!facts) {
      const unknown = {
        enforced: false,
        how: `not known: the Docker engine at ${this.address} has not answered yet`,
      };
      const limits = Object.fromEntries(
        ['processes', 'memory', 'cpu', 'disk', 'open_files', 'file_size', 'volume_quota'].map(
          (name) => [name, unknown],
        ),
      );
      return {
        mode: 'rootless',
        limits,
        warnings: Object.keys(limits).map((name) => `${name}: ${unknown.how}`),
      };
    }
    const cgroup = (ok: boolean, how: string, name: string) =>
      ok
        ? { enforced: true, how }
        : { enforced: false, how: `not enforced: this engine has no ${name} cgroup support` };
    const limits: IsolationReport['limits'] = {
      processes: cgroup(
        facts.pids,
        'pids cgroup (PidsLimit; 4096 when the template sets none)',
        'pids',
      ),
      memory: cgroup(
        facts.memory,
        `memory cgroup (Memory${facts.swap ? ', MemorySwap equal: no swap' : '; without swap accounting in this kernel swap is not limited'}${facts.cgroupVersion === '1' && facts.cgroupDriver === 'cgroupfs' && process.getuid?.() === 0 ? '; cgroup v1: the sandbox’s processes live in /abx-docker/<id>, made by the daemon with the limit' : ''})`,
        'memory',
      ),
      cpu: cgroup(facts.cpu, 'CFS quota (NanoCpus)', 'cpu'),
      disk: facts.diskQuota.enforced
        ? {
            enforced: true,
            how: `StorageOpt size on ${facts.diskQuota.driver}: everything the container writes (home and /tmp included)`,
          }
        : { enforced: false, how: `not enforced: ${facts.diskQuota.why}` },
      open_files: { enforced: true, how: 'RLIMIT_NOFILE (Ulimits nofile)' },
      file_size: { enforced: true, how: 'RLIMIT_FSIZE (Ulimits fsize)' },
      egress: this.egressSupport(),
      pause: {
        enforced: true,
        how: 'docker pause (the engine’s cgroup freezer); a hibernate stops the container and keeps it',
      },
      volume_quota: this.volumes.quotaWith(facts)
        ? {
            enforced: true,
            how: 'a named volume bound to an ext4 disk image of its size (a root daemon beside a root engine on this host)',
          }
        : {
            enforced: false,
            how: 'not enforced: a volume is a plain named volume on the engine’s disk (the daemon is not root, or the engine is rootless or remote); its size is reported only',
          },
    };
    const warnings = [
      facts.usernsRemap
        ? 'docker: sandboxes run as uid 1000 of the engine’s user namespace (dockerd --userns-remap), one uid shared by all of them'
        : 'docker: sandboxes run as host uid 1000, one uid shared by every docker sandbox (and by any host account with uid 1000); they are kept apart by namespaces, no capabilities and seccomp. Start dockerd with --userns-remap to map it to an unused subordinate uid',
      ...Object.entries(limits)
        .filter(([, limit]) => !limit.enforced)
        .map(([name, limit]) => `${name}: ${limit.how}`),
    ];
    if (!facts.seccomp) warnings.push('docker: this engine reports no seccomp support');
    if (this.baseMissing) {
      warnings.push(
        `docker: ${this.baseMissing}; sandboxes of templates without an image cannot start until it is`,
      );
    }
    if (facts.cgroupDriver !== 'cgroupfs') {
      warnings.push(
        `docker: with the ${facts.cgroupDriver} cgroup driver an OOM kill is known from the engine's events while this daemon runs; one that happens while no daemon runs is recorded as 'exited'`,
      );
    }
    return { mode: 'rootless', limits, warnings };
  }

  async close(): Promise<void> {
    this.closed = true;
    this.events?.destroy();
    this.events = undefined;
    this.closeClient();
  }

  /** The portable runtime folder, built (or found in its cache) once per provider. */
  private portableRuntime(): Promise<PortableRuntime> {
    this.runtime ??= portableRuntime({
      runtimeDir: this.options.runtimeDir,
      ...(this.options.runtimeCacheDir ? { cacheDir: this.options.runtimeCacheDir } : {}),
    }).catch((error: unknown) => {
      this.runtime = undefined;
      throw error;
    });
    return this.runtime;
  }

  /** The base image with the sandbox user added, prepared once per provider (and engine). */
  private baseImage(): Promise<string> {
    const base = this.options.baseImage ?? DEFAULT_BASE_IMAGE;
    let prepared = this.bases.get(base);
    if (!prepared) {
      const safe = base.replace(/[^a-z0-9._-]+/g, '-').slice(0, 100);
      prepared = this.images.prepare(
        { image: base },
        { user: 'user', tag: `abx-base/${safe}:user` },
      );
      prepared.catch(() => this.bases.delete(base));
      this.bases.set(base, prepared);
    }
    return prepared;
  }

  /** True when `path` exists in the container's file system (a HEAD of its archive). */
  private async exists(container: EngineContainer, path: string): Promise<boolean> {
    try {
      await container.infoArchive({ path });
      return true;
    } catch {
      return false;
    }
  }

  /** Kills and removes a container (force), until `deadline`; a missing one is fine. */
  private async removeContainer(id: string, deadline = Date.now() + KILL_MS): Promise<void> {
    try {
      await within(
        this.docker.getContainer(id).remove({ force: true, v: true }),
        Math.max(1, deadline - Date.now()),
        `removing container ${id}`,
      );
    } catch (error) {
      if (statusOf(error) === 404) return;
      // Removal of this container is under way already (another kill): wait for it to finish.
      if (statusOf(error) === 409) {
        while (Date.now() < deadline) {
          const gone = await this.docker
            .getContainer(id)
            .inspect()
            .then(
              () => false,
              (again: unknown) => statusOf(again) === 404,
            );
          if (gone) return;
          await sleep(20);
        }
      }
      throw error;
    }
  }

  private async removeSandboxCgroups(id: string): Promise<void> {
    const deadline = Date.now() + KILL_MS;
    const dirs = sandboxCgroupDirs(id);
    while (!removeCgroups(dirs) && Date.now() < deadline) await sleep(10);
  }

  /** The sandbox id of a handle's cgroups (`…/abx-docker/<id>`). */
  private sandboxIdOf(handle: SandboxHandle): string | undefined {
    const dir = handle.cgroups?.[0];
    return dir ? posix.basename(dir) : undefined;
  }

  /**
   * On the systemd cgroup driver Docker owns the container's cgroup, which goes with it: OOM
   * kills are learnt from the engine's `oom` events instead, while this provider runs.
   */
  private watchOomEvents(): void {
    if (this.events || this.closed) return;
    this.docker
      .getEvents({
        filters: { type: ['container'], event: ['oom'], label: [SANDBOX_LABEL] },
      })
      .then((stream) => {
        if (this.closed) {
          stream.destroy();
          return;
        }
        this.events = stream;
        // A live stream with no timeout: it must not keep the daemon's process alive.
        stream.socket?.unref();
        let pending = '';
        stream.on('data', (chunk: Buffer) => {
          pending += chunk.toString('utf8');
          const lines = pending.split('\n');
          pending = lines.pop() ?? '';
          for (const line of lines) {
            try {
              const event = JSON.parse(line) as { id?: string; Actor?: { ID?: string } };
              const id = event.Actor?.ID ?? event.id;
              if (id) this.oomKilled.set(id, true);
            } catch {
              // not an event
            }
          }
        });
        stream.on('error', () => undefined);
        stream.on('end', () => {
          this.events = undefined;
        });
      })
      .catch(() => undefined);
  }
}
