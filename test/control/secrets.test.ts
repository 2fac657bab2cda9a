import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { test as base, describe, expect } from 'vitest';
import { Daemon, type DaemonOptions } from '../../src/control/daemon.js';
import { openSqlite } from '../../src/control/sqlite.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { type Api, apiAs, type Json } from '../helpers/api-call.js';
import { MemoryProvider } from '../helpers/memory-provider.js';
import { createTestDatabase, NEEDS_POSTGRES } from '../helpers/postgres.js';

interface Started {
  daemon: Daemon;
  info: DaemonInfo;
  admin: Api;
  home: string;
}

interface Plane {
  /** A daemon on a new home; `database` true: on the test's PostgreSQL database. */
  start(options?: Partial<DaemonOptions> & { home?: string }): Promise<Started>;
  /** The test's PostgreSQL database (made on first use). */
  database(): Promise<string>;
  /** Every row of a table, read from the database directly (SQLite: a home's abx.db). */
  rows(where: { home: string } | { url: string }, table: string): Promise<Json[]>;
}

/** Daemons on a memory provider; every daemon, home, provider and database cleaned after. */
const test = base.extend<{ plane: Plane }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  plane: async ({}, use) => {
    const provider = new MemoryProvider();
    const homes: string[] = [];
    const daemons: Daemon[] = [];
    let database: Awaited<ReturnType<typeof createTestDatabase>> | undefined;
    try {
      await use({
        async start(options = {}) {
          const home = options.home ?? mkdtempSync(join(tmpdir(), 'abx-secrets-'));
          if (!homes.includes(home)) homes.push(home);
          const daemon = new Daemon({
            home,
            provider,
            apiPort: 0,
            gatewayPort: 0,
            warmPool: 0,
            dashboard: false,
            ...options,
          });
          daemons.push(daemon);
          const info = await daemon.start();
          const admin = apiAs(info, readFileSync(join(home, 'api-key'), 'utf8').trim());
          return { daemon, info, admin, home };
        },
        async database() {
          database ??= await createTestDatabase();
          return database.url;
        },
        async rows(where, table) {
          if ('home' in where) {
            const db = openSqlite(join(where.home, 'abx.db'));
            try {
              return db.prepare(`SELECT * FROM ${table}`).all();
            } finally {
              db.close();
            }
          }
          const client = new pg.Client({ connectionString: where.url });
          await client.connect();
          try {
            return (await client.query(`SELECT * FROM ${table}`)).rows;
          } finally {
            await client.end();
          }
        },
      });
    } finally {
      for (const daemon of daemons) await daemon.stop().catch(() => undefined);
      await provider.dispose();
      await database?.drop();
      for (const home of homes) rmSync(home, { recursive: true, force: true });
    }
  },
});

/** Makes a key through `admin`; its API and id. */
async function makeKey(admin: Api, info: DaemonInfo, name: string, isAdmin = false) {
  const made = await admin.post('/v1/keys', { name, admin: isAdmin });
  expect(made.status).toBe(200);
  return { api: apiAs(info, made.body.key), id: made.body.id as string };
}

const VALUE_1 = 'sk-live-FIRST-4c1d2f0e9a8b7c6d';
const VALUE_2 = 'sk-live-SECOND-0f9e8d7c6b5a4f3e';

const STORES = [
  { name: 'SQLite', skipped: '' },
  { name: 'PostgreSQL', skipped: NEEDS_POSTGRES },
] as const;

