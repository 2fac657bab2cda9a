import { createHmac } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo, Server as NetServer } from 'node:net';
import { dirname, join } from 'node:path';
import type { BodyLimits } from '../../runtime/server/http.js';
import { type Guard, RouteTable } from '../../runtime/server/route-table.js';
import { startReadyTimeoutMs } from '../commands/template-runtime.js';
import { E2bControlApi } from '../compat/e2b/control-api.js';
import { E2bEnvdFace } from '../compat/e2b/envd-face.js';
import { listenerDenials } from '../egress/host-addresses.js';
import { ALWAYS_DENIED } from '../egress/policy.js';
import { registerSecretResolver } from '../egress/secret-resolvers.js';
import {
  AuthenticationError,
  errorFromBody,
  InvalidArgumentError,
  UnavailableError,
} from '../errors.js';
import type { DaemonInfo } from '../installation/daemon-info.js';
import { type AbxPaths, abxPaths } from '../installation/paths.js';
import {
  checkPublicListen,
  gatewayOrigin,
  isLoopback,
  type ListenAddress,
  type PublicListenOptions,
  publicOrigin,
} from '../installation/public-listen.js';
import { readOrCreateSecret } from '../installation/secrets.js';
import { parseRegistryPrefix } from '../providers/docker/image-reference.js';
import { LocalProvider } from '../providers/local/local-provider.js';
import { egressPolicyOf, type SandboxProvider } from '../providers/provider.js';
import { sandboxPortTarget } from '../providers/sandbox-socket.js';
import { envMilliseconds } from '../util/env-ms.js';
import { packageInfo } from '../util/package-info.js';
import {
  API_ROUTES,
  type ApiContext,
  METRICS_PATH,
  metricJson,
  sandboxJson,
} from './api-routes.js';
import { AuditLog } from './audit.js';
import {
  checkCsrf,
  DASHBOARD_SESSION_MS,
  Dashboard,
  DashboardSessions,
  dashboardCookieOf,
} from './dashboard.js';
import { mountE2bControlApi } from './e2b-mount.js';
import { EgressAuditPoller } from './egress-audit.js';
import { envdRequest, runSetupStep, setSandboxEnv } from './envd-request.js';
import { EventService } from './event-service.js';
import { Gateway } from './gateway.js';
import { hashToken, sandboxToken, volumeToken } from './ids.js';
import { KeyService } from './key-service.js';
import { MetricsSampler, metricsInterval } from './metrics.js';
import { loopbackPeerUid } from './peer-uid.js';
import {
  DATABASE_CONNECT_TIMEOUT_MS,
  isUnreachable,
  PostgresRegistry,
} from './postgres-registry.js';
import { DaemonMetrics } from './prometheus.js';
import { Reaper } from './reaper.js';
import { RecordCache } from './record-cache.js';
import type { Registry } from './registry.js';
import { SandboxEventStreams } from './sandbox-events.js';
import { SandboxLogs } from './sandbox-logs.js';
import { PAUSED_TIMEOUT_MS, SandboxService } from './sandbox-service.js';
import { loadSecretsKey } from './secret-crypto.js';
import { SecretService } from './secret-service.js';
import { SqliteRegistry } from './sqlite-registry.js';
import { TemplateService } from './template-service.js';
import { VolumeService } from './volume-service.js';
import { WebhookDispatcher, webhookTiming } from './webhook-dispatcher.js';
import { WebhookService } from './webhook-service.js';
import { webhookRules } from './webhook-url.js';
import { DEFAULT_UPLOAD_MAX_BYTES, DEFAULT_UPLOAD_TIMEOUT_MS } from './workspace-uploads.js';

