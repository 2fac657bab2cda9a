import { describe, expect } from 'vitest';
import { MIGRATIONS, SCHEMA_VERSION } from '../../src/control/migrations.js';
import type { Registry } from '../../src/control/registry.js';
import { type DatabaseSync, openSqlite } from '../../src/control/sqlite.js';
import { apiKeyRow, STORES, sandboxRow, storeTest } from './registry-stores.js';

/** The versions a store recorded as applied. */
const versions = (registry: Registry) =>
  (registry as Registry & { appliedVersions(): Promise<number[]> }).appliedVersions();

const ALL = MIGRATIONS.map((m) => m.version);

for (const kind of STORES) {
  const test = storeTest(kind);

  describe.skipIf(kind.skipped !== '')(
    `migrations of the ${kind.name} registry${kind.skipped}`,
    () => {
      test('a fresh database gets every step, recorded once, and works', async ({ store }) => {
        const registry = await store.open();
        expect(await versions(registry)).toEqual(ALL);
        const row = sandboxRow();
        await registry.insertSandbox(row);
        expect(await registry.getSandbox(row.id)).toEqual(row);
      });

      test('an up-to-date database is left as it is, rows and all', async ({ store }) => {
        const first = await store.open();
        const row = sandboxRow();
        await first.insertSandbox(row);
        await first.migrate();
        const second = await store.open();
        expect(await versions(second)).toEqual(ALL);
        expect(await second.getSandbox(row.id)).toEqual(row);
      });

      test('daemons starting together on an empty database apply each step once', async ({
        store,
      }) => {
        const registries = await Promise.all(
          Array.from({ length: 4 }, () => store.open({ migrate: false })),
        );
        await Promise.all(registries.map((registry) => registry.migrate()));
        for (const registry of registries) expect(await versions(registry)).toEqual(ALL);
        const row = sandboxRow();
        await (registries[0] as Registry).insertSandbox(row);
        expect(await (registries[3] as Registry).getSandbox(row.id)).toEqual(row);
      });

      test('a database at step 1 (before API keys) gets steps 2 and 3: its rows stay, ownerless and not paused', async ({
        store,
      }) => {
        // The schema and a row as the abx of step 1 left them.
        const step1 = MIGRATIONS[0] as (typeof MIGRATIONS)[0];
        const schema = `CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,
            name TEXT NOT NULL, applied_at BIGINT NOT NULL);
          INSERT INTO schema_migrations VALUES (1, '${step1.name}', 1);`;
        if (kind.name === 'SQLite') {
          const db = openSqlite(store.location);
          try {
            (step1.sqlite as (db: DatabaseSync) => void)(db);
            db.exec(schema);
          } finally {
            db.close();
          }
        } else {
          await store.raw(`${step1.postgres}; ${schema}`);
        }
        await store.raw(`INSERT INTO sandboxes (id, template, state, metadata, created_at,
            expires_at, ended_at, end_reason, token_hash, handle, capabilities)
          VALUES ('iold', 'base', 'running', '{"a":"b"}', 1, 2, NULL, NULL, 'h',
            '{"provider":"local","pid":1,"startTime":"1","envdSocket":"/e","portsDir":"/p"}', '["files"]')`);
        const registry = await store.open();
        expect(await versions(registry)).toEqual(ALL);
        expect(await registry.getSandbox('iold')).toMatchObject({
          state: 'running',
          metadata: { a: 'b' },
          owner: null,
          paused: null,
          lifecycle: null,
        });
        // What step 2 brings works: keys, and sandboxes owned by them.
        const key = apiKeyRow();
        expect(await registry.insertApiKey(key)).toBe(true);
        await registry.insertSandbox(sandboxRow({ owner: key.id }), 1);
        expect(await registry.insertSandbox(sandboxRow({ owner: key.id }), 1)).toBe(false);
        expect((await registry.listApiKeys()).map((k) => [k.id, k.running])).toEqual([[key.id, 1]]);
      });

      test('a database at step 4 (before template owners) gets step 5: its templates stay shared, owned by no key', async ({
        store,
      }) => {
        const early = MIGRATIONS.filter((m) => m.version <= 4);
        const schema = `CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,
            name TEXT NOT NULL, applied_at BIGINT NOT NULL);
          ${early.map((m) => `INSERT INTO schema_migrations VALUES (${m.version}, '${m.name}', 1);`).join('\n')}`;
        if (kind.name === 'SQLite') {
          const db = openSqlite(store.location);
          try {
            for (const step of early) {
              if (typeof step.sqlite === 'string') db.exec(step.sqlite);
              else step.sqlite(db);
            }
            db.exec(schema);
          } finally {
            db.close();
          }
        } else {
          await store.raw(`${early.map((m) => m.postgres).join(';\n')}; ${schema}`);
        }
        await store.raw(`INSERT INTO templates (name, spec, dir, image, built_at)
          VALUES ('python', '{"name":"python"}', '/t/python', NULL, 7)`);
        const registry = await store.open();
        expect(await versions(registry)).toEqual(ALL);
        expect(await registry.getTemplate('python')).toEqual({
          name: 'python',
          spec: { name: 'python' },
          dir: '/t/python',
          image: null,
          builtAt: 7,
          owner: null,
          shared: true,
        });
        // What step 5 brings works: a key's own template, and publishing it.
        await registry.upsertTemplate({
          name: 'mine',
          spec: { name: 'mine' },
          dir: null,
          image: null,
          builtAt: 8,
          owner: 'key_x',
          shared: false,
        });
        expect(await registry.getTemplate('mine')).toMatchObject({ owner: 'key_x', shared: false });
        expect(await registry.setTemplateShared('mine', true)).toMatchObject({ shared: true });
      });

      test('a database a newer abx migrated is refused, saying so', async ({ store }) => {
        await store.open();
        await store.raw(
          `INSERT INTO schema_migrations (version, name, applied_at) VALUES (${SCHEMA_VERSION + 1}, 'from the future', 0)`,
        );
        await expect(store.open()).rejects.toThrow(
          `is at schema version ${SCHEMA_VERSION + 1}, newer than this abx knows (${SCHEMA_VERSION})`,
        );
      });
    },
  );
}