for (const store of STORES) {
  describe.skipIf(store.skipped !== '')(`secrets on ${store.name}${store.skipped}`, () => {
    /** A daemon on this store. */
    async function startOn(plane: Plane) {
      const url = store.name === 'PostgreSQL' ? await plane.database() : undefined;
      const started = await plane.start(url ? { databaseUrl: url } : {});
      return { ...started, where: url ? { url } : { home: started.home } };
    }

    test('create, list, info, update and remove through /v1: answers never hold a value; the newest version is what resolves', async ({
      plane,
    }) => {
      const { daemon, admin, where, home } = await startOn(plane);
      const answers: Json[] = [];
      const made = await admin.post('/v1/secrets', {
        name: 'OpenAI-Key',
        value: VALUE_1,
        metadata: { team: 'ml' },
      });
      answers.push(made.body);
      expect(made.status, JSON.stringify(made.body)).toBe(201);
      // Names are case-insensitive and kept lower-case (as E2B's).
      expect(made.body).toMatchObject({
        name: 'openai-key',
        version: 1,
        metadata: { team: 'ml' },
        owner: null,
      });
      expect(made.body.secretId).toMatch(/^sec_[0-9a-f]{20}$/);
      expect(Object.keys(made.body).sort()).toEqual(
        ['createdAt', 'metadata', 'name', 'owner', 'secretId', 'updatedAt', 'version'].sort(),
      );
      expect(await daemon.secrets.resolve(null, 'openai-key')).toBe(VALUE_1);

      const listed = await admin.get('/v1/secrets');
      answers.push(listed.body);
      expect(listed.body.secrets.map((s: Json) => [s.name, s.version])).toEqual([
        ['openai-key', 1],
      ]);
      const info = await admin.get('/v1/secrets/OPENAI-KEY');
      answers.push(info.body);
      expect(info.body).toEqual(made.body);
      expect((await admin.get(`/v1/secrets/${made.body.secretId}`)).body).toEqual(made.body);

      // A new value is the next version, used from the next request on.
      const updated = await admin.post('/v1/secrets/openai-key', { value: VALUE_2 });
      answers.push(updated.body);
      expect(updated.status).toBe(200);
      expect(updated.body).toMatchObject({ version: 2, metadata: { team: 'ml' } });
      expect(await daemon.secrets.resolve(null, 'OpenAI-Key')).toBe(VALUE_2);
      // Metadata alone replaces the metadata and keeps the version.
      const relabelled = await admin.post('/v1/secrets/openai-key', { metadata: { team: 'ops' } });
      answers.push(relabelled.body);
      expect(relabelled.body).toMatchObject({ version: 2, metadata: { team: 'ops' } });
      expect(await daemon.secrets.resolve(null, 'openai-key')).toBe(VALUE_2);

      // What is stored: ciphertext only, no value in any column of any row.
      const stored = JSON.stringify([
        await plane.rows(where, 'secrets'),
        await plane.rows(where, 'secret_versions'),
      ]);
      expect(stored).toContain(made.body.secretId);
      for (const value of [VALUE_1, VALUE_2]) {
        expect(stored).not.toContain(value);
        expect(stored).not.toContain(Buffer.from(value).toString('base64'));
      }
      if ('home' in where) {
        // Nor in the database's files (free pages and the write-ahead log included).
        for (const file of ['abx.db', 'abx.db-wal']) {
          const path = join(home, file);
          if (!existsSync(path)) continue;
          const bytes = readFileSync(path);
          expect(bytes.includes(VALUE_1), file).toBe(false);
          expect(bytes.includes(VALUE_2), file).toBe(false);
        }
      }
      for (const answer of answers) {
        expect(JSON.stringify(answer)).not.toContain('sk-live');
      }

      const removed = await admin.delete('/v1/secrets/openai-key');
      expect(removed.body).toEqual({
        removed: true,
        name: 'openai-key',
        secretId: made.body.secretId,
      });
      expect((await admin.get('/v1/secrets/openai-key')).status).toBe(404);
      expect(await daemon.secrets.resolve(null, 'openai-key')).toBeUndefined();
      expect(await plane.rows(where, 'secret_versions')).toEqual([]);
    });

    test('bad input gets a 400 saying the allowed form, and changes nothing', async ({ plane }) => {
      const { admin } = await startOn(plane);
      expect((await admin.post('/v1/secrets', { name: 'kept', value: 'v' })).status).toBe(201);
      const refusals: [unknown, number, RegExp][] = [
        [{ name: 'has space', value: 'v' }, 400, /1 to 64 letters, digits, _, - and \./],
        [{ name: 'sec_abc', value: 'v' }, 400, /does not start with sec_/],
        [{ name: '', value: 'v' }, 400, /1 to 64/],
        [{ name: 'x'.repeat(65), value: 'v' }, 400, /1 to 64/],
        [{ name: '${e2b}', value: 'v' }, 400, /1 to 64/],
        [{ value: 'v' }, 400, /secret name/],
        [{ name: 'new', value: '' }, 400, /value must not be empty/],
        [{ name: 'new' }, 400, /value must be a string/],
        [{ name: 'new', value: 42 }, 400, /value must be a string, not number/],
        [{ name: 'new', value: 'x'.repeat(64 * 1024 + 1) }, 400, /at most 65536 bytes/],
        [{ name: 'new', value: 'v', metadata: { a: 1 } }, 400, /metadata.a must be a string/],
        [{ name: 'new', value: 'v', metadata: [] }, 400, /metadata must be an object/],
        [{ name: 'kept', value: 'other' }, 409, /exists already/],
      ];
      for (const [body, status, message] of refusals) {
        const answer = await admin.post('/v1/secrets', body);
        expect(answer.status, JSON.stringify(body).slice(0, 80)).toBe(status);
        expect(answer.body.error).toMatch(message);
        expect(answer.body.type).toBe(
          status === 409 ? 'SecretConflictError' : 'InvalidArgumentError',
        );
      }
      // A value at the limit is taken.
      const big = await admin.post('/v1/secrets', { name: 'big', value: 'x'.repeat(64 * 1024) });
      expect(big.status).toBe(201);
      const noChange = await admin.post('/v1/secrets/kept', {});
      expect(noChange.status).toBe(400);
      expect(noChange.body.error).toMatch(/a new value, new metadata, or both/);
      expect((await admin.post('/v1/secrets/kept', { value: '' })).status).toBe(400);
      expect((await admin.get('/v1/secrets/bad name')).status).toBe(400);
      const names = (await admin.get('/v1/secrets')).body.secrets.map((s: Json) => [
        s.name,
        s.version,
      ]);
      expect(names).toEqual([
        ['big', 1],
        ['kept', 1],
      ]);
    });

    test("a secret is its key's: another key gets 404 as for an unknown name; admins see all", async ({
      plane,
    }) => {
      const { daemon, admin, info } = await startOn(plane);
      const alice = await makeKey(admin, info, 'alice');
      const bob = await makeKey(admin, info, 'bob');
      const made = await alice.api.post('/v1/secrets', { name: 'openai', value: 'alice-value' });
      expect(made.status).toBe(201);
      expect(made.body.owner).toBeUndefined();
      const unknown = await bob.api.get('/v1/secrets/nothing-here');
      expect(unknown.status).toBe(404);
      for (const path of ['/v1/secrets/openai', `/v1/secrets/${made.body.secretId}`]) {
        const asBob = [
          await bob.api.get(path),
          await bob.api.post(path, { value: 'bob-overwrites' }),
          await bob.api.delete(path),
        ];
        for (const answer of asBob) {
          expect(answer.status).toBe(404);
          expect(answer.body.type).toBe(unknown.body.type);
        }
      }
      expect((await bob.api.get('/v1/secrets')).body.secrets).toEqual([]);
      // The name is per key: bob has an `openai` of his own, and each key resolves its own.
      expect(
        (await bob.api.post('/v1/secrets', { name: 'openai', value: 'bob-value' })).status,
      ).toBe(201);
      expect(await daemon.secrets.resolve(alice.id, 'openai')).toBe('alice-value');
      expect(await daemon.secrets.resolve(bob.id, 'openai')).toBe('bob-value');
      expect(await daemon.secrets.resolve(null, 'openai')).toBeUndefined();

      // An admin lists every key's secrets with their owners and reaches one by its id.
      const all = (await admin.get('/v1/secrets')).body.secrets;
      expect(all.map((s: Json) => s.owner).sort()).toEqual([alice.id, bob.id].sort());
      const byId = await admin.post(`/v1/secrets/${made.body.secretId}`, { value: 'rotated' });
      expect(byId.body).toMatchObject({ version: 2, owner: alice.id });
      expect(await daemon.secrets.resolve(alice.id, 'openai')).toBe('rotated');
      expect(await daemon.secrets.resolve(bob.id, 'openai')).toBe('bob-value');
    });
  });
}