export interface DaemonOptions {
  home: string;
  /**
   * API port on 127.0.0.1; 0 picks a free one (default). Several: tried in order, the first free
   * one is taken. (`abx daemon` keeps its ports across starts: src/installation/daemon-ports.ts.)
   */
  apiPort?: number | readonly number[];
  /** Gateway port on 127.0.0.1, as `apiPort`; default 0, a free one. */
  gatewayPort?: number | readonly number[];
  /**
   * Sandbox host names are `{port}-{id}.{domain}`; default the host of `listen.publicUrl`, else
   * `localhost`.
   */
  domain?: string;
  /**
   * Serve remote clients too: the API and the gateway on these addresses, over TLS or (behind a
   * proxy that terminates it) plain HTTP. The loopback listeners for this host stay.
   */
  listen?: PublicListenOptions;
  /** How often expired sandboxes are looked for; default 1 s. */
  reapIntervalMs?: number;
  /** Time between samples of every running sandbox's use (default: ABX_METRICS_INTERVAL_MS, else 5 s). */
  metricsIntervalMs?: number;
  /**
   * How long a paused sandbox is kept before it is removed; default `ABX_PAUSED_TIMEOUT_MS`, else
   * 30 days.
   */
  pausedTimeoutMs?: number;
  /**
   * The most sandboxes kept started per template, so `create` hands one out at once: a used
   * template's pool follows its recent demand between 1 and this; default
   * {@link DEFAULT_WARM_POOL_MAX}, 0 turns the warm pool off.
   */
  warmPool?: number;
  /** Sandbox starts under way at once (creates and refills); default the number of cores, ≥ 2. */
  startConcurrency?: number;
  /**
   * How long after a sandbox's end its processes are left to the daemon that ended it before the
   * reaper kills them (that daemon died mid-kill); default 30 s.
   */
  releaseGraceMs?: number;
  /**
   * How often the reaper sweeps for sandboxes without a row (another daemon on the registry died
   * mid-create), where other daemons share the registry and the provider's sandboxes
   * (PostgreSQL, Kubernetes); default 60 s.
   */
  orphanSweepMs?: number;
  /**
   * `postgres://…`: keep the registry in PostgreSQL, shared with the other daemons given the same
   * URL (and the same token secret), instead of SQLite in `home`.
   */
  databaseUrl?: string;
  /**
   * The key secrets are sealed with: 32 bytes as 64 hex digits or base64. Default
   * `ABX_SECRETS_KEY`, else `$ABX_HOME/secrets-key` (made on first start, mode 0600). Daemons on
   * one PostgreSQL registry need the same key.
   */
  secretsKey?: string;
  provider?: SandboxProvider;
  /**
   * Builds image templates when `provider` cannot (the local provider runs images but never as
   * root, which a build's steps need). Made on the first image build; default: a Docker provider
   * on the host's engine.
   */
  imageBuilder?: () => Promise<SandboxProvider>;
  /**
   * `registry[:port][/path]` a cluster pulls from: every image template built is pushed there
   * (`abx-template-<name>:<content hash>`, through the builder's Docker engine) and its sandboxes
   * start from the pushed reference. For the kubernetes provider (`--kube-image-registry`).
   */
  imageRegistry?: string;
  /** Serve the dashboard at `/` of the API's listeners (default true; `--no-dashboard`). */
  dashboard?: boolean;
  /** The built dashboard's folder (default the package's `dist/ui`). */
  dashboardDir?: string;
}

/** The warm pool's maximum per template when `warmPool` / `ABX_WARM_POOL` does not say. */
export const DEFAULT_WARM_POOL_MAX = 10;

const BODY_LIMITS = { maxBytes: 1024 * 1024, timeoutMs: 30_000 };

/** The API's body limits; streamed bodies are a workspace's upload (docs/workspaces.md). */
function apiBodyLimits(): BodyLimits {
  return {
    ...BODY_LIMITS,
    maxStreamBytes: envNumber('ABX_WORKSPACE_UPLOAD_MAX_BYTES', DEFAULT_UPLOAD_MAX_BYTES),
    streamTimeoutMs: envNumber('ABX_WORKSPACE_UPLOAD_TIMEOUT_MS', DEFAULT_UPLOAD_TIMEOUT_MS),
  };
}

/** A positive whole number from the environment, or `fallback` (a bad value is refused at start). */
function envNumber(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value <= 0) {
    throw new Error(`${name} must be a positive whole number, not ${JSON.stringify(raw)}`);
  }
  return value;
}

/** What to do about a PostgreSQL refusal at start, by SQLSTATE class. */
const POSTGRES_HINTS: Record<string, string> = {
  '28': ': check the user and password in ABX_DATABASE_URL (abx daemon start --database-url)',
  '3D': ': create the database (createdb NAME) or fix its name in ABX_DATABASE_URL',
  '42': ': the user needs the right to create tables in that database (GRANT CREATE ON DATABASE … or make it the owner)',
};

/** `ABX_PAUSED_TIMEOUT_MS`: how long a paused sandbox is kept (default 30 days). */
export function pausedTimeout(env: NodeJS.ProcessEnv = process.env): number {
  return envMilliseconds('ABX_PAUSED_TIMEOUT_MS', PAUSED_TIMEOUT_MS, 1000, env);
}

