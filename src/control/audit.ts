/**
 * The audit trail: what was done to and from each sandbox, as the daemon itself saw it (never as
 * the sandbox reports it: envd runs inside and a hostile sandbox can lie). Commands started and
 * files written or removed through the gateway or E2B's face, port links issued, and every
 * connection the egress proxy decided. Rows are buffered and written in batches
 * ({@link AuditLog}), never on a request's path; they are kept as long as lifecycle events
 * (`eventsRetentionMs()`) and read through `GET /v1/sandboxes/{id}/audit` (docs/events.md,
 * "Audit trail").
 */

import { InvalidArgumentError } from '../errors.js';
import { eventsRetentionMs } from './events.js';

/** How long audit rows are kept: as long as lifecycle events (`ABX_EVENTS_RETENTION_MS`, 7 days). */
export function auditRetentionMs(env: NodeJS.ProcessEnv = process.env): number {
  return eventsRetentionMs(env);
}

/** What a row records. */
export const AUDIT_KINDS = [
  /** A process started through envd's `POST /exec` (native) or E2B's `process.Process/Start`. */
  'command.started',
  /** Its end, where the daemon serves the stream itself (E2B's face): `exitCode`. */
  'command.exited',
  /** A command of a command server called (`POST /commands/{name}` on a sandbox port). */
  'command.called',
  'file.written',
  'file.removed',
  'file.renamed',
  /** A one-time browser link to a port minted (`sandbox.getSignedUrl`, `abx url`). */
  'link.issued',
  /** One connection (or DNS question) the egress proxy decided, with its verdict and rule. */
  'egress',
  /**
   * What the trail could not keep, per sandbox: `count` (null: not known) and `reason` (the
   * daemon's buffer was full; egress's queue was full; a sandbox's raw-TCP sets were full).
   */
  'audit.dropped',
] as const;

export type AuditKind = (typeof AUDIT_KINDS)[number];

export function isAuditKind(kind: string): kind is AuditKind {
  return (AUDIT_KINDS as readonly string[]).includes(kind);
}

/** One row of the audit trail. */
export interface AuditRecord {
  /** The order of writes, from 1: the readers' cursor. */
  seq: number;
  /** When the daemon saw it, in ms since the epoch. */
  at: number;
  sandboxId: string;
  /** The API key id that owns the sandbox; null for the daemon's own key. */
  owner: string | null;
  /**
   * The API key id that made the request, when one did (requests through the gateway carry the
   * sandbox's token instead: `data.via` says how it came).
   */
  actor: string | null;
  kind: AuditKind;
  data: Record<string, unknown>;
}

export type NewAuditRecord = Omit<AuditRecord, 'seq'>;

/** What `listAudit` reads. */
export interface AuditFilter {
  sandboxId: string;
  /** Any of these kinds; undefined or empty: every kind. */
  kinds?: readonly string[];
  /** Only `seq` greater than this (the cursor). */
  afterSeq?: number;
  /** Only `at` at or after this (ms since the epoch). */
  since?: number;
  /** Only `at` before this. */
  until?: number;
  limit: number;
}

/** The registry's part for the audit trail (both stores implement it). */
export interface AuditStore {
  /** Appends rows in one transaction, `seq` in the order given. */
  appendAudit(rows: readonly NewAuditRecord[]): Promise<void>;
  /** A sandbox's rows by `seq`, ascending. */
  listAudit(filter: AuditFilter): Promise<AuditRecord[]>;
  /** Removes rows older than `before` (ms since the epoch); how many. */
  purgeAudit(before: number): Promise<number>;
}

/** How often buffered rows are written. */
export const AUDIT_FLUSH_MS = 1000;
/** Rows written at once; a buffer this full is written at once rather than at the next tick. */
export const AUDIT_BATCH_ROWS = 500;
/** Rows kept waiting at most; past it new rows are counted as dropped, not kept. */
export const AUDIT_MAX_BUFFERED = 20_000;
/** The reason of the rows {@link AuditLog} drops. */
export const DAEMON_BUFFER_FULL = `the daemon's audit buffer was full (${AUDIT_MAX_BUFFERED} rows not yet written)`;
/** The longest text kept of one field (a command line, a path). */
export const AUDIT_TEXT_MAX = 4096;

