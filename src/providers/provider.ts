import type { Readable } from 'node:stream';
import type { Capability } from '../../runtime/protocol/capabilities.js';
import {
  SANDBOX_HOME,
  SANDBOX_RUN_DIR,
  SANDBOX_RUNTIME_DIR,
} from '../../runtime/protocol/constants.js';
import type { IsolationReport } from '../../runtime/protocol/isolation.js';
import type { TemplateKubernetes, TemplateResources } from '../commands/template-runtime.js';
import type { EgressAuditEntry } from '../egress/audit-queue.js';
import type { EgressPolicy } from '../egress/policy.js';
import type { SandboxNet } from '../egress/sandbox-net.js';
import type { EgressCounters } from '../egress/service.js';
import { InvalidArgumentError } from '../errors.js';

/** Where every provider's sandbox has its home (the template's `setup` output lands there). */
export { SANDBOX_HOME } from '../../runtime/protocol/constants.js';
export type { IsolationReport };

/**
 * Node's own options for envd (and root.cjs, which starts root's and the user's envd), before
 * its script, on every provider (issue 50, docs/providers.md "envd's Node options"): a young
 * generation of 1 MiB a semi-space instead of up to 16 (envd's heap is small and short-lived per
 * request; this is most of what a busy envd kept), and one V8 worker thread instead of one per
 * core (each thread brings its stack and a malloc arena), and `gc` for envd's own code (once a
 * spell of requests is over it gives back what they left: runtime/envd/idle.ts `settleGarbage`).
 * Each is one word (`--name` or `--name=value`), so
 * {@link nodeScriptAt} finds the script after them. Options, not `NODE_OPTIONS`: the sandbox's
 * own processes (which inherit envd's environment) keep Node's defaults.
 */
export const ENVD_NODE_OPTIONS: readonly string[] = [
  '--max-semi-space-size=1',
  '--v8-pool-size=1',
  '--expose-gc',
];

/**
 * Where the script is in a Node command line (`/proc/PID/cmdline` split at NUL): the first
 * argument after the program that is not one of Node's options (those given here are one word
 * each, as {@link ENVD_NODE_OPTIONS}), or -1. envd's, root.cjs's and the command server's are
 * found by it, whatever options run them.
 */
export function nodeScriptAt(argv: readonly string[]): number {
  for (let at = 1; at < argv.length; at++) {
    if (!argv[at]?.startsWith('-')) return argv[at] ? at : -1;
  }
  return -1;
}

/**
 * Whether a command line (`/proc/PID/cmdline` split at NUL) runs envd: its script, after Node's
 * options, is exactly the sandbox's `/opt/abx/envd.cjs` (not another folder's envd.cjs). A
 * process of the sandbox can show the same; readers that must tell envd's own apart also check
 * its `--socket` and take the first found in the sandbox's tree, as sandbox-files.ts does.
 */
export function isEnvdCommandLine(argv: readonly string[]): boolean {
  return argv[nodeScriptAt(argv)] === `${SANDBOX_RUNTIME_DIR}/envd.cjs`;
}

/**
 * envd's arguments after the program that runs it (every provider starts it the same way): Node's
 * options for it ({@link ENVD_NODE_OPTIONS}), its script, its socket and ports folder in the
 * sandbox's /run/abx, the file its tokens are in (written with {@link envdTokenFile}), the
 * template's capabilities and name, and `extra`.
 */
export function envdArguments(
  tokenFile: string,
  spec: Pick<SandboxSpec, 'capabilities' | 'template'>,
  extra: readonly string[] = [],
): string[] {
  return [
    ...ENVD_NODE_OPTIONS,
    `${SANDBOX_RUNTIME_DIR}/envd.cjs`,
    '--socket',
    `${SANDBOX_RUN_DIR}/envd.sock`,
    '--ports-dir',
    `${SANDBOX_RUN_DIR}/ports`,
    '--token-file',
    tokenFile,
    ...(spec.capabilities ? ['--capabilities', spec.capabilities.join(',')] : []),
    ...(spec.template ? ['--template', spec.template] : []),
    ...extra,
  ];
}

/**
 * The content of envd's token file: the access token (limited to the template's capabilities)
 * on the first line, the control plane's token (every route) on the second when there is one.
 */