/** `ABX_AUTO_PAUSE_MEMORY`: what `autoPause` keeps when a create does not say (default true). */
export function autoPauseMemory(env: NodeJS.ProcessEnv = process.env): boolean {
  const text = env.ABX_AUTO_PAUSE_MEMORY;
  if (text === undefined || text === '' || text === 'true' || text === '1') return true;
  if (text === 'false' || text === '0') return false;
  throw new Error(
    `ABX_AUTO_PAUSE_MEMORY must be true (freeze) or false (hibernate), not '${text}'`,
  );
}

/**
 * `ABX_PRESTART_SERVER`: whether the warm pool starts a command server process ahead in each
 * sandbox of a template with ports (default true; false saves its memory and CPU where the
 * sandboxes of such templates seldom run a server).
 */
export function prestartServers(env: NodeJS.ProcessEnv = process.env): boolean {
  const text = env.ABX_PRESTART_SERVER;
  if (text === undefined || text === '' || text === 'true' || text === '1') return true;
  if (text === 'false' || text === '0') return false;
  throw new Error(`ABX_PRESTART_SERVER must be true or false, not '${text}'`);
}

/**
 * The control plane: REST API and gateway on loopback, the registry, the provider and the
 * reaper. On start it adopts the sandboxes a previous daemon left running.
 */
export class Daemon {
  readonly paths: AbxPaths;
  private readonly registry: Registry;
  private readonly tokenSecret: string;
  private readonly provider: SandboxProvider;
  readonly sandboxes: SandboxService;
  readonly templates: TemplateService;
  readonly volumes: VolumeService;
  readonly secrets: SecretService;
  readonly webhooks: WebhookService;
  private readonly webhookDispatcher: WebhookDispatcher;
  private readonly unregisterSecrets: () => void;
  private readonly api: Server;
  /** E2B's control API, told when the daemon stops (its template builds are recorded). */
  private readonly e2b: E2bControlApi;
  private readonly gateway: Gateway;
  /** The API and gateway listeners for remote clients, with their addresses. */
  private readonly remote:
    | {
        api: NetServer;
        gateway: NetServer;
        at: Required<Pick<PublicListenOptions, 'api' | 'gateway'>> & PublicListenOptions;
      }
    | undefined;
  private readonly domain: string;
  /** The gateway's origin as clients see it (its host the domain), once listening. */
  private gatewayOrigin = '';
  readonly keys: KeyService;
  /** The audit trail's writer (audit.ts): the gateway, E2B's face and egress record in it. */
  readonly audit: AuditLog;
  private readonly egressAudit: EgressAuditPoller;
  private readonly reaper: Reaper;
  readonly metrics: MetricsSampler;
  /** Each sandbox's log, read from its envd and kept after it ends (docs/logs.md). */
  readonly logs: SandboxLogs;
  /** The daemon's own metrics (`GET /metrics`, Prometheus' text format). */
  readonly prometheus: DaemonMetrics;
  private readonly liveness = new Map<string, { alive: boolean; at: number }>();
  /** The gateway's cache of running sandboxes' records (PostgreSQL only). */
  private readonly records: RecordCache | undefined;
  private stopping: Promise<void> | undefined;
  private resolveStopped = () => {};
  readonly stopped = new Promise<void>((resolve) => {
    this.resolveStopped = resolve;
  });

