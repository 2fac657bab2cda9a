/**
 * E2B's control API on the daemon's listener, translated onto abx's native services: what the
 * unmodified `e2b` SDK calls with `E2B_API_URL` pointing at the daemon. Keys are abx's API keys
 * (sent as `X-API-KEY`), with the ownership rules of `/v1`; errors are E2B's `{ code, message }`
 * with the status the SDK turns into its own exception. See docs/e2b.md.
 */
import { isUtf8 } from 'node:buffer';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { type BodyLimits, bodyChunks, drainBody, readBody } from '../../../runtime/server/http.js';
import { type Route, RouteTable } from '../../../runtime/server/route-table.js';
import {
  errorResponse,
  InvalidArgumentError,
  InvalidJsonError,
  LimitExceededError,
  RouteNotFoundError,
  SandboxError,
  SandboxNotFoundError,
  TemplateNotFoundError,
  UnsupportedMediaTypeError,
} from '../../errors.js';
import { checkForkCount } from '../../providers/provider.js';
import { timeRange } from '../../util/time-range.js';
import type {
  E2bBackend,
  E2bCaller,
  E2bConnection,
  E2bNetwork,
  E2bSandboxRow,
  E2bTemplateTraits,
} from './backend.js';
import { E2B_CODE_TEMPLATE } from './code-interpreter.js';
import { type EventCall, listEvents, sandboxEvents } from './event-routes.js';
import { page, parseListQuery } from './list-query.js';
import { type LogCall, sandboxLogsV1, sandboxLogsV2 } from './log-routes.js';
import {
  createSecret,
  getSecret,
  listSecrets,
  removeSecret,
  type SecretAnswer,
  type SecretCall,
  updateSecret,
} from './secret-routes.js';
import {
  type TemplateBuildAnswer,
  type TemplateBuildCall,
  TemplateBuilds,
  uploadTarget,
} from './template-build-routes.js';
import { E2bVolumeContent } from './volume-content.js';
import {
  createVolume,
  getVolume,
  listVolumes,
  removeVolume,
  type VolumeAnswer,
  type VolumeCall,
  volumeMountsOf,
} from './volume-routes.js';
import {
  createWebhook,
  getWebhook,
  listWebhooks,
  removeWebhook,
  updateWebhook,
  type WebhookCall,
} from './webhook-routes.js';
import {
  bodyObject,
  DEFAULT_TIMEOUT_SECONDS,
  detailAnswer,
  listedAnswer,
  optionalBoolean,
  optionalString,
  sandboxAnswer,
  stringMap,
  timeoutSeconds,
} from './wire.js';

/** An answer other than `200` JSON: a status, a body (undefined: none) and headers. */
class Answer {
  constructor(
    readonly status: number,
    readonly body: unknown,
    readonly headers: Record<string, string> = {},
  ) {}
}

interface Call {
  params: Record<string, string>;
  query: URLSearchParams;
  body: Record<string, unknown>;
  caller: E2bCaller;
  backend: E2bBackend;
  /** The origin the request reached (`http://host:port`), for links the answer gives. */
  origin: string;
  /** The request's connection: who may mount a workspace depends on its local client's user. */
  connection: E2bConnection;
}

type E2bRoute = Route<Call>;

/**
 * The caller's running or paused sandbox of that id. Another key's sandbox and one that has ended
 * answer exactly like an id that never existed (404), so a key learns nothing of the others'. A
 * paused one is refused by the native service where it must run (409, saying to resume it).
 */
async function visible(call: Call): Promise<E2bSandboxRow> {
  const id = call.params.id as string;
  const row = await call.backend.get(id);
  if (
    !row ||
    (!call.caller.admin && row.owner !== call.caller.keyId) ||
    (row.state !== 'running' && row.state !== 'paused')
  ) {
    throw new SandboxNotFoundError(
      `sandbox ${id} not found: it does not exist, or it has ended (only running and paused sandboxes are kept)`,
    );
  }
  return row;
}

/**
 * `autoResume: { enabled }`: a request for the paused sandbox (through the gateway, with its
 * credential) resumes it, as at E2B. Undefined when the body leaves it out.
 */
function autoResumeOf(body: Record<string, unknown>): boolean | undefined {
  const value = body.autoResume;
  if (value === undefined || value === null) return undefined;
  const enabled =
    typeof value === 'object' && !Array.isArray(value)
      ? (value as { enabled?: unknown }).enabled
      : value;
  if (enabled === undefined || enabled === null) return undefined;
  if (typeof enabled !== 'boolean') {
    throw new InvalidArgumentError(
      `autoResume must be { enabled: true | false }, not ${JSON.stringify(value)}`,
    );
  }
  return enabled;
}

