import type { EventWakes, SandboxEvent } from './events.js';
import { type DatabaseSync, lenient, type Statement, transaction } from './sqlite.js';
import {
  type ClaimedDelivery,
  type DeliveryOutcome,
  type DeliveryRecord,
  NEWEST_SEQ,
  TEST_PENDING_MAX,
  takes,
  testSeq,
  type WebhookChange,
  type WebhookRecord,
  type WebhookStore,
} from './webhook-store.js';

interface WebhookRow {
  id: string;
  owner_key: string;
  flavour: WebhookRecord['flavour'];
  name: string;
  url: string;
  enabled: number;
  events: string;
  secret_sealed: string;
  secret_key_check: string;
  secret_version: number;
  cursor: number;
  created_at: number;
  updated_at: number;
}

const webhookFromRow = (row: WebhookRow): WebhookRecord => ({
  id: row.id,
  owner: row.owner_key === '' ? null : row.owner_key,
  flavour: row.flavour,
  name: row.name,
  url: row.url,
  enabled: row.enabled === 1,
  events: JSON.parse(row.events),
  secret: {
    sealed: row.secret_sealed,
    keyCheck: row.secret_key_check,
    version: row.secret_version,
  },
  cursor: row.cursor,
  createdAt: row.created_at,
  updatedAt: row.updated_at,
});

interface DeliveryRow {
  id: string;
  webhook_id: string;
  event_seq: number;
  sandbox_id: string;
  state: DeliveryRecord['state'];
  attempts: number;
  next_attempt_at: number;
  claimed_until: number | null;
  last_status: number | null;
  last_error: string | null;
  created_at: number;
  delivered_at: number | null;
}

export const deliveryFromRow = (row: DeliveryRow): DeliveryRecord => ({
  id: row.id,
  webhookId: row.webhook_id,
  eventSeq: Number(row.event_seq),
  sandboxId: row.sandbox_id,
  state: row.state,
  attempts: row.attempts,
  nextAttemptAt: Number(row.next_attempt_at),
  claimedUntil: row.claimed_until === null ? null : Number(row.claimed_until),
  lastStatus: row.last_status,
  lastError: row.last_error,
  createdAt: Number(row.created_at),
  deliveredAt: row.delivered_at === null ? null : Number(row.delivered_at),
});

interface EventRow {
  seq: number;
  id: string;
  at: number;
  sandbox_id: string;
  owner_key: string;
  template: string;
  type: string;
  data: string;
}

const eventFromRow = (row: EventRow): SandboxEvent => ({
  seq: row.seq,
  id: row.id,
  at: row.at,
  sandboxId: row.sandbox_id,
  owner: row.owner_key === '' ? null : row.owner_key,
  template: row.template,
  type: row.type as SandboxEvent['type'],
  data: JSON.parse(row.data),
});

/**
 * Due deliveries, oldest event first: pending, their time come, no live claim, of an enabled
 * webhook, and no older pending delivery of the same sandbox to the same webhook (in order per
 * sandbox: the next waits while the one before is retried).
 */
export const DUE = `SELECT d.id FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
  WHERE d.state = 'pending' AND d.next_attempt_at <= :now
    AND (d.claimed_until IS NULL OR d.claimed_until <= :now) AND w.enabled = :enabled
    AND NOT EXISTS (SELECT 1 FROM webhook_deliveries p WHERE p.webhook_id = d.webhook_id
      AND p.sandbox_id = d.sandbox_id AND p.state = 'pending' AND p.event_seq < d.event_seq)
  ORDER BY d.event_seq LIMIT :limit`;

/** The webhooks part of the SQLite registry (one daemon on the file). */
export class SqliteWebhookStore implements WebhookStore {
  private readonly statements = new Map<string, Statement>();

  constructor(
    private readonly db: DatabaseSync,
    /** A new delivery's id. */
    private readonly newId: () => string,
    /** Signalled by the registry at each event insert (one daemon writes the file). */
    private readonly wakes?: EventWakes,
  ) {}

  onEventWritten(listener: () => void): () => Promise<void> {
    const off = this.wakes?.on(listener);
    return async () => off?.();
  }

  private statement(sql: string): Statement {
    let statement = this.statements.get(sql);
    if (!statement) {
      statement = lenient(this.db.prepare(sql));
      this.statements.set(sql, statement);
    }
    return statement;
  }