  constructor(private readonly options: DaemonOptions) {
    // Checked before anything is created, so a refused start leaves nothing behind.
    const listen = options.listen ? checkPublicListen(options.listen) : undefined;
    const imageRegistry =
      options.imageRegistry === undefined
        ? undefined
        : parseRegistryPrefix(options.imageRegistry, 'the image registry (--kube-image-registry)');
    this.domain = checkDomain(
      options.domain ??
        (listen?.publicUrl === undefined ? 'localhost' : publicOrigin(listen.publicUrl).hostname),
    );
    this.paths = abxPaths(options.home);
    for (const dir of [this.paths.home, this.paths.sandboxes, this.paths.templates]) {
      mkdirSync(dir, { recursive: true, mode: 0o700 });
    }
    const apiKeyHash = hashToken(readOrCreateSecret(this.paths.apiKey));
    const tokenSecret = readOrCreateSecret(this.paths.tokenSecret);
    this.tokenSecret = tokenSecret;
    this.registry = options.databaseUrl
      ? new PostgresRegistry(options.databaseUrl)
      : new SqliteRegistry(this.paths.database);
    this.keys = new KeyService(this.registry, apiKeyHash);
    this.audit = new AuditLog(this.registry);
    this.provider =
      options.provider ??
      new LocalProvider({ runtimeDir: join(packageInfo().root, 'dist', 'runtime') });
    // A sandbox must not reach this daemon's API or gateway by a non-loopback address they bind.
    if (listen) {
      this.provider.denyEgressTo?.(
        listenerDenials([listen.api.host, listen.gateway.host], ALWAYS_DENIED),
      );
    }
    this.templates = new TemplateService(
      this.registry,
      this.provider,
      this.paths.templates,
      runSetupStep,
      this.provider.images ? undefined : () => this.imageBuilder(),
      imageRegistry,
    );
    this.sandboxes = new SandboxService(
      this.registry,
      this.provider,
      this.templates,
      this.paths.sandboxes,
      (id, kind) => sandboxToken(tokenSecret, id, kind),
      setSandboxEnv,
      {
        // A provider that pools (agent-sandbox's SandboxWarmPools) is not pooled again here.
        max: this.provider.poolsItself ? 0 : (options.warmPool ?? DEFAULT_WARM_POOL_MAX),
        ...(options.startConcurrency === undefined
          ? {}
          : { startConcurrency: options.startConcurrency }),
      },
    );
    this.metrics = new MetricsSampler(
      this.registry,
      this.provider,
      options.metricsIntervalMs ?? metricsInterval(),
      undefined,
      (error) => this.sandboxes.log.failed('metrics', error),
    );
    this.logs = new SandboxLogs(join(dirname(this.paths.sandboxes), 'sandbox-logs'), {
      running: async () =>
        (await this.registry.listSandboxes({ state: 'running' })).map((record) => ({
          id: record.id,
          envdSocket: record.handle.envdSocket,
          ...(record.handle.envdRootSocket ? { envdRootSocket: record.handle.envdRootSocket } : {}),
        })),
      controlToken: (id) => this.sandboxes.controlTokenOf(id),
    });
    this.prometheus = new DaemonMetrics({
      liveSandboxes: () => this.registry.countLive(),
      poolSize: (template) => this.sandboxes.poolSize(template),
      ...(this.provider.networkStats ? { egress: () => this.egressCounts() } : {}),
    });
    this.sandboxes.events = this.prometheus;
    this.volumes = new VolumeService(this.registry, this.provider, this.paths.volumes);
    this.sandboxes.volumes = this.volumes;
    const secretsKey = loadSecretsKey(this.paths.secretsKey, options.secretsKey);
    this.secrets = new SecretService(this.registry, secretsKey);
    // Webhook URLs are egress of the daemon: the rules are read once (ABX_WEBHOOK_PERMIT).
    const webhookEgress = webhookRules();
    this.webhooks = new WebhookService(this.registry, secretsKey, () => webhookEgress);
    this.webhookDispatcher = new WebhookDispatcher(this.registry.webhooks, {
      secretOf: (webhook) => this.webhooks.secretOf(webhook),
      rules: () => webhookEgress,
      ownerRevoked: async (owner) => (await this.registry.getApiKey(owner))?.revokedAt != null,
      timing: webhookTiming(),
      log: (line) => console.error(line),
    });
    // Egress asks for a rule's secret by (sandbox, name); the sandbox's owner decides which
    // secret the name is, as a caller's key does on /v1. A sandbox this daemon does not know is
    // not answered here (another daemon in this process may know it).
    this.unregisterSecrets = registerSecretResolver(async (sandboxId, name) => {
      const record = await this.registry.getSandbox(sandboxId);
      if (!record) return undefined;
      // A revoked key's secrets are used no more, even by the sandboxes it leaves running.
      if (
        record.owner !== null &&
        (await this.registry.getApiKey(record.owner))?.revokedAt != null
      ) {
        return { value: undefined };
      }
      return { value: await this.secrets.resolve(record.owner, name) };
    });
    this.sandboxes.onEnded = (id) => {
      this.records?.forget(id);
      this.metrics.drop(id);
    };
    this.sandboxes.onChanged = (id) => {
      this.records?.forget(id);
      this.gateway.forgetSandbox(id);
    };
    this.sandboxes.pausedTimeoutMs = options.pausedTimeoutMs ?? pausedTimeout();
    this.sandboxes.startReadyTimeoutMs = startReadyTimeoutMs();
    this.sandboxes.autoPauseMemory = autoPauseMemory();
    this.sandboxes.prestartServers = prestartServers();
    this.egressAudit = new EgressAuditPoller(
      this.provider,
      (id) => this.registry.getSandbox(id),
      this.audit,
    );
    this.reaper = new Reaper(
      this.sandboxes.reaperHost(),
      options.reapIntervalMs ?? 1000,
      (error) => {
        this.prometheus.reaperPass(false);
        this.sandboxes.log.failed('reaper', error);
      },
      () => {
        this.prometheus.reaperPass(true);
        this.sandboxes.log.recovered('reaper');
      },
      options.releaseGraceMs,
      options.orphanSweepMs,
    );
    const table = new RouteTable(API_ROUTES);
    // Lifecycle events (events.ts): /v1/events, its stream, E2B's /events/sandboxes.
    const lifecycle = new EventService(this.registry);
    const shared: Omit<ApiContext, 'caller'> = {
      sandboxes: this.sandboxes,
      templates: this.templates,
      volumes: this.volumes,
      secrets: this.secrets,
      webhooks: this.webhooks,
      keys: this.keys,
      metrics: this.metrics,
      logs: this.logs,
      prometheus: this.prometheus,
      audit: this.audit,
      egressAudit: this.egressAudit,
      lifecycle,
      events: new SandboxEventStreams(
        {
          visible: async (caller) =>
            (
              await this.sandboxes.list({
                state: ['running', 'paused'],
                ...(caller.admin ? {} : { owner: caller.keyId as string }),
                metadata: {},
              })
            ).map(sandboxJson),
          find: async (id) => {
            const record = await this.registry.getSandbox(id);
            return record && sandboxJson(record);
          },
          samples: (id, start) => this.metrics.samples(id, start),
          metricJson,
        },
        undefined,
        lifecycle,
        (listener) => this.registry.webhooks.onEventWritten?.(listener) ?? (async () => {}),
      ),
      shutdown: () => setImmediate(() => void this.stop()),
      gatewayUrl: () => this.gatewayOrigin,
    };
    const sessions = new DashboardSessions(this.keys, dashboardSessionMs());
    const dashboard =
      options.dashboard === false
        ? undefined
        : new Dashboard({
            sessions,
            dir: options.dashboardDir ?? join(packageInfo().root, 'dist', 'ui'),
            gatewayUrl: () => this.gatewayOrigin,
          });
    const e2b = mountE2bControlApi(
      {
        sandboxes: this.sandboxes,
        templates: this.templates,
        keys: this.keys,
        metrics: this.metrics,
        logs: this.logs,
        volumes: this.volumes,
        secrets: this.secrets,
        webhooks: this.webhooks,
        events: lifecycle,
        volumeToken: (id) => volumeToken(tokenSecret, id),
      },
      // The host E2B's SDKs put after `{port}-{id}.`: the domain, and the gateway's port when it
      // is not its scheme's own (the SDK builds https://{port}-{id}.{domain} from it).
      () => new URL(this.gatewayOrigin).host,
      BODY_LIMITS,
    );
    this.e2b = e2b;
    const apiLimits = apiBodyLimits();
    const handle = (req: IncomingMessage, res: ServerResponse) => {
      // E2B's control API (src/compat/e2b) has its own paths, keys header and error bodies.
      if (E2bControlApi.claims(req.url)) {
        void e2b.handle(req, res);
        return;
      }
      // The dashboard's page and sign-in (docs/dashboard.md).
      if (dashboard && Dashboard.claims(req.url)) {
        void dashboard.handle(req, res);
        return;
      }
      // A context per request: the guard puts the caller its key names there for the handler.
      const context: ApiContext = {
        ...shared,
        caller: undefined,
        peerUid: () => loopbackPeerUid(req.socket),
      };
      const guard: Guard<ApiContext> = (route, request) => {
        if (route?.public) return;
        // The dashboard's cookie stands for a key when no other credential is sent; what it
        // changes needs the session's CSRF token too.
        if (
          dashboard &&
          request.headers.authorization === undefined &&
          request.headers['x-api-key'] === undefined &&
          dashboardCookieOf(request.headers.cookie) !== undefined
        ) {
          return sessions.resolve(request.headers.cookie).then((found) => {
            if (!found) {
              throw new AuthenticationError(
                'the dashboard session has ended (expired, signed out, or the daemon restarted): sign in again',
              );
            }
            checkCsrf(request, found.session);
            context.caller = found.caller;
          });
        }
        const apiKey = request.headers['x-api-key'];
        // Scrapers send a key either way (Prometheus' `authorization`, or a header of their own).
        const caller =
          route?.path === METRICS_PATH && request.headers.authorization === undefined
            ? this.keys.authenticateKey(
                typeof apiKey === 'string' ? apiKey : undefined,
                'Authorization: Bearer <key> or X-API-KEY: <key>',
              )
            : this.keys.authenticate(request.headers.authorization);
        return caller.then((caller) => {
          context.caller = caller;
        });
      };
      void table.dispatch(req, res, context, apiLimits, guard);
    };
    this.api = createServer(handle);
    const forwarded = new Set<string>();
    // SQLite answers in the thread: no cache. PostgreSQL would cost a round trip per connection.
    const registry = this.registry;
    const records = registry.getSandboxNow
      ? undefined
      : new RecordCache((id) => registry.getSandbox(id));
    this.records = records;
    this.gateway = new Gateway(
      {
        find: registry.getSandboxNow
          ? registry.getSandboxNow.bind(registry)
          : (id) => (records as RecordCache).get(id),
        isAlive: (record) => {
          // /proc is read at most every 250 ms per sandbox; a sandbox that dies in between fails
          // at the socket instead, with an error of its own.
          const cached = this.liveness.get(record.id);
          if (cached && Date.now() - cached.at < 250) return cached.alive;
          const alive = this.provider.isAlive(record.handle);
          this.liveness.set(record.id, { alive, at: Date.now() });
          if (this.liveness.size > 10_000) this.liveness.clear();
          return alive;
        },
        resume: async (record) => {
          const owner = record.owner ? await this.keys.ownerOf(record.owner) : undefined;
          return (await this.sandboxes.resume(record.id, {}, owner)).record;
        },
        openPort: async (record, token, port) => {
          // A socket that exists is served already (by envd's forwarder, or by a command server
          // listening there itself): no round trip to envd per request.
          const socket = sandboxPortTarget(record.handle, port);
          // Over TCP (a pod) there is no file to look at: envd is asked once per sandbox and port.
          const tcp = socket.startsWith('tcp:');
          if (tcp ? forwarded.has(`${record.id} ${port}`) : existsSync(socket)) return socket;
          const { status, body } = await envdRequest(
            record.handle.envdSocket,
            token,
            'POST',
            `/ports/${port}`,
          );
          if (status !== 200) throw errorFromBody(status, body);
          if (tcp) {
            if (forwarded.size > 10_000) forwarded.clear();
            forwarded.add(`${record.id} ${port}`);
          }
          return socket;
        },
        tokenSecret,
        directFiles: process.env.ABX_DIRECT_FILES !== '0',
        counts: this.prometheus,
        audit: this.audit,
        // One URL for the API and the sandboxes: requests that name no sandbox go to the API.
        apiTarget: () =>
          this.apiPort === undefined ? undefined : `tcp://127.0.0.1:${this.apiPort}`,
      },
      this.domain,
      {},
      // envd's E2B face (Connect RPC): E2B's SDKs reach sandboxes through this gateway too.
      new E2bEnvdFace(),
    );
    if (listen) {
      this.remote = {
        api: listen.tls ? createHttpsServer(listen.tls, handle) : createServer(handle),
        // The remote gateway serves the API's paths too (one URL), unless that would expose an
        // API its operator kept on loopback.
        gateway: this.gateway.listener(listen.tls, {
          api: !isLoopback(listen.api.host) || isLoopback(listen.gateway.host),
        }),
        at: listen,
      };
    }
  }