/** `text` cut to {@link AUDIT_TEXT_MAX} characters, marked when cut. */
export function auditText(text: string): string {
  return text.length <= AUDIT_TEXT_MAX ? text : `${text.slice(0, AUDIT_TEXT_MAX)}…`;
}

/**
 * The daemon's writer of audit rows: {@link record} only buffers (a request never waits for the
 * database), a timer writes the buffer every {@link AUDIT_FLUSH_MS} (or at once when
 * {@link AUDIT_BATCH_ROWS} wait), and a full buffer drops new rows, counting them per sandbox:
 * the next write adds one `audit.dropped` row per sandbox with its count. A write that fails
 * (the database is down) keeps the rows for the next tick, within the same bound.
 */
export class AuditLog {
  private buffer: NewAuditRecord[] = [];
  private readonly dropped = new Map<string, { owner: string | null; count: number }>();
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> | undefined;
  private closed = false;

  constructor(
    /** Where rows are written, and read back (`GET /v1/sandboxes/{id}/audit`). */
    readonly store: AuditStore,
    private readonly options: {
      flushMs?: number;
      batchRows?: number;
      maxBuffered?: number;
      onError?: (error: unknown) => void;
    } = {},
  ) {}

  /** Buffers a row (never throws, never waits). */
  record(row: Omit<NewAuditRecord, 'at'> & { at?: number }): void {
    if (this.closed) return;
    if (this.buffer.length >= (this.options.maxBuffered ?? AUDIT_MAX_BUFFERED)) {
      const seen = this.dropped.get(row.sandboxId);
      if (seen) seen.count++;
      else if (this.dropped.size < 10_000) {
        this.dropped.set(row.sandboxId, { owner: row.owner, count: 1 });
      }
      return;
    }
    this.buffer.push({ ...row, at: row.at ?? Date.now() });
    if (this.buffer.length >= (this.options.batchRows ?? AUDIT_BATCH_ROWS)) {
      void this.flush();
    } else {
      this.timer ??= setTimeout(() => {
        this.timer = undefined;
        void this.flush();
      }, this.options.flushMs ?? AUDIT_FLUSH_MS);
      this.timer.unref?.();
    }
  }

  /** Writes what is buffered now (one write at a time); resolves when it is written or failed. */
  flush(): Promise<void> {
    if (this.writing) return this.writing.then(() => this.flush());
    if (this.buffer.length === 0 && this.dropped.size === 0) return Promise.resolve();
    const batch = this.buffer.splice(0, this.options.batchRows ?? AUDIT_BATCH_ROWS);
    const drops = [...this.dropped].map(
      ([sandboxId, { owner, count }]): NewAuditRecord => ({
        at: Date.now(),
        sandboxId,
        owner,
        actor: null,
        kind: 'audit.dropped',
        data: { count, reason: DAEMON_BUFFER_FULL },
      }),
    );
    this.dropped.clear();
    const rows = [...batch, ...drops];
    this.writing = this.store
      .appendAudit(rows)
      .catch((error) => {
        // Kept for the next tick, ahead of what came since (within the bound).
        const room = (this.options.maxBuffered ?? AUDIT_MAX_BUFFERED) - this.buffer.length;
        this.buffer.unshift(...batch.slice(0, Math.max(0, room)));
        for (const drop of drops) {
          const seen = this.dropped.get(drop.sandboxId);
          const count = (drop.data.count as number) + (seen?.count ?? 0);
          this.dropped.set(drop.sandboxId, { owner: drop.owner, count });
        }
        (this.options.onError ?? ((e) => console.error('audit:', e)))(error);
      })
      .finally(() => {
        this.writing = undefined;
        if ((this.buffer.length > 0 || this.dropped.size > 0) && !this.closed) {
          this.timer ??= setTimeout(() => {
            this.timer = undefined;
            void this.flush();
          }, this.options.flushMs ?? AUDIT_FLUSH_MS);
          this.timer.unref?.();
        }
      });
    return this.writing;
  }

