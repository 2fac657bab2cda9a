import type * as Pg from 'pg';
import { EVENTS_CHANNEL, EventWakes, type SandboxEvent } from './events.js';
import { deliveryFromRow } from './sqlite-webhooks.js';
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
  enabled: boolean;
  events: string[];
  secret_sealed: string;
  secret_key_check: string;
  secret_version: number;
  cursor: string;
  created_at: string;
  updated_at: string;
}

const webhookFromRow = (row: WebhookRow): WebhookRecord => ({
  id: row.id,
  owner: row.owner_key === '' ? null : row.owner_key,
  flavour: row.flavour,
  name: row.name,
  url: row.url,
  enabled: row.enabled,
  events: row.events,
  secret: {
    sealed: row.secret_sealed,
    keyCheck: row.secret_key_check,
    version: row.secret_version,
  },
  cursor: Number(row.cursor),
  createdAt: Number(row.created_at),
  updatedAt: Number(row.updated_at),
});

interface EventRow {
  seq: string;
  id: string;
  at: string;
  sandbox_id: string;
  owner_key: string;
  template: string;
  type: string;
  data: Record<string, unknown>;
}

const eventFromRow = (row: EventRow): SandboxEvent => ({
  seq: Number(row.seq),
  id: row.id,
  at: Number(row.at),
  sandboxId: row.sandbox_id,
  owner: row.owner_key === '' ? null : row.owner_key,
  template: row.template,
  type: row.type as SandboxEvent['type'],
  data: row.data,
});

/** What the PostgreSQL registry lends its webhooks part: its pool's query and transaction. */
export interface PostgresAccess {
  query<Row extends Pg.QueryResultRow>(sql: string, params?: unknown[]): Promise<{ rows: Row[] }>;
  transaction<T>(work: (client: Pg.PoolClient) => Promise<T>): Promise<T>;
  /** A new client (not connected) of its own, outside the pool: what LISTEN holds. */
  listener?: () => Pg.Client;
}

/** How long a broken LISTEN connection waits before it connects again (the poll goes on meanwhile). */
export const LISTEN_RETRY_MS = 2000;

/**
 * The webhooks part of the PostgreSQL registry, shared by replicas: the fan-out locks a webhook's
 * row with `FOR UPDATE SKIP LOCKED` (one daemon moves a cursor at a time, the others skip it),
 * and a claim takes due rows the same way and leases them, so each delivery is sent by one
 * daemon (again by another only after its lease ends without an outcome).
 */
export class PostgresWebhookStore implements WebhookStore {
  private readonly wakes = new EventWakes();
  private listening: { stop(): Promise<void> } | undefined;

  constructor(
    private readonly db: PostgresAccess,
    private readonly newId: () => string,
  ) {}

  /**
   * Listens on {@link EVENTS_CHANNEL} while someone wants to know: each event insert of any
   * daemon on the database (this one too) NOTIFYs it at its commit. A connection that breaks is
   * made again after {@link LISTEN_RETRY_MS}, and the listeners are told once then (what was sent
   * meanwhile was missed; the dispatcher's poll finds it anyway).
   */
  onEventWritten(listener: () => void): () => Promise<void> {
    const off = this.wakes.on(listener);
    const make = this.db.listener;
    if (!this.listening && make) this.listening = listenForEvents(make, this.wakes);
    return async () => {
      off();
      if (!this.wakes.idle()) return;
      const listening = this.listening;
      this.listening = undefined;
      await listening?.stop();
    };
  }

  async insertWebhook(record: Omit<WebhookRecord, 'cursor'>): Promise<WebhookRecord> {
    const { rows } = await this.db.query<WebhookRow>(
      `INSERT INTO webhooks (id, owner_key, flavour, name, url, enabled, events, secret_sealed,
         secret_key_check, secret_version, cursor, created_at, updated_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, ${NEWEST_SEQ}, $11, $12) RETURNING *`,
      [
        record.id,
        record.owner ?? '',
        record.flavour,
        record.name,
        record.url,
        record.enabled,
        JSON.stringify(record.events),
        record.secret.sealed,
        record.secret.keyCheck,
        record.secret.version,
        record.createdAt,
        record.updatedAt,
      ],
    );
    return webhookFromRow(rows[0] as WebhookRow);
  }

  async getWebhook(id: string): Promise<WebhookRecord | undefined> {
    const { rows } = await this.db.query<WebhookRow>('SELECT * FROM webhooks WHERE id = $1', [id]);
    return rows[0] && webhookFromRow(rows[0]);
  }

  async listWebhooks(owner?: string | null): Promise<WebhookRecord[]> {
    const { rows } =
      owner === undefined
        ? await this.db.query<WebhookRow>('SELECT * FROM webhooks ORDER BY created_at, id')
        : await this.db.query<WebhookRow>(
            'SELECT * FROM webhooks WHERE owner_key = $1 ORDER BY created_at, id',
            [owner ?? ''],
          );
    return rows.map(webhookFromRow);
  }