export function envdTokenFile(spec: Pick<SandboxSpec, 'accessToken' | 'controlToken'>): string {
  return spec.controlToken ? `${spec.accessToken}\n${spec.controlToken}\n` : spec.accessToken;
}

/** The home of a sandbox whose user is `user`: /home/user, or /home/<user> for another name. */
export function sandboxHome(user?: string): string {
  return user && user !== 'user' ? `/home/${user}` : SANDBOX_HOME;
}

/** Everything a provider needs to start one sandbox. */
export interface SandboxSpec {
  id: string;
  /**
   * The sandbox's access token, what its users present (through the gateway); envd refuses
   * requests without it, and routes of capabilities the template lacks with it.
   */
  accessToken: string;
  /**
   * The control plane's token for this sandbox: every envd route, whatever the template allows
   * (snapshots export the home through the file routes). None: the access token is the only one.
   */
  controlToken?: string;
  /** The template's capabilities, which envd enforces for the access token; default all. */
  capabilities?: readonly Capability[];
  /** The template's name, for envd's refusals. */
  template?: string;
  /** Host folder owned by this sandbox (its home, its sockets, its log). */
  dir: string;
  /** A built template's home folder to start from, copied for this sandbox. */
  baseHome?: string;
  env: Record<string, string>;
  workdir: string;
  resources: TemplateResources;
  /**
   * `none`: only the sandbox's own loopback; `internet`: egress through abx's policy (`egress`);
   * `host`: the host's own network namespace.
   */
  network: 'none' | 'host' | 'internet';
  /** The egress policy of an `internet` sandbox (none: everything public allowed). */
  egress?: EgressPolicy;
  /**
   * The container image whose filesystem the sandbox runs on (a reference the provider's
   * {@link ImageStore} returned); none: the provider's default (the host's system for `local`).
   */
  image?: string;
  /** How long the sandbox may live, in ms (a provider that can enforce it itself may). */
  timeoutMs?: number;
  /** The template's `kubernetes:` section, for the kubernetes provider (others ignore it). */
  kubernetes?: TemplateKubernetes;
  /**
   * Who envd (and so every process) runs as inside the sandbox: the template's user (default
   * `user`, uid 1000), or `root` for the throwaway sandbox of an image template's build. A
   * sandbox's processes are never root on the host.
   */
  user?: string;
  /**
   * Root inside the sandbox (internal until offered as a template option): uid 0 of the sandbox's
   * own user namespace, a second envd for `user: 'root'`, and `sudo` for the default user. Local
   * provider, root daemon, image sandboxes only (root-userns.ts).
   */
  allowRoot?: boolean;
  /**
   * Volumes to mount (checked by the control plane: each exists, made by this provider's
   * {@link VolumeStore}, its path free and allowed). Absent or empty: none.
   */
  volumeMounts?: VolumeMountSpec[];
  /**
   * A host folder (`from`, absolute) the sandbox sees at `path`, writable, copy-on-write: its
   * writes land in a layer of the sandbox's own, the host folder is never written
   * (docs/workspaces.md). Local provider, root daemon only; others refuse it. `since` (ms since
   * the epoch): when the changes it starts with were first mounted (a fork's or a snapshot's
   * source), which an apply's conflicts count from; absent: its own mount. `layer`: an upper
   * layer to start from (a snapshot's, its files `uid`'s), copied at its first start.
   */
  workspace?: {
    from: string;
    path: string;
    since?: number;
    layer?: { dir: string; uid: number };
    /**
     * Mounted for a local client's user (control/workspace-access.ts): its uid, not the folder's
     * owner, is mapped to the sandbox's user, and the folder mounted must be the one checked
     * (`dev`, `ino`), else the start fails. Absent: an admin's, the folder's owner mapped.
     */
    user?: { uid: number; dev: number; ino: number };
  };
}

/** One volume: what its provider's {@link VolumeStore} needs to make, mount or remove it. */
export interface VolumeSpec {
  /** `vol_` and letters and digits: unique, never reused. */
  id: string;
  /** Its name, unique among its owner's volumes (`[A-Za-z0-9_-]`, at most 63). */
  name: string;
  /** Its size limit (quota), in bytes. */
  sizeBytes: number;
  /** A host folder of its own, kept until it is removed (a provider may keep its disk there). */
  dir: string;
}

