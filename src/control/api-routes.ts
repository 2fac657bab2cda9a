import { PassThrough, Readable } from 'node:stream';
import { validateKwargs } from '../../runtime/protocol/arguments.js';
import type { BuildProgress, SandboxInfo, TemplateInfo } from '../../runtime/protocol/wire.js';
import { Reply } from '../../runtime/server/http.js';
import type { Route } from '../../runtime/server/route-table.js';
import { argList } from '../../runtime/server/validate.js';
import { publicPolicy } from '../egress/policy.js';
import { errorResponse, InvalidArgumentError, SandboxNotFoundError } from '../errors.js';
import { egressPolicyOf } from '../providers/provider.js';
import { logJson, parseLogQuery, selectLines } from '../util/log-lines.js';
import { packageInfo } from '../util/package-info.js';
import { timeRange } from '../util/time-range.js';
import { type AuditLog, auditJson, auditLines, parseAuditQuery } from './audit.js';
import type { EgressAuditPoller } from './egress-audit.js';
import {
  type EventService,
  eventPage,
  nativeEventQuery,
  parseSeq,
  parseTypes,
} from './event-service.js';
import { ENVD_PORT } from './gateway.js';
import type { Caller, KeyService } from './key-service.js';
import type { MetricsSample, MetricsSampler } from './metrics.js';
import type { DaemonMetrics } from './prometheus.js';
import type { SandboxRecord, SandboxState } from './registry.js';
import type { SandboxEventStreams } from './sandbox-events.js';
import { followLog, type SandboxLogs } from './sandbox-logs.js';
import type { KeyOwner, SandboxService } from './sandbox-service.js';
import { type SecretService, secretJson } from './secret-service.js';
import type { BuiltTemplate, TemplateService } from './template-service.js';
import { type VolumeService, volumeJson } from './volume-service.js';
import { WEBHOOK_ROUTES } from './webhook-routes.js';
import type { WebhookService } from './webhook-service.js';

/** What the API's handlers reach. */
export interface ApiContext {
  sandboxes: SandboxService;
  templates: TemplateService;
  volumes: VolumeService;
  /** Secrets: write-only, so no route here ever answers a value. */
  secrets: SecretService;
  /** Webhooks of keys (`/v1/webhooks`): their secrets are write-only too. */
  webhooks: WebhookService;
  keys: KeyService;
  /** Running sandboxes' samples of use (CPU, memory, disk, processes). */
  metrics: MetricsSampler;
  /** Each sandbox's log (envd's lines, its processes), kept after it ends. */
  logs: SandboxLogs;
  /** The daemon's own metrics, which `GET /metrics` answers in Prometheus' text format. */
  prometheus: DaemonMetrics;
  /** Who sent the request (set by the daemon's guard; undefined only on public routes). */
  caller: Caller | undefined;
  /**
   * The host uid of the process that sent the request, when it is local (a loopback connection
   * whose client socket the kernel lists, peer-uid.ts); undefined otherwise.
   */
  peerUid?(): number | undefined;
  /** The audit trail's writer, whose store answers `GET /v1/sandboxes/{id}/audit`. */
  audit?: AuditLog;
  /** Reads a sandbox's raw TCP from egress into the trail before its audit is read (egress-audit.ts). */
  egressAudit?: Pick<EgressAuditPoller, 'harvest'>;
  /** Server-sent events of sandboxes (`GET /v1/events`). */
  events: SandboxEventStreams;
  /** Lifecycle events as their owners read them (`GET /v1/events` as JSON, and its stream). */
  lifecycle: EventService;
  /** Stops the daemon after the answer is sent. */
  shutdown(): void;
  /**
   * The gateway's origin as clients see it, its host the sandbox domain (`https://D:8444`):
   * sandbox ports are reached at `{scheme}://{port}-{sandboxId}.{domain}[:{port}]`.
   */
  gatewayUrl(): string;
}

type ApiRoute = Route<ApiContext>;

/** Where the daemon's Prometheus metrics are scraped (Prometheus' default path). */
export const METRICS_PATH = '/metrics';

const KEY_ARGS = argList({
  name: 'str',
  'admin?': ['bool', false],
  'maxRunning?': 'int',
  'format?': ['str', 'abx'],
});

/** The caller of a route that needs a key (the guard has authenticated it). */
function callerOf(ctx: ApiContext): Caller {
  if (!ctx.caller) throw new Error('a route that needs an API key ran without a caller');
  return ctx.caller;
}

/**
 * Refuses a sandbox the caller may not see, exactly as an id that does not exist is refused: a key
 * that is not an admin sees only the sandboxes it created, and learns nothing of the others.
 */
async function checkVisible(ctx: ApiContext, id: string): Promise<void> {
  const caller = callerOf(ctx);
  if (caller.admin) return;
  const record = await ctx.sandboxes.find(id);
  if (!record || record.owner !== caller.keyId) {
    throw new SandboxNotFoundError(`sandbox ${id} does not exist`);
  }
}

/** The key a create or resume counts against (none: the daemon's own key). */
function keyOwner(caller: Caller): KeyOwner | undefined {
  return caller.keyId === null
    ? undefined
    : {
        keyId: caller.keyId,
        name: caller.name,
        maxRunning: caller.maxRunning,
        admin: caller.admin,
      };
}