  /**
   * What the egress service allowed and refused for each running sandbox it serves, read at a
   * scrape (one call per internet sandbox, in parallel; undefined where one fails).
   */
  private async egressCounts(): Promise<
    Map<string, { allowed: number; refused: number } | undefined>
  > {
    const provider = this.provider;
    // Paused ones too: a sandbox missing from one scrape would have its counts added again.
    const running = (await this.registry.listSandboxes({ state: ['running', 'paused'] })).filter(
      (record) => egressPolicyOf(record.handle) !== undefined,
    );
    const counts = await Promise.all(
      running.map((record) =>
        provider.networkStats?.(record.handle).then(
          ({ allowed, refused }) => ({ allowed, refused }),
          () => undefined,
        ),
      ),
    );
    return new Map(running.map((record, i) => [record.id, counts[i]]));
  }

  /** The loopback API listener's port, once listening. */
  private apiPort: number | undefined;
  private builder: Promise<SandboxProvider> | undefined;

  /** The provider image builds run on (made once, on the first build that needs it). */
  private imageBuilder(): Promise<SandboxProvider> {
    this.builder ??= (
      this.options.imageBuilder ??
      (async () => {
        const { DockerProvider } = await import('../providers/docker/docker-provider.js');
        const docker = new DockerProvider({
          runtimeDir: join(packageInfo().root, 'dist', 'runtime'),
          ...(process.getuid?.() === 0
            ? {}
            : { runtimeCacheDir: join(this.paths.home, 'runtime') }),
        });
        await docker.engine();
        return docker;
      })
    )();
    // A failure (no engine) is not kept: the next build tries again.
    this.builder.catch(() => {
      this.builder = undefined;
    });
    return this.builder;
  }

