import {
  Counter,
  collectDefaultMetrics,
  Gauge,
  Histogram,
  Registry as PromRegistry,
} from 'prom-client';
import type { EndState } from './registry.js';

/** Where a created sandbox came from: the warm pool, or a start of its own. */
export type CreateSource = 'pool' | 'start' | 'fork';
/** How a sandbox is paused: its processes frozen (memory kept), or ended with its disk kept. */
export type PauseMode = 'freeze' | 'hibernate';
/** What a gateway request was for (see {@link gatewayRequestKind}). */
export type GatewayRequestKind = 'api' | 'envd' | 'e2b' | 'port' | 'link' | 'preflight' | 'invalid';

/** What the sandbox service tells of creates and ends (all optional to it: tests build it bare). */
export interface SandboxEvents {
  /**
   * A create answered with a sandbox after `seconds`. `pooled`: the warm pool was looked into
   * (it is on, and the create asked for the template's own network).
   */
  created(template: string, source: CreateSource, seconds: number, pooled: boolean): void;
  /** A create of a template failed on the daemon's side (a 5xx: the provider, the registry). */
  createFailed(template: string): void;
  /** A sandbox that was handed out ended (pooled spares leaving the pool are not counted). */
  ended(state: EndState): void;
  /** A sandbox was paused (recorded and done). */
  paused(mode: PauseMode): void;
  /** A paused sandbox runs again. */
  resumed(mode: PauseMode): void;
}

/** What the gateway counts: one call per request head, one per closed client connection. */
export interface GatewayCounts {
  request(kind: GatewayRequestKind): void;
  /** A client connection closed, having read `bytesIn` from its client and written `bytesOut`. */
  connection(bytesIn: number, bytesOut: number): void;
}

/** What the metrics read from the daemon at each scrape. */
export interface ScrapeSources {
  /** Sandboxes in the registry that have not ended, by state and template. */
  liveSandboxes(): Promise<{ state: string; template: string; count: number }[]>;
  /** The number of sandboxes the warm pool of a template aims at now. */
  poolSize(template: string): number;
  /**
   * The egress service's counts of every running sandbox it serves, by sandbox id (undefined
   * where they could not be read this time); absent where the provider has no egress service.
   */
  egress?(): Promise<Map<string, { allowed: number; refused: number } | undefined>>;
}

/** Buckets of the create histogram, in seconds: a pool hit (ms) to a slow image start (30 s). */
export const CREATE_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30];

/**
 * The daemon's own metrics in Prometheus' text format (`GET /metrics`), on a registry of its own
 * (not prom-client's global one) with every name prefixed `abx_`, Node's process metrics
 * included. Counters move as the service, the gateway and the reaper call in; gauges are read at
 * each scrape.
 */
export class DaemonMetrics implements SandboxEvents, GatewayCounts {
  readonly registry = new PromRegistry();
  private readonly creates: Counter<'template' | 'source'>;
  private readonly createFailures: Counter<'template'>;
  private readonly ends: Counter<'state'>;
  private readonly pauses: Counter<'mode'>;
  private readonly resumes: Counter<'mode'>;
  private readonly createSeconds: Histogram<'source'>;
  private readonly poolHits: Counter<'template'>;
  private readonly poolMisses: Counter<'template'>;
  private readonly reaperPasses: Counter;
  private readonly reaperFailures: Counter;
  /**
   * The gateway's counts as plain numbers, published at each scrape: a request costs an addition,
   * not a label lookup (prom-client's `inc` took about 70 ns).
   */
  private readonly requests: Record<GatewayRequestKind, number> = {
    api: 0,
    envd: 0,
    e2b: 0,
    port: 0,
    link: 0,
    preflight: 0,
    invalid: 0,
  };
  private readonly bytes = { in: 0, out: 0 };
  /** Templates that had a create: their pool sizes are reported. */
  private readonly templates = new Set<string>();
  /** The egress counts of each sandbox at the last scrape, to add only what is new. */
  private readonly egressSeen = new Map<string, { allowed: number; refused: number }>();

