import type { SandboxHandle } from '../providers/provider.js';
import type { AuditFilter, AuditKind, AuditRecord, NewAuditRecord } from './audit.js';
import {
  type EventDraft,
  type EventFilter,
  EventWakes,
  eventFor,
  type NewSandboxEvent,
  type SandboxEvent,
  type SandboxEventType,
} from './events.js';
import { MIGRATIONS, SCHEMA_VERSION, tooNewError } from './migrations.js';
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
import { type DatabaseSync, lenient, openSqlite, type Statement, transaction } from './sqlite.js';
import { SqliteWebhookStore } from './sqlite-webhooks.js';
import { newDeliveryId, type WebhookStore } from './webhook-store.js';

interface AuditRow {
  seq: number;
  at: number;
  sandbox_id: string;
  owner_key: string;
  actor: string | null;
  kind: string;
  data: string;
}

/** SQLite's `param` for {@link boundClauses}: adds the value to `params`, writes `?`. */
const placeholder = (params: unknown[]) => (value: unknown) => {
  params.push(value);
  return '?';
};

interface TemplateRow {
  name: string;
  spec: string;
  dir: string | null;
  image: string | null;
  built_at: number;
  owner_key: string | null;
  shared: number;
}

const templateFromRow = (row: TemplateRow): TemplateRecord => ({
  name: row.name,
  spec: JSON.parse(row.spec),
  dir: row.dir,
  image: row.image ?? null,
  builtAt: row.built_at,
  owner: row.owner_key,
  shared: row.shared === 1,
});

interface SandboxRow {
  id: string;
  template: string;
  state: SandboxState;
  metadata: string;
  created_at: number;
  expires_at: number;
  ended_at: number | null;
  end_reason: string | null;
  token_hash: string;
  handle: string;
  capabilities: string;
  owner_key: string | null;
  paused: string | null;
  lifecycle: string | null;
  volume_mounts: string | null;
}

const fromRow = (row: SandboxRow): SandboxRecord => ({
  id: row.id,
  template: row.template,
  state: row.state,
  metadata: JSON.parse(row.metadata),
  createdAt: row.created_at,
  expiresAt: row.expires_at,
  endedAt: row.ended_at,
  endReason: row.end_reason,
  tokenHash: row.token_hash,
  handle: JSON.parse(row.handle),
  capabilities: JSON.parse(row.capabilities),
  owner: row.owner_key ?? null,
  paused: row.paused ? JSON.parse(row.paused) : null,
  lifecycle: row.lifecycle ? JSON.parse(row.lifecycle) : null,
  volumeMounts: row.volume_mounts ? JSON.parse(row.volume_mounts) : [],
});

interface VolumeRow {
  id: string;
  name: string;
  owner_key: string;
  size_bytes: number;
  created_at: number;
}

const volumeFromRow = (row: VolumeRow): VolumeRecord => ({
  id: row.id,
  name: row.name,
  owner: row.owner_key === '' ? null : row.owner_key,
  sizeBytes: row.size_bytes,
  createdAt: row.created_at,
});

interface SecretRow {
  id: string;
  name: string;
  owner_key: string;
  metadata: string;
  version: number;
  created_at: number;
  updated_at: number;
}

const secretFromRow = (row: SecretRow): SecretRecord => ({
  id: row.id,
  name: row.name,
  owner: row.owner_key === '' ? null : row.owner_key,
  metadata: JSON.parse(row.metadata),
  version: row.version,
  createdAt: row.created_at,
  updatedAt: row.updated_at,
});

interface SecretVersionRow {
  version: number;
  sealed: string;
  key_check: string;
  created_at: number;
}

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
  type: row.type as SandboxEventType,
  data: JSON.parse(row.data),
});

// An event whose id is taken already is not written again (the caller gets that one).
const INSERT_EVENT = `INSERT INTO events (id, at, sandbox_id, owner_key, template, type, data)
  VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING RETURNING *`;