  /**
   * Opens the registry (migrating it), checks that daemons sharing it derive the same tokens.
   * Throws an error that says what to do when the database cannot be reached.
   */
  private async openRegistry(): Promise<void> {
    const { registry } = this;
    try {
      await registry.migrate();
    } catch (error) {
      // The store wraps it in a 503 for API callers; at start the daemon says what to fix.
      const cause = error instanceof UnavailableError ? error.cause : error;
      if (registry.kind === 'postgres' && isUnreachable(cause)) {
        throw new Error(
          `cannot reach the registry database ${registry.location} (${(cause as Error).message}; connect timeout ${DATABASE_CONNECT_TIMEOUT_MS} ms): check that PostgreSQL runs there and that ABX_DATABASE_URL (abx daemon start --database-url) names it, with user, password and database`,
          { cause: error },
        );
      }
      const sqlstate = (cause as { code?: unknown }).code;
      if (registry.kind === 'postgres' && typeof sqlstate === 'string' && sqlstate.length === 5) {
        throw new Error(
          `the registry database ${registry.location} refused this daemon: ${(cause as Error).message}${POSTGRES_HINTS[sqlstate.slice(0, 2)] ?? ''}`,
          { cause: error },
        );
      }
      throw error;
    }
    // Secrets sealed with another key would not open here. Replicas on PostgreSQL with different
    // keys are a misconfiguration: refuse, saying which key to share. On SQLite (one daemon) the
    // key file was lost or replaced: start, say so, and those secrets fail when used (remove and
    // make them again, or put the old key back).
    const otherKeys = await this.secrets.otherKeys();
    if (otherKeys && registry.kind === 'postgres') throw new Error(otherKeys);
    if (otherKeys) console.error(`warning: ${otherKeys}`);
    if (registry.kind !== 'postgres') return;
    // Every daemon must derive the same access tokens from a sandbox id, or a sandbox created on
    // one could not be connected to through another.
    const mine = createHmac('sha256', this.tokenSecret)
      .update('abx token secret check')
      .digest('hex');
    const agreed = await registry.agree('token-secret-check', mine);
    if (agreed !== mine) {
      throw new Error(
        `the token secret of this daemon (${this.paths.tokenSecret}) is not the one the other daemons on the registry ${registry.location} use: copy theirs to ${this.paths.tokenSecret} (every daemon sharing a database needs the same file)`,
      );
    }
  }