describe('the secrets key', () => {
  test('is made in $ABX_HOME/secrets-key (0600) on first start and kept across restarts', async ({
    plane,
  }) => {
    const first = await plane.start();
    const file = join(first.home, 'secrets-key');
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const key = readFileSync(file, 'utf8');
    await first.admin.post('/v1/secrets', { name: 'kept', value: 'across restarts' });
    await first.daemon.stop();
    const again = await plane.start({ home: first.home });
    expect(readFileSync(file, 'utf8')).toBe(key);
    expect(await again.daemon.secrets.resolve(null, 'kept')).toBe('across restarts');
  });

  test("the operator's key (ABX_SECRETS_KEY or the option) is used and no file is made; a bad one is refused without echoing it", async ({
    plane,
  }) => {
    const key = Buffer.alloc(32, 7).toString('base64');
    const started = await plane.start({ secretsKey: key });
    expect(existsSync(join(started.home, 'secrets-key'))).toBe(false);
    await started.admin.post('/v1/secrets', { name: 'given', value: 'under the given key' });
    await started.daemon.stop();
    // The same key as hex opens it on a restart.
    const hex = Buffer.alloc(32, 7).toString('hex');
    const again = await plane.start({ home: started.home, secretsKey: hex });
    expect(await again.daemon.secrets.resolve(null, 'given')).toBe('under the given key');
    await again.daemon.stop();
    const home = mkdtempSync(join(tmpdir(), 'abx-secrets-'));
    try {
      expect(() => new Daemon({ home, secretsKey: 'not-a-key-hunter2' })).toThrow(
        /the secretsKey option is not a secrets key: it must be 32 bytes as 64 hex digits or as base64/,
      );
      try {
        new Daemon({ home, secretsKey: 'not-a-key-hunter2' });
      } catch (error) {
        expect((error as Error).message).not.toContain('hunter2');
      }
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });

  test('a value sealed for one secret does not open as another (id, name and version are bound to it)', async ({
    plane,
  }) => {
    const { daemon, admin, home } = await plane.start();
    await admin.post('/v1/secrets', { name: 'a', value: 'value of a' });
    await admin.post('/v1/secrets', { name: 'b', value: 'value of b' });
    await daemon.stop();
    // Someone with the database copies a's sealed value onto b.
    const db = openSqlite(join(home, 'abx.db'));
    try {
      db.exec(`UPDATE secret_versions SET sealed = (
        SELECT v.sealed FROM secret_versions v JOIN secrets s ON s.id = v.secret_id WHERE s.name = 'a')
        WHERE secret_id = (SELECT id FROM secrets WHERE name = 'b')`);
    } finally {
      db.close();
    }
    const again = await plane.start({ home });
    await expect(again.daemon.secrets.resolve(null, 'b')).rejects.toThrow(
      /version 1 of secret b does not open with this daemon's secrets key/,
    );
    expect(await again.daemon.secrets.resolve(null, 'a')).toBe('value of a');
  });

  test('SQLite with another key than the secrets were sealed with: the daemon starts and says so; those secrets fail when resolved', async ({
    plane,
  }) => {
    const first = await plane.start();
    await first.admin.post('/v1/secrets', { name: 'old', value: 'sealed with the lost key' });
    await first.daemon.stop();
    writeFileSync(
      join(first.home, 'secrets-key'),
      `${Buffer.alloc(32, 1).toString('base64url')}\n`,
    );
    const lines: string[] = [];
    const original = console.error;
    console.error = (line: string) => lines.push(String(line));
    let again: Started;
    try {
      again = await plane.start({ home: first.home });
    } finally {
      console.error = original;
    }
    expect(lines.join('\n')).toMatch(
      /warning: the registry .* holds secrets sealed with another secrets key than this daemon's \(.*secrets-key\)/,
    );
    await expect(again.daemon.secrets.resolve(null, 'old')).rejects.toThrow(
      /sealed with another secrets key/,
    );
    // Its name and metadata are still listed, and it can be removed and made again.
    expect((await again.admin.delete('/v1/secrets/old')).body.removed).toBe(true);
    await again.admin.post('/v1/secrets', { name: 'old', value: 'new' });
    expect(await again.daemon.secrets.resolve(null, 'old')).toBe('new');
  });
});

describe.skipIf(NEEDS_POSTGRES !== '')(`replicas on PostgreSQL${NEEDS_POSTGRES}`, () => {
  test('replicas with one key share secrets; a daemon with another key is refused at start, saying which key to share', async ({
    plane,
  }) => {
    const url = await plane.database();
    const key = Buffer.alloc(32, 9).toString('base64');
    const one = await plane.start({ databaseUrl: url, secretsKey: key });
    // Replicas share the token secret too (docs/registry.md).
    const tokenSecret = readFileSync(join(one.home, 'token-secret'), 'utf8');
    const homeTwo = mkdtempSync(join(tmpdir(), 'abx-secrets-'));
    writeFileSync(join(homeTwo, 'token-secret'), tokenSecret, { mode: 0o600 });
    const two = await plane.start({ databaseUrl: url, secretsKey: key, home: homeTwo });
    await one.admin.post('/v1/secrets', { name: 'shared', value: 'made on one' });
    expect(await two.daemon.secrets.resolve(null, 'shared')).toBe('made on one');
    await two.admin.post('/v1/secrets/shared', { value: 'rotated on two' });
    expect(await one.daemon.secrets.resolve(null, 'shared')).toBe('rotated on two');

    const homeThree = mkdtempSync(join(tmpdir(), 'abx-secrets-'));
    writeFileSync(join(homeThree, 'token-secret'), tokenSecret, { mode: 0o600 });
    await expect(plane.start({ databaseUrl: url, home: homeThree })).rejects.toThrow(
      /holds secrets sealed with another secrets key than this daemon's \(.*secrets-key\): give every daemon on it the same key/,
    );
  });
});