/** The live sandboxes that mount a volume (`?`: its {@link volumeNeedle}). */
const USERS_OF_VOLUME = `SELECT id FROM sandboxes
  WHERE state IN ('running', 'paused', 'pooled') AND instr(volume_mounts, ?) > 0
  ORDER BY created_at, id`;

interface ApiKeyRow {
  id: string;
  name: string;
  prefix: string;
  key_hash: string;
  admin: number;
  max_running: number | null;
  created_at: number;
  last_used_at: number | null;
  revoked_at: number | null;
}

const keyFromRow = (row: ApiKeyRow): ApiKeyRecord => ({
  id: row.id,
  name: row.name,
  prefix: row.prefix,
  keyHash: row.key_hash,
  admin: row.admin === 1,
  maxRunning: row.max_running,
  createdAt: row.created_at,
  lastUsedAt: row.last_used_at,
  revokedAt: row.revoked_at,
});

/** Running sandboxes of the owner `@owner` (a subquery of the statements that check limits). */
const RUNNING_OF_OWNER = `(SELECT COUNT(*) FROM sandboxes WHERE owner_key = @owner AND state = 'running')`;

/**
 * The registry in one SQLite file under `$ABX_HOME` (the embedded default), through Node's own
 * `node:sqlite` (src/control/sqlite.ts). It is synchronous: each method runs to completion before it resolves, so one statement is one atomic
 * step, and `getSandboxNow` gives the gateway its lookup without a round trip.
 */
export class SqliteRegistry implements Registry {
  readonly kind = 'sqlite';
  private readonly db: DatabaseSync;
  /** Statements compiled once each (a prepare per call cost ~1 ms under load). */
  private readonly statements = new Map<string, Statement>();
  readonly webhooks: WebhookStore;
  /** Told of each event insert: the webhook deliveries wake (events.ts). */
  private readonly eventWakes = new EventWakes();

  constructor(readonly location: string) {
    this.db = openSqlite(location);
    // WAL lets readers (other CLI processes) in while the daemon writes.
    this.db.exec('PRAGMA journal_mode = WAL');
    // No fsync per commit (3 ms each on a VM's disk, one per create and kill); WAL still keeps
    // the file consistent, and what a power loss could forget (the last few changes) the daemon
    // recovers: a sandbox without a row is killed by the orphan sweep, a row of a dead sandbox is
    // ended at adoption.
    this.db.exec('PRAGMA synchronous = NORMAL');
    this.db.exec('PRAGMA busy_timeout = 5000');
    // Synchronous and cheap: the services may use the registry before anyone calls migrate().
    this.migrateNow();
    this.webhooks = new SqliteWebhookStore(this.db, newDeliveryId, this.eventWakes);
  }

  async migrate(): Promise<void> {
    this.migrateNow();
  }