  /** Opens the registry, adopts live sandboxes, starts listening and reaping, writes `daemon.json`. */
  async start(): Promise<DaemonInfo> {
    await this.openRegistry();
    await this.sandboxes.adopt();
    // What a daemon stopped mid-build left (E2B's build records say those builds stopped).
    await this.templates.sweepBuilds().catch((error: Error) => {
      console.error(`abx daemon: the build sandboxes a stopped daemon left stay: ${error.message}`);
    });
    const listen = (server: NetServer, at: ListenAddress) =>
      new Promise<number>((resolve, reject) => {
        server.once('error', (error: NodeJS.ErrnoException) =>
          reject(
            new Error(
              `cannot listen on ${hostPort(at.host, at.port)}: ${error.code === 'EADDRINUSE' ? 'the port is in use' : error.code === 'EADDRNOTAVAIL' ? 'no interface of this host has that address' : error.message}`,
              { cause: error },
            ),
          ),
        );
        server.listen(at.port, at.host, () => resolve((server.address() as AddressInfo).port));
      });
    // The loopback listeners: the first free port of their candidates. A failure names the
    // listener and the port (a PortInUseError when it is taken).
    const loopback = async (
      server: NetServer,
      listener: 'api' | 'gateway',
      wanted: number | readonly number[] | undefined,
    ) => {
      const ports = typeof wanted === 'number' ? [wanted] : wanted?.length ? wanted : [0];
      for (const [i, port] of ports.entries()) {
        try {
          return await listen(server, { host: '127.0.0.1', port });
        } catch (error) {
          const code = ((error as Error).cause as NodeJS.ErrnoException | undefined)?.code;
          if (code !== 'EADDRINUSE') throw error;
          if (i === ports.length - 1) throw new PortInUseError(listener, port, error as Error);
        }
      }
      throw new Error('unreachable: no port to listen on');
    };
    const apiPort = await loopback(this.api, 'api', this.options.apiPort);
    this.apiPort = apiPort;
    const gatewayPort = await loopback(this.gateway.server, 'gateway', this.options.gatewayPort);
    let remote: DaemonInfo['remote'];
    if (this.remote) {
      const { at } = this.remote;
      const tls = at.tls !== undefined;
      const scheme = tls ? 'https' : 'http';
      const remoteApiPort = await listen(this.remote.api, at.api);
      const remoteGatewayPort = await listen(this.remote.gateway, at.gateway);
      this.gatewayOrigin = gatewayOrigin({
        domain: this.domain,
        tls,
        port: remoteGatewayPort,
        publicUrl: at.publicUrl,
      });
      remote = {
        apiUrl: `${scheme}://${hostPort(at.api.host, remoteApiPort)}`,
        gatewayUrl: `${scheme}://${hostPort(at.gateway.host, remoteGatewayPort)}`,
        publicGatewayUrl: this.gatewayOrigin,
        tls,
      };
    } else {
      this.gatewayOrigin = gatewayOrigin({ domain: this.domain, tls: false, port: gatewayPort });
    }
    this.reaper.start();
    this.egressAudit.start();
    this.webhookDispatcher.start();
    this.metrics.start();
    this.logs.start();
    const info: DaemonInfo = {
      pid: process.pid,
      apiUrl: `http://127.0.0.1:${apiPort}`,
      gatewayUrl: `http://127.0.0.1:${gatewayPort}`,
      domain: this.domain,
      ...(remote ? { remote } : {}),
      version: packageInfo().version,
      provider: this.provider.name,
      startedAt: new Date().toISOString(),
      node: { version: process.version, path: process.execPath },
      isolation: this.provider.isolation(),
      registry: this.registry.location,
    };
    for (const warning of info.isolation?.warnings ?? []) console.error(`warning: ${warning}`);
    writeFileSync(this.paths.daemonInfo, `${JSON.stringify(info, null, 2)}\n`, { mode: 0o600 });
    return info;
  }

