import { createRequire } from 'node:module';
import type * as Pg from 'pg';
import { UnavailableError } from '../errors.js';
import type { SandboxHandle } from '../providers/provider.js';
import type { AuditFilter, AuditKind, AuditRecord, NewAuditRecord } from './audit.js';
import {
  EVENTS_CHANNEL,
  EVENTS_LOCK,
  type EventDraft,
  type EventFilter,
  eventFor,
  type NewSandboxEvent,
  type SandboxEvent,
  type SandboxEventType,
} from './events.js';
import { MIGRATIONS, SCHEMA_VERSION, tooNewError } from './migrations.js';
import { PostgresWebhookStore } from './postgres-webhooks.js';
import type {
  ApiKeyRecord,
  EndState,
  LifecycleRecord,
  PauseRecord,
  Registry,
  SandboxFilter,
  SandboxOwner,
  SandboxRecord,
  SandboxState,
  SealedSecretVersion,
  SecretChange,
  SecretRecord,
  TemplateRecord,
  VolumeRecord,
  VolumeRemoval,
} from './registry.js';
import { volumeMountsJson, volumeNeedle } from './registry.js';
import { boundClauses } from './row-bounds.js';
import { newDeliveryId, type WebhookStore } from './webhook-store.js';

/** A new connection to PostgreSQL must be made within this, or the request fails with 503. */
export const DATABASE_CONNECT_TIMEOUT_MS = 5000;
/** PostgreSQL cancels a statement that runs (or waits for a lock) longer than this. */
export const DATABASE_STATEMENT_TIMEOUT_MS = 10_000;
/**
 * The client gives up on an answer after this (a network partition leaves a statement without
 * any answer, which the server's own timeout cannot end).
 */
export const DATABASE_QUERY_TIMEOUT_MS = 15_000;
/** Connections a daemon keeps open to PostgreSQL at most. */
export const DATABASE_POOL_MAX = 10;
/** An idle connection is closed after this. */
export const DATABASE_IDLE_TIMEOUT_MS = 30_000;

/**
 * pg, loaded by the first PostgreSQL registry: requiring it costs milliseconds that a daemon on
 * SQLite (the default, started on demand) and every CLI command would pay for nothing.
 */
let pgModule: typeof Pg | undefined;
function loadPg(): typeof Pg {
  pgModule ??= createRequire(import.meta.url)('pg') as typeof Pg;
  return pgModule;
}

/** Two daemons migrating at once: the second waits for the first behind this advisory lock. */
const MIGRATION_LOCK = 0x61627821; // "abx!"
/** The advisory lock class of template writes (with the hash of the name). */
const TEMPLATE_LOCK = 0x61627874; // "abxt"

/** A database URL without its password, fit for messages and logs. */
export function redactUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    return parsed.toString();
  } catch {
    return '(a database URL that does not parse)';
  }
}

/** SQLSTATE classes that mean the server, not the statement, is the problem. */
const UNAVAILABLE_SQLSTATE = /^(08|53|57P0)/;
/** Node socket errors. */
const SOCKET_ERRORS = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EPIPE',
  'ENOENT',
]);

/**
 * True when an error of pg says the database cannot be reached, as opposed to a statement the
 * server refused: a socket error (ECONNREFUSED...), a server error whose SQLSTATE is about the
 * connection or the server's state (08, 53, 57P0x) or our statement timeout (57014), or one of
 * the plain `Error`s without a code pg raises for a connection that ended or timed out.
 */
export function isUnreachable(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  if (pgModule && error instanceof pgModule.DatabaseError) {
    return typeof code === 'string' && (code === '57014' || UNAVAILABLE_SQLSTATE.test(code));
  }
  if (typeof code === 'string') return SOCKET_ERRORS.has(code);
  return error.constructor === Error;
}

/** The 503 an API request gets while the database does not answer. */
export function databaseUnavailable(location: string, error: unknown): UnavailableError {
  const why = error instanceof Error ? error.message || (error as { code?: string }).code : error;
  return new UnavailableError(
    `the registry database ${location} does not answer (${why}); requests that need it fail until it is back, and the daemon reconnects by itself`,
    { code: 'database_unavailable', cause: error },
  );
}

interface SandboxRow {
  id: string;
  template: string;
  state: SandboxState;
  metadata: Record<string, string>;
  created_at: string;
  expires_at: string;
  ended_at: string | null;
  end_reason: string | null;
  token_hash: string;
  handle: SandboxRecord['handle'];
  capabilities: string[];
  owner_key: string | null;
  paused: SandboxRecord['paused'];
  lifecycle: SandboxRecord['lifecycle'];
  volume_mounts: SandboxRecord['volumeMounts'] | null;
}