/**
 * Fields of create abx cannot honour: refused by name rather than ignored. A value abx gives
 * anyway (no auto-resume, the template's own network) is accepted.
 */
function refuseUnsupported(body: Record<string, unknown>, template: E2bTemplateTraits): void {
  // allow_internet_access and network's allowOut, denyOut, rules and egressProxy are read by
  // networkOf.
  const given = (field: string) => body[field] !== undefined && body[field] !== null;
  if (template.network === 'host' && (given('allow_internet_access') || given('network'))) {
    throw new InvalidArgumentError(
      "the template gives its sandboxes the host's network (template.yaml network: host), which takes no egress policy: leave out allow_internet_access and network, or use a template whose network is none or internet",
    );
  }
  if (given('mcp')) {
    throw new InvalidArgumentError('mcp (the MCP gateway) is not supported by abx: leave it out');
  }
}

/** The metadata key that asks for a workspace on E2B's create, which has no field for one. */
export const WORKSPACE_METADATA = 'abx.workspace';

/**
 * A workspace from the metadata E2B's SDK sends: `abx.workspace` = `/host/folder` or
 * `/host/folder:/home/user/repo` (split at the first `:/`, as `abx create --workspace` does). The
 * native create checks it further, for the caller (docs/workspaces.md).
 */
function workspaceOf(
  metadata: Record<string, string>,
): { from: string; path?: string } | undefined {
  const value = metadata[WORKSPACE_METADATA];
  if (value === undefined) return undefined;
  const at = value.indexOf(':/');
  const from = at < 0 ? value : value.slice(0, at);
  if (!from.startsWith('/')) {
    throw new InvalidArgumentError(
      `metadata ${WORKSPACE_METADATA} must be an absolute folder of the daemon's host, optionally followed by :PATH in the sandbox (/home/me/repo or /home/me/repo:/home/user/repo), not ${JSON.stringify(value)}`,
    );
  }
  return { from, ...(at < 0 ? {} : { path: value.slice(at + 1) }) };
}

async function create(call: Call): Promise<Answer> {
  const body = call.body;
  const named = optionalString(body, 'templateID') ?? 'base';
  const base = call.backend.baseTemplate?.();
  let template = named === 'base' && base ? base : named;
  const seconds = timeoutSeconds(body) ?? DEFAULT_TIMEOUT_SECONDS;
  const envs = stringMap(body, 'envVars');
  const metadata = stringMap(body, 'metadata');
  optionalBoolean(body, 'secure');
  let traits = await call.backend.template(template, call.caller);
  if (!traits && template === E2B_CODE_TEMPLATE) {
    // `@e2b/code-interpreter`'s default template: `base` has the code contexts it needs, unless a
    // template of that name is built (one with more libraries, say).
    template = base ?? 'base';
    traits = await call.backend.template(template, call.caller);
  }
  if (!traits && base && template === base) {
    throw new TemplateNotFoundError(
      `template '${base}', which E2B's base names on this daemon (ABX_E2B_BASE_TEMPLATE), does not exist or is not yours to use: build it (abx template build) as an admin, or unset ABX_E2B_BASE_TEMPLATE`,
    );
  }
  if (!traits) {
    throw new TemplateNotFoundError(
      `template '${template}' does not exist: abx template list shows the templates, abx template build makes one`,
    );
  }
  refuseUnsupported(body, traits);
  const network = networkOf(body.network, 'network');
  const internet = optionalBoolean(body, 'allow_internet_access');
  // The native create checks them together (autoPauseMemory needs autoPause: true) and refuses
  // a pause this provider cannot do.
  const autoPause = optionalBoolean(body, 'autoPause');
  const autoPauseMemory = optionalBoolean(body, 'autoPauseMemory');
  const autoResume = autoResumeOf(body);
  const volumeMounts = await volumeMountsOf(body.volumeMounts, traits, call.caller, call.backend);
  const workspace = workspaceOf(metadata);
  try {
    const row = await call.backend.create(
      {
        template,
        timeoutMs: seconds * 1000,
        envs,
        metadata,
        ...(network ? { network } : {}),
        ...(internet === undefined ? {} : { allowInternetAccess: internet }),
        ...(autoPause === undefined ? {} : { autoPause }),
        ...(autoPauseMemory === undefined ? {} : { autoPauseMemory }),
        ...(autoResume === undefined ? {} : { autoResume }),
        ...(volumeMounts ? { volumeMounts } : {}),
        ...(workspace ? { workspace } : {}),
      },
      call.caller,
      call.connection,
    );
    return new Answer(
      201,
      sandboxAnswer(row, call.backend.accessToken(row.id), call.backend.domain()),
    );
  } catch (error) {
    if (error instanceof LimitExceededError) throw await withRetryAfter(error, call);
    throw error;
  }
}

