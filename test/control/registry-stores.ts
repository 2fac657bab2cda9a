import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { test as base } from 'vitest';
import { PostgresRegistry } from '../../src/control/postgres-registry.js';
import type {
  ApiKeyRecord,
  Registry,
  SandboxRecord,
  SealedSecretVersion,
  SecretRecord,
  VolumeRecord,
} from '../../src/control/registry.js';
import { openSqlite } from '../../src/control/sqlite.js';
import { SqliteRegistry } from '../../src/control/sqlite-registry.js';
import { createTestDatabase, NEEDS_POSTGRES, TEST_DATABASE_URL } from '../helpers/postgres.js';

/** One registry store as the tests open it: a new empty database per test. */
export interface StoreKind {
  name: 'SQLite' | 'PostgreSQL';
  /** Why its tests are skipped here, or '' when they run. */
  skipped: string;
}

export const STORES: StoreKind[] = [
  { name: 'SQLite', skipped: '' },
  { name: 'PostgreSQL', skipped: NEEDS_POSTGRES },
];

export interface StoreFixture {
  /**
   * Opens a registry on the test's database, migrated; every call opens another one on the same
   * database (as another daemon would), all closed after the test.
   */
  open(options?: { migrate?: boolean }): Promise<Registry>;
  /** Where the test's database is: a file, or a postgres:// URL. */
  location: string;
  /** Runs SQL on the database directly, as an older or newer abx would have. */
  raw(sql: string): Promise<void>;
  /** The rows a query answers, read from the database directly (what is really stored). */
  rows(sql: string): Promise<Record<string, unknown>[]>;
}

/** A vitest `test` whose `store` fixture makes a database of `kind` and removes it afterwards. */
export function storeTest(kind: StoreKind) {
  return base.extend<{ store: StoreFixture }>({
    // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
    store: async ({}, use) => {
      const opened: Registry[] = [];
      let location: string;
      let cleanup: () => Promise<void>;
      let make: () => Registry;
      let raw: (sql: string) => Promise<void>;
      let rows: (sql: string) => Promise<Record<string, unknown>[]>;
      if (kind.name === 'SQLite') {
        const dir = mkdtempSync(join(tmpdir(), 'abx-registry-'));
        const file = join(dir, 'abx.db');
        location = file;
        make = () => new SqliteRegistry(file);
        raw = async (sql) => {
          const db = openSqlite(file);
          try {
            db.exec(sql);
          } finally {
            db.close();
          }
        };
        rows = async (sql) => {
          const db = openSqlite(file);
          try {
            return db.prepare(sql).all() as Record<string, unknown>[];
          } finally {
            db.close();
          }
        };
        cleanup = async () => rmSync(dir, { recursive: true, force: true });
      } else {
        const database = await createTestDatabase(TEST_DATABASE_URL as string);
        location = database.url;
        make = () => new PostgresRegistry(database.url);
        raw = async (sql) => {
          const client = new pg.Client({ connectionString: database.url });
          await client.connect();
          try {
            await client.query(sql);
          } finally {
            await client.end();
          }
        };
        rows = async (sql) => {
          const client = new pg.Client({ connectionString: database.url });
          await client.connect();
          try {
            return (await client.query(sql)).rows;
          } finally {
            await client.end();
          }
        };
        cleanup = database.drop;
      }
      try {
        await use({
          location,
          raw,
          rows,
          async open(options = {}) {
            const registry = make();
            opened.push(registry);
            if (options.migrate !== false) await registry.migrate();
            return registry;
          },
        });
      } finally {
        for (const registry of opened) await registry.close().catch(() => undefined);
        await cleanup();
      }
    },
  });
}

let sequence = 0;

/** A volume row as the volume service would insert it. */
export function volumeRow(overrides: Partial<VolumeRecord> = {}): VolumeRecord {
  sequence++;
  return {
    id: `vol_${String(sequence).padStart(6, '0')}${Math.random().toString(36).slice(2, 10)}`,
    name: `volume-${sequence}`,
    owner: null,
    sizeBytes: 16 * 1024 ** 2,
    createdAt: 1_800_000_000_000 + sequence,
    ...overrides,
  };
}

/** A secret row as the secret service would insert it (its value is not a registry concern). */
export function secretRow(overrides: Partial<SecretRecord> = {}): SecretRecord {
  sequence++;
  return {
    id: `sec_${String(sequence).padStart(6, '0')}${Math.random().toString(16).slice(2, 16)}`,
    name: `secret-${sequence}`,
    owner: null,
    metadata: {},
    version: 1,
    createdAt: 1_800_000_000_000 + sequence,
    updatedAt: 1_800_000_000_000 + sequence,
    ...overrides,
  };
}

/** A sealed version as the secret service would store it (opaque text to the registry). */
export function sealedRow(version: number, sealed = `sealed-${version}`): SealedSecretVersion {
  return { version, sealed, keyCheck: 'check-a', createdAt: 1_800_000_000_000 + version };
}

/** A sandbox row as the services would insert it. */
export function sandboxRow(overrides: Partial<SandboxRecord> = {}): SandboxRecord {
  sequence++;
  const createdAt = 1_800_000_000_000 + sequence;
  return {
    id: `sbx${String(sequence).padStart(6, '0')}${Math.random().toString(36).slice(2, 8)}`,
    template: 'base',
    state: 'running',
    metadata: {},
    createdAt,
    expiresAt: createdAt + 60_000,
    endedAt: null,
    endReason: null,
    tokenHash: 'ab'.repeat(32),
    handle: {
      provider: 'memory',
      pid: 4242,
      startTime: `start-${sequence}`,
      envdSocket: `/run/abx/${sequence}/envd.sock`,
      portsDir: `/run/abx/${sequence}/ports`,
    },
    capabilities: ['files', 'commands'],
    owner: null,
    paused: null,
    lifecycle: null,
    volumeMounts: [],
    ...overrides,
  };
}

/** An API key row as the key service would insert it (a hash of a key nobody has). */
export function apiKeyRow(overrides: Partial<ApiKeyRecord> = {}): ApiKeyRecord {
  sequence++;
  const suffix = `${String(sequence).padStart(6, '0')}${Math.random().toString(36).slice(2, 8)}`;
  return {
    id: `key_${suffix}`.slice(0, 16),
    name: `key-${suffix}`,
    prefix: `abx_${suffix.slice(0, 6)}`,
    keyHash: createHash('sha256').update(`key ${suffix}`).digest('hex'),
    admin: false,
    maxRunning: null,
    createdAt: 1_800_000_000_000 + sequence,
    lastUsedAt: null,
    revokedAt: null,
    ...overrides,
  };
}