/** A volume mounted in a sandbox at `path` (absolute, canonical). */
export interface VolumeMountSpec {
  volume: VolumeSpec;
  path: string;
  readOnly: boolean;
}

/** What a volume holds now, in bytes, against its limit. */
export interface VolumeUsage {
  used: number;
  total: number;
  /**
   * True when a write past `total` fails (ENOSPC) because the storage itself is that size; false
   * when the limit is only reported (a mode whose storage the daemon cannot bound).
   */
  enforced: boolean;
}

/**
 * Volumes of a provider: storage that outlives every sandbox, mounted by several at once, with
 * its files owned by the sandbox's user (uid 1000) in every sandbox that mounts it.
 */
export interface VolumeStore {
  /**
   * Why this provider cannot make or mount volumes here, or undefined when it can (checked before
   * a volume is made, so none is made that no sandbox could mount).
   */
  unavailable(): string | undefined;
  /** Makes the volume's storage, empty, of its size; nothing is left behind when it fails. */
  create(volume: VolumeSpec): Promise<void>;
  /** Removes its storage and everything in it; one already gone is fine. */
  remove(volume: VolumeSpec): Promise<void>;
  /** What it holds now. */
  usage(volume: VolumeSpec): Promise<VolumeUsage>;
  /**
   * Its files reached without a sandbox (E2B's volume content API); absent where the provider
   * cannot reach a volume's storage from the daemon.
   */
  readonly files?: VolumeFiles;
}

/** One file, folder or link of a volume, as a sandbox that mounts it sees it. */
export interface VolumeEntry {
  /** Its last path component (`/` for the volume's root). */
  name: string;
  /** Its path in the volume: absolute, canonical (`/` is the volume's root). */
  path: string;
  type: 'file' | 'directory' | 'symlink' | 'unknown';
  size: number;
  /** Permission bits (0o777 at most). */
  mode: number;
  /** Owner as a sandbox sees it: its user (1000), else the overflow id (65534). */
  uid: number;
  gid: number;
  /** Times, ms since the epoch. */
  atime: number;
  mtime: number;
  ctime: number;
  /** A link's target, as written. */
  target?: string;
}

/** Who a new or changed entry belongs to and its permission bits; absent: the defaults. */
export interface VolumeOwnership {
  /** As a sandbox sees it; the default (and the only id a local volume takes) is its user's. */
  uid?: number;
  gid?: number;
  mode?: number;
}

/**
 * A volume's files from the daemon's side. `path` is taken inside the volume (`..` stops at its
 * root); no link is ever followed, so nothing outside the volume is reached whatever the
 * sandboxes mounting it put there. Errors: NotFoundError (404) for a path that is not there,
 * FileOperationError (400 with the errno as `code`; 409 for `EEXIST`; 507 for a full volume).
 */
export interface VolumeFiles {
  stat(volume: VolumeSpec, path: string): Promise<VolumeEntry>;
  /** A folder's entries, `depth` levels down (1: its own), each folder before what it holds. */
  list(volume: VolumeSpec, path: string, depth: number): Promise<VolumeEntry[]>;
  /** Makes a folder (`parents`: and the missing folders above it; one there already is kept). */
  makeDir(
    volume: VolumeSpec,
    path: string,
    options: VolumeOwnership & { parents: boolean },
  ): Promise<VolumeEntry>;
  /** A file's bytes; the stream is the caller's to read or destroy. */
  read(volume: VolumeSpec, path: string): Promise<{ size: number; stream: Readable }>;
  /**
   * Writes a file from `data`, all or nothing: it appears once every byte is written.
   * `overwrite` replaces a file there (and makes missing folders above it); without it an
   * existing path is `EEXIST`.
   */
  write(
    volume: VolumeSpec,
    path: string,
    data: AsyncIterable<Uint8Array>,
    options: VolumeOwnership & { overwrite: boolean },
  ): Promise<VolumeEntry>;
  /** Changes an entry's owner or mode (links have neither). */
  update(volume: VolumeSpec, path: string, changes: VolumeOwnership): Promise<VolumeEntry>;
  /** Removes a file, link or folder with everything in it; never the root. */
  remove(volume: VolumeSpec, path: string): Promise<void>;
}