/**
 * A key at its limit may create again once one of its sandboxes ends: at the latest when the first
 * of them expires. `Retry-After` says when, so the SDK retries only when that is near.
 */
async function withRetryAfter(error: LimitExceededError, call: Call): Promise<Answer> {
  const owner = call.caller.keyId;
  const rows =
    owner === null ? [] : await call.backend.list({ owner, metadata: {}, states: ['running'] });
  const first = Math.min(...rows.map((row) => row.expiresAt));
  const headers: Record<string, string> = Number.isFinite(first)
    ? { 'retry-after': String(Math.max(1, Math.ceil((first - Date.now()) / 1000))) }
    : {};
  return new Answer(429, { code: 429, message: error.message }, headers);
}

/**
 * A paused sandbox run again for `timeout` seconds (default E2B's 300, as at create): **201**.
 * `memory: false` (the SDK's `onResume: 'reboot'`) is a start from its disk alone: what a
 * hibernated sandbox's resume is anyway; a frozen one resumes with its memory only, so it is
 * refused (as E2B refuses it where that start is not enabled). Undefined when it was running
 * (resumed meanwhile by another caller).
 */
async function resumePaused(
  call: Call,
  row: E2bSandboxRow,
  seconds: number | undefined,
): Promise<Answer | undefined> {
  if (optionalBoolean(call.body, 'memory') === false && row.paused?.memory !== false) {
    throw new InvalidArgumentError(
      `sandbox ${row.id} was paused with its memory (frozen), and abx resumes it only with its memory: memory: false (onResume: 'reboot') is not supported for it; connect without onResume, or pause it with keepMemory: false to have it start from its disk`,
    );
  }
  try {
    const { row: resumed, resumed: changed } = await call.backend.resume(
      row.id,
      (seconds ?? DEFAULT_TIMEOUT_SECONDS) * 1000,
      call.caller,
    );
    if (!changed) return undefined;
    return new Answer(
      201,
      sandboxAnswer(resumed, call.backend.accessToken(row.id), call.backend.domain()),
    );
  } catch (error) {
    if (error instanceof LimitExceededError) throw await withRetryAfter(error, call);
    throw error;
  }
}

/**
 * `Sandbox.connect`: a paused sandbox is resumed (**201**); a running one answers **200**, its
 * `timeout` lengthening its life, never shortening it (as E2B's).
 */
async function connect(call: Call): Promise<Answer> {
  let row = await visible(call);
  const seconds = timeoutSeconds(call.body);
  if (row.state === 'paused') {
    const resumed = await resumePaused(call, row, seconds);
    if (resumed) return resumed;
    row = await visible(call);
  } else {
    optionalBoolean(call.body, 'memory');
  }
  const current =
    seconds !== undefined && row.expiresAt < Date.now() + seconds * 1000
      ? await call.backend.setTimeout(row.id, seconds * 1000)
      : row;
  return new Answer(
    200,
    sandboxAnswer(current, call.backend.accessToken(row.id), call.backend.domain()),
  );
}

/**
 * E2B's deprecated `POST /sandboxes/{id}/resume` (older SDKs): a paused sandbox is resumed
 * (**201**), a running one is a conflict (409), as at E2B. Its `autoPause` set what the resumed
 * sandbox's timeout does; abx keeps what its create said, so another value is refused by name.
 */
async function resume(call: Call): Promise<Answer> {
  const row = await visible(call);
  const seconds = timeoutSeconds(call.body);
  const autoPause = optionalBoolean(call.body, 'autoPause');
  const has = row.lifecycle?.onTimeout === 'pause';
  if (autoPause !== undefined && autoPause !== has) {
    throw new InvalidArgumentError(
      `autoPause ${autoPause} on resume is not supported by abx: sandbox ${row.id} keeps what its create said (autoPause ${has}); leave autoPause out, or use connect (Sandbox.connect), which takes none`,
    );
  }
  const answer = row.state === 'paused' ? await resumePaused(call, row, seconds) : undefined;
  if (!answer) {
    throw new SandboxError(
      `sandbox ${row.id} is already running: only a paused sandbox can be resumed (connect answers a running one as it is)`,
      { status: 409, code: 'conflict' },
    );
  }
  return answer;
}

/**
 * `sandbox.pause()` / `Sandbox.pause(id)`: `memory` (the SDK's `keepMemory`; absent means true)
 * freezes it with its memory, false hibernates it (its disk kept). **204**; 409 when it is paused
 * already, which the SDK returns as `false`.
 */
async function pause(call: Call): Promise<Answer> {
  const row = await visible(call);
  await call.backend.pause(row.id, optionalBoolean(call.body, 'memory'));
  return new Answer(204, undefined);
}

