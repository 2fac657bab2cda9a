import type { SandboxHandle } from '../providers/provider.js';
import { killedData } from './events.js';
import type { Registry, SandboxOwner, SandboxRecord } from './registry.js';
import type { StartSlots } from './start-slots.js';
import type { BuiltTemplate } from './template-service.js';

/** What the warm pool needs from the sandbox service that owns it. */
export interface PoolHost {
  registry: Registry;
  /** Bounds the starts under way at once; the pool's refills wait behind creates. */
  slots: StartSlots;
  isAlive(handle: SandboxHandle): boolean;
  template(name: string): Promise<BuiltTemplate>;
  /** Starts a sandbox of the template in the `pooled` state. */
  start(template: BuiltTemplate): Promise<SandboxRecord>;
  /** Kills what is left of a sandbox and removes its folder. */
  release(record: SandboxRecord): Promise<void>;
  /** Kills a sandbox that was handed out but could not be made the caller's. */
  discard(record: SandboxRecord, why: string): Promise<void>;
  /** Adds variables to a running sandbox's environment. */
  setEnv(record: SandboxRecord, env: Record<string, string>): Promise<void>;
  /**
   * Readies a pooled sandbox further once it has waited {@link WarmPoolOptions.readyDelayMs}
   * unclaimed (its command server's idle process): work worth doing only while the pool has
   * slack, never on a burst's or a tight loop's path. Optional.
   */
  ready?(record: SandboxRecord): Promise<void>;
  /**
   * Keeps a pooled sandbox ready to answer at once while it waits (a local sandbox's envd would
   * otherwise sleep when idle, docs/providers.md, and its first call after a claim pay the wake);
   * what it returns lets go, at the claim or when the sandbox leaves the pool. Optional.
   */
  hold?(record: SandboxRecord): () => void;
  /** Reports a failure of the pool's background work. */
  log(what: string, error: unknown): void;
  /** Reports that background work which failed works again. */
  recovered(what: string): void;
}

export interface WarmPoolOptions {
  /** The most sandboxes kept per template; 0 turns the pool off. */
  max: number;
  /**
   * How long a create counts towards its template's size, and so how long a template that went
   * quiet keeps more than one sandbox; default 60 s.
   */
  windowMs?: number;
  /** The clock demand is measured on (tests move it); default `Date.now`. */
  now?: () => number;
  /**
   * How long after a create its template's pool starts refilling; default
   * {@link REFILL_DELAY_MS}. The caller's first commands come within milliseconds of its create,
   * and a refill's start beside them would take half of a small host's CPU from them.
   */
  refillDelayMs?: number;
  /**
   * How long a pooled sandbox waits unclaimed before {@link PoolHost.ready} runs on it; default
   * {@link READY_DELAY_MS}.
   */
  readyDelayMs?: number;
}

/**
 * A refill waits this long after the create that called for it. On a 2-core host a sandbox's
 * first command right after a create from the pool took 3-5x longer while the refill's start
 * (namespaces, a Node process) ran beside it, and about as long as a later command without.
 */
export const REFILL_DELAY_MS = 200;

/**
 * A pooled sandbox is readied further (PoolHost.ready) after waiting this long unclaimed. A loop
 * of creates claims each sandbox within milliseconds of its start, and a burst at once: neither
 * pays for work that only a sandbox waiting in a quiet pool can use.
 */
export const READY_DELAY_MS = 300;

/** The size of a pool that has not yet seen a start of its template take its time. */
const FIRST_START_GUESS_MS = 500;
/** Creates remembered per template: enough to tell any size up to a sane maximum. */
const MAX_ARRIVALS = 10_000;

/** One template's demand and the refills under way for it. */
class Demand {
  /** When its recent creates arrived, oldest first (within the window). */
  readonly arrivals: number[] = [];
  /** How long a start of this template takes, a moving average of the latest ones. */
  startMs = FIRST_START_GUESS_MS;
  private measured = false;
  /** Refills waiting for a start slot or under way. */
  readonly refills = new Set<Promise<void>>();
  /** Provider starts of refills under way (holding a slot). */
  readonly starting = new Set<Promise<unknown>>();
  /** Drained or closed: its waiting refills start nothing. */
  dropped = false;
  /** A refill failed: no more until the next create of the template. */
  stalled = false;
  rebalanceScheduled = false;
  /** The rebalance in flight (or the last one). */
  rebalancing: Promise<void> = Promise.resolve();
  /** A rebalance waiting for the one in flight: later calls join it rather than queue more. */
  queued: Promise<void> | undefined;

