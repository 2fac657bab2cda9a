import type { SandboxHandle } from '../providers/provider.js';
import { auditRetentionMs } from './audit.js';
import { eventsRetentionMs, expiringEventId, expiringLeadMs } from './events.js';
import type { Registry, SandboxRecord } from './registry.js';

/** What the reaper needs from the sandboxes it watches. */
export interface ReaperHost {
  registry: Registry;
  isAlive(handle: SandboxHandle): boolean;
  /** True while a sandbox is being killed (its processes are expected to go). */
  isEnding(id: string): boolean;
  /** Records that a sandbox ended by itself and releases what it held. */
  markDead(record: SandboxRecord): Promise<void>;
  /** Kills a sandbox whose time was up at `now` (unless its lifetime was extended since). */
  expire(record: SandboxRecord, now: number): Promise<unknown>;
  /** Kills what is left of an ended sandbox and removes its folder. */
  release(record: SandboxRecord): Promise<void>;
  /**
   * Kills the sandboxes nobody recorded that are older than any create under way (another
   * daemon on the registry died mid-create); present where other daemons share the sandboxes.
   */
  sweep?(): Promise<unknown>;
}

/**
 * How long after a sandbox's end the daemon that ended it is trusted to kill it. Past this, any
 * daemon's reaper kills what still runs of it (the daemon that ended it died mid-kill).
 */
export const RELEASE_GRACE_MS = 30_000;
/** How far back a pass looks for ended sandboxes still running. */
export const RELEASE_WINDOW_MS = 600_000;
/** How often a reaper sweeps for orphans, where its host sweeps (see {@link ReaperHost.sweep}). */
export const ORPHAN_SWEEP_MS = 60_000;

/** How often a reaper removes audit rows past their retention (the first pass does at once). */
export const AUDIT_PURGE_MS = 60_000;

/**
 * Keeps the registry and the hosts' processes in agreement while the daemon runs: every pass
 * kills the running sandboxes whose time is up, marks dead (cleaning up after) the running or
 * pooled ones whose processes ended by themselves, and kills what still runs of a sandbox that
 * ended more than {@link RELEASE_GRACE_MS} ago (a daemon died between recording an end and
 * killing), and, where its host sweeps, every {@link ORPHAN_SWEEP_MS} kills the sandboxes that
 * have no row (a daemon died mid-create). One pass at a time; `stop` waits for the pass
 * in flight, so nothing touches the registry after the daemon closes it. Daemons sharing a
 * registry each run one: every end is a conditional update, so each sandbox is ended (and
 * killed) by the one pass that wins it.
 */
export class Reaper {
  private timer: NodeJS.Timeout | undefined;
  private inFlight: Promise<unknown> | undefined;
  /** When the next orphan sweep is due (the first a period after the first pass). */
  private nextSweep: number | undefined;
  /** When audit rows past their retention are next removed. */
  private nextAuditPurge = 0;
  /**
   * See events.ts expiringLeadMs and eventsRetentionMs: read when the reaper is made, so a bad
   * value stops the daemon's start.
   */
  private readonly expiringLeadMs = expiringLeadMs();
  private readonly eventsRetentionMs = eventsRetentionMs();
  /** The expiry each running sandbox near its timeout was warned of (its `expiring` event). */
  private readonly warned = new Map<string, number>();

  constructor(
    private readonly host: ReaperHost,
    /** Time between passes (default 1 s). */
    private readonly intervalMs = 1000,
    private readonly onError: (error: unknown) => void = (error) => console.error('reaper:', error),
    /** Called after each pass that succeeds (a log says the passes work again). */
    private readonly onSuccess: () => void = () => {},
    /** See {@link RELEASE_GRACE_MS}. */
    private readonly releaseGraceMs = RELEASE_GRACE_MS,
    /** See {@link ORPHAN_SWEEP_MS}. */
    private readonly sweepIntervalMs = ORPHAN_SWEEP_MS,
  ) {}

  /** Starts passing every `intervalMs`; a pass still running when the next is due is not doubled. */
  start(): void {
    this.timer ??= setInterval(() => {
      if (this.inFlight) return;
      this.inFlight = this.pass()
        .then(this.onSuccess, this.onError)
        .finally(() => {
          this.inFlight = undefined;
        });
    }, this.intervalMs);
  }

  /** Stops passing; resolves once the pass in flight (if any) is done. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.inFlight;
  }

  /** One pass as of `now`; returns the ids of the sandboxes that expired. */
  async pass(now = Date.now()): Promise<string[]> {
    const { registry } = this.host;
    // One read: the sandboxes whose time is up, and the running ones whose time is near.
    const due = await registry.expired(now + this.expiringLeadMs);
    const expired = due.filter((record) => record.expiresAt <= now);
    const dead = [
      ...(await registry.listSandboxes({ state: 'running' })),
      ...(await registry.listSandboxes({ state: 'pooled' })),
    ].filter((record) => !this.host.isEnding(record.id) && !this.host.isAlive(record.handle));
    // Ended, yet its processes run past the grace: the daemon that ended it did not finish.
    const leftovers = (await registry.endedSince(now - RELEASE_WINDOW_MS)).filter(
      (record) =>
        (record.endedAt as number) <= now - this.releaseGraceMs &&
        !this.host.isEnding(record.id) &&
        this.host.isAlive(record.handle),
    );
    await Promise.all([
      ...dead.map((record) => this.host.markDead(record)),
      ...expired
        .filter((record) => !dead.some((ended) => ended.id === record.id))
        .map((record) => this.host.expire(record, now)),
      ...leftovers.map((record) => this.host.release(record)),
    ]);
    if (this.host.sweep) {
      this.nextSweep ??= now + this.sweepIntervalMs;
      if (now >= this.nextSweep) {
        this.nextSweep = now + this.sweepIntervalMs;
        await this.host.sweep();
      }
    }
    await this.warnExpiring(due, now);
    if (now >= this.nextAuditPurge) {
      this.nextAuditPurge = now + AUDIT_PURGE_MS;
      await registry.purgeAudit(now - auditRetentionMs());
      await registry.purgeEvents(now - this.eventsRetentionMs);
    }
    return expired.map((record) => record.id);
  }

  /**
   * Writes the `expiring` event of each running sandbox whose timeout is within the lead: once
   * per sandbox and expiry (its id is made from both, so another daemon's reaper writing it too,
   * or this one after a restart, adds nothing); a timeout extended since is warned of again.
   */
  private async warnExpiring(due: SandboxRecord[], now: number): Promise<void> {
    if (this.expiringLeadMs <= 0) return;
    const near = due.filter((record) => record.state === 'running' && record.expiresAt > now);
    for (const id of this.warned.keys()) {
      if (!near.some((record) => record.id === id)) this.warned.delete(id);
    }
    for (const record of near) {
      if (this.warned.get(record.id) === record.expiresAt) continue;
      await this.host.registry.appendEvent({
        id: expiringEventId(record.id, record.expiresAt),
        at: now,
        sandboxId: record.id,
        owner: record.owner,
        template: record.template,
        type: 'sandbox.lifecycle.expiring',
        data: {
          expiresAt: record.expiresAt,
          leadMs: this.expiringLeadMs,
          onTimeout: record.lifecycle?.onTimeout ?? 'kill',
        },
      });
      this.warned.set(record.id, record.expiresAt);
    }
  }
}