describe('a SQLite registry made before versioning', () => {
  const test = storeTest({ name: 'SQLite', skipped: '' });

  test('is adopted: its rows stay, the missing image column is added, the steps recorded', async ({
    store,
  }) => {
    // The schema and a row as abx wrote them before schema_migrations existed.
    await store.raw(`
      CREATE TABLE sandboxes (id TEXT PRIMARY KEY, template TEXT NOT NULL, state TEXT NOT NULL,
        metadata TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
        ended_at INTEGER, end_reason TEXT, token_hash TEXT NOT NULL, handle TEXT NOT NULL,
        capabilities TEXT NOT NULL);
      CREATE INDEX sandboxes_state ON sandboxes (state, expires_at);
      CREATE TABLE templates (name TEXT PRIMARY KEY, spec TEXT NOT NULL, dir TEXT,
        built_at INTEGER NOT NULL);
      INSERT INTO templates VALUES ('old', '{"name":"old"}', '/t/old', 5);
      INSERT INTO sandboxes VALUES ('iold', 'old', 'running', '{"a":"b"}', 1, 2, NULL, NULL, 'h',
        '{"provider":"local","pid":1,"startTime":"1","envdSocket":"/e","portsDir":"/p"}', '["files"]');
    `);
    const registry = await store.open();
    expect(await versions(registry)).toEqual(ALL);
    expect(await registry.getTemplate('old')).toEqual({
      name: 'old',
      spec: { name: 'old' },
      dir: '/t/old',
      image: null,
      builtAt: 5,
      // Made before templates had owners: it stays in the shared catalogue.
      owner: null,
      shared: true,
    });
    expect(await registry.getSandbox('iold')).toMatchObject({
      state: 'running',
      metadata: { a: 'b' },
    });
    await registry.upsertTemplate({
      name: 'img',
      spec: {},
      dir: null,
      image: 'i:1',
      builtAt: 6,
      owner: null,
      shared: true,
    });
    expect((await registry.getTemplate('img'))?.image).toBe('i:1');
  });
});
