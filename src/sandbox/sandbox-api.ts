import type {
  SandboxInfo,
  SandboxState,
  TemplateInfo,
  VolumeInfo,
} from '../../runtime/protocol/wire.js';
import { VolumeNotFoundError } from '../errors.js';
import {
  type ControlConnection,
  connectControlPlane,
  controlJsonClient,
} from '../installation/control-connection.js';
import type { ConnectionOptions } from '../installation/daemon-connection.js';
import type { JsonClient } from '../installation/json-client.js';
import type { WorkspaceChange } from '../workspace/types.js';

/**
 * The control plane's sandbox calls, without a {@link Sandbox} object: what `Sandbox`'s static
 * methods and the CLI's `create`, `list`, `info`, `kill` and `timeout` send. This module loads
 * node:http and nothing of the SDK's other parts (undici, the command model, the bundler, the
 * agent tools), so a CLI command made of these starts about as fast as Node itself.
 */

export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;

/** What create and connect answer: the sandbox, its token, and where its gateway is. */
export type ConnectedSandbox = SandboxInfo & { accessToken: string; gatewayUrl?: string };

/** What a new sandbox is made of (see `Sandbox.create`). */
export interface SandboxSpec {
  template?: string;
  timeoutMs?: number;
  envs?: Record<string, string>;
  metadata?: Record<string, string>;
  network?: NetworkPolicy;
  allowInternetAccess?: boolean;
  autoPause?: boolean;
  autoPauseMemory?: boolean;
  autoResume?: boolean;
  volumeMounts?: VolumeMountRequest[];
  /** A host folder mounted copy-on-write (docs/workspaces.md), or an upload's id. */
  workspace?: WorkspaceRequest | { upload: string; path?: string };
}

/**
 * A workspace to mount on create: `from`, an absolute folder on the daemon's host; `path`, where
 * the sandbox sees it (default `/home/user/workspace`, the home's `workspace`).
 */
export interface WorkspaceRequest {
  from: string;
  path?: string;
  /**
   * `from` is a folder of this machine, which the SDK packs and uploads before the create (for a
   * daemon on another machine; docs/workspaces.md, "From a remote client"). Any key may.
   */
  upload?: boolean;
  /** With `upload`: leave out what .gitignore excludes (`git ls-files`; `from` must be in a git work tree). */
  gitignore?: boolean;
}

/** A volume to mount on create: its name, where, and whether read-only (default read-write). */
export interface VolumeMountRequest {
  name: string;
  path: string;
  readOnly?: boolean;
}

/**
 * An egress policy (docs/network.md): CIDRs, exact domain names or `*.` wildcards. An allow
 * entry wins over a deny entry; what neither names is allowed; the host, private ranges and other
 * sandboxes are never reached.
 */
export interface NetworkPolicy {
  allowOut?: string[];
  denyOut?: string[];
  /**
   * Per-host header rules (docs/network.md, "Header rules"): host (a domain name or `*.`
   * wildcard) → rules setting headers whose values may name secrets as `${secrets.NAME}`; egress
   * resolves them as each request to that host leaves. A host named here is not allowed by that.
   */
  rules?: NetworkRules;
  /**
   * Your own SOCKS5 proxy (docs/network.md, "Your own egress proxy"): what the policy allows
   * leaves through it, names resolved by the proxy. Raw TCP to ports other than 80 and 443 is
   * refused while it is set. The password is kept with the sandbox and never shown again.
   */
  egressProxy?: EgressProxy;
}

/** A SOCKS5 proxy: `host:port` (a name, an IPv4 or an `[IPv6]` address), RFC 1929 credentials. */
export interface EgressProxy {
  address: string;
  username?: string;
  password?: string;
}

/** `network.rules`: E2B's shape, `{ 'api.example.com': [{ transform: { headers: {…} } }] }`. */
export type NetworkRules = Record<
  string,
  Array<{ transform?: { headers?: Record<string, string> } }>
>;

/**
 * The states {@link listSandboxes} shows when asked for none: the sandboxes that are still there
 * (E2B lists running and paused ones the same way). Ended ones come on request.
 */
export const LIVE_STATES: readonly SandboxState[] = ['running', 'paused'];

/** Filter of {@link listSandboxes}. */
export interface SandboxListFilter extends ConnectionOptions {
  /** One state or several; default {@link LIVE_STATES}. */
  state?: SandboxState | readonly SandboxState[];
  /** Every state but `pooled` (spares of the warm pool), ended sandboxes included; overrides `state`. */
  all?: boolean;
  template?: string;
  metadata?: Record<string, string>;
}