// BIGINT arrives as a string (it may not fit a double); milliseconds since 1970 do.
const fromRow = (row: SandboxRow): SandboxRecord => ({
  id: row.id,
  template: row.template,
  state: row.state,
  metadata: row.metadata,
  createdAt: Number(row.created_at),
  expiresAt: Number(row.expires_at),
  endedAt: row.ended_at === null ? null : Number(row.ended_at),
  endReason: row.end_reason,
  tokenHash: row.token_hash,
  handle: row.handle,
  capabilities: row.capabilities,
  owner: row.owner_key ?? null,
  paused: row.paused ?? null,
  lifecycle: row.lifecycle ?? null,
  volumeMounts: row.volume_mounts ?? [],
});

interface VolumeRow {
  id: string;
  name: string;
  owner_key: string;
  size_bytes: string;
  created_at: string;
}

const volumeFromRow = (row: VolumeRow): VolumeRecord => ({
  id: row.id,
  name: row.name,
  owner: row.owner_key === '' ? null : row.owner_key,
  sizeBytes: Number(row.size_bytes),
  createdAt: Number(row.created_at),
});

interface SecretRow {
  id: string;
  name: string;
  owner_key: string;
  metadata: Record<string, string>;
  version: number;
  created_at: string;
  updated_at: string;
}

const secretFromRow = (row: SecretRow): SecretRecord => ({
  id: row.id,
  name: row.name,
  owner: row.owner_key === '' ? null : row.owner_key,
  metadata: row.metadata,
  version: row.version,
  createdAt: Number(row.created_at),
  updatedAt: Number(row.updated_at),
});

interface SecretVersionRow {
  version: number;
  sealed: string;
  key_check: string;
  created_at: string;
}

const INSERT_SECRET_VERSION = `INSERT INTO secret_versions
  (secret_id, version, sealed, key_check, created_at) VALUES ($1, $2, $3, $4, $5)`;

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
  type: row.type as SandboxEventType,
  data: row.data,
});

/**
 * Inserts an event in `client`'s transaction, after {@link EVENTS_LOCK}: held to the commit, it
 * lines up event inserts, so `seq` (taken inside it) grows in commit order and a reader following
 * `seq > cursor` never passes a row that commits later.
 */
async function insertEvent(client: Pg.PoolClient, event: NewSandboxEvent): Promise<SandboxEvent> {
  await client.query('SELECT pg_advisory_xact_lock($1)', [EVENTS_LOCK]);
  // An event whose id is taken already is not written again (the caller gets that one). A new
  // one NOTIFYs EVENTS_CHANNEL with its seq, in the same statement: sent at the commit, to every
  // daemon listening (webhook deliveries wake), and not at all on a rollback.
  const { rows } = await client.query<EventRow>(
    `WITH added AS (
       INSERT INTO events (id, at, sandbox_id, owner_key, template, type, data)
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING RETURNING *)
     SELECT added.* FROM added
       CROSS JOIN LATERAL (SELECT pg_notify('${EVENTS_CHANNEL}', added.seq::text)) AS woke
     UNION ALL SELECT * FROM events WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM added)`,
    [
      event.id,
      event.at,
      event.sandboxId,
      event.owner ?? '',
      event.template,
      event.type,
      JSON.stringify(event.data),
    ],
  );
  return eventFromRow(rows[0] as EventRow);
}

/** What an event needs of the row a change touched. */
interface ChangedRow {
  id: string;
  owner_key: string | null;
  template: string;
}

/** Records `draft` as the event of the row `rows[0]` (when a row was changed) in `client`'s transaction. */
async function eventOf(
  client: Pg.PoolClient,
  rows: ChangedRow[],
  draft: EventDraft | undefined,
): Promise<boolean> {
  const row = rows[0];
  if (!row) return false;
  if (draft) {
    await insertEvent(
      client,
      eventFor({ id: row.id, owner: row.owner_key ?? null, template: row.template }, draft),
    );
  }
  return true;
}

const CHANGED = 'RETURNING id, owner_key, template';

/** The live sandboxes that mount a volume (`$1`: its {@link volumeNeedle}). */
const USERS_OF_VOLUME = `SELECT id FROM sandboxes
  WHERE state IN ('running', 'paused', 'pooled') AND strpos(volume_mounts::text, $1) > 0
  ORDER BY created_at, id`;

/** Running sandboxes of the key `$N` (a subquery of the statements that check limits). */
const runningOf = (param: string) =>
  `(SELECT COUNT(*) FROM sandboxes WHERE owner_key = ${param} AND state = 'running')`;

interface ApiKeyRow {
  id: string;
  name: string;
  prefix: string;
  key_hash: string;
  admin: boolean;
  max_running: number | null;
  created_at: string;
  last_used_at: string | null;
  revoked_at: string | null;
}

const keyFromRow = (row: ApiKeyRow): ApiKeyRecord => ({
  id: row.id,
  name: row.name,
  prefix: row.prefix,
  keyHash: row.key_hash,
  admin: row.admin,
  maxRunning: row.max_running,
  createdAt: Number(row.created_at),
  lastUsedAt: row.last_used_at === null ? null : Number(row.last_used_at),
  revokedAt: row.revoked_at === null ? null : Number(row.revoked_at),
});

