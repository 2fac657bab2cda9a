import Database from 'better-sqlite3';
/**
 * Life of a sandbox: `running` until killed, expired (reaped) or found dead. `pooled`: started
 * ahead of demand in the warm pool, not yet handed out (never listed by default).
 */
import type { SandboxState } from '../../runtime/protocol/wire.js';
import type { SandboxHandle } from '../providers/provider.js';

export type { SandboxState };

/** One sandbox as the registry records it. */
export interface SandboxRecord {
  id: string;
  template: string;
  state: SandboxState;
  metadata: Record<string, string>;
  createdAt: number;
  expiresAt: number;
  endedAt: number | null;
  /** Why it ended: `killed by API`, `expired`, `found dead after daemon restart`... */
  endReason: string | null;
  /** SHA-256 of the access token, hex: the token itself is never stored. */
  tokenHash: string;
  handle: SandboxHandle;
  capabilities: string[];
}

/** One built template. */
export interface TemplateRecord {
  name: string;
  /** The loaded template (JSON), as the daemon needs it to create sandboxes. */
  spec: unknown;
  /** Folder whose `home/` new sandboxes start from, or null when there was nothing to build. */
  dir: string | null;
  /** The image new sandboxes start from (an image template's build), or null. */
  image: string | null;
  builtAt: number;
}

interface TemplateRow {
  name: string;
  spec: string;
  dir: string | null;
  image: string | null;
  built_at: number;
}

function templateFromRow(row: TemplateRow): TemplateRecord {
  return {
    name: row.name,
    spec: JSON.parse(row.spec),
    dir: row.dir,
    image: row.image ?? null,
    builtAt: row.built_at,
  };
}

export interface SandboxFilter {
  state?: SandboxState;
  template?: string;
  /** Every key must match. */
  metadata?: Record<string, string>;
}

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
});

/** The control plane's state in SQLite: sandboxes and templates. */
export class Registry {
  private readonly db: Database.Database;
  private bySandboxId: Database.Statement | undefined;