  async updateWebhook(id: string, change: WebhookChange): Promise<WebhookRecord | undefined> {
    const { rows } = await this.db.query<WebhookRow>(
      `UPDATE webhooks SET name = COALESCE($2, name), url = COALESCE($3, url),
         enabled = COALESCE($4, enabled), events = COALESCE($5::json, events),
         secret_sealed = COALESCE($6, secret_sealed),
         secret_key_check = COALESCE($7, secret_key_check),
         secret_version = COALESCE($8, secret_version), updated_at = $9
       WHERE id = $1 RETURNING *`,
      [
        id,
        change.name ?? null,
        change.url ?? null,
        change.enabled ?? null,
        change.events === undefined ? null : JSON.stringify(change.events),
        change.secret?.sealed ?? null,
        change.secret?.keyCheck ?? null,
        change.secret?.version ?? null,
        change.at,
      ],
    );
    return rows[0] && webhookFromRow(rows[0]);
  }

  async removeWebhook(id: string): Promise<boolean> {
    return this.db.transaction(async (client) => {
      await client.query('DELETE FROM webhook_deliveries WHERE webhook_id = $1', [id]);
      return ((await client.query('DELETE FROM webhooks WHERE id = $1', [id])).rowCount ?? 0) > 0;
    });
  }

  async listDeliveries(webhookId: string, limit: number): Promise<DeliveryRecord[]> {
    const { rows } = await this.db.query(
      'SELECT * FROM webhook_deliveries WHERE webhook_id = $1 ORDER BY event_seq DESC LIMIT $2',
      [webhookId, limit],
    );
    return rows.map((row) => deliveryFromRow(row as never));
  }

  async fanOut(now: number, batch: number): Promise<number> {
    const { rows: hooks } = await this.db.query<{ id: string }>(
      `SELECT id FROM webhooks w WHERE cursor < (SELECT COALESCE(MAX(seq), 0) FROM events
         WHERE owner_key = w.owner_key)`,
    );
    let written = 0;
    for (const { id } of hooks) {
      written += await this.db.transaction(async (client) => {
        const { rows } = await client.query<WebhookRow>(
          'SELECT * FROM webhooks WHERE id = $1 FOR UPDATE SKIP LOCKED',
          [id],
        );
        if (!rows[0]) return 0;
        const hook = webhookFromRow(rows[0]);
        const { rows: events } = await client.query<EventRow>(
          `SELECT seq, sandbox_id, type FROM events WHERE owner_key = $1 AND seq > $2
             ORDER BY seq LIMIT $3`,
          [rows[0].owner_key, hook.cursor, batch],
        );
        const last = events.at(-1);
        if (!last) return 0;
        const taken = hook.enabled ? events.filter((e) => takes(hook, e.type)) : [];
        let count = 0;
        if (taken.length > 0) {
          const result = await client.query(
            `INSERT INTO webhook_deliveries (id, webhook_id, event_seq, sandbox_id, state,
               attempts, next_attempt_at, created_at)
             SELECT unnest($1::text[]), $2, unnest($3::bigint[]), unnest($4::text[]), 'pending',
               0, $5, $5
             ON CONFLICT (webhook_id, event_seq) DO NOTHING`,
            [
              taken.map(() => this.newId()),
              id,
              taken.map((e) => e.seq),
              taken.map((e) => e.sandbox_id),
              now,
            ],
          );
          count = result.rowCount ?? 0;
        }
        await client.query('UPDATE webhooks SET cursor = $1 WHERE id = $2', [last.seq, id]);
        return count;
      });
    }
    return written;
  }

  async claimDue(now: number, leaseMs: number, limit: number): Promise<ClaimedDelivery[]> {
    if (limit <= 0) return [];
    return this.db.transaction(async (client) => {
      const { rows } = await client.query(
        `UPDATE webhook_deliveries SET claimed_until = $2, attempts = attempts + 1
         WHERE id IN (
           SELECT d.id FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
           WHERE d.state = 'pending' AND d.next_attempt_at <= $1
             AND (d.claimed_until IS NULL OR d.claimed_until <= $1) AND w.enabled
             AND NOT EXISTS (SELECT 1 FROM webhook_deliveries p WHERE p.webhook_id = d.webhook_id
               AND p.sandbox_id = d.sandbox_id AND p.state = 'pending'
               AND p.event_seq < d.event_seq)
           ORDER BY d.event_seq LIMIT $3
           FOR UPDATE OF d SKIP LOCKED)
         RETURNING *`,
        [now, now + leaseMs, limit],
      );
      const deliveries = rows.map((row) => deliveryFromRow(row as never));
      if (deliveries.length === 0) return [];
      const { rows: hooks } = await client.query<WebhookRow>(
        'SELECT * FROM webhooks WHERE id = ANY($1::text[])',
        [[...new Set(deliveries.map((d) => d.webhookId))]],
      );
      const { rows: events } = await client.query<EventRow>(
        'SELECT * FROM events WHERE seq = ANY($1::bigint[])',
        [deliveries.map((d) => d.eventSeq)],
      );
      const hookOf = new Map(hooks.map((h) => [h.id, webhookFromRow(h)]));
      const eventOf = new Map(events.map((e) => [Number(e.seq), eventFromRow(e)]));
      return deliveries
        .sort((a, b) => a.eventSeq - b.eventSeq)
        .map((delivery) => ({
          delivery,
          webhook: hookOf.get(delivery.webhookId) as WebhookRecord,
          event: eventOf.get(delivery.eventSeq),
        }));
    });
  }