  observeStart(ms: number): void {
    this.startMs = this.measured ? 0.75 * this.startMs + 0.25 * ms : ms;
    this.measured = true;
  }

  /**
   * The most creates that arrived within one refill's time of each other since `since` (its
   * delay, then a start): as many sandboxes as were wanted while one more was on its way.
   */
  peak(since: number, delayMs: number): number {
    const { arrivals } = this;
    let first = 0;
    while (first < arrivals.length && (arrivals[first] as number) < since) first++;
    arrivals.splice(0, first);
    let peak = 0;
    for (let from = 0, to = 0; to < arrivals.length; to++) {
      while ((arrivals[to] as number) - (arrivals[from] as number) > delayMs + this.startMs) {
        from++;
      }
      peak = Math.max(peak, to - from + 1);
    }
    return peak;
  }
}

/**
 * Sandboxes started ahead of demand, per template once it has been used. A template's pool holds
 * as many as the most creates of it that came within one refill's time (its delay and a start) of
 * each other in the last `windowMs` (a burst of 20 → 20; a steady stream → its rate × that time),
 * at least 1 and at most `max`. `claim` hands one out (made the caller's: its metadata, lifetime and envs);
 * refills run in the background, several at once behind callers' creates (StartSlots); extras are
 * killed once the demand that called for them is older than the window; `drain` empties the pool
 * (a template was rebuilt, or the daemon stops).
 */
export class WarmPool {
  private readonly demand = new Map<string, Demand>();
  /** Extras and recycled sandboxes being killed. */
  private readonly evicting = new Set<Promise<void>>();
  /**
   * Pooled sandboxes this pool started (not yet handed out or evicted), with their template and
   * what lets go of their hold: what `close` kills. Other daemons sharing the registry keep
   * theirs, which any daemon's creates may claim.
   */
  private readonly own = new Map<string, { template: string; release: () => void }>();
  private readonly windowMs: number;
  private readonly refillDelayMs: number;
  private readonly readyDelayMs: number;
  private readonly now: () => number;
  readonly max: number;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(
    private readonly host: PoolHost,
    options: WarmPoolOptions,
  ) {
    const {
      max,
      windowMs = 60_000,
      refillDelayMs = REFILL_DELAY_MS,
      readyDelayMs = READY_DELAY_MS,
    } = options;
    if (!Number.isInteger(max) || max < 0) {
      throw new RangeError(`the warm pool's maximum must be a whole number ≥ 0, not ${max}`);
    }
    if (!(windowMs > 0)) {
      throw new RangeError(`the warm pool's window must be a positive duration, not ${windowMs}`);
    }
    if (!(refillDelayMs >= 0)) {
      throw new RangeError(`the warm pool's refill delay must be ≥ 0 ms, not ${refillDelayMs}`);
    }
    this.max = max;
    this.windowMs = windowMs;
    this.refillDelayMs = refillDelayMs;
    this.readyDelayMs = readyDelayMs;
    this.now = options.now ?? Date.now;
  }

  /** The number of sandboxes the pool of a template aims at now: 0 until it is used. */
  size(template: string): number {
    const demand = this.demand.get(template);
    if (!demand || this.max <= 0) return 0;
    return Math.min(
      this.max,
      Math.max(1, demand.peak(this.now() - this.windowMs, this.refillDelayMs)),
    );
  }

  /** Records how long a start of the template took (a create's or a refill's). */
  observeStart(template: string, ms: number): void {
    this.demand.get(template)?.observeStart(ms);
  }