  constructor(file: string) {
    this.db = new Database(file);
    // WAL lets readers (other CLI processes) in while the daemon writes.
    this.db.pragma('journal_mode = WAL');
    // No fsync per commit (3 ms each on a VM's disk, one per create and kill); WAL still keeps
    // the file consistent, and what a power loss could forget (the last few changes) the daemon
    // recovers: a sandbox without a row is killed by the orphan sweep, a row of a dead sandbox is
    // ended at adoption.
    this.db.pragma('synchronous = NORMAL');
    this.db.pragma('busy_timeout = 5000');
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS sandboxes (
        id TEXT PRIMARY KEY,
        template TEXT NOT NULL,
        state TEXT NOT NULL,
        metadata TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        ended_at INTEGER,
        end_reason TEXT,
        token_hash TEXT NOT NULL,
        handle TEXT NOT NULL,
        capabilities TEXT NOT NULL
      );
      CREATE INDEX IF NOT EXISTS sandboxes_state ON sandboxes (state, expires_at);
      CREATE TABLE IF NOT EXISTS templates (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        dir TEXT,
        built_at INTEGER NOT NULL
      );
    `);
    // Registries made before image templates lack the image column.
    const columns = this.db.prepare('PRAGMA table_info(templates)').all() as { name: string }[];
    if (!columns.some((c) => c.name === 'image')) {
      this.db.exec('ALTER TABLE templates ADD COLUMN image TEXT');
    }
  }

  insertSandbox(record: SandboxRecord): void {
    this.db
      .prepare(
        `INSERT INTO sandboxes (id, template, state, metadata, created_at, expires_at, ended_at,
           end_reason, token_hash, handle, capabilities)
         VALUES (@id, @template, @state, @metadata, @createdAt, @expiresAt, @endedAt, @endReason,
           @tokenHash, @handle, @capabilities)`,
      )
      .run({
        ...record,
        metadata: JSON.stringify(record.metadata),
        handle: JSON.stringify(record.handle),
        capabilities: JSON.stringify(record.capabilities),
      });
  }

  getSandbox(id: string): SandboxRecord | undefined {
    // The gateway looks a sandbox up on every request: the statement is compiled once.
    this.bySandboxId ??= this.db.prepare('SELECT * FROM sandboxes WHERE id = ?');
    const row = this.bySandboxId.get(id) as SandboxRow | undefined;
    return row && fromRow(row);
  }

  listSandboxes(filter: SandboxFilter = {}): SandboxRecord[] {
    const where: string[] = [];
    const params: unknown[] = [];
    if (filter.state) {
      where.push('state = ?');
      params.push(filter.state);
    } else {
      where.push("state != 'pooled'");
    }
    if (filter.template) {
      where.push('template = ?');
      params.push(filter.template);
    }
    for (const [key, value] of Object.entries(filter.metadata ?? {})) {
      where.push('json_extract(metadata, ?) = ?');
      params.push(`$.${JSON.stringify(key)}`, value);
    }
    const sql = `SELECT * FROM sandboxes ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY created_at`;
    return (this.db.prepare(sql).all(...params) as SandboxRow[]).map(fromRow);
  }

  /**
   * Hands out the oldest pooled sandbox of a template: it becomes `running` with the caller's
   * metadata and lifetime. One statement, so two concurrent creates never get the same one.
   */
  claimPooled(
    template: string,
    metadata: Record<string, string>,
    now: number,
    expiresAt: number,
  ): SandboxRecord | undefined {
    const row = this.db
      .prepare(
        `UPDATE sandboxes SET state = 'running', metadata = ?, created_at = ?, expires_at = ?
         WHERE id = (SELECT id FROM sandboxes WHERE state = 'pooled' AND template = ?
                     ORDER BY created_at LIMIT 1)
         RETURNING *`,
      )
      .get(JSON.stringify(metadata), now, expiresAt, template) as SandboxRow | undefined;
    return row && fromRow(row);
  }

  countPooled(template: string): number {
    return (
      this.db
        .prepare(`SELECT COUNT(*) AS n FROM sandboxes WHERE state = 'pooled' AND template = ?`)
        .get(template) as { n: number }
    ).n;
  }

  /** Removes a row for good (a pooled sandbox that was never handed out). */
  deleteSandbox(id: string): void {
    this.db.prepare('DELETE FROM sandboxes WHERE id = ?').run(id);
  }

  /** Marks a running sandbox ended; false when it was not running (already ended). */
  endSandbox(
    id: string,
    state: Exclude<SandboxState, 'running' | 'pooled'>,
    reason: string,
  ): boolean {
    const result = this.db
      .prepare(
        `UPDATE sandboxes SET state = ?, end_reason = ?, ended_at = ? WHERE id = ? AND state = 'running'`,
      )
      .run(state, reason, Date.now(), id);
    return result.changes === 1;
  }

  setExpiry(id: string, expiresAt: number): boolean {
    const result = this.db
      .prepare(`UPDATE sandboxes SET expires_at = ? WHERE id = ? AND state = 'running'`)
      .run(expiresAt, id);
    return result.changes === 1;
  }

  /** Running sandboxes whose time is up. */
  expired(now = Date.now()): SandboxRecord[] {
    const rows = this.db
      .prepare(`SELECT * FROM sandboxes WHERE state = 'running' AND expires_at <= ?`)
      .all(now) as SandboxRow[];
    return rows.map(fromRow);
  }

  upsertTemplate(record: TemplateRecord): void {
    this.db
      .prepare(
        `INSERT INTO templates (name, spec, dir, image, built_at) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, dir = excluded.dir,
           image = excluded.image, built_at = excluded.built_at`,
      )
      .run(record.name, JSON.stringify(record.spec), record.dir, record.image, record.builtAt);
  }

  getTemplate(name: string): TemplateRecord | undefined {
    const row = this.db.prepare('SELECT * FROM templates WHERE name = ?').get(name) as
      | TemplateRow
      | undefined;
    return row && templateFromRow(row);
  }

  listTemplates(): TemplateRecord[] {
    const rows = this.db.prepare('SELECT * FROM templates ORDER BY name').all() as TemplateRow[];
    return rows.map(templateFromRow);
  }

  removeTemplate(name: string): boolean {
    return this.db.prepare('DELETE FROM templates WHERE name = ?').run(name).changes === 1;
  }

  close(): void {
    this.db.close();
  }
}