/** `?kill=` of a key's revocation: true or false (absent: false). */
function killFlag(query: URLSearchParams): boolean {
  const value = query.get('kill');
  if (value === null || value === 'false' || value === '0') return false;
  if (value === 'true' || value === '1' || value === '') return true;
  throw new InvalidArgumentError(
    `kill must be true (also kill the key's running and paused sandboxes) or false, not ${JSON.stringify(value)}`,
  );
}

/**
 * Kills the running and paused sandboxes of a revoked key through the normal kill path (the
 * gateway forgets each at once); the ids it ended. One that ended meanwhile is left out.
 */
async function killSandboxesOf(ctx: ApiContext, keyId: string): Promise<string[]> {
  const live = await ctx.sandboxes.list({ owner: keyId, state: ['running', 'paused'] });
  const killed: string[] = [];
  for (const record of live) {
    const ended = await ctx.sandboxes
      .kill(record.id, 'killed', `killed: its API key ${keyId} was revoked`)
      .catch(() => false);
    if (ended) killed.push(record.id);
  }
  return killed;
}

/** Refuses a caller whose key is not an admin key. */
function requireAdmin(ctx: ApiContext, what: string): void {
  ctx.keys.requireAdmin(callerOf(ctx), what);
}

/** A sample as the API shows it: its time as ISO 8601, as every time of the API. */
export function metricJson(sample: MetricsSample) {
  const { at, ...rest } = sample;
  return { timestamp: new Date(at).toISOString(), ...rest };
}

const STATES: SandboxState[] = ['running', 'pooled', 'paused', 'killed', 'expired', 'dead'];

/** A sandbox as the API shows it (never its token). */
export function sandboxJson(record: SandboxRecord): SandboxInfo {
  const egress = egressPolicyOf(record.handle);
  return {
    sandboxId: record.id,
    template: record.template,
    state: record.state,
    metadata: record.metadata,
    capabilities: record.capabilities,
    createdAt: new Date(record.createdAt).toISOString(),
    expiresAt: new Date(record.expiresAt).toISOString(),
    endedAt: record.endedAt === null ? null : new Date(record.endedAt).toISOString(),
    endReason: record.endReason,
    envdPort: ENVD_PORT,
    ...(egress ? { network: publicPolicy(egress) } : {}),
    ...(record.paused
      ? {
          paused: {
            memory: record.paused.memory,
            pausedAt: new Date(record.paused.at).toISOString(),
          },
        }
      : {}),
    lifecycle: record.lifecycle ?? { onTimeout: 'kill', keepMemory: true },
    volumeMounts: record.volumeMounts.map(({ name, path, readOnly }) => ({ name, path, readOnly })),
    ...(record.handle.workspace ? { workspace: { path: record.handle.workspace.path } } : {}),
  };
}

/**
 * A template as the API shows it to `caller`: `shared` for every key; `owner` (the key id that
 * built or took it) only to admins and to that key itself (null otherwise, and for the daemon's).
 */
export function templateJson(template: BuiltTemplate, caller?: Caller): TemplateInfo {
  const { spec } = template;
  const showOwner = !caller || caller.admin || template.owner === caller.keyId;
  return {
    name: spec.name,
    description: spec.description,
    image: spec.image ?? null,
    dockerfile: spec.dockerfile ?? null,
    builtImage: template.image ?? null,
    user: spec.user,
    capabilities: spec.capabilities,
    network: spec.network,
    ...(spec.egress ? { egress: spec.egress } : {}),
    timeoutMs: spec.timeoutMs,
    workdir: spec.workdir,
    env: spec.env,
    resources: spec.resources,
    setup: spec.setup,
    customCommands: spec.customCommands,
    ...(spec.runtime ? { runtime: spec.runtime } : {}),
    builtAt: template.builtAt === 0 ? null : new Date(template.builtAt).toISOString(),
    path: spec.path ?? null,
    shared: template.shared,
    owner: showOwner ? template.owner : null,
  };
}

/**
 * A build as NDJSON: a `{progress}` line per event while it runs, then `{template}`, or
 * `{error, status}` with the error's wire body (the answer's status is sent before the build ends).
 */
function progressLines(
  build: (onProgress: (event: BuildProgress) => void) => Promise<TemplateInfo>,
): Readable {
  const out = new PassThrough();
  const line = (value: unknown) => out.write(`${JSON.stringify(value)}\n`);
  build((progress) => line({ progress })).then(
    (template) => out.end(`${JSON.stringify({ template })}\n`),
    (error) => {
      const { status, body } = errorResponse(error);
      out.end(`${JSON.stringify({ error: body, status })}\n`);
    },
  );
  return out;
}

