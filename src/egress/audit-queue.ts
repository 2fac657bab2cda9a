import { randomUUID } from 'node:crypto';

/**
 * One connection (or DNS question) egress decided, as the daemon's audit trail records it: kept
 * here until the daemon has read it (`GET /audit` on the control socket), never written by egress
 * itself. An allowed connection is queued when it closes, with the bytes that went each way.
 */
export interface EgressAuditRow {
  /** This process's order of rows: the daemon acknowledges what it has read by it. */
  seq: number;
  /** When the decision was made, in ms since the epoch. */
  at: number;
  sandbox: string;
  /** `tcp`: raw TCP, which the sandbox's own rules decide (tcp-audit.ts). */
  kind: 'dns' | 'http' | 'tls' | 'connect' | 'tcp';
  /**
   * The destination as the sandbox named it (a name, or an address); for `tcp`, the name egress's
   * DNS last answered this sandbox with that address, else the address itself.
   */
  name: string;
  /** The address egress dialed (allowed), when there was one. */
  address?: string;
  port: number;
  allowed: boolean;
  rule: string;
  /** Bytes from the sandbox (up) and to it (down), counted on egress's side of the connection. */
  up: number;
  down: number;
}

/** Rows waiting for the daemon at most; past it new rows are counted as dropped. */
export const EGRESS_AUDIT_MAX = 50_000;
/** Rows one read answers at most. */
export const EGRESS_AUDIT_PAGE = 2000;

/**
 * The rows waiting for the daemon. A read acknowledges the rows up to the `after` it names (the
 * last seq of its previous read) for this process's `epoch`, so a daemon whose answer was lost
 * reads them again; a new egress process (another epoch) has nothing of the old one's.
 */
export class EgressAuditQueue {
  readonly epoch = randomUUID();
  private rows: EgressAuditRow[] = [];
  private seq = 0;
  private dropped = 0;

  constructor(private readonly max = EGRESS_AUDIT_MAX) {}

  push(row: Omit<EgressAuditRow, 'seq'>): void {
    if (this.rows.length >= this.max) {
      this.dropped++;
      return;
    }
    this.rows.push({ seq: ++this.seq, ...row });
  }

  /** Rows after `after` (acknowledging the rest) and the rows dropped since the last read. */
  take(
    epoch: string | undefined,
    after: number,
  ): { epoch: string; rows: EgressAuditRow[]; dropped: number } {
    if (epoch === this.epoch) {
      let acked = 0;
      while (acked < this.rows.length && (this.rows[acked] as EgressAuditRow).seq <= after) acked++;
      if (acked > 0) this.rows = this.rows.slice(acked);
    }
    const dropped = this.dropped;
    this.dropped = 0;
    return { epoch: this.epoch, rows: this.rows.slice(0, EGRESS_AUDIT_PAGE), dropped };
  }
}