/**
 * E2B's fork: `{ timeout?, count? }` → one entry per fork, `{ sandbox }` as a create answers it.
 * abx starts all of them or none, so a failure is the request's error rather than an entry's.
 */
async function fork(call: Call): Promise<Answer> {
  // The request is checked before the sandbox is looked up, as E2B does.
  const seconds = timeoutSeconds(call.body);
  const count = checkForkCount(call.body.count ?? 1);
  const row = await visible(call);
  try {
    const forks = await call.backend.fork(
      row.id,
      { count, ...(seconds === undefined ? {} : { timeoutMs: seconds * 1000 }) },
      call.caller,
    );
    const domain = call.backend.domain();
    return new Answer(
      201,
      forks.map((made) => ({
        sandbox: sandboxAnswer(made, call.backend.accessToken(made.id), domain),
      })),
    );
  } catch (error) {
    if (error instanceof LimitExceededError) throw await withRetryAfter(error, call);
    throw error;
  }
}

async function list(call: Call): Promise<Answer> {
  const query = parseListQuery(call.query);
  const { caller, backend } = call;
  const rows = await backend.list({
    ...(caller.admin ? {} : { owner: caller.keyId as string }),
    metadata: query.metadata,
    states: query.states,
  });
  const { startedAfter, template } = query;
  const chosen = rows.filter(
    (row) =>
      (startedAfter === undefined || row.createdAt >= startedAfter) &&
      (template === undefined || row.template === template),
  );
  const { items, nextToken } = page(chosen, query);
  const answer = await Promise.all(
    items.map(async (row) => listedAnswer(row, await backend.template(row.template))),
  );
  return new Answer(200, answer, nextToken ? { 'x-next-token': nextToken } : {});
}

const snapshotName = (id: string) => `snapshot-${id}-${Date.now().toString(36)}`;

/** A route of this API: its handler gets the call (caller, parameters, body). */
function route(
  method: E2bRoute['method'],
  path: string,
  summary: string,
  run: (call: Call) => Promise<Answer>,
): E2bRoute {
  return { method, path, group: 'e2b', summary, handler: ({ ctx }) => run(ctx) };
}

/** A secret route (secret-routes.ts), its answer as this API sends it. */
function secretRoute(run: (call: SecretCall) => Promise<SecretAnswer>) {
  return async (call: Call): Promise<Answer> => {
    const { status, body, headers } = await run(call);
    return new Answer(status, body, headers);
  };
}

/** A log route (log-routes.ts), its answer as this API sends it. */
function logRoute(run: (call: LogCall) => Promise<{ status: number; body: unknown }>) {
  return async (call: Call): Promise<Answer> => {
    const { status, body } = await run(call);
    return new Answer(status, body);
  };
}

/** A webhook route (webhook-routes.ts), its answer as this API sends it. */
function webhookRoute(run: (call: WebhookCall) => Promise<{ status: number; body: unknown }>) {
  return async (call: Call): Promise<Answer> => {
    const { status, body } = await run(call);
    return new Answer(status, body);
  };
}

/** An event route (event-routes.ts), its answer as this API sends it. */
function eventRoute(run: (call: EventCall) => Promise<{ status: number; body: unknown }>) {
  return async (call: Call): Promise<Answer> => {
    const { status, body } = await run(call);
    return new Answer(status, body);
  };
}

/** A volume route (volume-routes.ts), its answer as this API sends it. */
function volumeRoute(run: (call: VolumeCall) => Promise<VolumeAnswer>) {
  return async (call: Call): Promise<Answer> => {
    const { status, body } = await run(call);
    return new Answer(status, body);
  };
}

/** E2B's template builds of each daemon (template-build-routes.ts): one a backend. */
const BUILDS = new WeakMap<E2bBackend, TemplateBuilds>();

function buildsOf(backend: E2bBackend): TemplateBuilds {
  let builds = BUILDS.get(backend);
  if (!builds) {
    builds = new TemplateBuilds();
    BUILDS.set(backend, builds);
  }
  return builds;
}

/** A template build route (template-build-routes.ts), its answer as this API sends it. */
function buildRoute(
  route: (builds: TemplateBuilds) => (call: TemplateBuildCall) => Promise<TemplateBuildAnswer>,
) {
  return async (call: Call): Promise<Answer> => {
    const { status, body } = await route(buildsOf(call.backend))(call);
    return new Answer(status, body);
  };
}

async function info(call: Call): Promise<Answer> {
  const row = await visible(call);
  const template = await call.backend.template(row.template);
  return new Answer(200, detailAnswer(row, template, call.backend.domain()));
}