/** Where an image template starts from. */
export type ImageSource = { image: string } | { dockerfile: string };

/**
 * Images for image templates, on a provider that runs them. The control plane builds a template
 * as: `prepare` its source (with the template's user added), start a build sandbox from it as
 * `root`, run the setup steps through envd, `commit` the build sandbox's filesystem as the
 * template's image, kill the build sandbox; sandboxes of the template then start from that image.
 */
export interface ImageStore {
  /**
   * Makes `source` ready to start sandboxes from, with `user` (uid 1000, home /home/<user>)
   * added when the image lacks it; builds a Dockerfile. Returns the image reference to use.
   * An image that is not there is a NotFoundError naming it and how to get it.
   */
  prepare(source: ImageSource, options: { user: string; tag: string }): Promise<string>;
  /** Saves the filesystem of a (build) sandbox as the image `tag`; returns its reference. */
  commit(handle: SandboxHandle, tag: string): Promise<string>;
  /**
   * Copies a host file or folder into a running (build) sandbox: a folder's content into `to`, a
   * file as `to`, owned by `user` (a name in the sandbox's /etc/passwd). Through the engine, so
   * the image needs no `tar`; a store without it leaves copies to envd (the image's tar).
   */
  copyIn?(handle: SandboxHandle, from: string, to: string, user: string): Promise<void>;
  /** Removes an image this store made (a template rebuilt or removed); absent is fine. */
  remove(image: string): Promise<void>;
  /**
   * Pushes `image` to `repository` (`registry[:port]/path`) under a tag of its content (the
   * image's id), so the tag never changes meaning; returns the pushed reference, which stays a
   * local name of the image too. A failure leaves no tag behind.
   */
  publish?(image: string, repository: string): Promise<string>;
}

/**
 * Where a running sandbox is, in a form that survives a daemon restart (stored in the registry).
 * `pid` + `startTime` identify the sandbox's root process even if the pid is later reused.
 */
export interface SandboxHandle {
  provider: string;
  pid: number;
  startTime: string;
  /**
   * Where the sandbox's envd answers: its Unix socket on the host, or `tcp://HOST:PORT` for a
   * sandbox reached over the network (a pod: its IP and envd's port). `connectSandboxSocket`
   * dials either.
   */
  envdSocket: string;
  /**
   * The folder holding one Unix socket per forwarded port (`{port}.sock`), or `tcp://HOST` for a
   * sandbox reached over the network, whose port P is `HOST:P` (see `sandboxPortTarget`).
   */
  portsDir: string;
  /**
   * A root-allowing sandbox's second envd, running as the sandbox's root: where requests for
   * `user: 'root'` go (the local provider's root daemon, image sandboxes whose template allows
   * root). Absent: root is refused.
   */
  envdRootSocket?: string;
  /** The host uid the sandbox runs as, when the daemon gave it one of its own (root daemon). */
  uid?: number;
  /** The sandbox's cgroups (memory, CPU, pids), where the host allows them. */
  cgroups?: string[];
  /** @deprecated a handle written by an older daemon: its one memory cgroup. */
  cgroup?: string;
  /** The sandbox's container, for providers that run containers (docker: its id). */
  container?: string;
  /**
   * A sandbox's workspace (docs/workspaces.md): the host folder (`from`), where the sandbox sees
   * it (`path`), and on the host the merged view (`view`, the overlay the daemon reads) and its
   * upper layer (`upper`); `dir` holds them (unmounted and removed at kill); `mountedAt` (ms
   * since the epoch): when it was mounted, after which a host edit is an apply's conflict.
   */
  workspace?: {
    from: string;
    path: string;
    view: string;
    upper: string;
    dir: string;
    mountedAt: number;
    /** The uid it was mounted for (a local client's user): an apply writes only where it may. */
    uid?: number;
  };
  /**
   * The sandbox's pod (kubernetes): its namespace and name (`startTime` then holds its uid), and
   * whether an agent-sandbox `Sandbox` of the same name owns it (then that is what `kill` deletes).
   * `egress`: an `internet` sandbox's policy, which its NetworkPolicy enforces.
   */
  pod?: {
    namespace: string;
    name: string;
    sandbox?: boolean;
    claim?: string;
    egress?: EgressPolicy;
  };
  /** An `internet` sandbox's network (local provider): its namespace, slirp4netns, egress ports. */
  net?: SandboxNet & { policy: EgressPolicy };
}