export function controlClient(
  connection: ControlConnection,
  options: ConnectionOptions,
): JsonClient {
  return controlJsonClient(connection, options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS);
}

/** The control plane `options` name (the local daemon, started if need be, or a remote one) and a client of it. */
export async function openControl(
  options: ConnectionOptions = {},
): Promise<{ connection: ControlConnection; client: JsonClient }> {
  const connection = await connectControlPlane(options);
  return { connection, client: controlClient(connection, options) };
}

const sandboxPath = (id: string) => `/v1/sandboxes/${encodeURIComponent(id)}`;

/** Creates a sandbox; answers with its token. */
export function createSandbox(client: JsonClient, spec: SandboxSpec): Promise<ConnectedSandbox> {
  return client.json<ConnectedSandbox>('POST', '/v1/sandboxes', {
    body: {
      ...(spec.template ? { template: spec.template } : {}),
      ...(spec.timeoutMs === undefined ? {} : { timeoutMs: spec.timeoutMs }),
      ...(spec.envs ? { envs: spec.envs } : {}),
      ...(spec.metadata ? { metadata: spec.metadata } : {}),
      ...(spec.network ? { network: spec.network } : {}),
      ...(spec.allowInternetAccess === undefined
        ? {}
        : { allowInternetAccess: spec.allowInternetAccess }),
      ...(spec.autoPause === undefined ? {} : { autoPause: spec.autoPause }),
      ...(spec.autoPauseMemory === undefined ? {} : { autoPauseMemory: spec.autoPauseMemory }),
      ...(spec.autoResume === undefined ? {} : { autoResume: spec.autoResume }),
      ...(spec.volumeMounts && spec.volumeMounts.length > 0
        ? { volumeMounts: spec.volumeMounts }
        : {}),
      ...(spec.workspace ? { workspace: spec.workspace } : {}),
    },
  });
}

/** What changed in a running sandbox's workspace (`GET …/workspace/changes`). */
export async function getWorkspaceChanges(
  client: JsonClient,
  sandboxId: string,
): Promise<WorkspaceChange[]> {
  return (
    await client.json<{ entries: WorkspaceChange[] }>(
      'GET',
      `${sandboxPath(sandboxId)}/workspace/changes`,
    )
  ).entries;
}

/** `GET …/workspace`: where the sandbox sees it, whether a client uploaded it, since when it counts. */
export function getWorkspaceInfo(
  client: JsonClient,
  sandboxId: string,
): Promise<{ path: string; uploaded: boolean; since: number }> {
  return client.json('GET', `${sandboxPath(sandboxId)}/workspace`);
}

/** What `sandbox.workspace.apply()` takes. */
export interface WorkspaceApplyRequest {
  /** Only these changes: a path (either path of a rename) or a folder (`src/`). */
  paths?: string[];
  /** Check everything, write nothing. */
  dryRun?: boolean;
  /** Write over host edits made since the workspace was mounted. */
  force?: boolean;
}

/** What an apply did (or, `dryRun`, would do). */
export interface WorkspaceApplyResult {
  dryRun: boolean;
  applied: WorkspaceChange[];
  forced: { path: string; reason: string }[];
}

/** Applies a running sandbox's workspace changes to its host folder. */
export function applyWorkspace(
  client: JsonClient,
  sandboxId: string,
  request: WorkspaceApplyRequest,
): Promise<WorkspaceApplyResult> {
  return client.json<WorkspaceApplyResult>('POST', `${sandboxPath(sandboxId)}/workspace/apply`, {
    body: request,
  });
}

/** `GET …/workspace/diff?format=json`: the patch as text, `--stat`, `--name-only` and what it lacks. */
export interface WorkspaceDiffReport {
  patch: string;
  stat: { path: string; from?: string; added: number; deleted: number; binary: boolean }[];
  names: string[];
  complete: boolean;
  omitted: { path: string; reason: string }[];
}

/** A running sandbox's workspace changes as a patch with its stat and names. */
export function getWorkspaceDiffReport(
  client: JsonClient,
  sandboxId: string,
): Promise<WorkspaceDiffReport> {
  return client.json<WorkspaceDiffReport>('GET', `${sandboxPath(sandboxId)}/workspace/diff`, {
    query: { format: 'json' },
  });
}

