import type { SandboxProvider } from '../providers/provider.js';
import type { AuditLog } from './audit.js';
import type { SandboxRecord } from './registry.js';

/** How often the daemon reads egress's decisions into the audit trail. */
export const EGRESS_AUDIT_POLL_MS = 1000;
/**
 * How long a read of a sandbox's audit trail waits for egress to read that sandbox's raw TCP
 * first (`GET /v1/sandboxes/{id}/audit`); past it the read answers with what the trail has.
 */
export const EGRESS_AUDIT_READ_TIMEOUT_MS = 4000;

/**
 * Reads the connections the egress process decided (its control socket's `GET /audit`, batched;
 * egress never waits for it) into the audit trail as `egress` rows, and what it could not keep as
 * `audit.dropped` rows, with the owner the registry has for each sandbox. A read acknowledges the previous one, so an answer lost on the way is
 * read again; a new egress process starts afresh.
 */
export class EgressAuditPoller {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private epoch: string | undefined;
  private after = 0;

  constructor(
    private readonly provider: Pick<SandboxProvider, 'egressAudit'>,
    private readonly find: (id: string) => Promise<SandboxRecord | undefined>,
    private readonly audit: AuditLog,
    private readonly intervalMs = EGRESS_AUDIT_POLL_MS,
    private readonly onError: (error: unknown) => void = (error) =>
      console.error('egress audit:', error),
  ) {}

  start(): void {
    if (!this.provider.egressAudit) return;
    this.timer ??= setInterval(() => {
      if (this.running) return;
      const run: Promise<void> = this.poll()
        .catch(this.onError)
        .finally(() => {
          if (this.running === run) this.running = undefined;
        });
      this.running = run;
    }, this.intervalMs);
    this.timer.unref?.();
  }

  /**
   * Before a read of a sandbox's trail: egress reads its raw TCP and the daemon what egress has,
   * after the poll under way; {@link EGRESS_AUDIT_READ_TIMEOUT_MS} at most, never an error.
   */
  async harvest(id: string): Promise<void> {
    if (!this.provider.egressAudit) return;
    // One read of egress at a time: after the poll under way, and the next waits for this one.
    const run: Promise<void> = (this.running ?? Promise.resolve())
      .then(() => this.poll(id))
      .catch(this.onError)
      .finally(() => {
        if (this.running === run) this.running = undefined;
      });
    this.running = run;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      run,
      new Promise<void>((resolve) => {
        timer = setTimeout(resolve, EGRESS_AUDIT_READ_TIMEOUT_MS);
      }),
    ]);
    clearTimeout(timer);
  }

  /** Reads what egress has now (pages until it has no more); `harvest`: that sandbox's raw TCP first. */
  async poll(harvest?: string): Promise<void> {
    for (let page = 0; page < 50; page++) {
      const answer = await this.provider.egressAudit?.(
        this.epoch,
        this.after,
        page === 0 ? harvest : undefined,
      );
      if (!answer) return;
      if (answer.epoch !== this.epoch) {
        this.epoch = answer.epoch;
        this.after = 0;
      }
      const owners = new Map<string, SandboxRecord | undefined>();
      for (const row of answer.rows) {
        if (!owners.has(row.sandbox)) owners.set(row.sandbox, await this.find(row.sandbox));
        const record = owners.get(row.sandbox);
        // A sandbox no row names is not one of this registry's: nobody could read its trail.
        if (!record) continue;
        const who = { at: row.at, sandboxId: row.sandbox, owner: record.owner, actor: null };
        if (row.kind === 'dropped') {
          this.audit.record({
            ...who,
            kind: 'audit.dropped',
            data: { count: row.count, reason: row.reason },
          });
          continue;
        }
        this.audit.record({
          ...who,
          kind: 'egress',
          data: {
            protocol: row.kind,
            name: row.name,
            ...(row.address === undefined ? {} : { address: row.address }),
            port: row.port,
            verdict: row.allowed ? 'allowed' : 'denied',
            rule: row.rule,
            up: row.up,
            down: row.down,
            ...(row.open ? { open: true } : {}),
          },
        });
      }
      const last = answer.rows[answer.rows.length - 1];
      if (!last) return;
      this.after = last.seq;
    }
  }

  /** Stops reading, after one last read of what egress has. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
    if (this.provider.egressAudit) await this.poll().catch(() => undefined);
  }
}