  /** Writes what is buffered (one attempt per batch) and takes no more. */
  async close(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    for (let i = 0; i < 100 && (this.buffer.length > 0 || this.dropped.size > 0); i++) {
      const before = this.buffer.length;
      await this.flush();
      if (this.buffer.length >= before && before > 0) break;
    }
    this.closed = true;
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}

/** The most rows one page of `GET /v1/sandboxes/{id}/audit` answers. */
export const AUDIT_PAGE_MAX = 1000;

/** What a reader asked for: `after`, `limit`, `kind` (repeatable or a comma list), `since`, `until`. */
export interface AuditQuery {
  afterSeq?: number;
  limit: number;
  kinds?: AuditKind[];
  since?: number;
  until?: number;
}

/** A time in a query: ms since the epoch, or an ISO 8601 date; else an InvalidArgumentError. */
function queryTime(query: URLSearchParams, name: 'since' | 'until'): number | undefined {
  const text = query.get(name);
  if (text === null || text === '') return undefined;
  if (/^\d{1,15}$/.test(text)) return Number(text);
  const parsed = /^\d{4}-\d\d-\d\d/.test(text) ? Date.parse(text) : Number.NaN;
  if (Number.isNaN(parsed)) {
    throw new InvalidArgumentError(
      `${name} must be a time: ms since the epoch or an ISO 8601 date (2026-01-02T03:04:05Z), not ${JSON.stringify(text.slice(0, 60))}`,
    );
  }
  return parsed;
}

/** Reads the audit query of a request; anything malformed is an InvalidArgumentError naming it. */
export function parseAuditQuery(query: URLSearchParams): AuditQuery {
  const after = query.get('after') ?? query.get('cursor');
  if (after !== null && !/^\d{1,15}$/.test(after)) {
    throw new InvalidArgumentError(
      `after must be the seq of the last row read (a whole number), not ${JSON.stringify(after.slice(0, 60))}`,
    );
  }
  const limitText = query.get('limit');
  const limit = limitText === null ? 100 : Number(limitText);
  if (!/^\d+$/.test(limitText ?? '1') || limit < 1 || limit > AUDIT_PAGE_MAX) {
    throw new InvalidArgumentError(
      `limit must be a whole number from 1 to ${AUDIT_PAGE_MAX}, not ${JSON.stringify(limitText)}`,
    );
  }
  const kinds = query
    .getAll('kind')
    .flatMap((text) => text.split(','))
    .map((text) => text.trim())
    .filter((text) => text !== '');
  for (const kind of kinds) {
    if (!isAuditKind(kind)) {
      throw new InvalidArgumentError(
        `kind ${JSON.stringify(kind.slice(0, 60))} is not one the audit trail records: use ${AUDIT_KINDS.join(', ')}`,
      );
    }
  }
  const since = queryTime(query, 'since');
  const until = queryTime(query, 'until');
  if (since !== undefined && until !== undefined && since > until) {
    throw new InvalidArgumentError(
      `since (${since}) is after until (${until}): give since <= until`,
    );
  }
  return {
    limit,
    ...(after === null ? {} : { afterSeq: Number(after) }),
    ...(kinds.length > 0 ? { kinds: kinds as AuditKind[] } : {}),
    ...(since === undefined ? {} : { since }),
    ...(until === undefined ? {} : { until }),
  };
}

/** One row as the API answers it (`at` as an ISO date too, for people reading an export). */
export function auditJson(row: AuditRecord): Record<string, unknown> {
  return {
    seq: row.seq,
    at: row.at,
    time: new Date(row.at).toISOString(),
    sandboxId: row.sandboxId,
    owner: row.owner,
    actor: row.actor,
    kind: row.kind,
    data: row.data,
  };
}

/**
 * Every row a query selects, page by page, as JSON lines (an export): `limit` is the page size,
 * not a bound on the whole.
 */
export async function* auditLines(
  store: AuditStore,
  sandboxId: string,
  query: AuditQuery,
): AsyncGenerator<string> {
  let after = query.afterSeq;
  for (;;) {
    const rows = await store.listAudit({
      ...query,
      sandboxId,
      limit: AUDIT_PAGE_MAX,
      ...(after === undefined ? {} : { afterSeq: after }),
    });
    for (const row of rows) yield `${JSON.stringify(auditJson(row))}\n`;
    if (rows.length < AUDIT_PAGE_MAX) return;
    after = rows[rows.length - 1]?.seq;
  }
}