  /**
   * A pooled sandbox of the template made the caller's, or undefined when none is waiting.
   * `counted`: this call is a create's first look (its demand is recorded and a refill
   * scheduled), not its second after it waited for a start slot.
   */
  async claim(
    template: string,
    envs: Record<string, string>,
    metadata: Record<string, string>,
    timeoutMs: number,
    counted = true,
    owner?: SandboxOwner,
  ): Promise<SandboxRecord | undefined> {
    if (this.max <= 0 || this.stopped) return undefined;
    if (counted) this.demanded(template);
    const { registry } = this.host;
    for (;;) {
      const now = Date.now();
      // Handed out: from now it is the caller's sandbox, and its `created` event is written.
      const record = await registry.claimPooled(template, metadata, now, now + timeoutMs, owner, {
        type: 'sandbox.lifecycle.created',
        at: now,
        data: { source: 'pool', metadata, expiresAt: now + timeoutMs },
      });
      if (!record) return undefined;
      this.letGo(record.id);
      if (!this.host.isAlive(record.handle)) {
        // Never handed out: no row of it stays behind, under the caller's metadata or any.
        await registry.deleteSandbox(record.id, 'running', {
          type: 'sandbox.lifecycle.killed',
          data: killedData('dead', 'found dead when handed out from the pool'),
        });
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

  /**
   * Brings the pool of a template to its size now (extras killed, what is missing started) and
   * resolves once the refills that takes are done.
   */
  async refill(template: string): Promise<void> {
    for (;;) {
      await this.rebalance(template);
      const refills = [...(this.demand.get(template)?.refills ?? [])];
      if (refills.length === 0) break;
      await Promise.all(refills);
    }
    await Promise.all([...this.evicting]);
  }

  /**
   * Kills the pooled sandboxes of a template, or of all templates when none is named, and forgets
   * their demand until their next create: refills waiting for a slot start nothing, those under way
   * are waited for and their sandboxes killed. `ownOnly`: only those this pool started (a stopping
   * daemon leaves the others' spares on a shared registry).
   */
  async drain(template?: string, ownOnly = false): Promise<void> {
    const names = template === undefined ? [...this.demand.keys()] : [template];
    const starting: Promise<unknown>[] = [];
    for (const name of names) {
      const demand = this.demand.get(name);
      if (!demand) continue;
      demand.dropped = true;
      this.demand.delete(name);
      starting.push(...demand.starting);
    }
    await Promise.allSettled(starting);
    const pooled = (await this.host.registry.listSandboxes({ state: 'pooled' })).filter(
      (record) =>
        (template === undefined || record.template === template) &&
        (!ownOnly || this.own.has(record.id)),
    );
    await this.evict(pooled);
    await Promise.all([...this.evicting]);
  }

  /** Stops refilling and empties the pool (of what it started itself). */
  async close(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    this.timer = undefined;
    await this.drain(undefined, true);
  }

  private demanded(template: string): void {
    let demand = this.demand.get(template);
    if (!demand) {
      demand = new Demand();
      this.demand.set(template, demand);
    }
    demand.arrivals.push(this.now());
    if (demand.arrivals.length > MAX_ARRIVALS) demand.arrivals.shift();
    demand.stalled = false;
    // The create's answer and the caller's first commands go first (see REFILL_DELAY_MS).
    if (!demand.rebalanceScheduled) {
      demand.rebalanceScheduled = true;
      setTimeout(() => {
        demand.rebalanceScheduled = false;
        void this.rebalanceLogged(template);
      }, this.refillDelayMs).unref();
    }
    // Pools shrink (and recycle) on their own, also when no create comes.
    this.timer ??= setInterval(
      () => {
        for (const name of this.demand.keys()) void this.rebalanceLogged(name);
      },
      Math.min(1000, Math.max(10, this.windowMs / 10)),
    ).unref();
  }

  /** A rebalance in the background: a failure (the registry does not answer) is logged. */
  private rebalanceLogged(template: string): Promise<void> {
    const what = `warm pool of ${template}, rebalancing`;
    return this.rebalance(template).then(
      () => this.host.recovered(what),
      (error) => this.host.log(what, error),
    );
  }

  /**
   * Kills extras and sandboxes past the longest lifetime; starts what is missing. One at a time
   * per template: each decides from what the one before it did.
   */
  private rebalance(template: string): Promise<void> {
    const demand = this.demand.get(template);
    if (!demand) return Promise.resolve();
    if (demand.queued) return demand.queued;
    const next = demand.rebalancing
      .catch(() => undefined)
      .then(() => {
        demand.queued = undefined;
        return this.rebalanceNow(template, demand);
      });
    demand.queued = next;
    demand.rebalancing = next;
    return next;
  }

  private async rebalanceNow(template: string, demand: Demand): Promise<void> {
    if (demand.dropped || this.stopped) return;
    // Oldest first, as claimPooled hands them out: extras go from the front too.
    // Ours before the listing: a refill that ends during it is not in it, and stays ours.
    const ours = [...this.own].filter(([, held]) => held.template === template);
    const pooled = await this.host.registry.listSandboxes({ state: 'pooled', template });
    if (demand.dropped || this.stopped) return;
    // One of ours that another daemon's create claimed (a shared registry) is no longer pooled:
    // its hold goes, or its envd would never sleep.
    const still = new Set(pooled.map((record) => record.id));
    for (const [id] of ours) if (!still.has(id)) this.letGo(id);
    const size = this.size(template);
    const now = Date.now();
    const stale = pooled.filter((record) => record.expiresAt <= now);
    const fresh = pooled.filter((record) => record.expiresAt > now);
    const extras = fresh.slice(0, Math.max(0, fresh.length - size));
    await this.evict([...stale, ...extras]);
    if (demand.stalled || demand.dropped || this.stopped) return;
    for (let n = fresh.length - extras.length + demand.refills.size; n < size; n++) {
      this.startRefill(template, demand);
    }
  }

  private startRefill(template: string, demand: Demand): void {
    const refill = this.host.slots
      .run('refill', async () => {
        // Decided again with a slot in hand: the demand may have passed while it waited.
        const wanted =
          !demand.dropped &&
          !this.stopped &&
          !demand.stalled &&
          (await this.host.registry.countPooled(template)) + demand.starting.size <
            this.size(template);
        if (!wanted) return;
        const start = this.host.template(template).then((built) => this.host.start(built));
        demand.starting.add(start);
        try {
          const record = await start;
          this.own.set(record.id, { template, release: this.host.hold?.(record) ?? (() => {}) });
          this.readyLater(record);
        } finally {
          demand.starting.delete(start);
        }
      })
      .catch((error) => {
        demand.stalled = true;
        this.host.log(`warm pool of ${template}`, error);
      })
      .finally(() => demand.refills.delete(refill));
    demand.refills.add(refill);
  }

  /**
   * Runs PoolHost.ready on a sandbox this pool started once it has waited unclaimed for the ready
   * delay, in a start slot as a refill (creates go first). One claimed or evicted meanwhile is
   * left alone; a failure is logged, and the sandbox stays pooled as it is.
   */
  private readyLater(record: SandboxRecord): void {
    const ready = this.host.ready?.bind(this.host);
    if (!ready) return;
    const waiting = () => !this.stopped && this.own.has(record.id);
    setTimeout(() => {
      if (!waiting()) return;
      void this.host.slots
        .run('refill', async () => {
          if (waiting()) await ready(record);
        })
        .catch((error) => this.host.log(`warm pool: readying ${record.id}`, error));
    }, this.readyDelayMs).unref();
  }

  /** Forgets a sandbox this pool started (claimed or evicted), letting go of its hold. */
  private letGo(id: string): void {
    const held = this.own.get(id);
    this.own.delete(id);
    held?.release();
  }

  /**
   * Takes pooled sandboxes out of the pool (no create can claim them), then kills them; one a
   * create claimed meanwhile (here or on another daemon) is the create's and stays.
   */
  private async evict(records: SandboxRecord[]): Promise<void> {
    const taken: SandboxRecord[] = [];
    for (const record of records) {
      this.letGo(record.id);
      if (await this.host.registry.deleteSandbox(record.id, 'pooled')) taken.push(record);
    }
    for (const record of taken) {
      const killing = this.host
        .release(record)
        .catch((error) => this.host.log(`warm pool: killing ${record.id}`, error))
        .finally(() => this.evicting.delete(killing));
      this.evicting.add(killing);
    }
  }
}