  /** Stops listening; sandboxes keep running for the next daemon to adopt. */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      this.e2b.stop();
      await this.reaper.stop();
      await this.egressAudit.stop();
      await this.webhookDispatcher.stop();
      await this.metrics.stop();
      this.logs.stop();
      // A registry that does not answer must not keep the daemon from stopping.
      await this.sandboxes
        .close()
        .catch((error) =>
          console.error(`stopping: the warm pool was not emptied: ${error.message}`),
        );
      await this.provider.close?.();
      await (await this.builder?.catch(() => undefined))?.close?.();
      const close = (server: NetServer) =>
        new Promise<void>((resolve) => {
          if (!server.listening) return resolve();
          server.close(() => resolve());
          (server as Server).closeAllConnections?.();
        });
      this.gateway.close();
      await Promise.all(
        [this.api, this.gateway.server, this.remote?.api, this.remote?.gateway]
          .filter((server) => server !== undefined)
          .map(close),
      );
      try {
        const info = JSON.parse(readFileSync(this.paths.daemonInfo, 'utf8')) as DaemonInfo;
        if (info.pid === process.pid) rmSync(this.paths.daemonInfo, { force: true });
      } catch {
        // no daemon.json: nothing to remove
      }
      this.unregisterSecrets();
      await this.audit.close();
      await this.registry.close().catch(() => undefined);
      this.resolveStopped();
    })();
    return this.stopping;
  }
}

/** A loopback listener's port is taken by another process. */
export class PortInUseError extends Error {
  constructor(
    readonly listener: 'api' | 'gateway',
    readonly port: number,
    cause: Error,
  ) {
    super(cause.message, { cause });
    this.name = 'PortInUseError';
  }
}

/** How long a dashboard sign-in lasts: `ABX_DASHBOARD_SESSION_MS` (1 minute or more), else 12 h. */
function dashboardSessionMs(): number {
  return envMilliseconds('ABX_DASHBOARD_SESSION_MS', DASHBOARD_SESSION_MS, 60_000);
}

/** `host:port`, with an IPv6 host in brackets. */
function hostPort(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** A DNS name sandbox host names can end with (`{port}-{id}.{domain}`), lower-cased. */
function checkDomain(domain: string): string {
  const name = domain.toLowerCase();
  const label = '[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?';
  if (name.length > 200 || !new RegExp(`^${label}(?:\\.${label})*$`).test(name)) {
    throw new InvalidArgumentError(
      `--domain must be a DNS name such as sandboxes.example.com (sandbox hosts are {port}-{sandboxId}.{domain}), not '${domain}'`,
    );
  }
  return name;
}