async function kill(call: Call): Promise<Answer> {
  const row = await visible(call);
  if (!(await call.backend.kill(row.id))) {
    throw new SandboxNotFoundError(`sandbox ${row.id} not found: it ended meanwhile`);
  }
  return new Answer(204, undefined);
}

async function setTimeoutOf(call: Call): Promise<Answer> {
  const row = await visible(call);
  const seconds = timeoutSeconds(call.body);
  if (seconds === undefined) {
    throw new InvalidArgumentError(
      `timeout is required: the seconds from now until sandbox ${row.id} is killed, 1 to 86400`,
    );
  }
  await call.backend.setTimeout(row.id, seconds * 1000);
  return new Answer(204, undefined);
}

/**
 * E2B's `network` object: `allowOut`, `denyOut`, `rules` (per-host header rules, with E2B's
 * `${e2b.secrets.NAME}` placeholders) and `egressProxy` (the caller's SOCKS5 proxy) are abx's
 * policy, checked where the policy is (checkNetworkPolicy); what abx does not do (host masking,
 * HTTPS ports, public traffic to ports without the token) is refused by name rather than
 * ignored. Undefined when absent.
 */
function networkOf(value: unknown, name: string): Partial<E2bNetwork> | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw new InvalidArgumentError(`${name} must be an object { allowOut?, denyOut?, rules? }`);
  }
  const { allowOut, denyOut, rules, egressProxy, allowPublicTraffic, ...rest } = value as Record<
    string,
    unknown
  >;
  if (allowPublicTraffic === true) {
    throw new InvalidArgumentError(
      `${name}.allowPublicTraffic true is not supported by abx: a sandbox's ports are reached with its traffic token only (as allowPublicTraffic false); leave it out`,
    );
  }
  const other = Object.keys(rest).find((key) => rest[key] !== undefined && rest[key] !== null);
  if (other) {
    throw new InvalidArgumentError(
      `${name}.${other} is not supported by abx: only allowOut, denyOut (CIDRs, domain names, *.domain wildcards), rules (per-host headers) and egressProxy (a SOCKS5 proxy) are; leave it out`,
    );
  }
  return {
    ...(allowOut === undefined ? {} : { allowOut: allowOut as string[] }),
    ...(denyOut === undefined ? {} : { denyOut: denyOut as string[] }),
    ...(rules === undefined || rules === null ? {} : { rules: rules as E2bNetwork['rules'] }),
    // E2B's null is no proxy.
    ...(egressProxy === undefined || egressProxy === null
      ? {}
      : { egressProxy: egressProxy as E2bNetwork['egressProxy'] }),
  };
}

/**
 * `Sandbox.updateNetwork` / `sandbox.updateNetwork()`: replaces the whole egress policy (fields
 * left out are cleared, as in E2B); `allow_internet_access: false` denies every address but what
 * allowOut names.
 */
async function updateNetwork(call: Call): Promise<Answer> {
  const row = await visible(call);
  const { allow_internet_access: _flag, ...lists } = call.body;
  const network = networkOf(lists, 'network') ?? {};
  const internet = optionalBoolean(call.body, 'allow_internet_access');
  const denyOut = [
    ...(network.denyOut ?? []),
    ...(internet === false ? ['0.0.0.0/0', '::/0'] : []),
  ];
  // rules and egressProxy left out are cleared too, as E2B's update replaces the whole
  // configuration.
  await call.backend.setNetwork(row.id, {
    allowOut: network.allowOut ?? [],
    denyOut,
    ...(network.rules ? { rules: network.rules } : {}),
    ...(network.egressProxy ? { egressProxy: network.egressProxy } : {}),
  });
  return new Answer(204, undefined);
}

/**
 * `Sandbox.getMetrics` / `sandbox.getMetrics()`: the samples the daemon keeps of a running
 * sandbox (every 5 s, the last 720), bounded by `start` and `end` in seconds since the epoch (the
 * whole second of `end` included), in E2B's `SandboxMetric` shape. A provider that measures
 * nothing answers an empty list, which the SDK reads as none.
 */
async function metrics(call: Call): Promise<Answer> {
  const row = await visible(call);
  const { start, end } = timeRange(call.query, 's');
  const samples = call.backend.metrics(
    row.id,
    start === undefined ? undefined : start * 1000,
    end === undefined ? undefined : end * 1000 + 999,
  );
  return new Answer(
    200,
    samples.map((s) => ({
      timestamp: new Date(s.at).toISOString(),
      timestampUnix: Math.floor(s.at / 1000),
      cpuUsedPct: s.cpuUsedPct,
      cpuCount: s.cpuCount,
      memUsed: s.memUsed,
      memCache: s.memCache,
      memTotal: s.memTotal,
      diskUsed: s.diskUsed,
      diskTotal: s.diskTotal,
    })),
  );
}

