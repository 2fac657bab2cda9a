import type { MetricsSample, SandboxProvider, SandboxUsage } from '../providers/provider.js';

export type { MetricsSample };

import { envMilliseconds } from '../util/env-ms.js';
import type { Registry } from './registry.js';

/** How often running sandboxes are sampled unless `ABX_METRICS_INTERVAL_MS` says otherwise. */
export const METRICS_INTERVAL_MS = 5000;
/** Samples kept per sandbox: the last hour at the default interval. */
export const METRICS_SAMPLES = 720;

interface Ring {
  samples: MetricsSample[];
  /** The previous reading of the CPU time counter, and when. */
  cpuTimeUs: number;
  at: number;
}

/** The sampler's interval from the environment (`ABX_METRICS_INTERVAL_MS`), else the default. */
export function metricsInterval(env: NodeJS.ProcessEnv = process.env): number {
  return envMilliseconds('ABX_METRICS_INTERVAL_MS', METRICS_INTERVAL_MS, 100, env);
}

/**
 * Every `intervalMs`, asks the provider what each running sandbox uses and keeps the last
 * {@link METRICS_SAMPLES} samples of each in memory (they do not survive a daemon restart). A
 * sandbox that is no longer running loses its samples at the next pass (or at once, `drop`).
 */
export class MetricsSampler {
  private readonly rings = new Map<string, Ring>();
  /** Sandboxes dropped since the running list was last read: a pass under way must not add them back. */
  private readonly ended = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private inFlight: Promise<void> | undefined;

  constructor(
    private readonly registry: Registry,
    private readonly provider: SandboxProvider,
    readonly intervalMs = METRICS_INTERVAL_MS,
    private readonly capacity = METRICS_SAMPLES,
    private readonly onError: (error: unknown) => void = () => {},
  ) {}

  /** Why no sandbox here has metrics, or undefined when the provider measures them. */
  unavailable(): string | undefined {
    return this.provider.metrics
      ? undefined
      : `the ${this.provider.name} provider measures no sandbox metrics`;
  }

  start(): void {
    if (!this.provider.metrics) return;
    this.timer ??= setInterval(() => {
      if (this.inFlight) return;
      this.inFlight = this.pass()
        .catch(this.onError)
        .finally(() => {
          this.inFlight = undefined;
        });
    }, this.intervalMs);
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.inFlight;
    this.rings.clear();
    this.ended.clear();
  }

  /** Forgets a sandbox that ended. */
  drop(id: string): void {
    this.rings.delete(id);
    this.ended.add(id);
  }

  /** How many sandboxes have samples kept (for tests and status). */
  size(): number {
    return this.rings.size;
  }

  /** A sandbox's samples taken from `start` to `end` (ms since the epoch, both included). */
  samples(id: string, start?: number, end?: number): MetricsSample[] {
    const samples = this.rings.get(id)?.samples ?? [];
    return samples.filter(
      (s) => (start === undefined || s.at >= start) && (end === undefined || s.at <= end),
    );
  }

  /** One pass: a sample of every running sandbox; the samples of the others are dropped. */
  async pass(): Promise<void> {
    const measure = this.provider.metrics?.bind(this.provider);
    if (!measure) return;
    const running = await this.registry.listSandboxes({ state: 'running' });
    const ids = new Set(running.map((r) => r.id));
    for (const id of this.rings.keys()) if (!ids.has(id)) this.rings.delete(id);
    for (const id of this.ended) if (!ids.has(id)) this.ended.delete(id);
    await Promise.all(
      running.map(async (record) => {
        if (this.ended.has(record.id) || !this.provider.isAlive(record.handle)) return;
        let usage: SandboxUsage;
        try {
          usage = await measure(record.handle);
        } catch {
          // It ended meanwhile (or another host's sandbox): the next pass tells.
          return;
        }
        const at = Date.now();
        // Ended while it was measured: its samples must not come back.
        if (this.ended.has(record.id) || !this.provider.isAlive(record.handle)) return;
        const ring = this.rings.get(record.id);
        const since = ring ?? { cpuTimeUs: 0, at: Math.min(record.createdAt, at - 1) };
        const busy = (usage.cpuTimeUs - since.cpuTimeUs) / ((at - since.at) * 1000);
        const pct = Math.min(100, Math.max(0, (busy / usage.cpuCount) * 100));
        const sample: MetricsSample = {
          at,
          cpuUsedPct: Math.round(pct * 100) / 100,
          cpuCount: usage.cpuCount,
          memUsed: usage.memUsed,
          memCache: usage.memCache,
          memTotal: usage.memTotal,
          diskUsed: usage.diskUsed,
          diskTotal: usage.diskTotal,
          processes: usage.processes,
          netRxBytes: usage.netRxBytes,
          netTxBytes: usage.netTxBytes,
        };
        const samples = ring?.samples ?? [];
        samples.push(sample);
        if (samples.length > this.capacity) samples.splice(0, samples.length - this.capacity);
        this.rings.set(record.id, { samples, cpuTimeUs: usage.cpuTimeUs, at });
      }),
    );
  }
}
