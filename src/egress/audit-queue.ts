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
  /**
   * The connection was still open when it was written (its trail was read, or it went idle): the
   * bytes are what it carried so far, and a later row of the same connection carries the rest.
   */
  open?: boolean;
}

/**
 * What egress could not put in the trail, for one sandbox and reason: rows it dropped (its queue
 * was full: `count`), or connections its raw-TCP sets could not hold (`count` null: the kernel
 * does not say how many). One note per sandbox and reason until the daemon reads it; later drops
 * make a new one.
 */
export interface EgressAuditDrop {
  seq: number;
  at: number;
  sandbox: string;
  kind: 'dropped';
  count: number | null;
  reason: string;
}

/** What the queue holds and a read answers: decisions, and notes of what was dropped. */
export type EgressAuditEntry = EgressAuditRow | EgressAuditDrop;

/** Rows waiting for the daemon at most; past it new rows are counted as dropped. */
export const EGRESS_AUDIT_MAX = 50_000;
/** Rows one read answers at most. */
export const EGRESS_AUDIT_PAGE = 2000;
/**
 * How often a connection still open gets a row when its trail is read (`open: true`) at most: the
 * first read writes it, later reads only once this long has passed since its last row (a
 * dashboard or `abx audit --follow` reads every few seconds; a row each time would be noise).
 */
export const OPEN_ROW_INTERVAL_MS = 30_000;
/** Notes of drops kept beyond {@link EGRESS_AUDIT_MAX} at most (one per sandbox and reason). */
export const EGRESS_AUDIT_MAX_DROP_NOTES = 10_000;
/** The reason of rows dropped because the queue was full. */
export const QUEUE_FULL = `egress's audit queue was full (${EGRESS_AUDIT_MAX} rows the daemon had not read)`;

/** A drop note's key: one note per sandbox and reason. */
const noteKey = (sandbox: string, reason: string) => `${sandbox}\n${reason}`;

/**
 * The rows waiting for the daemon. A read acknowledges the rows up to the `after` it names (the
 * last seq of its previous read) for this process's `epoch`, so a daemon whose answer was lost
 * reads them again; a new egress process (another epoch) has nothing of the old one's.
 */
export class EgressAuditQueue {
  readonly epoch = randomUUID();
  private rows: EgressAuditEntry[] = [];
  private seq = 0;
  /** Notes not yet answered, by sandbox and reason: a drop adds to its note's count. */
  private readonly unread = new Map<string, EgressAuditDrop>();

  constructor(private readonly max = EGRESS_AUDIT_MAX) {}

  push(row: Omit<EgressAuditRow, 'seq'>): void {
    if (this.rows.length >= this.max) {
      this.drop(row.sandbox, QUEUE_FULL, 1);
      return;
    }
    this.rows.push({ seq: ++this.seq, ...row });
  }

  /**
   * Notes that `count` rows (null: an unknown number) of `sandbox`'s were not kept, for `reason`:
   * the daemon writes it as an `audit.dropped` row of that sandbox's trail.
   */
  drop(sandbox: string, reason: string, count: number | null): void {
    const key = noteKey(sandbox, reason);
    const note = this.unread.get(key);
    if (note) {
      note.count = note.count === null || count === null ? null : note.count + count;
      return;
    }
    if (this.unread.size >= EGRESS_AUDIT_MAX_DROP_NOTES) return;
    const added: EgressAuditDrop = {
      seq: ++this.seq,
      at: Date.now(),
      sandbox,
      kind: 'dropped',
      count,
      reason,
    };
    this.rows.push(added);
    this.unread.set(key, added);
  }

  /** Entries after `after` (acknowledging the rest): a lost answer is read again. */
  take(epoch: string | undefined, after: number): { epoch: string; rows: EgressAuditEntry[] } {
    if (epoch === this.epoch) {
      let acked = 0;
      while (acked < this.rows.length && (this.rows[acked] as EgressAuditEntry).seq <= after)
        acked++;
      if (acked > 0) this.rows = this.rows.slice(acked);
    }
    const page = this.rows.slice(0, EGRESS_AUDIT_PAGE);
    // A note answered is not added to any more (the daemon may have written it): later drops
    // make a new one.
    for (const entry of page) {
      if (entry.kind === 'dropped') this.unread.delete(noteKey(entry.sandbox, entry.reason));
    }
    return { epoch: this.epoch, rows: page };
  }
}