  constructor(sources: ScrapeSources) {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry, prefix: 'abx_' });
    new Gauge({
      name: 'abx_sandboxes',
      help: 'Sandboxes in the registry that have not ended, by state and template',
      labelNames: ['state', 'template'],
      registers,
      async collect() {
        const rows = await sources.liveSandboxes();
        this.reset();
        for (const { state, template, count } of rows) this.set({ state, template }, count);
      },
    });
    const templates = this.templates;
    new Gauge({
      name: 'abx_warm_pool_size',
      help: 'Sandboxes the warm pool of a template aims at now',
      labelNames: ['template'],
      registers,
      collect() {
        for (const template of templates) this.set({ template }, sources.poolSize(template));
      },
    });
    this.creates = new Counter({
      name: 'abx_sandbox_creates_total',
      help: 'Sandboxes created, by template and where they came from (pool, start)',
      labelNames: ['template', 'source'],
      registers,
    });
    this.createFailures = new Counter({
      name: 'abx_sandbox_create_failures_total',
      help: "Creates that failed on the daemon's side (5xx answers: provider, registry), by template",
      labelNames: ['template'],
      registers,
    });
    this.ends = new Counter({
      name: 'abx_sandbox_ends_total',
      help: 'Sandboxes that ended, by how (killed, expired, dead)',
      labelNames: ['state'],
      registers,
    });
    this.pauses = new Counter({
      name: 'abx_sandbox_pauses_total',
      help: 'Sandboxes paused, by mode (freeze, hibernate)',
      labelNames: ['mode'],
      registers,
    });
    this.resumes = new Counter({
      name: 'abx_sandbox_resumes_total',
      help: 'Sandboxes resumed, by the mode they were paused in (freeze, hibernate)',
      labelNames: ['mode'],
      registers,
    });
    this.createSeconds = new Histogram({
      name: 'abx_sandbox_create_seconds',
      help: 'Time from a create request to its sandbox, by source (pool, start)',
      labelNames: ['source'],
      buckets: CREATE_BUCKETS,
      registers,
    });
    this.poolHits = new Counter({
      name: 'abx_warm_pool_hits_total',
      help: 'Creates served from the warm pool, by template',
      labelNames: ['template'],
      registers,
    });
    this.poolMisses = new Counter({
      name: 'abx_warm_pool_misses_total',
      help: 'Creates that found the warm pool of their template empty and started a sandbox',
      labelNames: ['template'],
      registers,
    });
    const requests = this.requests;
    new Counter({
      name: 'abx_gateway_requests_total',
      help: 'Requests through the gateway, by kind (api, envd, e2b, port, link, invalid)',
      labelNames: ['kind'],
      registers,
      collect() {
        this.reset();
        for (const [kind, count] of Object.entries(requests)) this.inc({ kind }, count);
      },
    });
    const bytes = this.bytes;
    new Counter({
      name: 'abx_gateway_bytes_total',
      help: "Bytes of the gateway's client connections, counted when each closes: in (from clients), out (to clients)",
      labelNames: ['direction'],
      registers,
      collect() {
        this.reset();
        this.inc({ direction: 'in' }, bytes.in);
        this.inc({ direction: 'out' }, bytes.out);
      },
    });
    this.reaperPasses = new Counter({
      name: 'abx_reaper_passes_total',
      help: "The reaper's passes (expiries, dead sandboxes, leftovers)",
      registers,
    });
    this.reaperFailures = new Counter({
      name: 'abx_reaper_failures_total',
      help: "The reaper's passes that failed (logged by the daemon)",
      registers,
    });
    const seen = this.egressSeen;
    new Counter({
      name: 'abx_egress_connections_total',
      help: "The egress service's decisions on running sandboxes' connections, HTTP requests and DNS questions, by decision (allowed, refused)",
      labelNames: ['decision'],
      registers,
      async collect() {
        if (!sources.egress) return;
        const counts = await sources.egress();
        for (const id of seen.keys()) if (!counts.has(id)) seen.delete(id);
        let allowed = 0;
        let refused = 0;
        for (const [id, now] of counts) {
          if (!now) continue;
          const before = seen.get(id) ?? { allowed: 0, refused: 0 };
          allowed += Math.max(0, now.allowed - before.allowed);
          refused += Math.max(0, now.refused - before.refused);
          seen.set(id, now);
        }
        this.inc({ decision: 'allowed' }, allowed);
        this.inc({ decision: 'refused' }, refused);
      },
    });
  }

  /** The text Prometheus scrapes, and its content type. */
  async scrape(): Promise<{ text: string; contentType: string }> {
    return { text: await this.registry.metrics(), contentType: this.registry.contentType };
  }

  created(template: string, source: CreateSource, seconds: number, pooled: boolean): void {
    this.templates.add(template);
    this.creates.inc({ template, source });
    this.createSeconds.observe({ source }, seconds);
    if (source === 'pool') this.poolHits.inc({ template });
    else if (pooled) this.poolMisses.inc({ template });
  }

  createFailed(template: string): void {
    this.createFailures.inc({ template });
  }

  ended(state: EndState): void {
    this.ends.inc({ state });
  }

  paused(mode: PauseMode): void {
    this.pauses.inc({ mode });
  }

  resumed(mode: PauseMode): void {
    this.resumes.inc({ mode });
  }

  /** A reaper pass ended, `ok` or failed. */
  reaperPass(ok: boolean): void {
    this.reaperPasses.inc();
    if (!ok) this.reaperFailures.inc();
  }

  request(kind: GatewayRequestKind): void {
    this.requests[kind]++;
  }

  connection(bytesIn: number, bytesOut: number): void {
    this.bytes.in += bytesIn;
    this.bytes.out += bytesOut;
  }
}