async function snapshot(call: Call): Promise<Answer> {
  const row = await visible(call);
  const name = optionalString(call.body, 'name') ?? snapshotName(row.id);
  await call.backend.snapshot(row.id, name, call.caller);
  return new Answer(201, { snapshotID: name, names: [name] });
}

/**
 * `Sandbox.listSnapshots` and `sandbox.listSnapshots()`: the templates saved from sandboxes that
 * the caller may use (its own, published ones; every one for an admin key), filtered by
 * `sandboxID` and `name`, paged as sandboxes are (`limit`, `nextToken`). Snapshots are templates,
 * as `abx template list` shows them.
 */
async function listSnapshots(call: Call): Promise<Answer> {
  const query = parseListQuery(call.query);
  const sandboxId = call.query.get('sandboxID') || undefined;
  const name = call.query.get('name') || undefined;
  const rows = (await call.backend.snapshots(call.caller))
    .filter(
      (s) =>
        (sandboxId === undefined || s.sandboxId === sandboxId) &&
        (name === undefined || s.name === name),
    )
    .map((s) => ({ createdAt: s.builtAt, id: s.name }));
  const { items, nextToken } = page(rows, query);
  return new Answer(
    200,
    items.map((s) => ({ snapshotID: s.id, names: [s.id] })),
    nextToken ? { 'x-next-token': nextToken } : {},
  );
}

/** `Sandbox.deleteSnapshot`: a snapshot is a template. */
async function removeTemplate(call: Call): Promise<Answer> {
  await call.backend.removeTemplate(call.params.id as string, call.caller);
  return new Answer(204, undefined);
}

const ROUTES: E2bRoute[] = [
  route('POST', '/v2/sandboxes', 'Create a sandbox.', create),
  route('POST', '/sandboxes', 'Create a sandbox (older SDKs).', create),
  route('GET', '/v2/sandboxes', 'List running and paused sandboxes, a page at a time.', list),
  route('GET', '/sandboxes', 'List running and paused sandboxes (older SDKs).', list),
  route(
    'POST',
    '/v2/sandboxes/{id}/connect',
    'Connect to a sandbox, resuming a paused one.',
    connect,
  ),
  route('POST', '/sandboxes/{id}/connect', 'Connect (older SDKs).', connect),
  route('GET', '/sandboxes/{id}', 'One sandbox.', info),
  route('DELETE', '/sandboxes/{id}', 'Kill a sandbox.', kill),
  route('POST', '/sandboxes/{id}/timeout', 'Set the time left.', setTimeoutOf),
  route('PUT', '/sandboxes/{id}/network', "Replace a sandbox's egress policy.", updateNetwork),
  route('GET', '/sandboxes/{id}/metrics', 'Samples of CPU, memory and disk use.', metrics),
  route('GET', '/sandboxes/{id}/logs', "A sandbox's log (older SDKs).", logRoute(sandboxLogsV1)),
  route(
    'GET',
    '/v2/sandboxes/{id}/logs',
    "A sandbox's log, running or ended.",
    logRoute(sandboxLogsV2),
  ),
  route('POST', '/sandboxes/{id}/snapshots', 'Save a sandbox as a template.', snapshot),
  route('POST', '/sandboxes/{id}/pause', 'Pause: freeze, or hibernate with memory: false.', pause),
  route('POST', '/sandboxes/{id}/resume', 'Resume a paused sandbox (older SDKs).', resume),
  route('POST', '/sandboxes/{id}/fork', 'Fork: count new sandboxes on copies of its disk.', fork),
  route('DELETE', '/templates/{id}', 'Remove a snapshot (a template).', removeTemplate),
  route('GET', '/snapshots', 'List snapshots (templates saved from sandboxes).', listSnapshots),
  route('POST', '/volumes', 'Make a volume of the key: { name }.', volumeRoute(createVolume)),
  route('GET', '/volumes', "The key's volumes.", volumeRoute(listVolumes)),
  route('GET', '/volumes/{id}', 'One volume, with its content token.', volumeRoute(getVolume)),
  route('DELETE', '/volumes/{id}', 'Remove a volume and its files.', volumeRoute(removeVolume)),
  route(
    'POST',
    '/secrets',
    'Make a secret of the key: { name, value, metadata? }.',
    secretRoute(createSecret),
  ),
  route('GET', '/secrets', "The key's secrets, paged (never a value).", secretRoute(listSecrets)),
  route(
    'GET',
    '/secrets/{id}',
    'One secret by id or name (never its value).',
    secretRoute(getSecret),
  ),
  route(
    'POST',
    '/secrets/{id}',
    "A secret's next version: { value, metadata? }.",
    secretRoute(updateSecret),
  ),
  route('DELETE', '/secrets/{id}', 'Remove a secret and its versions.', secretRoute(removeSecret)),
  route(
    'GET',
    '/events/sandboxes',
    "Lifecycle events of the key's sandboxes: offset, limit, orderAsc, types.",
    eventRoute(listEvents),
  ),
  route(
    'GET',
    '/events/sandboxes/{id}',
    "One sandbox's lifecycle events: offset, limit, orderAsc, types.",
    eventRoute(sandboxEvents),
  ),
  route(
    'POST',
    '/events/webhooks',
    'Register a webhook of the key: { name, url, enabled, events, signatureSecret }.',
    webhookRoute(createWebhook),
  ),
  route(
    'GET',
    '/events/webhooks',
    "The key's webhooks (never a secret).",
    webhookRoute(listWebhooks),
  ),
  route('GET', '/events/webhooks/{id}', 'One webhook.', webhookRoute(getWebhook)),
  route(
    'PATCH',
    '/events/webhooks/{id}',
    'Change a webhook: { name?, url?, enabled?, events?, signatureSecret? }.',
    webhookRoute(updateWebhook),
  ),
  route('DELETE', '/events/webhooks/{id}', 'Remove a webhook.', webhookRoute(removeWebhook)),
  route(
    'POST',
    '/v3/templates',
    'Request a template build.',
    buildRoute((b) => b.request),
  ),
  route(
    'POST',
    '/v2/templates',
    'Request a template build (older SDKs).',
    buildRoute((b) => b.request),
  ),
  route(
    'GET',
    '/templates/{id}/files/{hash}',
    "Whether the key uploaded a copy step's files; else an upload link.",
    buildRoute((b) => b.fileLink),
  ),
  route(
    'POST',
    '/v2/templates/{id}/builds/{buildID}',
    "Start a build with its steps (abx's template builder, in the background).",
    buildRoute((b) => b.start),
  ),
  route(
    'GET',
    '/templates/{id}/builds/{buildID}/status',
    "A build's status and its log lines from logsOffset.",
    buildRoute((b) => b.status),
  ),
  route(
    'GET',
    '/templates/{id}/builds/{buildID}/logs',
    "A build's log lines.",
    buildRoute((b) => b.logs),
  ),
  route(
    'GET',
    '/templates/aliases/{alias}',
    'Whether a template exists.',
    buildRoute((b) => b.alias),
  ),
  route(
    'GET',
    '/templates/{id}/tags',
    "A template's tags (default).",
    buildRoute((b) => b.tags),
  ),
  route(
    'POST',
    '/templates/tags',
    'Assign tags (refused).',
    buildRoute((b) => b.tagEdit),
  ),
  route(
    'DELETE',
    '/templates/tags',
    'Remove tags (refused).',
    buildRoute((b) => b.tagEdit),
  ),
];