/**
 * The egress policy of an `internet` sandbox, wherever its provider keeps it (a network namespace
 * of the host, or a pod's NetworkPolicy); undefined for a sandbox on another network.
 */
export function egressPolicyOf(handle: SandboxHandle): EgressPolicy | undefined {
  return handle.net?.policy ?? handle.pod?.egress;
}

/**
 * What a sandbox uses at one instant (a provider's {@link SandboxProvider.metrics}); the daemon's
 * sampler turns `cpuTimeUs` into a share of `cpuCount` between two readings.
 */
export interface SandboxUsage {
  /** CPU time all its processes used since it started, in microseconds (a growing counter). */
  cpuTimeUs: number;
  /** Cores it may use: its CPU limit (`0.5` is half a core), else the host's cores. */
  cpuCount: number;
  /** Bytes of memory its processes use (page cache included, as its limit counts it). */
  memUsed: number;
  /** Of `memUsed`, the page cache (file data the kernel may drop), in bytes. */
  memCache: number;
  /** Its memory limit in bytes, else the host's memory. */
  memTotal: number;
  /** Bytes used on its disk (home and /tmp), and the disk's size (its quota). */
  diskUsed: number;
  diskTotal: number;
  /** Processes running in it. */
  processes: number;
  /**
   * Bytes it received from and sent to the outside since it started (growing counters), as its
   * network link counts them (headers included): 0 on `none`, whose only interface is its own
   * loopback; `null` on `host`, whose traffic cannot be told from the host's. Its own loopback
   * and the gateway's requests to its ports (Unix sockets) are not network traffic here.
   */
  netRxBytes: number | null;
  netTxBytes: number | null;
}

/**
 * One sample of a sandbox's use, in E2B's shape (`cpuUsedPct`, `cpuCount`, `memUsed`,
 * `memTotal`, `diskUsed`, `diskTotal`, plus `memCache`) and abx's `processes`, `netRxBytes` and
 * `netTxBytes` (which the E2B face leaves out): a reading of
 * `SandboxUsage` with the CPU time counter turned into `cpuUsedPct`, the CPU time used since the
 * previous sample as a share of `cpuCount` cores over that time (the first sample: since the
 * sandbox started); 100 is its whole limit busy.
 */
export type MetricsSample = Omit<SandboxUsage, 'cpuTimeUs'> & {
  /** When it was taken, in ms since the epoch. */
  at: number;
  cpuUsedPct: number;
};

/**
 * Why sandboxes of `provider` cannot have root inside (`allow_root`), for a person, or undefined
 * when they can.
 */
export function rootUnavailableOn(provider: SandboxProvider): string | undefined {
  return provider.rootUnavailable
    ? provider.rootUnavailable()
    : `the ${provider.name} provider cannot give a sandbox a root of its own (only the local provider on a root daemon can)`;
}

/**
 * Why sandboxes of `provider` cannot have a workspace (a host folder mounted copy-on-write,
 * docs/workspaces.md) here, for a person, or undefined when they can. A provider that does not
 * say cannot.
 */
export function workspaceUnavailableOn(provider: SandboxProvider): string | undefined {
  return provider.workspaceUnavailable
    ? provider.workspaceUnavailable()
    : `the ${provider.name} provider cannot mount one yet; the local provider on a root daemon can (abx daemon start --provider local)`;
}

/** The most forks one request makes. */
export const MAX_FORKS = 10;

/** A fork's `count`: a whole number from 1 to {@link MAX_FORKS} (default 1). */
export function checkForkCount(count: unknown = 1): number {
  if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > MAX_FORKS) {
    throw new InvalidArgumentError(
      `count must be a whole number of forks from 1 to ${MAX_FORKS}, not ${JSON.stringify(count)}`,
    );
  }
  return count;
}

/** Why a sandbox's processes ended without being killed. */
export type EndCause = 'oom' | 'exited';