/** A running sandbox's workspace changes as a git patch (`GET …/workspace/diff`). */
export async function getWorkspaceDiff(client: JsonClient, sandboxId: string): Promise<string> {
  return (await getWorkspaceDiffReport(client, sandboxId)).patch;
}

const volumePath = (name: string) => `/v1/volumes/${encodeURIComponent(name)}`;

/** Makes a volume (`size`: bytes, or `512M`, `2G`; default 1 GiB). */
export function createVolume(
  client: JsonClient,
  name: string,
  size?: number | string,
): Promise<VolumeInfo> {
  return client.json<VolumeInfo>('POST', '/v1/volumes', {
    body: { name, ...(size === undefined ? {} : { size }) },
  });
}

/** The caller's volumes, by name. */
export async function listVolumes(client: JsonClient): Promise<VolumeInfo[]> {
  return (await client.json<{ volumes: VolumeInfo[] }>('GET', '/v1/volumes')).volumes;
}

/** One volume, with what it holds and the sandboxes that mount it. */
export function getVolume(client: JsonClient, name: string): Promise<VolumeInfo> {
  return client.json<VolumeInfo>('GET', volumePath(name));
}

/** Removes a volume and its files; false when there was none of that name. */
export async function removeVolume(client: JsonClient, name: string): Promise<boolean> {
  try {
    return (await client.json<{ removed: boolean }>('DELETE', volumePath(name))).removed;
  } catch (error) {
    if (error instanceof VolumeNotFoundError) return false;
    throw error;
  }
}

/** Pauses a running sandbox: frozen with its memory, or (`memory: false`) hibernated. */
export function pauseSandbox(
  client: JsonClient,
  sandboxId: string,
  options: { memory?: boolean } = {},
): Promise<SandboxInfo> {
  return client.json<SandboxInfo>('POST', `${sandboxPath(sandboxId)}/pause`, {
    body: options.memory === undefined ? {} : { memory: options.memory },
  });
}

/** Runs a paused sandbox again; `resumed` is false when it was running already. */
export function resumeSandbox(
  client: JsonClient,
  sandboxId: string,
  options: { timeoutMs?: number } = {},
): Promise<SandboxInfo & { resumed: boolean }> {
  return client.json('POST', `${sandboxPath(sandboxId)}/resume`, {
    body: options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs },
  });
}

/**
 * Forks a running or paused sandbox: `count` (1-10, default 1) new running sandboxes on copies of
 * its disk (not its processes), each with its token.
 */
export async function forkSandbox(
  client: JsonClient,
  sandboxId: string,
  options: { count?: number; timeoutMs?: number; metadata?: Record<string, string> } = {},
): Promise<ConnectedSandbox[]> {
  const answer = await client.json<{ sandboxes: ConnectedSandbox[] }>(
    'POST',
    `${sandboxPath(sandboxId)}/fork`,
    {
      body: {
        ...(options.count === undefined ? {} : { count: options.count }),
        ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
        ...(options.metadata === undefined ? {} : { metadata: options.metadata }),
      },
    },
  );
  return answer.sandboxes;
}

/** A running sandbox by id, with its token. */
export function connectSandbox(client: JsonClient, sandboxId: string): Promise<ConnectedSandbox> {
  return client.json<ConnectedSandbox>('POST', `${sandboxPath(sandboxId)}/connect`);
}

/** Sandboxes by state (default: the live ones), template and metadata; oldest first. */
export async function listSandboxes(
  client: JsonClient,
  filter: SandboxListFilter = {},
): Promise<SandboxInfo[]> {
  const query: Record<string, string> = {};
  if (!filter.all) {
    const states = filter.state === undefined ? LIVE_STATES : [filter.state].flat();
    query.state = states.join(',');
  }
  if (filter.template) query.template = filter.template;
  for (const [key, value] of Object.entries(filter.metadata ?? {})) {
    query[`metadata.${key}`] = value;
  }
  const { sandboxes } = await client.json<{ sandboxes: SandboxInfo[] }>('GET', '/v1/sandboxes', {
    query,
  });
  return sandboxes;
}

/** One sandbox, whatever its state. */
export function getSandboxInfo(client: JsonClient, sandboxId: string): Promise<SandboxInfo> {
  return client.json<SandboxInfo>('GET', sandboxPath(sandboxId));
}

