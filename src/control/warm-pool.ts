import type { SandboxHandle } from '../providers/provider.js';
import type { Registry, SandboxRecord } from './registry.js';
import type { BuiltTemplate } from './template-service.js';

/** What the warm pool needs from the sandbox service that owns it. */
export interface PoolHost {
  registry: Registry;
  isAlive(handle: SandboxHandle): boolean;
  template(name: string): BuiltTemplate;
  /** Starts a sandbox of the template in the `pooled` state. */
  start(template: BuiltTemplate): Promise<unknown>;
  /** Kills what is left of a sandbox and removes its folder. */
  release(record: SandboxRecord): Promise<void>;
  /** Kills a sandbox that was handed out but could not be made the caller's. */
  discard(record: SandboxRecord, why: string): Promise<void>;
  /** Adds variables to a running sandbox's environment. */
  setEnv(record: SandboxRecord, env: Record<string, string>): Promise<void>;
}

/**
 * Sandboxes started ahead of demand, `size` per template once it has been used: `claim` hands
 * one out (made the caller's: its metadata, lifetime and envs), `refill` tops the pool up in the
 * background, `drain` empties it (a template was rebuilt, or the daemon stops).
 */
export class WarmPool {
  private readonly refilling = new Map<string, Promise<void>>();
  private stopped = false;

  constructor(
    private readonly host: PoolHost,
    /** Sandboxes kept per template; 0 turns the pool off. */
    readonly size: number,
  ) {}

  /** A pooled sandbox of the template made the caller's, or undefined when none is waiting. */
  async claim(
    template: string,
    envs: Record<string, string>,
    metadata: Record<string, string>,
    timeoutMs: number,
  ): Promise<SandboxRecord | undefined> {
    if (this.size <= 0) return undefined;
    const { registry } = this.host;
    for (;;) {
      const now = Date.now();
      const record = registry.claimPooled(template, metadata, now, now + timeoutMs);
      if (!record) return undefined;
      if (!this.host.isAlive(record.handle)) {
        // Never handed out: no row of it stays behind, under the caller's metadata or any.
        registry.deleteSandbox(record.id);
        await this.host.release(record);
        continue;
      }
      // It started before the caller's envs were known: envd adds them for every later process.
      if (Object.keys(envs).length > 0) {
        try {
          await this.host.setEnv(record, envs);
        } catch (error) {
          await this.host.discard(record, 'could not set its environment');
          throw error;
        }
      }
      return record;
    }
  }

  /** Tops the pool of a template up to its size, one sandbox at a time. */
  refill(template: string): Promise<void> {
    if (this.size <= 0 || this.stopped) return Promise.resolve();
    let running = this.refilling.get(template);
    if (!running) {
      running = (async () => {
        while (!this.stopped && this.host.registry.countPooled(template) < this.size) {
          await this.host.start(this.host.template(template));
        }
      })()
        .catch((error) => console.error(`warm pool of ${template}:`, error))
        .finally(() => this.refilling.delete(template));
      this.refilling.set(template, running);
    }
    return running;
  }

  /** Kills the pooled sandboxes of a template, or of all templates when none is named. */
  async drain(template?: string): Promise<void> {
    await (template ? this.refilling.get(template) : Promise.all(this.refilling.values()));
    const pooled = this.host.registry
      .listSandboxes({ state: 'pooled' })
      .filter((record) => !template || record.template === template);
    // Out of the pool first, all at once: a create arriving while they die cannot claim one.
    for (const record of pooled) this.host.registry.deleteSandbox(record.id);
    await Promise.all(pooled.map((record) => this.host.release(record)));
  }

  /** Stops refilling and empties the pool. */
  async close(): Promise<void> {
    this.stopped = true;
    await this.drain();
  }
}