/** The Node that envd and the command server run on in a provider's sandboxes. */
export interface SandboxNode {
  /** Its version, such as `v24.22.3`. */
  version: string;
  /** Where it comes from, for a person: `the host's /usr/bin/node (...)`. */
  source: string;
  /** How to give these sandboxes Node `line` instead, for a person. */
  change(line: number): string;
}

/**
 * Where sandboxes come from. `local` runs them with bubblewrap on this host; a Kubernetes
 * provider would run pods with the same envd and return handles pointing at them.
 */
export interface SandboxProvider {
  readonly name: string;
  /** Starts a sandbox and resolves once its envd answers. */
  create(spec: SandboxSpec): Promise<SandboxHandle>;
  /**
   * A new daemon found this sandbox running: take up what the provider serves it from the daemon
   * (the egress service of an `internet` sandbox). Absent: nothing to do.
   */
  adopt?(handle: SandboxHandle): Promise<void>;
  /**
   * Gives a running `internet` sandbox a new egress policy (new connections follow it at once);
   * the handle to keep from now on. Absent: the provider has no internet network.
   */
  setNetwork?(handle: SandboxHandle, policy: EgressPolicy): Promise<SandboxHandle>;
  /**
   * The connections egress decided that the daemon has not read yet, for its audit trail,
   * acknowledging those up to `after` of `epoch` (src/egress/audit-queue.ts); undefined while no
   * egress process runs. `harvest`: that sandbox's raw TCP is read first (src/egress/tcp-audit.ts).
   * Absent: the provider has no internet network.
   */
  egressAudit?(
    epoch: string | undefined,
    after: number,
    harvest?: string,
  ): Promise<{ epoch: string; rows: EgressAuditEntry[] } | undefined>;
  /** What egress allowed and refused for an internet sandbox: counts and the latest decisions. */
  networkStats?(handle: SandboxHandle): Promise<EgressCounters>;
  /**
   * The daemon's listener addresses (CIDRs), which no internet sandbox may reach; called before
   * any sandbox is made or adopted. Absent: the provider has no internet network.
   */
  denyEgressTo?(cidrs: string[]): void;
  /**
   * What a running sandbox uses now (see {@link SandboxUsage}); the daemon samples it every few
   * seconds. Absent: this provider measures nothing, and a sandbox's metrics are empty.
   */
  metrics?(handle: SandboxHandle): Promise<SandboxUsage>;
  /**
   * Freezes every process of a running sandbox where it is (their memory kept, no CPU used);
   * resolves once they are all stopped (the isolation report's `pause` line says how). Freezing
   * a frozen sandbox is a no-op. Absent: this provider cannot pause with memory.
   */
  freeze?(handle: SandboxHandle): Promise<void>;
  /** Lets a frozen sandbox's processes run again where they were. Safe on one not frozen. */
  thaw?(handle: SandboxHandle): Promise<void>;
  /**
   * Ends every process of the sandbox and frees its memory, CPU and network, but keeps its disk
   * (home, /tmp, an image's overlay) and what `wake` needs; safe to call again (a daemon that
   * died mid-way). `spec`: the one it was created with. Absent: this provider cannot hibernate.
   */
  hibernate?(handle: SandboxHandle, spec: SandboxSpec): Promise<void>;
  /**
   * Why this provider, which has `hibernate`, cannot hibernate sandboxes as it is set up here
   * (kubernetes: homes on emptyDirs), or undefined when it can. Left out: it can.
   */
  hibernateUnavailable?(): string | undefined;
  /**
   * Starts a hibernated sandbox again on its kept disk, as `spec` (the one it was created with,
   * its environment as it was at the hibernate); resolves with its new handle once envd answers.
   */
  wake?(handle: SandboxHandle, spec: SandboxSpec): Promise<SandboxHandle>;
  /**
   * Starts a new sandbox (`spec`: its own id, folder, tokens, environment) on a copy of the disk
   * of `source` (started as `sourceSpec`): its home, /tmp and an image's overlay; never its
   * processes. `paused`: the source is frozen (it stays so) or hibernated (its kept disk is
   * copied); else it runs, and is frozen only for the instant of the copy. Resolves once the
   * fork's envd answers. Absent: this provider cannot fork.
   */
  fork?(
    source: SandboxHandle,
    sourceSpec: SandboxSpec,
    spec: SandboxSpec,
    paused?: 'frozen' | 'hibernated',
  ): Promise<SandboxHandle>;
  /**
   * Copies a sandbox's workspace upper layer (its changes) to `to`, which must not exist, for a
   * snapshot to start sandboxes from (`SandboxSpec.workspace.layer`); the caller froze it.
   * Absent: this provider has no workspaces.
   */
  copyWorkspaceLayer?(handle: SandboxHandle, to: string): Promise<void>;
  /** True while the sandbox's root process runs (and is the same process). */
  isAlive(handle: SandboxHandle): boolean;
  /** Why a sandbox that is no longer alive ended (call before `kill` releases its cgroups). */
  endCause(handle: SandboxHandle): EndCause;
  /**
   * Kills every process of the sandbox (frozen ones too) and releases what it held on the host
   * (cgroups, uid); resolves once they are gone. Safe to call on a sandbox that already ended or
   * is hibernated.
   */
  kill(handle: SandboxHandle): Promise<void>;
  /**
   * Kills sandboxes of `sandboxesDir` that the registry does not know as running, pooled or
   * paused (e.g. one started just before a daemon crash, before its row was written). Returns
   * their ids.
   * `startedBefore` (ms since the epoch, given only to providers with `orphanAgeMs`): leave alone
   * the sandboxes made at or after it, creates that another daemon may still be making.
   */
  sweepOrphans(
    sandboxesDir: string,
    running: ReadonlySet<string>,
    startedBefore?: number,
  ): Promise<string[]>;
  /**
   * Set by providers whose sandboxes every daemon sharing a registry sees and may kill (pods): a
   * sandbox of theirs without a registry row is an orphan once this old (no create takes longer).
   * Daemons on a shared registry then sweep such orphans while they run, not only at start: a
   * replica killed mid-create leaves one that no restart of its own may ever come to.
   */
  readonly orphanAgeMs?: number;
  /** How this provider isolates sandboxes on this host. */
  isolation(): IsolationReport;
  /**
   * The Node a new sandbox would run envd on, with an image or without one (the template's
   * `runtime: { node }` is checked against it at build). Absent: the provider cannot tell before
   * a sandbox runs (kubernetes: the runtime image's); a create checks the started sandbox's envd
   * either way.
   */
  sandboxNode?(image: boolean): Promise<SandboxNode>;
  /**
   * Why this provider cannot give sandboxes the `internet` network here, or undefined when it
   * can. Left out: it cannot. Templates that name no network then run offline (denied rather
   * than allowed); those that name `internet` do not start.
   */
  internetUnavailable?(): string | undefined;
  /**
   * Why this provider cannot give sandboxes root inside (`allowRoot`) here, or undefined when it
   * can. Left out: it cannot, and a template that allows root is refused with the reason.
   */
  rootUnavailable?(): string | undefined;
  /**
   * Why this provider cannot give sandboxes a workspace (`SandboxSpec.workspace`) here, or
   * undefined when it can. Left out: it cannot, and a create that asks for one is refused with
   * the reason (workspaceUnavailableOn).
   */
  workspaceUnavailable?(): string | undefined;
  /**
   * The sandbox's end moved (a pooled sandbox handed out, `setTimeout`): for a provider that ends
   * sandboxes itself at their timeout (agent-sandbox's `shutdownTime`), so it does not end one
   * early. Others leave it out: the daemon's reaper ends sandboxes.
   */
  setExpiry?(handle: SandboxHandle, expiresAt: number): Promise<void>;
  /**
   * True when the provider pre-starts sandboxes itself (kubernetes with agent-sandbox claims:
   * the cluster's SandboxWarmPools): the daemon then keeps no warm pool of its own.
   */
  readonly poolsItself?: boolean;
  /** Releases what the provider keeps for itself (an engine client, say); sandboxes keep running. */
  close?(): Promise<void>;
  /**
   * Drops what the provider keeps of images that are gone (the local provider's unpacked file
   * systems) once no sandbox runs on them; called after template images are removed.
   */
  pruneImages?(): Promise<void>;
  /** Present when the provider runs container images (image templates need it). */
  readonly images?: ImageStore;
  /** Present when the provider has volumes (`volumeMounts` on create need it). */
  readonly volumes?: VolumeStore;
}