/** The first path segments this API answers; the daemon's own API keeps every other path. */
const PREFIXES = [
  ['sandboxes'],
  ['v2', 'sandboxes'],
  ['snapshots'],
  ['templates'],
  ['v2', 'templates'],
  ['v3', 'templates'],
  ['volumes'],
  ['volumecontent'],
  ['secrets'],
  ['events', 'webhooks'],
  ['events', 'sandboxes'],
];

/** E2B's control API, answering on the daemon's listener beside `/v1`. */
export class E2bControlApi {
  private readonly table = new RouteTable<Call>(ROUTES);
  private readonly content: E2bVolumeContent;

  constructor(
    private readonly backend: E2bBackend,
    private readonly limits: BodyLimits,
  ) {
    this.content = new E2bVolumeContent(backend, limits);
  }

  /**
   * Ends this API's work as the daemon stops: a template build still running is recorded as
   * stopped by it (template-build-routes.ts), for the next daemon to answer.
   */
  stop(): void {
    buildsOf(this.backend).stop();
  }

  /**
   * Whether a request path is E2B's (`/sandboxes…`, `/v2/sandboxes…`, `/snapshots`,
   * `/templates…`, `/volumes…`, `/secrets…`, and the volume content API's `/volumecontent/…`).
   */
  static claims(url: string | undefined): boolean {
    const path = (url ?? '/').split('?')[0] as string;
    const segments = path.split('/').filter(Boolean);
    return PREFIXES.some((prefix) => prefix.every((part, i) => segments[i] === part));
  }