  async insertWebhook(record: Omit<WebhookRecord, 'cursor'>): Promise<WebhookRecord> {
    this.statement(
      `INSERT INTO webhooks (id, owner_key, flavour, name, url, enabled, events, secret_sealed,
         secret_key_check, secret_version, cursor, created_at, updated_at)
       VALUES (:id, :owner, :flavour, :name, :url, :enabled, :events, :sealed, :keyCheck,
         :version, ${NEWEST_SEQ}, :createdAt, :updatedAt)`,
    ).run({
      id: record.id,
      owner: record.owner ?? '',
      flavour: record.flavour,
      name: record.name,
      url: record.url,
      enabled: record.enabled ? 1 : 0,
      events: JSON.stringify(record.events),
      sealed: record.secret.sealed,
      keyCheck: record.secret.keyCheck,
      version: record.secret.version,
      createdAt: record.createdAt,
      updatedAt: record.updatedAt,
    });
    return (await this.getWebhook(record.id)) as WebhookRecord;
  }

  async getWebhook(id: string): Promise<WebhookRecord | undefined> {
    const row = this.statement('SELECT * FROM webhooks WHERE id = ?').get(id) as
      | WebhookRow
      | undefined;
    return row && webhookFromRow(row);
  }

  async listWebhooks(owner?: string | null): Promise<WebhookRecord[]> {
    const rows =
      owner === undefined
        ? this.statement('SELECT * FROM webhooks ORDER BY created_at, id').all()
        : this.statement('SELECT * FROM webhooks WHERE owner_key = ? ORDER BY created_at, id').all(
            owner ?? '',
          );
    return (rows as WebhookRow[]).map(webhookFromRow);
  }

  async updateWebhook(id: string, change: WebhookChange): Promise<WebhookRecord | undefined> {
    const changes = this.statement(
      `UPDATE webhooks SET name = COALESCE(:name, name), url = COALESCE(:url, url),
         enabled = COALESCE(:enabled, enabled), events = COALESCE(:events, events),
         secret_sealed = COALESCE(:sealed, secret_sealed),
         secret_key_check = COALESCE(:keyCheck, secret_key_check),
         secret_version = COALESCE(:version, secret_version), updated_at = :at
       WHERE id = :id`,
    ).run({
      id,
      name: change.name ?? null,
      url: change.url ?? null,
      enabled: change.enabled === undefined ? null : change.enabled ? 1 : 0,
      events: change.events === undefined ? null : JSON.stringify(change.events),
      sealed: change.secret?.sealed ?? null,
      keyCheck: change.secret?.keyCheck ?? null,
      version: change.secret?.version ?? null,
      at: change.at,
    }).changes;
    return changes === 1 ? this.getWebhook(id) : undefined;
  }

  async removeWebhook(id: string): Promise<boolean> {
    return transaction(
      this.db,
      () => {
        this.statement('DELETE FROM webhook_deliveries WHERE webhook_id = ?').run(id);
        return this.statement('DELETE FROM webhooks WHERE id = ?').run(id).changes === 1;
      },
      'IMMEDIATE',
    );
  }

  async listDeliveries(webhookId: string, limit: number): Promise<DeliveryRecord[]> {
    return (
      this.statement(
        'SELECT * FROM webhook_deliveries WHERE webhook_id = ? ORDER BY event_seq DESC LIMIT ?',
      ).all(webhookId, limit) as DeliveryRow[]
    ).map(deliveryFromRow);
  }

  async fanOut(now: number, batch: number): Promise<number> {
    let written = 0;
    const hooks = this.statement(
      `SELECT id FROM webhooks w WHERE cursor < (SELECT COALESCE(MAX(seq), 0) FROM events
         WHERE owner_key = w.owner_key)`,
    ).all() as { id: string }[];
    for (const { id } of hooks) {
      written += transaction(
        this.db,
        () => {
          const row = this.statement('SELECT * FROM webhooks WHERE id = ?').get(id) as
            | WebhookRow
            | undefined;
          if (!row) return 0;
          const hook = webhookFromRow(row);
          const events = this.statement(
            `SELECT seq, id, sandbox_id, type FROM events WHERE owner_key = ? AND seq > ?
               ORDER BY seq LIMIT ?`,
          ).all(row.owner_key, hook.cursor, batch) as Pick<
            EventRow,
            'seq' | 'id' | 'sandbox_id' | 'type'
          >[];
          const last = events.at(-1);
          if (!last) return 0;
          let count = 0;
          for (const event of events) {
            if (!hook.enabled) break;
            if (!takes(hook, event.type)) continue;
            count += this.statement(
              `INSERT OR IGNORE INTO webhook_deliveries (id, webhook_id, event_seq, sandbox_id,
                 state, attempts, next_attempt_at, created_at)
               VALUES (?, ?, ?, ?, 'pending', 0, ?, ?)`,
            ).run(this.newId(), id, event.seq, event.sandbox_id, now, now).changes;
          }
          this.statement('UPDATE webhooks SET cursor = ? WHERE id = ?').run(last.seq, id);
          return count;
        },
        'IMMEDIATE',
      );
    }
    return written;
  }