interface TemplateRow {
  name: string;
  spec: string;
  dir: string | null;
  image: string | null;
  built_at: string;
  owner_key: string | null;
  shared: boolean;
}

const templateFromRow = (row: TemplateRow): TemplateRecord => ({
  name: row.name,
  spec: JSON.parse(row.spec),
  dir: row.dir,
  image: row.image,
  builtAt: Number(row.built_at),
  owner: row.owner_key,
  shared: row.shared,
});

export interface PostgresRegistryOptions {
  /** Called when an idle connection breaks (the database went away); default: a log line. */
  onIdleError?: (error: Error) => void;
}

/**
 * The registry in PostgreSQL (`ABX_DATABASE_URL`): what several daemons share. Every change of
 * state is one conditional statement (`UPDATE … WHERE state = 'running'`, the pool's claim with
 * `FOR UPDATE SKIP LOCKED`), so replicas never both win a race. A statement that fails because
 * the database cannot be reached throws {@link UnavailableError} (503, code
 * `database_unavailable`); pg's pool makes new connections on the next statement, so the daemon
 * works again as soon as the database answers.
 */
export class PostgresRegistry implements Registry {
  readonly kind = 'postgres';
  readonly location: string;
  private readonly pool: Pg.Pool;
  readonly webhooks: WebhookStore;

  constructor(url: string, options: PostgresRegistryOptions = {}) {
    this.location = redactUrl(url);
    this.pool = new (loadPg().Pool)({
      connectionString: url,
      max: DATABASE_POOL_MAX,
      connectionTimeoutMillis: DATABASE_CONNECT_TIMEOUT_MS,
      idleTimeoutMillis: DATABASE_IDLE_TIMEOUT_MS,
      statement_timeout: DATABASE_STATEMENT_TIMEOUT_MS,
      query_timeout: DATABASE_QUERY_TIMEOUT_MS,
      keepAlive: true,
      application_name: 'abx-daemon',
    });
    // An idle connection that breaks emits here; unheard, it would end the process.
    const onIdleError =
      options.onIdleError ??
      ((error: Error) =>
        console.error(`registry: a connection to ${this.location} broke: ${error.message}`));
    this.pool.on('error', onIdleError);
    this.webhooks = new PostgresWebhookStore(
      {
        query: (sql, params) => this.query(sql, params),
        transaction: (work) => this.transaction(work),
        // A connection of its own, outside the pool, held open for LISTEN.
        listener: () =>
          new (loadPg().Client)({
            connectionString: url,
            connectionTimeoutMillis: DATABASE_CONNECT_TIMEOUT_MS,
            // LISTEN itself answers at once; a server gone silent is found by keep-alive.
            query_timeout: DATABASE_QUERY_TIMEOUT_MS,
            keepAlive: true,
            keepAliveInitialDelayMillis: 10_000,
            application_name: 'abx-daemon-listen',
          }),
      },
      newDeliveryId,
    );
  }

  private async query<Row extends Pg.QueryResultRow>(
    sql: string,
    params: unknown[] = [],
  ): Promise<Pg.QueryResult<Row>> {
    try {
      return await this.pool.query<Row>(sql, params);
    } catch (error) {
      throw isUnreachable(error) ? databaseUnavailable(this.location, error) : error;
    }
  }

  /** Runs `work` in one transaction on one connection. */
  private async transaction<T>(work: (client: Pg.PoolClient) => Promise<T>): Promise<T> {
    let client: Pg.PoolClient;
    try {
      client = await this.pool.connect();
    } catch (error) {
      throw isUnreachable(error) ? databaseUnavailable(this.location, error) : error;
    }
    let broken = false;
    try {
      await client.query('BEGIN');
      const result = await work(client);
      await client.query('COMMIT');
      return result;
    } catch (error) {
      await client.query('ROLLBACK').catch(() => {
        broken = true;
      });
      throw isUnreachable(error) ? databaseUnavailable(this.location, error) : error;
    } finally {
      client.release(broken);
    }
  }