  /** Serves one request end to end; never rejects. */
  async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // Its own token, streamed bodies and error shape: see volume-content.ts.
    if (E2bVolumeContent.claims(req.url ?? '/')) return this.content.handle(req, res);
    // Its own token (the link's), a tar body: see template-files.ts.
    const upload = uploadTarget(req.method, req.url);
    if (upload) return this.receiveUpload(req, res, upload);
    try {
      let answer: Answer;
      try {
        answer = await this.answer(req);
      } catch (error) {
        if (!req.complete) await drainBody(req, this.limits);
        answer = errorAnswer(error);
      }
      send(res, answer);
    } catch {
      // The client went away mid-answer: nothing is left to tell it, and the daemon goes on.
      res.destroy();
    }
  }

  /** An upload to a link `GET /templates/{id}/files/{hash}` gave: 201, or E2B's error. */
  private async receiveUpload(
    req: IncomingMessage,
    res: ServerResponse,
    upload: { hash: string; token: string },
  ): Promise<void> {
    let answer: Answer;
    try {
      await buildsOf(this.backend).upload(this.backend).receive(upload.token, upload.hash, req);
      answer = new Answer(201, undefined);
    } catch (error) {
      if (!req.complete) await drainBody(req, this.limits).catch(() => undefined);
      answer = errorAnswer(error);
    }
    try {
      send(res, answer);
    } catch {
      res.destroy();
    }
  }

  private async answer(req: IncomingMessage): Promise<Answer> {
    const target = req.url ?? '/';
    const mark = target.indexOf('?');
    const header = req.headers['x-api-key'];
    // Before anything else: a request without a key learns nothing, not even which paths exist.
    const caller = await this.backend.authenticate(Array.isArray(header) ? header[0] : header);
    const { route, params } = match(
      this.table,
      req.method ?? 'GET',
      mark < 0 ? target : target.slice(0, mark),
    );
    const bytes = await readBody(req, this.limits);
    const query = new URLSearchParams(mark < 0 ? '' : target.slice(mark + 1));
    const body =
      route.method === 'POST' || route.method === 'PUT' || route.method === 'PATCH'
        ? bodyObject(parseJson(bytes, req))
        : {};
    const forwarded = req.headers['x-forwarded-proto'];
    const scheme = typeof forwarded === 'string' && forwarded === 'https' ? 'https' : 'http';
    const origin = `${scheme}://${req.headers.host ?? 'localhost'}`;
    const { localAddress, localPort, remoteAddress, remotePort } = req.socket;
    const connection = { localAddress, localPort, remoteAddress, remotePort };
    const call: Call = { params, query, body, caller, backend: this.backend, origin, connection };
    return (await route.handler({
      method: route.method,
      path: target,
      params,
      query,
      body,
      args: {},
      stream: () => bodyChunks(req, this.limits),
      // Read whole above (E2B's control API takes JSON only).
      wholeIfSmall: async () => bytes,
      closed: new AbortController().signal,
      headers: req.headers,
      ctx: call,
    })) as Answer;
  }
}

/** The route of a request; an unknown one is named with where the served routes are listed. */
function match(table: RouteTable<Call>, method: string, path: string) {
  try {
    return table.match(method, path);
  } catch (error) {
    if (!(error instanceof RouteNotFoundError)) throw error;
    throw new RouteNotFoundError(
      `abx does not serve ${method} ${path} of E2B's API; docs/e2b.md lists the routes it serves`,
    );
  }
}

function parseJson(bytes: Buffer, req: IncomingMessage): unknown {
  if (bytes.length === 0) return undefined;
  const type = req.headers['content-type'];
  if (type !== undefined && !/^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i.test(type)) {
    throw new UnsupportedMediaTypeError(
      `the body is declared as ${JSON.stringify(type)}; send JSON with Content-Type: application/json`,
    );
  }
  if (!isUtf8(bytes)) throw new InvalidJsonError('the request body is not valid UTF-8 JSON');
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch (error) {
    throw new InvalidJsonError(
      `the request body is not valid JSON (${(error as Error).message}); send a JSON object with Content-Type: application/json`,
    );
  }
}

/** Any error as E2B's `{ code, message }`, `code` being the HTTP status as the SDK reads it. */
function errorAnswer(error: unknown): Answer {
  if (error instanceof Answer) return error;
  const { status, body } = errorResponse(error);
  const headers: Record<string, string> =
    status === 405 && error instanceof SandboxError && Array.isArray(error.details.allow)
      ? { allow: (error.details.allow as string[]).join(', ') }
      : {};
  return new Answer(status, { code: status, message: body.error }, headers);
}

function send(res: ServerResponse, answer: Answer): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  if (answer.body === undefined) {
    res.writeHead(answer.status, answer.headers).end();
    return;
  }
  const text = JSON.stringify(answer.body);
  res
    .writeHead(answer.status, {
      ...answer.headers,
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(text),
    })
    .end(text);
}