/** The daemon's REST API, as data. Every route but health needs the API key. */
export const API_ROUTES: ApiRoute[] = [
  {
    method: 'GET',
    path: '/v1/health',
    group: 'api',
    summary: 'The daemon answers; no key needed.',
    public: true,
    handler: ({ ctx }) => ({
      status: 'ok',
      pid: process.pid,
      version: packageInfo().version,
      // Where sandboxes are reached: remote clients (`abx e2b env`) learn it here.
      gatewayUrl: ctx.gatewayUrl(),
    }),
  },
  {
    method: 'POST',
    path: '/v1/sandboxes',
    group: 'api',
    summary:
      'Create a sandbox from a template: { template?, timeoutMs?, envs?, metadata?, network?: { allowOut?, denyOut?, rules? (host → [{ transform: { headers } }], header values may name secrets, docs/network.md) }, allowInternetAccess?, autoPause? (its timeout pauses it), autoPauseMemory?, autoResume? (its traffic resumes it), volumeMounts?: [{ name, path, readOnly? }], workspace?: { from, path? } (a host folder mounted copy-on-write: an admin key any, another key from a local process a folder its user can read; local provider, root daemon; docs/workspaces.md) }; the answer has its accessToken and the gatewayUrl its ports are reached through.',
    handler: async ({ body, ctx }) => {
      const request = (body ?? {}) as Record<string, unknown>;
      if (typeof request !== 'object' || Array.isArray(request)) {
        throw new InvalidArgumentError('the body must be a JSON object');
      }
      if (request.template !== undefined && typeof request.template !== 'string') {
        throw new InvalidArgumentError(
          `template must be a template name such as "base", not ${JSON.stringify(request.template)}`,
        );
      }
      const caller = callerOf(ctx);
      const { record, accessToken } = await ctx.sandboxes.create(
        {
          ...(typeof request.template === 'string' ? { template: request.template } : {}),
          ...(request.timeoutMs === undefined ? {} : { timeoutMs: request.timeoutMs as number }),
          envs: request.envs as Record<string, string>,
          metadata: request.metadata as Record<string, string>,
          ...(request.network === undefined ? {} : { network: request.network }),
          ...(request.allowInternetAccess === undefined
            ? {}
            : { allowInternetAccess: request.allowInternetAccess }),
          autoPause: request.autoPause,
          autoPauseMemory: request.autoPauseMemory,
          autoResume: request.autoResume,
          volumeMounts: request.volumeMounts,
          ...(request.workspace === undefined ? {} : { workspace: request.workspace }),
        },
        keyOwner(caller),
        // Who may mount a host folder depends on the user of a local client (workspace-access.ts):
        // looked up only when a workspace asks for it (it reads /proc/net/tcp).
        {
          get uid() {
            return ctx.peerUid?.();
          },
        },
      );
      return { ...sandboxJson(record), accessToken, gatewayUrl: ctx.gatewayUrl() };
    },
  },
  {
    method: 'GET',
    path: '/v1/sandboxes',
    group: 'api',
    summary:
      'List sandboxes (every state but pooled); filter with state= (one or several, comma-separated), template= and metadata.KEY=VALUE. A key that is not an admin sees only its own.',
    handler: async ({ query, ctx }) => {
      const caller = callerOf(ctx);
      // One state or several, comma-separated: state=running or state=killed,expired,dead.
      const states = (query.get('state') ?? '').split(',').filter(Boolean);
      for (const state of states) {
        if (!STATES.includes(state as SandboxState)) {
          throw new InvalidArgumentError(
            `state must be one or more of ${STATES.join(', ')} (comma-separated), not '${state}'`,
          );
        }
      }
      const metadata: Record<string, string> = {};
      for (const [key, value] of query) {
        if (key.startsWith('metadata.')) metadata[key.slice('metadata.'.length)] = value;
      }
      const template = query.get('template') ?? undefined;
      return {
        sandboxes: (
          await ctx.sandboxes.list({
            ...(states.length > 0 ? { state: states as SandboxState[] } : {}),
            ...(template ? { template } : {}),
            ...(caller.admin ? {} : { owner: caller.keyId as string }),
            metadata,
          })
        ).map(sandboxJson),
      };
    },
  },
  {
    method: 'GET',
    path: '/v1/events',
    group: 'api',
    summary:
      "Lifecycle events of the key's sandboxes (an admin key: all), docs/events.md. As JSON (unless Accept asks for text/event-stream): a page { events, cursor, more } by seq; limit (1-1000, default 100), order (asc, desc), cursor (the last page's), after (a seq), sandbox, type (repeated or comma-separated), since and until (ms or ISO 8601); another key's sandbox is 404. As server-sent events: lifecycle {event} with id: its seq, from after Last-Event-ID or ?after= (else from now), filtered by sandbox and type; and, unless only=lifecycle, the dashboard's view: snapshot {sandboxes} first (running and paused), then sandbox {sandbox} when one appears or changes, ended {sandboxId, state, endReason}, metrics {sandboxId, metric} per new sample. Lifecycle events come as they are written; the rest is read every ABX_EVENTS_INTERVAL_MS (1000).",
    handler: async ({ ctx, closed, headers, query }) => {
      const caller = callerOf(ctx);
      const accept = headers.accept ?? '';
      if (!/text\/event-stream/i.test(accept)) {
        const read = nativeEventQuery(query);
        return eventPage(await ctx.lifecycle.list(caller, read), read);
      }
      const only = query.get('only');
      if (only !== null && only !== 'lifecycle') {
        throw new InvalidArgumentError(
          `only must be lifecycle (no dashboard events), not '${only}'`,
        );
      }
      // A reconnecting EventSource sends the last id it had; ?after= says the same for others.
      const lastId = headers['last-event-id'];
      const after =
        parseSeq('Last-Event-ID', typeof lastId === 'string' ? lastId : null) ??
        parseSeq('after', query.get('after')) ??
        (await ctx.lifecycle.newestSeq(caller));
      const sandboxId = query.get('sandbox') || undefined;
      if (sandboxId) await ctx.lifecycle.checkSandbox(caller, sandboxId);
      const types = parseTypes('type', query.getAll('type'));
      return new Reply(
        200,
        ctx.events.stream(caller, closed, {
          after,
          ...(sandboxId ? { sandboxId } : {}),
          ...(types.length > 0 ? { types } : {}),
          lifecycleOnly: only === 'lifecycle',
        }),
        {
          'content-type': 'text/event-stream; charset=utf-8',
          'cache-control': 'no-store',
          'x-accel-buffering': 'no',
        },
      );
    },
  },
  {
    method: 'GET',
    path: '/v1/sandboxes/{id}',
    group: 'api',
    summary: 'One sandbox.',
    handler: async ({ params, ctx }) => {
      await checkVisible(ctx, params.id as string);
      return sandboxJson(await ctx.sandboxes.get(params.id as string));
    },
  },
  {
    method: 'POST',
    path: '/v1/sandboxes/{id}/connect',
    group: 'api',
    summary:
      'A running sandbox with its access token, to use it from another process; a paused one is resumed first (with its template’s timeout).',
    body: 'none',
    handler: async ({ params, ctx }) => {
      await checkVisible(ctx, params.id as string);
      const { record } = await ctx.sandboxes.resume(
        params.id as string,
        {},
        keyOwner(callerOf(ctx)),
      );
      return {
        ...sandboxJson(record),
        accessToken: ctx.sandboxes.tokenOf(record.id),
        gatewayUrl: ctx.gatewayUrl(),
      };
    },
  },
  {
    method: 'DELETE',
    path: '/v1/sandboxes/{id}',
    group: 'api',
    summary: 'Kill a sandbox and every process in it.',
    body: 'none',
    handler: async ({ params, ctx }) => {
      await checkVisible(ctx, params.id as string);
      const killed = await ctx.sandboxes.kill(params.id as string, 'killed', 'killed by request');
      return { killed, sandbox: sandboxJson(await ctx.sandboxes.get(params.id as string)) };
    },
  },
  {
    method: 'POST',
    path: '/v1/sandboxes/{id}/pause',
    group: 'api',
    summary:
      'Pause a running sandbox: { memory? }. memory true (the default) freezes its processes with their memory; false hibernates it: its processes end, its disk and environment are kept. 409 (SandboxPausedError) when it is paused already.',
    args: argList({ 'memory?': ['bool', true] }),
    handler: async ({ params, args, ctx }) => {
      await checkVisible(ctx, params.id as string);
      return sandboxJson(await ctx.sandboxes.pause(params.id as string, { memory: args.memory }));
    },
  },
  {
    method: 'POST',
    path: '/v1/sandboxes/{id}/resume',
    group: 'api',
    summary:
      'Run a paused sandbox again: { timeoutMs? } (default: its template’s timeout). The answer is the sandbox with resumed: false when it was running already.',
    args: argList({ 'timeoutMs?': 'int' }),
    handler: async ({ params, args, ctx }) => {
      await checkVisible(ctx, params.id as string);
      const { record, resumed } = await ctx.sandboxes.resume(
        params.id as string,
        args.timeoutMs === undefined ? {} : { timeoutMs: args.timeoutMs },
        keyOwner(callerOf(ctx)),
      );
      return { ...sandboxJson(record), resumed };
    },
  },
  {
    method: 'POST',
    path: '/v1/sandboxes/{id}/fork',
    group: 'api',
    summary:
      'Fork a running or paused sandbox: { count? (1-10, default 1), timeoutMs?, metadata? }. Each fork is a new running sandbox on a copy of its disk (home, /tmp, an image’s changes; not its processes), with its own id and token, its network policy, environment and metadata. The answer: { sandboxes: [sandbox with accessToken] }.',
    handler: async ({ params, body, ctx }) => {
      const request = (body ?? {}) as Record<string, unknown>;
      if (typeof request !== 'object' || Array.isArray(request)) {
        throw new InvalidArgumentError(
          'the body must be a JSON object: { count?, timeoutMs?, metadata? }',
        );
      }
      await checkVisible(ctx, params.id as string);
      const forks = await ctx.sandboxes.fork(
        params.id as string,
        { count: request.count, timeoutMs: request.timeoutMs, metadata: request.metadata },
        keyOwner(callerOf(ctx)),
      );
      return {
        sandboxes: forks.map(({ record, accessToken }) => ({
          ...sandboxJson(record),
          accessToken,
          gatewayUrl: ctx.gatewayUrl(),
        })),
      };
    },
  },
  {
    method: 'POST',
    path: '/v1/sandboxes/{id}/timeout',
    group: 'api',
    summary: 'Set the time left before the sandbox is reaped: { timeoutMs }.',
    args: argList({ timeoutMs: 'int' }),
    handler: async ({ params, args, ctx }) => {
      await checkVisible(ctx, params.id as string);
      return sandboxJson(await ctx.sandboxes.setTimeout(params.id as string, args.timeoutMs));
    },
  },
  {
    method: 'GET',
    path: '/v1/sandboxes/{id}/network',
    group: 'api',
    summary:
      "An internet sandbox's egress policy and what it allowed and refused: { allowOut, denyOut, allowed, refused, recent: the latest 200 decisions }.",
    handler: async ({ params, ctx }) => {
      await checkVisible(ctx, params.id as string);
      return ctx.sandboxes.networkOf(params.id as string);
    },
  },
  {
    method: 'GET',
    path: '/v1/sandboxes/{id}/metrics',
    group: 'api',
    summary:
      "A running sandbox's use, sampled every 5 s (ABX_METRICS_INTERVAL_MS), the last 720 samples: { metrics: [{ timestamp, cpuUsedPct (share of cpuCount), cpuCount, memUsed, memCache, memTotal, diskUsed, diskTotal, processes, netRxBytes, netTxBytes (bytes in and out since it started; null on the host network) }] }; start= and end= (ms since the epoch, both included) bound them. An ended sandbox has none.",
    handler: async ({ params, query, ctx }) => {
      const id = params.id as string;
      await checkVisible(ctx, id);
      const range = timeRange(query, 'ms');
      await ctx.sandboxes.get(id);
      const unavailable = ctx.metrics.unavailable();
      if (unavailable) {
        throw new InvalidArgumentError(
          `sandbox ${id} has no metrics: ${unavailable} (the local and docker providers measure them)`,
        );
      }
      return { metrics: ctx.metrics.samples(id, range.start, range.end).map(metricJson) };
    },
  },
  {
    method: 'GET',
    path: '/v1/sandboxes/{id}/workspace/changes',
    group: 'api',
    summary:
      "What changed in a running sandbox's workspace against its host folder: { entries: [{ status (added, deleted, modified, renamed, typechange), path, from?, before?, after?, contentChanged, modeChanged, binary }] }, sorted by path; .git left out (docs/workspaces.md).",
    handler: async ({ params, ctx }) => {
      const id = params.id as string;
      await checkVisible(ctx, id);
      const found = await ctx.sandboxes.workspaceChanges(id);
      return { entries: found.entries };
    },
  },
  {
    method: 'GET',
    path: '/v1/sandboxes/{id}/workspace/diff',
    group: 'api',
    summary:
      "A running sandbox's workspace changes as a git patch (text/x-diff; what `git diff --binary --full-index` writes, `git apply` takes it); X-Abx-Diff-Complete: false when something could not be in it (a FIFO, a mode git does not keep). format=json: { patch (as UTF-8 text), stat, names, complete, omitted }.",
    handler: async ({ params, query, ctx }) => {
      const id = params.id as string;
      await checkVisible(ctx, id);
      const format = query.get('format') ?? 'patch';
      if (format !== 'patch' && format !== 'json') {
        throw new InvalidArgumentError(
          `format must be patch or json, not ${JSON.stringify(format)}`,
        );
      }
      const review = await ctx.sandboxes.workspaceDiff(id);
      if (format === 'json') {
        const { patch, ...rest } = review;
        return { patch: patch.toString('utf8'), ...rest };
      }
      return new Reply(200, review.patch, {
        'content-type': 'text/x-diff; charset=utf-8',
        'cache-control': 'no-store',
        'x-abx-diff-complete': String(review.complete),
      });
    },
  },
  {
    method: 'POST',
    path: '/v1/sandboxes/{id}/workspace/apply',
    group: 'api',
    summary:
      "Writes a running sandbox's workspace changes into its host folder: { paths? (files, or folders ending in /), dryRun?, force? (write over host edits made since it was mounted) } → { dryRun, applied: [changes], forced: [{ path, reason }] }. Everything is checked first: a refusal (links out of the folder, devices, set-id bits, conflicts…) is 400 workspace_refused naming each path, and nothing is written; a write that fails midway (a full disk, a folder the user may not write) is undone, 400 workspace_write_failed with path, rolledBack and notRestored (docs/workspaces.md).",
    handler: async ({ params, body, ctx }) => {
      const id = params.id as string;
      await checkVisible(ctx, id);
      return ctx.sandboxes.workspaceApply(id, body);
    },
  },
  {
    method: 'POST',
    path: '/v1/workspaces/uploads',
    group: 'api',
    body: 'stream',
    summary:
      "A remote client's folder for a workspace: the body a tar stream (application/x-tar, not compressed; at most ABX_WORKSPACE_UPLOAD_MAX_BYTES, 1 GiB, within ABX_WORKSPACE_UPLOAD_TIMEOUT_MS, 10 min), extracted by the checking extractor (links out of it, '..', set-id bits, devices and FIFOs refused: 400 workspace_archive_refused, nothing kept); since= the client's clock when it packed. → { uploadId, since, uploadedAt, files, directories, symlinks, expiresAt }: a create's workspace: { upload: uploadId, path? } takes it once, within 10 minutes, for the same key (docs/workspaces.md).",
    handler: async ({ query, stream, ctx }) => {
      const raw = query.get('since');
      const since = raw === null ? null : Number(raw);
      if (since !== null && !(Number.isSafeInteger(since) && since > 0)) {
        throw new InvalidArgumentError(
          `since must be the client's clock in ms since the epoch, not ${JSON.stringify(raw)}`,
        );
      }
      return ctx.sandboxes.uploads.receive(stream(), keyOwner(callerOf(ctx))?.keyId, since);
    },
  },
  {
    method: 'GET',
    path: '/v1/sandboxes/{id}/workspace',
    group: 'api',
    summary:
      "A running sandbox's workspace: { path (where the sandbox sees it), uploaded (true: a client's folder, applied on the client: POST …/workspace/apply refuses it), since (an upload's: the client's clock when it packed; else when it was mounted, the daemon's) }.",
    handler: async ({ params, ctx }) => {
      const id = params.id as string;
      await checkVisible(ctx, id);
      return ctx.sandboxes.workspaceInfo(id);
    },
  },
  {
    method: 'GET',
    path: '/v1/sandboxes/{id}/logs',
    group: 'api',
    summary:
      "A sandbox's log, running or ended (kept as long as its record; the newest 10000 lines and 1 MiB): { logs: [{ timestamp, level, message, fields }] }, oldest first; start= (ms since the epoch), level= (debug, info, warn, error: that level and above), search= (a substring), direction= (forward, backward), limit= (1 to 10000). With follow=1: NDJSON {log} lines, then each new one as it comes, {keepalive:{}} every 15 s without one, {end:{state}} once the sandbox has ended.",
    handler: async ({ params, query, ctx, closed }) => {
      const id = params.id as string;
      await checkVisible(ctx, id);
      const record = await ctx.sandboxes.find(id);
      if (!record) throw new SandboxNotFoundError(`sandbox ${id} does not exist`);
      const logQuery = parseLogQuery(query);
      const follow = query.get('follow');
      if (follow !== null && !['0', '1', 'true', 'false'].includes(follow)) {
        throw new InvalidArgumentError(`follow must be 1 or 0, not ${JSON.stringify(follow)}`);
      }
      if (follow === '1' || follow === 'true') {
        if (logQuery.direction === 'backward') {
          throw new InvalidArgumentError(
            'follow reads forward (new lines come last): leave out direction=backward',
          );
        }
        const stateOf = async () => (await ctx.sandboxes.find(id))?.state;
        return new Reply(200, followLog(ctx.logs, id, logQuery, stateOf, closed), {
          'content-type': 'application/x-ndjson; charset=utf-8',
          'cache-control': 'no-store',
          'x-accel-buffering': 'no',
        });
      }
      return { logs: selectLines(ctx.logs.read(id), logQuery).map(logJson) };
    },
  },
  {
    method: 'GET',
    path: '/v1/sandboxes/{id}/audit',
    group: 'api',
    summary:
      "A sandbox's audit trail, running or ended (kept as long as events): what the daemon saw done to and from it (commands, files written and removed, port links, egress connections). { audit: [{ seq, at, time, sandboxId, owner, actor, kind, data }], next } by seq; after= (the last seq read), limit= (1 to 1000, default 100), kind= (repeatable or a comma list), since=/until= (ms since the epoch or ISO 8601). format=jsonl (or Accept: application/x-ndjson): every row selected, one JSON object per line.",
    handler: async ({ params, query, headers, ctx }) => {
      const id = params.id as string;
      await checkVisible(ctx, id);
      if (!(await ctx.sandboxes.find(id)))
        throw new SandboxNotFoundError(`sandbox ${id} does not exist`);
      const audit = ctx.audit;
      if (!audit) throw new Error('the daemon keeps no audit trail');
      const format = query.get('format');
      if (format !== null && format !== 'json' && format !== 'jsonl') {
        throw new InvalidArgumentError(
          `format must be json or jsonl (one row per line), not ${JSON.stringify(format.slice(0, 40))}`,
        );
      }
      const filter = parseAuditQuery(query);
      // What this daemon saw before the read is in the answer: egress's raw TCP of it too.
      await ctx.egressAudit?.harvest(id);
      await audit.flush();
      const jsonl =
        format === 'jsonl' ||
        (format === null && /application\/x-ndjson|application\/jsonl/.test(headers.accept ?? ''));
      if (jsonl) {
        return new Reply(200, Readable.from(auditLines(audit.store, id, filter)), {
          'content-type': 'application/x-ndjson; charset=utf-8',
          'cache-control': 'no-store',
        });
      }
      const rows = await audit.store.listAudit({ ...filter, sandboxId: id });
      const last = rows[rows.length - 1];
      return {
        audit: rows.map(auditJson),
        next: rows.length === filter.limit && last ? last.seq : null,
      };
    },
  },
  {
    method: 'PUT',
    path: '/v1/sandboxes/{id}/network',
    group: 'api',
    summary:
      "Replace an internet sandbox's egress policy: { allowOut?, denyOut?, rules? } (CIDRs, domain names, *.domain wildcards; an allow entry wins; per-host header rules, placeholders only). New connections and DNS questions follow it at once.",
    handler: async ({ params, body, ctx }) => {
      await checkVisible(ctx, params.id as string);
      return sandboxJson(await ctx.sandboxes.setNetwork(params.id as string, body));
    },
  },
  {
    method: 'POST',
    path: '/v1/sandboxes/{id}/snapshot',
    group: 'api',
    summary:
      "Save a running sandbox as the template { name } (its home; with images, its whole filesystem). The snapshot is the caller's key's own: only that key and admin keys list it and create from it (an admin's publish shares it). 409 TemplateConflictError (template_name_taken) for a name another key's template has.",
    args: argList({ name: 'str' }),
    handler: async ({ params, args, ctx }) => {
      const caller = callerOf(ctx);
      await checkVisible(ctx, params.id as string);
      const record = await ctx.sandboxes.running(params.id as string);
      const built = await ctx.templates.snapshot(
        record,
        ctx.sandboxes.controlTokenOf(record.id),
        args.name as string,
        caller,
        (to) => ctx.sandboxes.saveWorkspace(record.id, to),
      );
      await ctx.sandboxes.drainPool(built.spec.name);
      return templateJson(built, caller);
    },
  },
  {
    method: 'GET',
    path: '/v1/templates',
    group: 'api',
    summary:
      "The templates the key may use: base, the shared catalogue, and its own (an admin key: every template). Another key's own templates are not listed.",
    handler: async ({ ctx }) => {
      const caller = callerOf(ctx);
      return {
        templates: (await ctx.templates.list(caller)).map((t) => templateJson(t, caller)),
      };
    },
  },
  {
    method: 'GET',
    path: '/v1/templates/{name}',
    group: 'api',
    summary: "One template; another key's own template answers 404, as an unknown name.",
    handler: async ({ params, ctx }) => {
      const caller = callerOf(ctx);
      return templateJson(await ctx.templates.get(params.name as string, caller), caller);
    },
  },
  {
    method: 'POST',
    path: '/v1/templates/{name}/publish',
    group: 'api',
    summary:
      'Put a template into the shared catalogue ({ shared: true }, the default: every key lists it and creates from it) or take it out ({ shared: false }: its owner and admins only). Admin keys only.',
    args: argList({ 'shared?': ['bool', true] }),
    handler: async ({ params, args, ctx }) => {
      const caller = callerOf(ctx);
      const built = await ctx.templates.publish(
        params.name as string,
        args.shared as boolean,
        caller,
      );
      return templateJson(built, caller);
    },
  },
  {
    method: 'POST',
    path: '/v1/templates',
    group: 'api',
    summary:
      "Build a template: { yaml } (its text), or { path } of a template.yaml on the daemon's host (admin keys only); with progress: true, NDJSON {progress} lines then {template} or {error, status}. An admin key's new template is shared (every key uses it); another key's is its own. A rebuild keeps its owner; a key may rebuild only its own (403 admin_required for a shared one, 409 TemplateConflictError template_name_taken for another key's).",
    args: argList({ 'path?': 'str', 'yaml?': 'str', 'progress?': ['bool', false] }),
    handler: async ({ args, ctx }) => {
      const caller = callerOf(ctx);
      if ((args.yaml === undefined) === (args.path === undefined)) {
        throw new InvalidArgumentError(
          "give either yaml (the template's text) or path (a template.yaml on the daemon's host)",
        );
      }
      if (args.path !== undefined) {
        requireAdmin(
          ctx,
          "building a template from a path on the daemon's host (send yaml instead)",
        );
      }
      const source =
        args.yaml === undefined ? (args.path as string) : { yaml: args.yaml as string };
      const build = async (onProgress?: (event: BuildProgress) => void) => {
        const built = await ctx.templates.build(source, onProgress, caller);
        // Spare sandboxes of the old build must not be handed out.
        await ctx.sandboxes.drainPool(built.spec.name);
        return templateJson(built, caller);
      };
      if (!args.progress) return build();
      return new Reply(200, progressLines(build), {
        'content-type': 'application/x-ndjson; charset=utf-8',
        'cache-control': 'no-store',
      });
    },
  },
  {
    method: 'DELETE',
    path: '/v1/templates/{name}',
    group: 'api',
    summary:
      "Remove a built template: a key its own; a shared one (403 admin_required otherwise) or another key's, admin keys only (to any other key that answers 404, as an unknown name).",
    body: 'none',
    handler: async ({ params, ctx }) => {
      await ctx.templates.remove(params.name as string, callerOf(ctx));
      await ctx.sandboxes.drainPool(params.name as string);
      return { removed: params.name };
    },
  },
  {
    method: 'POST',
    path: '/v1/volumes',
    group: 'api',
    summary:
      "Make a volume: { name, size? } (bytes, or 512M, 2G; default 1G). Names are the caller's key's own: letters, digits, _ and -. 409 (VolumeConflictError, volume_exists) when the name is taken.",
    handler: async ({ body, ctx }) => {
      const request = (body ?? {}) as Record<string, unknown>;
      if (typeof request !== 'object' || Array.isArray(request)) {
        throw new InvalidArgumentError('the body must be a JSON object { name, size? }');
      }
      const volume = await ctx.volumes.create(callerOf(ctx).keyId, request);
      return new Reply(201, volumeJson(volume, await ctx.volumes.details(volume)));
    },
  },
  {
    method: 'GET',
    path: '/v1/volumes',
    group: 'api',
    summary: "The caller's key's volumes, by name.",
    handler: async ({ ctx }) => ({
      volumes: (await ctx.volumes.list(callerOf(ctx).keyId)).map((volume) => volumeJson(volume)),
    }),
  },
  {
    method: 'GET',
    path: '/v1/volumes/{name}',
    group: 'api',
    summary: 'One volume: its size, what it holds now and the live sandboxes that mount it.',
    handler: async ({ params, ctx }) => {
      const volume = await ctx.volumes.get(callerOf(ctx).keyId, params.name as string);
      return volumeJson(volume, await ctx.volumes.details(volume));
    },
  },
  {
    method: 'DELETE',
    path: '/v1/volumes/{name}',
    group: 'api',
    summary:
      'Remove a volume and every file in it. 409 (VolumeConflictError, volume_in_use, with users) while a running or paused sandbox mounts it.',
    body: 'none',
    handler: async ({ params, ctx }) => {
      const volume = await ctx.volumes.get(callerOf(ctx).keyId, params.name as string);
      return { removed: await ctx.volumes.remove(volume), name: volume.name };
    },
  },
  {
    method: 'POST',
    path: '/v1/secrets',
    group: 'api',
    summary:
      "Make a secret: { name, value, metadata? }. The value is write-only: no answer ever holds it. Names are the caller's key's own, 1 to 64 letters, digits, _, - and ., kept lower-case; a value is 1 byte to 64 KiB. 201 with its name, version (1), metadata and times; 409 (SecretConflictError, secret_exists) when the name is taken.",
    handler: async ({ body, ctx }) => {
      const request = body ?? {};
      if (typeof request !== 'object' || Array.isArray(request)) {
        throw new InvalidArgumentError('the body must be a JSON object { name, value, metadata? }');
      }
      const caller = callerOf(ctx);
      const secret = await ctx.secrets.create(caller, request);
      return new Reply(201, secretJson(secret, caller.admin));
    },
  },
  {
    method: 'GET',
    path: '/v1/secrets',
    group: 'api',
    summary:
      "The secrets the caller's key owns (an admin key: every key's, with its owner), by name: names, versions, metadata and times, never a value.",
    handler: async ({ ctx }) => {
      const caller = callerOf(ctx);
      return {
        secrets: (await ctx.secrets.list(caller)).map((s) => secretJson(s, caller.admin)),
      };
    },
  },
  {
    method: 'GET',
    path: '/v1/secrets/{name}',
    group: 'api',
    summary:
      "One secret by name (among the caller's) or id (sec_…): its version, metadata and times, never its value. Another key's secret is 404, as an unknown name.",
    handler: async ({ params, ctx }) => {
      const caller = callerOf(ctx);
      return secretJson(await ctx.secrets.find(caller, params.name as string), caller.admin);
    },
  },
  {
    method: 'POST',
    path: '/v1/secrets/{name}',
    group: 'api',
    summary:
      'Change a secret: { value?, metadata? } (at least one). A new value is the next version, used from the next request on; metadata replaces the old.',
    handler: async ({ params, body, ctx }) => {
      const request = body ?? {};
      if (typeof request !== 'object' || Array.isArray(request)) {
        throw new InvalidArgumentError('the body must be a JSON object { value?, metadata? }');
      }
      const caller = callerOf(ctx);
      const secret = await ctx.secrets.update(caller, params.name as string, request);
      return secretJson(secret, caller.admin);
    },
  },
  {
    method: 'DELETE',
    path: '/v1/secrets/{name}',
    group: 'api',
    summary: 'Remove a secret and every version of its value.',
    body: 'none',
    handler: async ({ params, ctx }) => {
      const { removed, secret } = await ctx.secrets.remove(callerOf(ctx), params.name as string);
      return { removed, name: secret.name, secretId: secret.id };
    },
  },
  {
    method: 'GET',
    path: METRICS_PATH,
    group: 'api',
    summary:
      "The daemon's own metrics in Prometheus' text format (docs/metrics.md): admin keys only, sent as Authorization: Bearer or X-API-KEY.",
    handler: async ({ ctx }) => {
      requireAdmin(ctx, `GET ${METRICS_PATH} (the daemon's Prometheus metrics)`);
      const { text, contentType } = await ctx.prometheus.scrape();
      return new Reply(200, text, { 'content-type': contentType, 'cache-control': 'no-store' });
    },
  },
  {
    method: 'POST',
    path: '/v1/shutdown',
    group: 'api',
    summary:
      'Stop the daemon (sandboxes keep running and are adopted by the next daemon). Admin keys only.',
    body: 'none',
    handler: ({ ctx }) => {
      requireAdmin(ctx, 'stopping the daemon');
      ctx.shutdown();
      return { stopping: true };
    },
  },
  {
    method: 'POST',
    path: '/v1/keys',
    group: 'api',
    summary:
      'Make an API key: { name, admin?, maxRunning?, format? (abx, or e2b: e2b_ and hex) }; the answer holds the key, shown this once. Admin keys only.',
    handler: async ({ body, ctx }) => {
      // Checked before the body: a key that may not make keys learns nothing of the body's form.
      requireAdmin(ctx, 'making an API key');
      const args = validateKwargs('POST /v1/keys', KEY_ARGS, body);
      return ctx.keys.create({
        name: args.name as string,
        admin: args.admin as boolean,
        maxRunning: (args.maxRunning as number | undefined) ?? null,
        format: args.format as string,
      });
    },
  },
  {
    method: 'GET',
    path: '/v1/keys',
    group: 'api',
    summary:
      'The API keys (never the keys themselves), with the sandboxes each has running. Admin keys only.',
    handler: async ({ ctx }) => {
      requireAdmin(ctx, 'listing the API keys');
      return { keys: await ctx.keys.list() };
    },
  },
  {
    method: 'DELETE',
    path: '/v1/keys/{id}',
    group: 'api',
    summary:
      "Revoke an API key: refused from the next request on. Its sandboxes run on until they end, unless ?kill=true: then its running and paused sandboxes are killed too (their tokens stop working at the gateway at once); the answer's killed lists their ids. Admin keys only.",
    body: 'none',
    handler: async ({ params, query, ctx }) => {
      requireAdmin(ctx, 'revoking an API key');
      const kill = killFlag(query);
      const revoked = await ctx.keys.revoke(params.id as string);
      if (!kill) return revoked;
      return { ...revoked, killed: await killSandboxesOf(ctx, revoked.key.id) };
    },
  },
  ...WEBHOOK_ROUTES,
];