  async migrate(): Promise<void> {
    await this.transaction(async (client) => {
      await client.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK]);
      await client.query(`CREATE TABLE IF NOT EXISTS schema_migrations (
        version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)`);
      const { rows } = await client.query<{ version: number }>(
        'SELECT version FROM schema_migrations',
      );
      const applied = new Set(rows.map((row) => row.version));
      const newest = Math.max(0, ...applied);
      if (newest > SCHEMA_VERSION) throw tooNewError(this.location, newest);
      for (const migration of MIGRATIONS) {
        if (applied.has(migration.version)) continue;
        await client.query(migration.postgres);
        await client.query(
          'INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)',
          [migration.version, migration.name, Date.now()],
        );
      }
    });
  }

  /** The versions applied, in order. */
  async appliedVersions(): Promise<number[]> {
    const { rows } = await this.query<{ version: number }>(
      'SELECT version FROM schema_migrations ORDER BY version',
    );
    return rows.map((row) => row.version);
  }

  async insertSandbox(
    record: SandboxRecord,
    maxRunning?: number | null,
    event?: EventDraft,
  ): Promise<boolean> {
    const limited = maxRunning != null && record.owner !== null && record.state === 'running';
    const insert = `INSERT INTO sandboxes (id, template, state, metadata, created_at, expires_at,
         ended_at, end_reason, token_hash, handle, capabilities, owner_key, lifecycle, volume_mounts)
       SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14
       ${limited ? `WHERE ${runningOf('$12')} < $15` : ''} ${CHANGED}`;
    const params = [
      record.id,
      record.template,
      record.state,
      JSON.stringify(record.metadata),
      record.createdAt,
      record.expiresAt,
      record.endedAt,
      record.endReason,
      record.tokenHash,
      JSON.stringify(record.handle),
      JSON.stringify(record.capabilities),
      record.owner,
      record.lifecycle === null ? null : JSON.stringify(record.lifecycle),
      volumeMountsJson(record.volumeMounts),
      ...(limited ? [maxRunning] : []),
    ];
    const volumes = [...new Set(record.volumeMounts.map((m) => m.id))];
    if (!limited && volumes.length === 0 && !event) {
      return (await this.query(insert, params)).rowCount === 1;
    }
    return this.transaction(async (client) => {
      // Its volumes' rows, share-locked until commit: a removal (which locks the row for update)
      // waits for this row and then sees the sandbox, or went first and the volume is gone.
      if (volumes.length > 0) {
        const { rowCount } = await client.query(
          'SELECT 1 FROM volumes WHERE id = ANY($1::text[]) FOR SHARE',
          [volumes],
        );
        if (rowCount !== volumes.length) return false;
      }
      // The key's row, locked until commit, lines up the creates of that key on every replica:
      // each counts after the one before it committed its row.
      if (limited) {
        await client.query('SELECT 1 FROM api_keys WHERE id = $1 FOR UPDATE', [record.owner]);
      }
      return eventOf(client, (await client.query<ChangedRow>(insert, params)).rows, event);
    });
  }

  async getSandbox(id: string): Promise<SandboxRecord | undefined> {
    const { rows } = await this.query<SandboxRow>('SELECT * FROM sandboxes WHERE id = $1', [id]);
    return rows[0] && fromRow(rows[0]);
  }

  async listSandboxes(filter: SandboxFilter = {}): Promise<SandboxRecord[]> {
    const where: string[] = [];
    const params: unknown[] = [];
    const param = (value: unknown) => {
      params.push(value);
      return `$${params.length}`;
    };
    where.push(
      filter.state ? `state = ANY(${param([filter.state].flat())}::text[])` : "state <> 'pooled'",
    );
    if (filter.template) where.push(`template = ${param(filter.template)}`);
    if (filter.owner !== undefined) where.push(`owner_key = ${param(filter.owner)}`);
    for (const [key, value] of Object.entries(filter.metadata ?? {})) {
      where.push(`metadata ->> ${param(key)} = ${param(value)}`);
    }
    const { rows } = await this.query<SandboxRow>(
      `SELECT * FROM sandboxes WHERE ${where.join(' AND ')} ORDER BY created_at, id`,
      params,
    );
    return rows.map(fromRow);
  }

  async claimPooled(
    template: string,
    metadata: Record<string, string>,
    now: number,
    expiresAt: number,
    owner?: SandboxOwner,
    event?: EventDraft,
  ): Promise<SandboxRecord | undefined> {
    const limited = owner !== undefined && owner.maxRunning !== null;
    // SKIP LOCKED: concurrent claims (of any daemon) each take another row, none waits.
    const claim = `UPDATE sandboxes SET state = 'running', metadata = $1, created_at = $2,
         expires_at = $3, owner_key = $5
       WHERE state = 'pooled' AND id = (
         SELECT id FROM sandboxes WHERE state = 'pooled' AND template = $4
         ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
       ${limited ? `AND ${runningOf('$5')} < $6` : ''}
       RETURNING *`;
    const params = [
      JSON.stringify(metadata),
      now,
      expiresAt,
      template,
      owner?.keyId ?? null,
      ...(limited ? [owner.maxRunning] : []),
    ];
    if (!limited && !event) {
      const { rows } = await this.query<SandboxRow>(claim, params);
      return rows[0] && fromRow(rows[0]);
    }
    // As in insertSandbox: the key's row lock lines up its creates across replicas.
    return this.transaction(async (client) => {
      if (limited) {
        await client.query('SELECT 1 FROM api_keys WHERE id = $1 FOR UPDATE', [owner.keyId]);
      }
      const { rows } = await client.query<SandboxRow>(claim, params);
      await eventOf(client, rows, event);
      return rows[0] && fromRow(rows[0]);
    });
  }

  async countPooled(template: string): Promise<number> {
    const { rows } = await this.query<{ n: string }>(
      `SELECT COUNT(*) AS n FROM sandboxes WHERE state = 'pooled' AND template = $1`,
      [template],
    );
    return Number(rows[0]?.n ?? 0);
  }

  async countLive(): Promise<{ state: SandboxState; template: string; count: number }[]> {
    const { rows } = await this.query<{ state: SandboxState; template: string; count: string }>(
      'SELECT state, template, COUNT(*) AS count FROM sandboxes WHERE ended_at IS NULL GROUP BY state, template ORDER BY state, template',
    );
    return rows.map((row) => ({ ...row, count: Number(row.count) }));
  }

  /**
   * One conditional statement `sql` (ending in {@link CHANGED}); with an event, in a transaction
   * with the event of the row it changed.
   */
  private async change(
    sql: string,
    params: unknown[],
    event: EventDraft | undefined,
  ): Promise<boolean> {
    if (!event) return (await this.query(sql, params)).rowCount === 1;
    return this.transaction(async (client) =>
      eventOf(client, (await client.query<ChangedRow>(sql, params)).rows, event),
    );
  }

  async deleteSandbox(
    id: string,
    state: 'pooled' | 'running',
    event?: EventDraft,
  ): Promise<boolean> {
    return this.change(
      `DELETE FROM sandboxes WHERE id = $1 AND state = $2 ${CHANGED}`,
      [id, state],
      event,
    );
  }

  async endSandbox(
    id: string,
    state: EndState,
    reason: string,
    options: { expiredBy?: number; event?: EventDraft } = {},
  ): Promise<boolean> {
    const params: unknown[] = [state, reason, Date.now(), id];
    let due = '';
    if (options.expiredBy !== undefined) {
      params.push(options.expiredBy);
      due = ' AND expires_at <= $5';
    }
    return this.change(
      `UPDATE sandboxes SET state = $1, end_reason = $2, ended_at = $3
       WHERE id = $4 AND state IN ('running', 'paused')${due} ${CHANGED}`,
      params,
      options.event,
    );
  }

  async pauseSandbox(
    id: string,
    pause: PauseRecord,
    expiresAt: number,
    event?: EventDraft,
  ): Promise<boolean> {
    return this.change(
      `UPDATE sandboxes SET state = 'paused', paused = $1, expires_at = $2
       WHERE id = $3 AND state = 'running' ${CHANGED}`,
      [JSON.stringify(pause), expiresAt, id],
      event,
    );
  }

  async resumeSandbox(
    id: string,
    handle: SandboxHandle,
    expiresAt: number,
    maxRunning?: number | null,
    event?: EventDraft,
  ): Promise<boolean> {
    const limited = maxRunning != null;
    const resume = `UPDATE sandboxes SET state = 'running', paused = NULL, handle = $1,
         expires_at = $2
       WHERE id = $3 AND state = 'paused'
       ${limited ? `AND (owner_key IS NULL OR (SELECT COUNT(*) FROM sandboxes AS o WHERE o.owner_key = sandboxes.owner_key AND o.state = 'running') < $4)` : ''}
       ${CHANGED}`;
    const params = [JSON.stringify(handle), expiresAt, id, ...(limited ? [maxRunning] : [])];
    if (!limited) return this.change(resume, params, event);
    // As in insertSandbox: the owner's key row lines up its creates and resumes across replicas.
    return this.transaction(async (client) => {
      await client.query(
        'SELECT 1 FROM api_keys WHERE id = (SELECT owner_key FROM sandboxes WHERE id = $1) FOR UPDATE',
        [id],
      );
      return eventOf(client, (await client.query<ChangedRow>(resume, params)).rows, event);
    });
  }

  async setLifecycle(id: string, lifecycle: LifecycleRecord | null): Promise<boolean> {
    const { rowCount } = await this.query(
      `UPDATE sandboxes SET lifecycle = $1 WHERE id = $2 AND state = 'running'`,
      [lifecycle === null ? null : JSON.stringify(lifecycle), id],
    );
    return rowCount === 1;
  }

  async setExpiry(id: string, expiresAt: number, event?: EventDraft): Promise<boolean> {
    return this.change(
      `UPDATE sandboxes SET expires_at = $1 WHERE id = $2 AND state = 'running' ${CHANGED}`,
      [expiresAt, id],
      event,
    );
  }

  async setHandle(id: string, handle: SandboxHandle, event?: EventDraft): Promise<boolean> {
    return this.change(
      `UPDATE sandboxes SET handle = $1 WHERE id = $2 AND state = 'running' ${CHANGED}`,
      [JSON.stringify(handle), id],
      event,
    );
  }

  async expired(now = Date.now()): Promise<SandboxRecord[]> {
    const { rows } = await this.query<SandboxRow>(
      `SELECT * FROM sandboxes WHERE state IN ('running', 'paused') AND expires_at <= $1
       ORDER BY expires_at`,
      [now],
    );
    return rows.map(fromRow);
  }

  async endedSince(since: number): Promise<SandboxRecord[]> {
    const { rows } = await this.query<SandboxRow>(
      'SELECT * FROM sandboxes WHERE ended_at >= $1 ORDER BY ended_at, id',
      [since],
    );
    return rows.map(fromRow);
  }

  async upsertTemplate(
    record: TemplateRecord,
    check?: (previous: TemplateRecord | undefined) => void,
    event?: NewSandboxEvent,
  ): Promise<TemplateRecord | undefined> {
    // What the check throws is the caller's answer, never taken for a database failure.
    const refusal: { error?: unknown } = {};
    const checked = (previous: TemplateRecord | undefined) => {
      try {
        check?.(previous);
      } catch (error) {
        refusal.error = error;
        throw error;
      }
    };
    return this.transaction(async (client) => {
      // Until commit no other write of this name starts (a first build has no row to lock yet):
      // `check` sees what this write replaces, and a build racing this one reads it as previous.
      await client.query('SELECT pg_advisory_xact_lock($1, hashtext($2))', [
        TEMPLATE_LOCK,
        record.name,
      ]);
      const { rows } = await client.query<TemplateRow>(
        'SELECT * FROM templates WHERE name = $1 FOR UPDATE',
        [record.name],
      );
      const previous = rows[0] && templateFromRow(rows[0]);
      checked(previous);
      // A rebuild keeps the owner and sharing of what it replaces.
      await client.query(
        `INSERT INTO templates (name, spec, dir, image, built_at, owner_key, shared)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, dir = excluded.dir,
           image = excluded.image, built_at = excluded.built_at`,
        [
          record.name,
          JSON.stringify(record.spec),
          record.dir,
          record.image,
          record.builtAt,
          record.owner,
          record.shared,
        ],
      );
      if (event) await insertEvent(client, event);
      return previous;
    }).catch((error: unknown) => {
      throw refusal.error ?? error;
    });
  }

  async setTemplateShared(name: string, shared: boolean): Promise<TemplateRecord | undefined> {
    const { rows } = await this.query<TemplateRow>(
      'UPDATE templates SET shared = $2 WHERE name = $1 RETURNING *',
      [name, shared],
    );
    return rows[0] && templateFromRow(rows[0]);
  }

  async getTemplate(name: string): Promise<TemplateRecord | undefined> {
    const { rows } = await this.query<TemplateRow>('SELECT * FROM templates WHERE name = $1', [
      name,
    ]);
    return rows[0] && templateFromRow(rows[0]);
  }

  async listTemplates(): Promise<TemplateRecord[]> {
    const { rows } = await this.query<TemplateRow>('SELECT * FROM templates ORDER BY name');
    return rows.map(templateFromRow);
  }

  async removeTemplate(name: string): Promise<TemplateRecord | undefined> {
    const { rows } = await this.query<TemplateRow>(
      'DELETE FROM templates WHERE name = $1 RETURNING *',
      [name],
    );
    return rows[0] && templateFromRow(rows[0]);
  }

  async insertApiKey(record: ApiKeyRecord): Promise<boolean> {
    // The unique index on active names turns a duplicate into no change.
    const { rowCount } = await this.query(
      `INSERT INTO api_keys (id, name, prefix, key_hash, admin, max_running, created_at,
         last_used_at, revoked_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING`,
      [
        record.id,
        record.name,
        record.prefix,
        record.keyHash,
        record.admin,
        record.maxRunning,
        record.createdAt,
        record.lastUsedAt,
        record.revokedAt,
      ],
    );
    return rowCount === 1;
  }

  async findApiKey(keyHash: string): Promise<ApiKeyRecord | undefined> {
    const { rows } = await this.query<ApiKeyRow>('SELECT * FROM api_keys WHERE key_hash = $1', [
      keyHash,
    ]);
    return rows[0] && keyFromRow(rows[0]);
  }

  async getApiKey(id: string): Promise<ApiKeyRecord | undefined> {
    const { rows } = await this.query<ApiKeyRow>('SELECT * FROM api_keys WHERE id = $1', [id]);
    return rows[0] && keyFromRow(rows[0]);
  }

  async listApiKeys(): Promise<(ApiKeyRecord & { running: number })[]> {
    const { rows } = await this.query<ApiKeyRow & { running: string }>(
      `SELECT k.*, (SELECT COUNT(*) FROM sandboxes s
                    WHERE s.owner_key = k.id AND s.state = 'running') AS running
       FROM api_keys k ORDER BY k.created_at, k.id`,
    );
    return rows.map((row) => ({ ...keyFromRow(row), running: Number(row.running) }));
  }

  async revokeApiKey(id: string, now: number): Promise<ApiKeyRecord | undefined> {
    const { rows } = await this.query<ApiKeyRow>(
      'UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2 RETURNING *',
      [now, id],
    );
    return rows[0] && keyFromRow(rows[0]);
  }

  async touchApiKey(id: string, now: number): Promise<void> {
    await this.query('UPDATE api_keys SET last_used_at = $1 WHERE id = $2', [now, id]);
  }

  async insertVolume(record: VolumeRecord): Promise<boolean> {
    const { rowCount } = await this.query(
      `INSERT INTO volumes (id, name, owner_key, size_bytes, created_at) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (owner_key, name) DO NOTHING`,
      [record.id, record.name, record.owner ?? '', record.sizeBytes, record.createdAt],
    );
    return rowCount === 1;
  }

  async getVolume(id: string): Promise<VolumeRecord | undefined> {
    const { rows } = await this.query<VolumeRow>('SELECT * FROM volumes WHERE id = $1', [id]);
    return rows[0] && volumeFromRow(rows[0]);
  }

  async findVolume(owner: string | null, name: string): Promise<VolumeRecord | undefined> {
    const { rows } = await this.query<VolumeRow>(
      'SELECT * FROM volumes WHERE owner_key = $1 AND name = $2',
      [owner ?? '', name],
    );
    return rows[0] && volumeFromRow(rows[0]);
  }

  async listVolumes(owner?: string | null): Promise<VolumeRecord[]> {
    const { rows } =
      owner === undefined
        ? await this.query<VolumeRow>('SELECT * FROM volumes ORDER BY name, owner_key')
        : await this.query<VolumeRow>('SELECT * FROM volumes WHERE owner_key = $1 ORDER BY name', [
            owner ?? '',
          ]);
    return rows.map(volumeFromRow);
  }

  async volumeUsers(id: string): Promise<string[]> {
    const { rows } = await this.query<{ id: string }>(USERS_OF_VOLUME, [volumeNeedle(id)]);
    return rows.map((row) => row.id);
  }

  async removeVolume(id: string): Promise<VolumeRemoval> {
    return this.transaction(async (client) => {
      // Waits for creates that share-locked the row (see insertSandbox), then holds it.
      const locked = await client.query('SELECT 1 FROM volumes WHERE id = $1 FOR UPDATE', [id]);
      if (locked.rowCount !== 1) return { removed: false, users: [] };
      const { rows } = await client.query<{ id: string }>(USERS_OF_VOLUME, [volumeNeedle(id)]);
      if (rows.length > 0) return { removed: false, users: rows.map((row) => row.id) };
      await client.query('DELETE FROM volumes WHERE id = $1', [id]);
      return { removed: true, users: [] };
    });
  }

  async insertSecret(record: SecretRecord, first: SealedSecretVersion): Promise<boolean> {
    return this.transaction(async (client) => {
      const { rowCount } = await client.query(
        `INSERT INTO secrets (id, name, owner_key, metadata, version, created_at, updated_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (owner_key, name) DO NOTHING`,
        [
          record.id,
          record.name,
          record.owner ?? '',
          JSON.stringify(record.metadata),
          record.version,
          record.createdAt,
          record.updatedAt,
        ],
      );
      if (rowCount !== 1) return false;
      await client.query(INSERT_SECRET_VERSION, [
        record.id,
        first.version,
        first.sealed,
        first.keyCheck,
        first.createdAt,
      ]);
      return true;
    });
  }

  async getSecret(id: string): Promise<SecretRecord | undefined> {
    const { rows } = await this.query<SecretRow>('SELECT * FROM secrets WHERE id = $1', [id]);
    return rows[0] && secretFromRow(rows[0]);
  }

  async findSecret(owner: string | null, name: string): Promise<SecretRecord | undefined> {
    const { rows } = await this.query<SecretRow>(
      'SELECT * FROM secrets WHERE owner_key = $1 AND name = $2',
      [owner ?? '', name],
    );
    return rows[0] && secretFromRow(rows[0]);
  }

  async listSecrets(owner?: string | null): Promise<SecretRecord[]> {
    const { rows } =
      owner === undefined
        ? await this.query<SecretRow>('SELECT * FROM secrets ORDER BY name, owner_key')
        : await this.query<SecretRow>('SELECT * FROM secrets WHERE owner_key = $1 ORDER BY name', [
            owner ?? '',
          ]);
    return rows.map(secretFromRow);
  }

  async updateSecret(id: string, change: SecretChange): Promise<SecretRecord | undefined> {
    return this.transaction(async (client) => {
      const next = change.value ? change.from + 1 : change.from;
      // Conditional on the version the caller read: of two changes racing, one writes.
      const { rows } = await client.query<SecretRow>(
        `UPDATE secrets SET version = $1, metadata = COALESCE($2::json, metadata), updated_at = $3
           WHERE id = $4 AND version = $5 RETURNING *`,
        [
          next,
          change.metadata === undefined ? null : JSON.stringify(change.metadata),
          change.at,
          id,
          change.from,
        ],
      );
      if (!rows[0]) return undefined;
      if (change.value) {
        await client.query(INSERT_SECRET_VERSION, [
          id,
          next,
          change.value.sealed,
          change.value.keyCheck,
          change.value.createdAt,
        ]);
      }
      return secretFromRow(rows[0]);
    });
  }

  async currentSecretVersion(id: string): Promise<SealedSecretVersion | undefined> {
    const { rows } = await this.query<SecretVersionRow>(
      `SELECT v.version, v.sealed, v.key_check, v.created_at FROM secrets s
         JOIN secret_versions v ON v.secret_id = s.id AND v.version = s.version WHERE s.id = $1`,
      [id],
    );
    const row = rows[0];
    return (
      row && {
        version: row.version,
        sealed: row.sealed,
        keyCheck: row.key_check,
        createdAt: Number(row.created_at),
      }
    );
  }

  async removeSecret(id: string): Promise<boolean> {
    return this.transaction(async (client) => {
      await client.query('DELETE FROM secret_versions WHERE secret_id = $1', [id]);
      const { rowCount } = await client.query('DELETE FROM secrets WHERE id = $1', [id]);
      return rowCount === 1;
    });
  }

  async secretKeyChecks(): Promise<string[]> {
    const { rows } = await this.query<{ key_check: string }>(
      'SELECT DISTINCT key_check FROM secret_versions ORDER BY key_check',
    );
    return rows.map((row) => row.key_check);
  }

  async appendEvent(event: NewSandboxEvent): Promise<SandboxEvent> {
    return this.transaction((client) => insertEvent(client, event));
  }

  async listEvents(filter: EventFilter): Promise<SandboxEvent[]> {
    const where: string[] = [];
    const params: unknown[] = [];
    const param = (value: unknown) => {
      params.push(value);
      return `$${params.length}`;
    };
    if (filter.owner !== undefined) where.push(`owner_key = ${param(filter.owner ?? '')}`);
    if (filter.sandboxId !== undefined) where.push(`sandbox_id = ${param(filter.sandboxId)}`);
    if (filter.types && filter.types.length > 0) {
      where.push(`type = ANY(${param([...filter.types])}::text[])`);
    }
    where.push(...boundClauses(filter, param));
    const { rows } = await this.query<EventRow>(
      `SELECT * FROM events ${where.length > 0 ? `WHERE ${where.join(' AND ')}` : ''}
       ORDER BY seq ${filter.order === 'desc' ? 'DESC' : 'ASC'}
       LIMIT ${param(filter.limit)} OFFSET ${param(filter.offset ?? 0)}`,
      params,
    );
    return rows.map(eventFromRow);
  }

  async purgeEvents(before: number): Promise<number> {
    const { rowCount } = await this.query('DELETE FROM events WHERE at < $1', [before]);
    return rowCount ?? 0;
  }

  async agree(key: string, value: string): Promise<string> {
    const { rows } = await this.query<{ value: string }>(
      `INSERT INTO settings (key, value) VALUES ($1, $2)
       ON CONFLICT (key) DO UPDATE SET value = settings.value RETURNING value`,
      [key, value],
    );
    return (rows[0] as { value: string }).value;
  }

  async appendAudit(rows: readonly NewAuditRecord[]): Promise<void> {
    if (rows.length === 0) return;
    // One statement for the batch: rows go in as arrays, unnested in their order.
    await this.query(
      `INSERT INTO audit (at, sandbox_id, owner_key, actor, kind, data)
         SELECT r.at, r.sandbox_id, r.owner_key, r.actor, r.kind, r.data
           FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::json[])
           WITH ORDINALITY AS r(at, sandbox_id, owner_key, actor, kind, data, n) ORDER BY r.n`,
      [
        rows.map((row) => row.at),
        rows.map((row) => row.sandboxId),
        rows.map((row) => row.owner ?? ''),
        rows.map((row) => row.actor),
        rows.map((row) => row.kind),
        rows.map((row) => JSON.stringify(row.data)),
      ],
    );
  }

  async listAudit(filter: AuditFilter): Promise<AuditRecord[]> {
    const params: unknown[] = [];
    const param = (value: unknown) => {
      params.push(value);
      return `$${params.length}`;
    };
    const where = [`sandbox_id = ${param(filter.sandboxId)}`];
    if (filter.kinds && filter.kinds.length > 0) {
      where.push(`kind = ANY(${param([...filter.kinds])}::text[])`);
    }
    where.push(...boundClauses(filter, param));
    params.push(filter.limit);
    const { rows } = await this.query<{
      seq: string;
      at: string;
      sandbox_id: string;
      owner_key: string;
      actor: string | null;
      kind: string;
      data: Record<string, unknown>;
    }>(
      `SELECT * FROM audit WHERE ${where.join(' AND ')} ORDER BY seq LIMIT $${params.length}`,
      params,
    );
    return rows.map((row) => ({
      seq: Number(row.seq),
      at: Number(row.at),
      sandboxId: row.sandbox_id,
      owner: row.owner_key === '' ? null : row.owner_key,
      actor: row.actor,
      kind: row.kind as AuditKind,
      data: row.data,
    }));
  }

  async purgeAudit(before: number): Promise<number> {
    return (await this.query('DELETE FROM audit WHERE at < $1', [before])).rowCount ?? 0;
  }

  async close(): Promise<void> {
    await this.pool.end();
  }
}