  private migrateNow(): void {
    this.db.exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
      version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`);
    // IMMEDIATE takes the write lock first: two processes opening one file apply each step once.
    transaction(
      this.db,
      () => {
        const applied = new Set(
          (
            this.db.prepare('SELECT version FROM schema_migrations').all() as { version: number }[]
          ).map((row) => row.version),
        );
        const newest = Math.max(0, ...applied);
        if (newest > SCHEMA_VERSION) {
          throw tooNewError(this.location, newest);
        }
        for (const migration of MIGRATIONS) {
          if (applied.has(migration.version)) continue;
          if (typeof migration.sqlite === 'string') this.db.exec(migration.sqlite);
          else migration.sqlite(this.db);
          this.db
            .prepare('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)')
            .run(migration.version, migration.name, Date.now());
        }
      },
      'IMMEDIATE',
    );
  }
  /** The compiled statement of `sql`, from the cache (listSandboxes' filters make a few texts). */
  private statement(sql: string): Statement {
    let statement = this.statements.get(sql);
    if (!statement) {
      // A filter on many metadata keys makes a text of its own: the cache stays bounded.
      if (this.statements.size >= 64) this.statements.clear();
      // Records are passed whole: fields a statement does not name are left out.
      statement = lenient(this.db.prepare(sql));
      this.statements.set(sql, statement);
    }
    return statement;
  }

  /** The versions applied, in order (for tests and `abx doctor`-like checks). */
  async appliedVersions(): Promise<number[]> {
    return (
      this.statement('SELECT version FROM schema_migrations ORDER BY version').all() as {
        version: number;
      }[]
    ).map((row) => row.version);
  }

  /**
   * Runs `change` (one conditional statement; it answers the row it changed, or undefined) and,
   * when it changed one and there is an `event`, records the event of that row in the same
   * transaction. Without an event it is the statement alone, as before.
   */
  private changed(
    change: () => { id: string; owner_key: string | null; template: string } | undefined,
    event: EventDraft | undefined,
  ): boolean {
    if (!event) return change() !== undefined;
    return transaction(
      this.db,
      () => {
        const row = change();
        if (!row) return false;
        this.insertEvent(
          eventFor({ id: row.id, owner: row.owner_key ?? null, template: row.template }, event),
        );
        return true;
      },
      'IMMEDIATE',
    );
  }

  async insertSandbox(
    record: SandboxRecord,
    maxRunning?: number | null,
    event?: EventDraft,
  ): Promise<boolean> {
    // One statement holds the write lock from the count to the insert, for every process on the
    // file: two creates at a key's limit cannot both pass.
    const limited = maxRunning != null && record.owner !== null && record.state === 'running';
    const insert = () =>
      this.statement(
        `INSERT INTO sandboxes (id, template, state, metadata, created_at, expires_at, ended_at,
             end_reason, token_hash, handle, capabilities, owner_key, lifecycle, volume_mounts)
           SELECT @id, @template, @state, @metadata, @createdAt, @expiresAt, @endedAt, @endReason,
             @tokenHash, @handle, @capabilities, @owner, @lifecycle, @volumeMounts
           WHERE ${limited ? `${RUNNING_OF_OWNER} < @limit` : '1'}
             AND (SELECT COUNT(*) FROM volumes WHERE id IN (SELECT value FROM json_each(@volumeIds)))
               = json_array_length(@volumeIds)`,
      ).run({
        ...record,
        metadata: JSON.stringify(record.metadata),
        handle: JSON.stringify(record.handle),
        capabilities: JSON.stringify(record.capabilities),
        lifecycle: record.lifecycle === null ? null : JSON.stringify(record.lifecycle),
        volumeMounts: volumeMountsJson(record.volumeMounts),
        volumeIds: JSON.stringify([...new Set(record.volumeMounts.map((m) => m.id))]),
        ...(limited ? { limit: maxRunning } : {}),
      }).changes === 1
        ? { id: record.id, owner_key: record.owner, template: record.template }
        : undefined;
    return this.changed(insert, event);
  }

  getSandboxNow(id: string): SandboxRecord | undefined {
    // The gateway looks a sandbox up on every new connection.
    const row = this.statement('SELECT * FROM sandboxes WHERE id = ?').get(id) as
      | SandboxRow
      | undefined;
    return row && fromRow(row);
  }

  async getSandbox(id: string): Promise<SandboxRecord | undefined> {
    return this.getSandboxNow(id);
  }

  async listSandboxes(filter: SandboxFilter = {}): Promise<SandboxRecord[]> {
    const where: string[] = [];
    const params: unknown[] = [];
    if (filter.state) {
      const states = [filter.state].flat();
      where.push(`state IN (${states.map(() => '?').join(', ')})`);
      params.push(...states);
    } else {
      where.push("state != 'pooled'");
    }
    if (filter.template) {
      where.push('template = ?');
      params.push(filter.template);
    }
    if (filter.owner !== undefined) {
      where.push('owner_key = ?');
      params.push(filter.owner);
    }
    for (const [key, value] of Object.entries(filter.metadata ?? {})) {
      where.push('json_extract(metadata, ?) = ?');
      params.push(`$.${JSON.stringify(key)}`, value);
    }
    const sql = `SELECT * FROM sandboxes WHERE ${where.join(' AND ')} ORDER BY created_at, id`;
    return (this.statement(sql).all(...params) as SandboxRow[]).map(fromRow);
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
    let claimed: SandboxRow | undefined;
    const claim = () => {
      claimed = this.statement(
        `UPDATE sandboxes SET state = 'running', metadata = @metadata, created_at = @now,
           expires_at = @expiresAt, owner_key = @owner
         WHERE id = (SELECT id FROM sandboxes WHERE state = 'pooled' AND template = @template
                     ORDER BY created_at, id LIMIT 1)
           ${limited ? `AND ${RUNNING_OF_OWNER} < @limit` : ''}
         RETURNING *`,
      ).get({
        metadata: JSON.stringify(metadata),
        now,
        expiresAt,
        template,
        owner: owner?.keyId ?? null,
        ...(limited ? { limit: owner.maxRunning } : {}),
      }) as SandboxRow | undefined;
      return claimed;
    };
    this.changed(claim, event);
    return claimed && fromRow(claimed);
  }

  async countPooled(template: string): Promise<number> {
    return (
      this.statement(
        `SELECT COUNT(*) AS n FROM sandboxes WHERE state = 'pooled' AND template = ?`,
      ).get(template) as { n: number }
    ).n;
  }

  async countLive(): Promise<{ state: SandboxState; template: string; count: number }[]> {
    return this.statement(
      'SELECT state, template, COUNT(*) AS count FROM sandboxes WHERE ended_at IS NULL GROUP BY state, template ORDER BY state, template',
    ).all() as { state: SandboxState; template: string; count: number }[];
  }

  async deleteSandbox(
    id: string,
    state: 'pooled' | 'running',
    event?: EventDraft,
  ): Promise<boolean> {
    return this.changed(
      () =>
        this.statement(
          'DELETE FROM sandboxes WHERE id = ? AND state = ? RETURNING id, owner_key, template',
        ).get(id, state) as SandboxRow | undefined,
      event,
    );
  }

  async endSandbox(
    id: string,
    state: EndState,
    reason: string,
    options: { expiredBy?: number; event?: EventDraft } = {},
  ): Promise<boolean> {
    const due = options.expiredBy === undefined ? '' : ' AND expires_at <= ?';
    return this.changed(
      () =>
        this.statement(
          `UPDATE sandboxes SET state = ?, end_reason = ?, ended_at = ?
             WHERE id = ? AND state IN ('running', 'paused')${due}
             RETURNING id, owner_key, template`,
        ).get(
          state,
          reason,
          Date.now(),
          id,
          ...(options.expiredBy === undefined ? [] : [options.expiredBy]),
        ) as SandboxRow | undefined,
      options.event,
    );
  }

  async pauseSandbox(
    id: string,
    pause: PauseRecord,
    expiresAt: number,
    event?: EventDraft,
  ): Promise<boolean> {
    return this.changed(
      () =>
        this.statement(
          `UPDATE sandboxes SET state = 'paused', paused = ?, expires_at = ?
             WHERE id = ? AND state = 'running' RETURNING id, owner_key, template`,
        ).get(JSON.stringify(pause), expiresAt, id) as SandboxRow | undefined,
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
    // One statement: the owner's count and the change happen under the write lock.
    const limited = maxRunning != null;
    return this.changed(
      () =>
        this.statement(
          `UPDATE sandboxes SET state = 'running', paused = NULL, handle = @handle,
               expires_at = @expiresAt
             WHERE id = @id AND state = 'paused'
             ${limited ? `AND (owner_key IS NULL OR (SELECT COUNT(*) FROM sandboxes AS o WHERE o.owner_key = sandboxes.owner_key AND o.state = 'running') < @limit)` : ''}
             RETURNING id, owner_key, template`,
        ).get({
          handle: JSON.stringify(handle),
          expiresAt,
          id,
          ...(limited ? { limit: maxRunning } : {}),
        }) as SandboxRow | undefined,
      event,
    );
  }

  async setLifecycle(id: string, lifecycle: LifecycleRecord | null): Promise<boolean> {
    const result = this.statement(
      `UPDATE sandboxes SET lifecycle = ? WHERE id = ? AND state = 'running'`,
    ).run(lifecycle === null ? null : JSON.stringify(lifecycle), id);
    return result.changes === 1;
  }

  async setExpiry(id: string, expiresAt: number, event?: EventDraft): Promise<boolean> {
    return this.changed(
      () =>
        this.statement(
          `UPDATE sandboxes SET expires_at = ? WHERE id = ? AND state = 'running'
             RETURNING id, owner_key, template`,
        ).get(expiresAt, id) as SandboxRow | undefined,
      event,
    );
  }

  async setHandle(id: string, handle: SandboxHandle, event?: EventDraft): Promise<boolean> {
    return this.changed(
      () =>
        this.statement(
          `UPDATE sandboxes SET handle = ? WHERE id = ? AND state = 'running'
             RETURNING id, owner_key, template`,
        ).get(JSON.stringify(handle), id) as SandboxRow | undefined,
      event,
    );
  }

  async expired(now = Date.now()): Promise<SandboxRecord[]> {
    const rows = this.statement(
      `SELECT * FROM sandboxes WHERE state IN ('running', 'paused') AND expires_at <= ?`,
    ).all(now) as SandboxRow[];
    return rows.map(fromRow);
  }

  async endedSince(since: number): Promise<SandboxRecord[]> {
    const rows = this.statement(
      'SELECT * FROM sandboxes WHERE ended_at >= ? ORDER BY ended_at, id',
    ).all(since) as SandboxRow[];
    return rows.map(fromRow);
  }

  async upsertTemplate(
    record: TemplateRecord,
    check?: (previous: TemplateRecord | undefined) => void,
    event?: NewSandboxEvent,
  ): Promise<TemplateRecord | undefined> {
    // IMMEDIATE: the write lock is held from the read, so the check sees what is replaced.
    return transaction(
      this.db,
      () => {
        const previous = this.getTemplateNow(record.name);
        check?.(previous);
        // A rebuild keeps the owner and sharing of what it replaces.
        this.statement(
          `INSERT INTO templates (name, spec, dir, image, built_at, owner_key, shared)
           VALUES (?, ?, ?, ?, ?, ?, ?)
           ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, dir = excluded.dir,
             image = excluded.image, built_at = excluded.built_at`,
        ).run(
          record.name,
          JSON.stringify(record.spec),
          record.dir,
          record.image,
          record.builtAt,
          record.owner,
          record.shared ? 1 : 0,
        );
        if (event) this.insertEvent(event);
        return previous;
      },
      'IMMEDIATE',
    );
  }

  async setTemplateShared(name: string, shared: boolean): Promise<TemplateRecord | undefined> {
    const row = this.statement('UPDATE templates SET shared = ? WHERE name = ? RETURNING *').get(
      shared ? 1 : 0,
      name,
    ) as TemplateRow | undefined;
    return row && templateFromRow(row);
  }

  private getTemplateNow(name: string): TemplateRecord | undefined {
    const row = this.statement('SELECT * FROM templates WHERE name = ?').get(name) as
      | TemplateRow
      | undefined;
    return row && templateFromRow(row);
  }

  async getTemplate(name: string): Promise<TemplateRecord | undefined> {
    return this.getTemplateNow(name);
  }

  async listTemplates(): Promise<TemplateRecord[]> {
    const rows = this.statement('SELECT * FROM templates ORDER BY name').all() as TemplateRow[];
    return rows.map(templateFromRow);
  }

  async removeTemplate(name: string): Promise<TemplateRecord | undefined> {
    const row = this.statement('DELETE FROM templates WHERE name = ? RETURNING *').get(name) as
      | TemplateRow
      | undefined;
    return row && templateFromRow(row);
  }

  async insertApiKey(record: ApiKeyRecord): Promise<boolean> {
    // The unique index on active names turns a duplicate into no change.
    return (
      this.statement(
        `INSERT INTO api_keys (id, name, prefix, key_hash, admin, max_running, created_at,
             last_used_at, revoked_at)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
      ).run(
        record.id,
        record.name,
        record.prefix,
        record.keyHash,
        record.admin ? 1 : 0,
        record.maxRunning,
        record.createdAt,
        record.lastUsedAt,
        record.revokedAt,
      ).changes === 1
    );
  }

  async findApiKey(keyHash: string): Promise<ApiKeyRecord | undefined> {
    const row = this.statement('SELECT * FROM api_keys WHERE key_hash = ?').get(keyHash) as
      | ApiKeyRow
      | undefined;
    return row && keyFromRow(row);
  }

  async getApiKey(id: string): Promise<ApiKeyRecord | undefined> {
    const row = this.statement('SELECT * FROM api_keys WHERE id = ?').get(id) as
      | ApiKeyRow
      | undefined;
    return row && keyFromRow(row);
  }

  async listApiKeys(): Promise<(ApiKeyRecord & { running: number })[]> {
    const rows = this.statement(
      `SELECT k.*, (SELECT COUNT(*) FROM sandboxes s
                      WHERE s.owner_key = k.id AND s.state = 'running') AS running
         FROM api_keys k ORDER BY k.created_at, k.id`,
    ).all() as (ApiKeyRow & { running: number })[];
    return rows.map((row) => ({ ...keyFromRow(row), running: row.running }));
  }

  async revokeApiKey(id: string, now: number): Promise<ApiKeyRecord | undefined> {
    const row = this.statement(
      'UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ? RETURNING *',
    ).get(now, id) as ApiKeyRow | undefined;
    return row && keyFromRow(row);
  }

  async touchApiKey(id: string, now: number): Promise<void> {
    this.statement('UPDATE api_keys SET last_used_at = ? WHERE id = ?').run(now, id);
  }

  async insertVolume(record: VolumeRecord): Promise<boolean> {
    return (
      this.statement(
        `INSERT INTO volumes (id, name, owner_key, size_bytes, created_at) VALUES (?, ?, ?, ?, ?)
           ON CONFLICT (owner_key, name) DO NOTHING`,
      ).run(record.id, record.name, record.owner ?? '', record.sizeBytes, record.createdAt)
        .changes === 1
    );
  }

  async getVolume(id: string): Promise<VolumeRecord | undefined> {
    const row = this.statement('SELECT * FROM volumes WHERE id = ?').get(id) as
      | VolumeRow
      | undefined;
    return row && volumeFromRow(row);
  }

  async findVolume(owner: string | null, name: string): Promise<VolumeRecord | undefined> {
    const row = this.statement('SELECT * FROM volumes WHERE owner_key = ? AND name = ?').get(
      owner ?? '',
      name,
    ) as VolumeRow | undefined;
    return row && volumeFromRow(row);
  }

  async listVolumes(owner?: string | null): Promise<VolumeRecord[]> {
    const rows = (
      owner === undefined
        ? this.statement('SELECT * FROM volumes ORDER BY name, owner_key').all()
        : this.statement('SELECT * FROM volumes WHERE owner_key = ? ORDER BY name').all(owner ?? '')
    ) as VolumeRow[];
    return rows.map(volumeFromRow);
  }

  async volumeUsers(id: string): Promise<string[]> {
    return (this.statement(USERS_OF_VOLUME).all(volumeNeedle(id)) as { id: string }[]).map(
      (row) => row.id,
    );
  }

  async removeVolume(id: string): Promise<VolumeRemoval> {
    // IMMEDIATE: the write lock from the check to the delete, as an insert's check holds it.
    return transaction(
      this.db,
      (): VolumeRemoval => {
        const users = (
          this.statement(USERS_OF_VOLUME).all(volumeNeedle(id)) as { id: string }[]
        ).map((row) => row.id);
        if (users.length > 0) return { removed: false, users };
        const removed = this.statement('DELETE FROM volumes WHERE id = ?').run(id).changes === 1;
        return { removed, users: [] };
      },
      'IMMEDIATE',
    );
  }

  async insertSecret(record: SecretRecord, first: SealedSecretVersion): Promise<boolean> {
    return transaction(
      this.db,
      () => {
        const inserted =
          this.statement(
            `INSERT INTO secrets (id, name, owner_key, metadata, version, created_at, updated_at)
               VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner_key, name) DO NOTHING`,
          ).run(
            record.id,
            record.name,
            record.owner ?? '',
            JSON.stringify(record.metadata),
            record.version,
            record.createdAt,
            record.updatedAt,
          ).changes === 1;
        if (inserted) this.insertSecretVersion(record.id, first);
        return inserted;
      },
      'IMMEDIATE',
    );
  }

  private insertSecretVersion(id: string, version: SealedSecretVersion): void {
    this.statement(
      `INSERT INTO secret_versions (secret_id, version, sealed, key_check, created_at)
         VALUES (?, ?, ?, ?, ?)`,
    ).run(id, version.version, version.sealed, version.keyCheck, version.createdAt);
  }

  async getSecret(id: string): Promise<SecretRecord | undefined> {
    const row = this.statement('SELECT * FROM secrets WHERE id = ?').get(id) as
      | SecretRow
      | undefined;
    return row && secretFromRow(row);
  }

  async findSecret(owner: string | null, name: string): Promise<SecretRecord | undefined> {
    const row = this.statement('SELECT * FROM secrets WHERE owner_key = ? AND name = ?').get(
      owner ?? '',
      name,
    ) as SecretRow | undefined;
    return row && secretFromRow(row);
  }

  async listSecrets(owner?: string | null): Promise<SecretRecord[]> {
    const rows = (
      owner === undefined
        ? this.statement('SELECT * FROM secrets ORDER BY name, owner_key').all()
        : this.statement('SELECT * FROM secrets WHERE owner_key = ? ORDER BY name').all(owner ?? '')
    ) as SecretRow[];
    return rows.map(secretFromRow);
  }

  async updateSecret(id: string, change: SecretChange): Promise<SecretRecord | undefined> {
    return transaction(
      this.db,
      () => {
        const next = change.value ? change.from + 1 : change.from;
        const row = this.statement(
          `UPDATE secrets SET version = ?, metadata = COALESCE(?, metadata), updated_at = ?
             WHERE id = ? AND version = ? RETURNING *`,
        ).get(
          next,
          change.metadata === undefined ? null : JSON.stringify(change.metadata),
          change.at,
          id,
          change.from,
        ) as SecretRow | undefined;
        if (!row) return undefined;
        if (change.value) this.insertSecretVersion(id, { ...change.value, version: next });
        return secretFromRow(row);
      },
      'IMMEDIATE',
    );
  }

  async currentSecretVersion(id: string): Promise<SealedSecretVersion | undefined> {
    const row = this.statement(
      `SELECT v.version, v.sealed, v.key_check, v.created_at FROM secrets s
         JOIN secret_versions v ON v.secret_id = s.id AND v.version = s.version WHERE s.id = ?`,
    ).get(id) as SecretVersionRow | undefined;
    return (
      row && {
        version: row.version,
        sealed: row.sealed,
        keyCheck: row.key_check,
        createdAt: row.created_at,
      }
    );
  }

  async removeSecret(id: string): Promise<boolean> {
    return transaction(
      this.db,
      () => {
        this.statement('DELETE FROM secret_versions WHERE secret_id = ?').run(id);
        return this.statement('DELETE FROM secrets WHERE id = ?').run(id).changes === 1;
      },
      'IMMEDIATE',
    );
  }

  async secretKeyChecks(): Promise<string[]> {
    return (
      this.statement('SELECT DISTINCT key_check FROM secret_versions ORDER BY key_check').all() as {
        key_check: string;
      }[]
    ).map((row) => row.key_check);
  }

  /** Inserts an event (in the caller's transaction, when there is one). */
  private insertEvent(event: NewSandboxEvent): SandboxEvent {
    const row = this.statement(INSERT_EVENT).get(
      event.id,
      event.at,
      event.sandboxId,
      event.owner ?? '',
      event.template,
      event.type,
      JSON.stringify(event.data),
    ) as EventRow | undefined;
    if (row) this.eventWakes.signal();
    return eventFromRow(
      row ?? (this.statement('SELECT * FROM events WHERE id = ?').get(event.id) as EventRow),
    );
  }

  async appendEvent(event: NewSandboxEvent): Promise<SandboxEvent> {
    return this.insertEvent(event);
  }

  async listEvents(filter: EventFilter): Promise<SandboxEvent[]> {
    const where: string[] = [];
    const params: unknown[] = [];
    if (filter.owner !== undefined) {
      where.push('owner_key = ?');
      params.push(filter.owner ?? '');
    }
    if (filter.sandboxId !== undefined) {
      where.push('sandbox_id = ?');
      params.push(filter.sandboxId);
    }
    if (filter.types && filter.types.length > 0) {
      where.push(`type IN (${filter.types.map(() => '?').join(', ')})`);
      params.push(...filter.types);
    }
    where.push(...boundClauses(filter, placeholder(params)));
    params.push(filter.limit, filter.offset ?? 0);
    const sql = `SELECT * FROM events ${where.length > 0 ? `WHERE ${where.join(' AND ')}` : ''}
      ORDER BY seq ${filter.order === 'desc' ? 'DESC' : 'ASC'} LIMIT ? OFFSET ?`;
    return (this.statement(sql).all(...params) as EventRow[]).map(eventFromRow);
  }

  async purgeEvents(before: number): Promise<number> {
    return this.statement('DELETE FROM events WHERE at < ?').run(before).changes;
  }

  async agree(key: string, value: string): Promise<string> {
    const row = this.statement(
      `INSERT INTO settings (key, value) VALUES (?, ?)
         ON CONFLICT (key) DO UPDATE SET value = settings.value RETURNING value`,
    ).get(key, value) as { value: string };
    return row.value;
  }

  async appendAudit(rows: readonly NewAuditRecord[]): Promise<void> {
    if (rows.length === 0) return;
    const insert = this.statement(
      'INSERT INTO audit (at, sandbox_id, owner_key, actor, kind, data) VALUES (?, ?, ?, ?, ?, ?)',
    );
    transaction(this.db, () => {
      for (const row of rows) {
        insert.run(
          row.at,
          row.sandboxId,
          row.owner ?? '',
          row.actor,
          row.kind,
          JSON.stringify(row.data),
        );
      }
    });
  }

  async listAudit(filter: AuditFilter): Promise<AuditRecord[]> {
    const where = ['sandbox_id = ?'];
    const params: unknown[] = [filter.sandboxId];
    if (filter.kinds && filter.kinds.length > 0) {
      where.push(`kind IN (${filter.kinds.map(() => '?').join(', ')})`);
      params.push(...filter.kinds);
    }
    where.push(...boundClauses(filter, placeholder(params)));
    const rows = this.statement(
      `SELECT * FROM audit WHERE ${where.join(' AND ')} ORDER BY seq LIMIT ?`,
    ).all(...params, filter.limit) as AuditRow[];
    return rows.map((row) => ({
      seq: Number(row.seq),
      at: Number(row.at),
      sandboxId: row.sandbox_id,
      owner: row.owner_key === '' ? null : row.owner_key,
      actor: row.actor,
      kind: row.kind as AuditKind,
      data: JSON.parse(row.data) as Record<string, unknown>,
    }));
  }

  async purgeAudit(before: number): Promise<number> {
    return this.statement('DELETE FROM audit WHERE at < ?').run(before).changes;
  }

  async close(): Promise<void> {
    this.db.close();
  }
}