  async finishDelivery(id: string, outcome: DeliveryOutcome): Promise<void> {
    await this.db.query(
      `UPDATE webhook_deliveries SET state = $2, claimed_until = NULL, last_status = $3,
         last_error = $4, next_attempt_at = COALESCE($5, next_attempt_at), delivered_at = $6
       WHERE id = $1 AND state = 'pending'`,
      [
        id,
        outcome.state,
        outcome.status,
        outcome.state === 'delivered' ? null : outcome.error,
        outcome.state === 'pending' ? outcome.nextAttemptAt : null,
        outcome.state === 'delivered' ? outcome.at : null,
      ],
    );
  }

  async purgeDeliveries(before: number): Promise<number> {
    const result = await this.db.query(
      `DELETE FROM webhook_deliveries WHERE state IN ('delivered', 'failed') AND created_at < $1`,
      [before],
    );
    return (result as { rowCount?: number }).rowCount ?? 0;
  }

  async getDelivery(webhookId: string, id: string): Promise<DeliveryRecord | undefined> {
    const { rows } = await this.db.query(
      'SELECT * FROM webhook_deliveries WHERE id = $1 AND webhook_id = $2',
      [id, webhookId],
    );
    return rows[0] && deliveryFromRow(rows[0] as never);
  }

  async insertTestDelivery(webhookId: string, now: number): Promise<DeliveryRecord | undefined> {
    const { rows } = await this.db.query(
      `INSERT INTO webhook_deliveries (id, webhook_id, event_seq, sandbox_id, state, attempts,
         next_attempt_at, created_at)
       SELECT $1, $2, $3, '', 'pending', 0, $4, $4
       WHERE (SELECT COUNT(*) FROM webhook_deliveries WHERE webhook_id = $2
         AND event_seq < 0 AND state = 'pending') < $5
       RETURNING *`,
      [this.newId(), webhookId, testSeq(now), now, TEST_PENDING_MAX],
    );
    // Due now: this daemon's dispatcher need not wait for its poll (the others poll).
    if (rows[0]) this.wakes.signal();
    return rows[0] && deliveryFromRow(rows[0] as never);
  }

  async restartDelivery(
    webhookId: string,
    id: string,
    now: number,
  ): Promise<DeliveryRecord | undefined> {
    const { rows } = await this.db.query(
      `UPDATE webhook_deliveries d SET state = 'pending', attempts = 0, next_attempt_at = $3,
         claimed_until = NULL, last_status = NULL, last_error = NULL, delivered_at = NULL,
         created_at = $3
       WHERE d.id = $1 AND d.webhook_id = $2 AND d.state IN ('delivered', 'failed')
         AND (d.event_seq < 0 OR EXISTS (SELECT 1 FROM events e WHERE e.seq = d.event_seq))
       RETURNING *`,
      [id, webhookId, now],
    );
    if (rows[0]) this.wakes.signal();
    return rows[0] && deliveryFromRow(rows[0] as never);
  }
}

/** A LISTEN on {@link EVENTS_CHANNEL} that signals `wakes` at each notification, until stopped. */
function listenForEvents(make: () => Pg.Client, wakes: EventWakes): { stop(): Promise<void> } {
  let stopped = false;
  let client: Pg.Client | undefined;
  let retry: NodeJS.Timeout | undefined;
  const connect = async (again: boolean) => {
    if (stopped) return;
    const current = make();
    client = current;
    let broken = false;
    const broke = () => {
      if (broken) return;
      broken = true;
      current.removeAllListeners('notification');
      current.end().catch(() => undefined);
      if (stopped) return;
      retry = setTimeout(() => void connect(true), LISTEN_RETRY_MS);
      retry.unref();
    };
    // An error of an idle client is emitted here; unheard, it would end the process.
    current.on('error', broke);
    current.on('end', broke);
    current.on('notification', () => wakes.signal());
    try {
      await current.connect();
      await current.query(`LISTEN ${EVENTS_CHANNEL}`);
      // Events written while it was not listening: the listeners look once.
      if (again) wakes.signal();
    } catch {
      broke();
    }
  };
  void connect(false);
  return {
    async stop() {
      stopped = true;
      clearTimeout(retry);
      await client?.end().catch(() => undefined);
    },
  };
}