  async claimDue(now: number, leaseMs: number, limit: number): Promise<ClaimedDelivery[]> {
    if (limit <= 0) return [];
    return transaction(
      this.db,
      () => {
        const ids = (this.statement(DUE).all({ now, limit, enabled: 1 }) as { id: string }[]).map(
          (r) => r.id,
        );
        const claimed: ClaimedDelivery[] = [];
        for (const id of ids) {
          const row = this.statement(
            `UPDATE webhook_deliveries SET claimed_until = ?, attempts = attempts + 1
             WHERE id = ? RETURNING *`,
          ).get(now + leaseMs, id) as DeliveryRow;
          const delivery = deliveryFromRow(row);
          const hook = this.statement('SELECT * FROM webhooks WHERE id = ?').get(
            delivery.webhookId,
          ) as WebhookRow;
          const event = this.statement('SELECT * FROM events WHERE seq = ?').get(
            delivery.eventSeq,
          ) as EventRow | undefined;
          claimed.push({
            delivery,
            webhook: webhookFromRow(hook),
            event: event && eventFromRow(event),
          });
        }
        return claimed;
      },
      'IMMEDIATE',
    );
  }

  async finishDelivery(id: string, outcome: DeliveryOutcome): Promise<void> {
    this.statement(
      `UPDATE webhook_deliveries SET state = :state, claimed_until = NULL, last_status = :status,
         last_error = :error, next_attempt_at = COALESCE(:next, next_attempt_at),
         delivered_at = :deliveredAt
       WHERE id = :id AND state = 'pending'`,
    ).run({
      id,
      state: outcome.state,
      status: outcome.status,
      error: outcome.state === 'delivered' ? null : outcome.error,
      next: outcome.state === 'pending' ? outcome.nextAttemptAt : null,
      deliveredAt: outcome.state === 'delivered' ? outcome.at : null,
    });
  }

  async purgeDeliveries(before: number): Promise<number> {
    return this.statement(
      `DELETE FROM webhook_deliveries WHERE state IN ('delivered', 'failed') AND created_at < ?`,
    ).run(before).changes;
  }

  async getDelivery(webhookId: string, id: string): Promise<DeliveryRecord | undefined> {
    const row = this.statement(
      'SELECT * FROM webhook_deliveries WHERE id = ? AND webhook_id = ?',
    ).get(id, webhookId) as DeliveryRow | undefined;
    return row && deliveryFromRow(row);
  }

  async insertTestDelivery(webhookId: string, now: number): Promise<DeliveryRecord | undefined> {
    const row = this.statement(
      `INSERT INTO webhook_deliveries (id, webhook_id, event_seq, sandbox_id, state, attempts,
         next_attempt_at, created_at)
       SELECT :id, :webhookId, :seq, '', 'pending', 0, :now, :now
       WHERE (SELECT COUNT(*) FROM webhook_deliveries WHERE webhook_id = :webhookId
         AND event_seq < 0 AND state = 'pending') < :max
       RETURNING *`,
    ).get({
      id: this.newId(),
      webhookId,
      seq: testSeq(now),
      now,
      max: TEST_PENDING_MAX,
    }) as DeliveryRow | undefined;
    if (row) this.wakes?.signal(); // due now: the dispatcher need not wait for its poll
    return row && deliveryFromRow(row);
  }

  async restartDelivery(
    webhookId: string,
    id: string,
    now: number,
  ): Promise<DeliveryRecord | undefined> {
    const row = this.statement(
      `UPDATE webhook_deliveries SET state = 'pending', attempts = 0, next_attempt_at = :now,
         claimed_until = NULL, last_status = NULL, last_error = NULL, delivered_at = NULL,
         created_at = :now
       WHERE id = :id AND webhook_id = :webhookId AND state IN ('delivered', 'failed')
         AND (event_seq < 0 OR EXISTS (SELECT 1 FROM events WHERE seq = event_seq))
       RETURNING *`,
    ).get({ id, webhookId, now }) as DeliveryRow | undefined;
    if (row) this.wakes?.signal();
    return row && deliveryFromRow(row);
  }
}
