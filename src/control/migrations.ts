import type { DatabaseSync } from './sqlite.js';

/**
 * The registry's schema, as numbered steps both stores apply in order. A store records each step
 * it applied in `schema_migrations` (version, name, applied_at), applies the missing ones in one
 * transaction under a lock (PostgreSQL: an advisory lock; SQLite: the write lock), and refuses a
 * registry a newer abx migrated further than it knows. A new table or column is a new step at the
 * end with both dialects; a released step never changes.
 */
export interface Migration {
  version: number;
  name: string;
  /** SQL, or a function for steps that must look at what is there first. */
  sqlite: string | ((db: DatabaseSync) => void);
  postgres: string;
}

export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: 'sandboxes, templates and settings',
    // Registries made before versioning have the tables already, some without templates.image.
    sqlite: (db) => {
      db.exec(`
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
        CREATE INDEX IF NOT EXISTS sandboxes_ended ON sandboxes (ended_at);
        CREATE TABLE IF NOT EXISTS templates (
          name TEXT PRIMARY KEY,
          spec TEXT NOT NULL,
          dir TEXT,
          built_at INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
      `);
      const columns = db.prepare('PRAGMA table_info(templates)').all() as { name: string }[];
      if (!columns.some((c) => c.name === 'image')) {
        db.exec('ALTER TABLE templates ADD COLUMN image TEXT');
      }
    },
    // json (not jsonb) keeps the text as written: metadata and handles read back key for key.
    postgres: `
      CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        template TEXT NOT NULL,
        state TEXT NOT NULL,
        metadata JSON NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        ended_at BIGINT,
        end_reason TEXT,
        token_hash TEXT NOT NULL,
        handle JSON NOT NULL,
        capabilities JSON NOT NULL
      );
      CREATE INDEX sandboxes_state ON sandboxes (state, expires_at);
      CREATE INDEX sandboxes_pool ON sandboxes (template, created_at) WHERE state = 'pooled';
      CREATE INDEX sandboxes_ended ON sandboxes (ended_at);
      CREATE TABLE templates (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        dir TEXT,
        image TEXT,
        built_at BIGINT NOT NULL
      );
      CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    `,
  },
  {
    version: 2,
    name: 'API keys and the owner of each sandbox',
    sqlite: `
      CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        prefix TEXT NOT NULL,
        key_hash TEXT NOT NULL UNIQUE,
        admin INTEGER NOT NULL,
        max_running INTEGER,
        created_at INTEGER NOT NULL,
        last_used_at INTEGER,
        revoked_at INTEGER
      );
      CREATE UNIQUE INDEX api_keys_active_name ON api_keys (name) WHERE revoked_at IS NULL;
      ALTER TABLE sandboxes ADD COLUMN owner_key TEXT;
      CREATE INDEX sandboxes_owner ON sandboxes (owner_key, state);
    `,
    postgres: `
      CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        prefix TEXT NOT NULL,
        key_hash TEXT NOT NULL UNIQUE,
        admin BOOLEAN NOT NULL,
        max_running INTEGER,
        created_at BIGINT NOT NULL,
        last_used_at BIGINT,
        revoked_at BIGINT
      );
      CREATE UNIQUE INDEX api_keys_active_name ON api_keys (name) WHERE revoked_at IS NULL;
      ALTER TABLE sandboxes ADD COLUMN owner_key TEXT;
      CREATE INDEX sandboxes_owner ON sandboxes (owner_key, state);
    `,
  },
  {
    version: 3,
    name: 'paused sandboxes and what a timeout does',
    sqlite: `
      ALTER TABLE sandboxes ADD COLUMN paused TEXT;
      ALTER TABLE sandboxes ADD COLUMN lifecycle TEXT;
    `,
    postgres: `
      ALTER TABLE sandboxes ADD COLUMN paused JSON;
      ALTER TABLE sandboxes ADD COLUMN lifecycle JSON;
    `,
  },
  {
    version: 4,
    name: 'volumes and the volumes each sandbox mounts',
    // owner_key '' is the daemon's own key: a unique index treats NULLs as all different.
    sqlite: `
      CREATE TABLE volumes (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        owner_key TEXT NOT NULL,
        size_bytes INTEGER NOT NULL,
        created_at INTEGER NOT NULL
      );
      CREATE UNIQUE INDEX volumes_owner_name ON volumes (owner_key, name);
      ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT;
    `,
    postgres: `
      CREATE TABLE volumes (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        owner_key TEXT NOT NULL,
        size_bytes BIGINT NOT NULL,
        created_at BIGINT NOT NULL
      );
      CREATE UNIQUE INDEX volumes_owner_name ON volumes (owner_key, name);
      ALTER TABLE sandboxes ADD COLUMN volume_mounts JSON;
    `,
  },
  {
    version: 5,
    name: 'the owner of each template, and whether it is shared',
    // Templates made before owners were recorded stay in the shared catalogue (as an admin's).
    sqlite: `
      ALTER TABLE templates ADD COLUMN owner_key TEXT;
      ALTER TABLE templates ADD COLUMN shared INTEGER NOT NULL DEFAULT 1;
    `,
    postgres: `
      ALTER TABLE templates ADD COLUMN owner_key TEXT;
      ALTER TABLE templates ADD COLUMN shared BOOLEAN NOT NULL DEFAULT TRUE;
    `,
  },
  {
    version: 6,
    name: 'secrets and their encrypted versions',
    // owner_key '' is the daemon's own key (as volumes'). A version's `sealed` is the IV, the
    // AES-256-GCM ciphertext and its tag, base64: never the value. `key_check` names the key it
    // was sealed with (an HMAC of the key, not the key), so a daemon with another key can tell.
    sqlite: `
      CREATE TABLE secrets (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        owner_key TEXT NOT NULL,
        metadata TEXT NOT NULL,
        version INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
      );
      CREATE UNIQUE INDEX secrets_owner_name ON secrets (owner_key, name);
      CREATE TABLE secret_versions (
        secret_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        sealed TEXT NOT NULL,
        key_check TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (secret_id, version)
      );
    `,
    postgres: `
      CREATE TABLE secrets (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        owner_key TEXT NOT NULL,
        metadata JSON NOT NULL,
        version INTEGER NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
      );
      CREATE UNIQUE INDEX secrets_owner_name ON secrets (owner_key, name);
      CREATE TABLE secret_versions (
        secret_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        sealed TEXT NOT NULL,
        key_check TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (secret_id, version)
      );
    `,
  },
  {
    version: 7,
    name: 'lifecycle events of sandboxes',
    // `seq` is the order and the readers' cursor (events.ts). owner_key '' is the daemon's own
    // key (as volumes'). No foreign key: a sandbox's events outlive its row until retention.
    sqlite: `
      CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        at INTEGER NOT NULL,
        sandbox_id TEXT NOT NULL,
        owner_key TEXT NOT NULL,
        template TEXT NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL
      );
      CREATE INDEX events_sandbox ON events (sandbox_id, seq);
      CREATE INDEX events_owner ON events (owner_key, seq);
      CREATE INDEX events_at ON events (at);
    `,
    postgres: `
      CREATE TABLE events (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        at BIGINT NOT NULL,
        sandbox_id TEXT NOT NULL,
        owner_key TEXT NOT NULL,
        template TEXT NOT NULL,
        type TEXT NOT NULL,
        data JSON NOT NULL
      );
      CREATE INDEX events_sandbox ON events (sandbox_id, seq);
      CREATE INDEX events_owner ON events (owner_key, seq);
      CREATE INDEX events_at ON events (at);
    `,
  },
  {
    version: 8,
    name: 'webhooks and their deliveries',
    // owner_key '' is the daemon's own key (as events'). A webhook's signing secret is sealed
    // (secret-crypto.ts, as secrets' values): `secret_key_check` names the key. `cursor` is the
    // last events.seq fanned out to it; each delivery row is written once per (webhook, event)
    // and keeps its id across retries, which is what a receiver deduplicates on.
    sqlite: `
      CREATE TABLE webhooks (
        id TEXT PRIMARY KEY,
        owner_key TEXT NOT NULL,
        flavour TEXT NOT NULL,
        name TEXT NOT NULL,
        url TEXT NOT NULL,
        enabled INTEGER NOT NULL,
        events TEXT NOT NULL,
        secret_sealed TEXT NOT NULL,
        secret_key_check TEXT NOT NULL,
        secret_version INTEGER NOT NULL,
        cursor INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
      );
      CREATE INDEX webhooks_owner ON webhooks (owner_key, created_at);
      CREATE TABLE webhook_deliveries (
        id TEXT PRIMARY KEY,
        webhook_id TEXT NOT NULL,
        event_seq INTEGER NOT NULL,
        sandbox_id TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        next_attempt_at INTEGER NOT NULL,
        claimed_until INTEGER,
        last_status INTEGER,
        last_error TEXT,
        created_at INTEGER NOT NULL,
        delivered_at INTEGER,
        UNIQUE (webhook_id, event_seq)
      );
      CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at);
      CREATE INDEX webhook_deliveries_order
        ON webhook_deliveries (webhook_id, sandbox_id, state, event_seq);
    `,
    postgres: `
      CREATE TABLE webhooks (
        id TEXT PRIMARY KEY,
        owner_key TEXT NOT NULL,
        flavour TEXT NOT NULL,
        name TEXT NOT NULL,
        url TEXT NOT NULL,
        enabled BOOLEAN NOT NULL,
        events JSON NOT NULL,
        secret_sealed TEXT NOT NULL,
        secret_key_check TEXT NOT NULL,
        secret_version INTEGER NOT NULL,
        cursor BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
      );
      CREATE INDEX webhooks_owner ON webhooks (owner_key, created_at);
      CREATE TABLE webhook_deliveries (
        id TEXT PRIMARY KEY,
        webhook_id TEXT NOT NULL,
        event_seq BIGINT NOT NULL,
        sandbox_id TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        next_attempt_at BIGINT NOT NULL,
        claimed_until BIGINT,
        last_status INTEGER,
        last_error TEXT,
        created_at BIGINT NOT NULL,
        delivered_at BIGINT,
        UNIQUE (webhook_id, event_seq)
      );
      CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at);
      CREATE INDEX webhook_deliveries_order
        ON webhook_deliveries (webhook_id, sandbox_id, state, event_seq);
    `,
  },
  {
    version: 9,
    name: 'the audit trail of sandboxes',
    // Written by the daemon only (audit.ts): what it saw done to and from each sandbox. owner_key
    // '' is the daemon's own key (as events'); actor is the API key that asked, when one did.
    sqlite: `
      CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        sandbox_id TEXT NOT NULL,
        owner_key TEXT NOT NULL,
        actor TEXT,
        kind TEXT NOT NULL,
        data TEXT NOT NULL
      );
      CREATE INDEX audit_sandbox ON audit (sandbox_id, seq);
      CREATE INDEX audit_at ON audit (at);
    `,
    postgres: `
      CREATE TABLE audit (
        seq BIGSERIAL PRIMARY KEY,
        at BIGINT NOT NULL,
        sandbox_id TEXT NOT NULL,
        owner_key TEXT NOT NULL,
        actor TEXT,
        kind TEXT NOT NULL,
        data JSON NOT NULL
      );
      CREATE INDEX audit_sandbox ON audit (sandbox_id, seq);
      CREATE INDEX audit_at ON audit (at);
    `,
  },
];

/** The highest version this abx knows. */
export const SCHEMA_VERSION = Math.max(...MIGRATIONS.map((m) => m.version));

/** The refusal for a registry migrated by a newer abx. */
export function tooNewError(location: string, version: number): Error {
  return new Error(
    `the registry ${location} is at schema version ${version}, newer than this abx knows (${SCHEMA_VERSION}): a newer abx migrated it; run that version (or newer) here too`,
  );
}