/** Kills a sandbox by id; false when it had already ended. */
export async function killSandbox(client: JsonClient, sandboxId: string): Promise<boolean> {
  const { killed } = await client.json<{ killed: boolean }>('DELETE', sandboxPath(sandboxId));
  return killed;
}

/** Sets the time a running sandbox has left, counted from now. */
export async function setSandboxTimeout(
  client: JsonClient,
  sandboxId: string,
  timeoutMs: number,
): Promise<void> {
  await client.json('POST', `${sandboxPath(sandboxId)}/timeout`, { body: { timeoutMs } });
}

/** One decision of a sandbox's egress: a DNS question, an HTTP request, a TLS or CONNECT dial. */
export interface NetworkEvent {
  time: string;
  kind: 'dns' | 'http' | 'tls' | 'connect';
  /** The name asked for (`?` when a TLS client sent none). */
  target: string;
  allowed: boolean;
  /** The rule that decided: `allowOut pypi.org`, `denyOut 0.0.0.0/0`, `always denied: …`. */
  rule: string;
}

/** An internet sandbox's policy and what egress allowed and refused (see `Sandbox.getNetwork`). */
export interface NetworkInfo {
  allowOut: string[];
  denyOut: string[];
  /** The header rules, placeholders as written (never a secret's value). */
  rules?: NetworkRules;
  /** The egress proxy: its address and username, never its password. */
  egressProxy?: Omit<EgressProxy, 'password'>;
  allowed: number;
  refused: number;
  /** The latest decisions, oldest first (at most 200). */
  recent: NetworkEvent[];
}

export function getSandboxNetwork(client: JsonClient, sandboxId: string): Promise<NetworkInfo> {
  return client.json<NetworkInfo>('GET', `${sandboxPath(sandboxId)}/network`);
}

/**
 * One sample of a sandbox's use (see `Sandbox.getMetrics`), in E2B's shape with abx's
 * `processes`, `netRxBytes` and `netTxBytes`: the daemon takes one every 5 s and keeps the last 720.
 */
export interface SandboxMetric {
  /** When it was taken (ISO 8601). */
  timestamp: string;
  /** CPU used since the previous sample, as a percent of `cpuCount` cores (100: all busy). */
  cpuUsedPct: number;
  /** Cores the sandbox may use: its CPU limit (may be a fraction), else the host's cores. */
  cpuCount: number;
  /** Memory used in bytes, page cache included (`memCache` of it). */
  memUsed: number;
  memCache: number;
  /** Its memory limit, else the host's memory, in bytes. */
  memTotal: number;
  /** Bytes used on its disk (home and /tmp), and the disk's size (its quota). */
  diskUsed: number;
  diskTotal: number;
  /** Processes running in it. */
  processes: number;
  /**
   * Bytes it received from and sent to the outside since it started (growing counters, headers
   * included): 0 on the `none` network; `null` on `host`, where the host's traffic and the
   * sandbox's are one.
   */
  netRxBytes: number | null;
  netTxBytes: number | null;
}

/** The samples of a running sandbox from `start` to `end` (both included). */
export async function getSandboxMetrics(
  client: JsonClient,
  sandboxId: string,
  range: { start?: Date | number; end?: Date | number } = {},
): Promise<SandboxMetric[]> {
  const query = new URLSearchParams();
  for (const name of ['start', 'end'] as const) {
    const value = range[name];
    if (value !== undefined) query.set(name, String(Math.round(Number(value))));
  }
  const tail = query.size > 0 ? `?${query}` : '';
  return (
    await client.json<{ metrics: SandboxMetric[] }>(
      'GET',
      `${sandboxPath(sandboxId)}/metrics${tail}`,
    )
  ).metrics;
}

/** Replaces an internet sandbox's egress policy (see `Sandbox.setNetwork`). */
export function setSandboxNetwork(
  client: JsonClient,
  sandboxId: string,
  policy: NetworkPolicy,
): Promise<SandboxInfo> {
  return client.json<SandboxInfo>('PUT', `${sandboxPath(sandboxId)}/network`, { body: policy });
}

/** Saves a running sandbox as the template `name` (see `Sandbox.snapshot`). */
export function snapshotSandbox(
  client: JsonClient,
  sandboxId: string,
  name: string,
): Promise<TemplateInfo> {
  return client.json<TemplateInfo>('POST', `${sandboxPath(sandboxId)}/snapshot`, {
    body: { name },
    // Copying a large home (or committing an image) takes longer than a plain call.
    timeoutMs: 600_000,
  });
}
