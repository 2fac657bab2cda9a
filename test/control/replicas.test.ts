import { execFile } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Client } from 'undici';
import { test as base, describe, expect } from 'vitest';
import { Daemon, type DaemonOptions } from '../../src/control/daemon.js';
import { PostgresRegistry } from '../../src/control/postgres-registry.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { call, type Json } from '../helpers/api-call.js';
import { ROOT } from '../helpers/build.js';
import { MemoryProvider } from '../helpers/memory-provider.js';
import {
  createTestDatabase,
  freePort,
  NEEDS_POSTGRES,
  TEST_DATABASE_URL,
  withDatabase,
} from '../helpers/postgres.js';
import { until } from './plane.js';

interface Replica {
  daemon: Daemon;
  info: DaemonInfo;
  home: string;
  api: {
    get(path: string): Promise<{ status: number; body: Json }>;
    post(path: string, body?: unknown): Promise<{ status: number; body: Json }>;
    delete(path: string): Promise<{ status: number; body: Json }>;
  };
  /** One request through this daemon's gateway, on a connection of its own. */
  gateway(path: string, headers: Record<string, string>): Promise<{ status: number; body: Json }>;
}

interface Replicas {
  /** The sandboxes' host, shared by every daemon (as pods are, to every replica on a cluster). */
  provider: MemoryProvider;
  url: string;
  /** Starts a daemon with its own `$ABX_HOME` on the test's database. */
  start(options?: Partial<DaemonOptions> & { tokenSecret?: string }): Promise<Replica>;
  /** The homes made so far (the first one's token secret is every later one's). */
  homes: string[];
}

/** Two (or more) daemons on one PostgreSQL database and one provider; all stopped afterwards. */
const test = base.extend<{ replicas: Replicas }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  replicas: async ({}, use) => {
    const database = await createTestDatabase();
    const provider = new MemoryProvider();
    const homes: string[] = [];
    const daemons: Daemon[] = [];
    try {
      await use({
        provider,
        url: database.url,
        homes,
        async start(options = {}) {
          const { tokenSecret, ...rest } = options;
          const home = mkdtempSync(join(tmpdir(), 'abx-replica-'));
          homes.push(home);
          // Replicas share the token secret, as a secret mounted into every replica would be.
          if (tokenSecret) writeFileSync(join(home, 'token-secret'), `${tokenSecret}\n`);
          else if (homes.length > 1) {
            copyFileSync(join(homes[0] as string, 'token-secret'), join(home, 'token-secret'));
          }
          const daemon = new Daemon({
            home,
            provider,
            databaseUrl: database.url,
            apiPort: 0,
            gatewayPort: 0,
            reapIntervalMs: 20,
            warmPool: 0,
            ...rest,
          });
          daemons.push(daemon);
          const info = await daemon.start();
          const auth = {
            authorization: `Bearer ${readFileSync(join(home, 'api-key'), 'utf8').trim()}`,
          };
          return {
            daemon,
            info,
            home,
            api: {
              get: (path) => call(`${info.apiUrl}${path}`, { headers: auth }),
              post: (path, body = {}) =>
                call(`${info.apiUrl}${path}`, { method: 'POST', headers: auth, body }),
              delete: (path) => call(`${info.apiUrl}${path}`, { method: 'DELETE', headers: auth }),
            },
            async gateway(path, headers) {
              // A connection of its own: the gateway checks the sandbox per connection.
              const client = new Client(info.gatewayUrl);
              try {
                const response = await client.request({ method: 'GET', path, headers });
                const text = await response.body.text();
                return { status: response.statusCode, body: text ? JSON.parse(text) : undefined };
              } finally {
                await client.close();
              }
            },
          };
        },
      });
    } finally {
      provider.releaseCreates();
      for (const daemon of daemons) await daemon.stop().catch(() => undefined);
      await provider.dispose();
      for (const home of homes) rmSync(home, { recursive: true, force: true });
      await database.drop();
    }
  },
});

const envd = (id: string, token: string) => ({
  host: `49983-${id}.localhost`,
  'x-access-token': token,
});

describe(`two daemons on one PostgreSQL database${NEEDS_POSTGRES}`, () => {
  test.skipIf(NEEDS_POSTGRES !== '')(
    'a sandbox created through one is listed, reached, connected to and killed through the other',
    async ({ replicas }) => {
      const a = await replicas.start();
      const b = await replicas.start();
      const created = await a.api.post('/v1/sandboxes', { metadata: { owner: 'alice' } });
      expect(created.status).toBe(200);
      const { sandboxId: id, accessToken } = created.body;

      const listed = await b.api.get('/v1/sandboxes?metadata.owner=alice');
      expect(listed.body.sandboxes.map((s: Json) => s.sandboxId)).toEqual([id]);
      expect(await b.gateway('/health', envd(id, accessToken))).toEqual({
        status: 200,
        body: { status: 'ok' },
      });
      // Both daemons derive the same token for a sandbox: a client may connect through either.
      const connected = await b.api.post(`/v1/sandboxes/${id}/connect`);
      expect(connected.body).toMatchObject({ sandboxId: id, accessToken, state: 'running' });
      // a's gateway has seen it running (and may keep its record a moment).
      expect((await a.gateway('/health', envd(id, accessToken))).status).toBe(200);

      const killed = await b.api.delete(`/v1/sandboxes/${id}`);
      expect(killed.body).toMatchObject({ killed: true, sandbox: { state: 'killed' } });
      expect((await a.api.get(`/v1/sandboxes/${id}`)).body).toMatchObject({
        state: 'killed',
        endReason: 'killed by request',
      });
      // a's gateway may trust what it saw a moment longer (its processes are checked, so it
      // cannot answer from the sandbox); then it refuses as for any ended sandbox.
      let refused: { status: number; body: Json } | undefined;
      await until(
        async () => {
          refused = await a.gateway('/health', envd(id, accessToken));
          expect(refused.status).not.toBe(200);
          return refused.status === 404;
        },
        'a’s gateway to refuse the killed sandbox',
        5000,
      );
      expect(refused?.body).toMatchObject({ type: 'SandboxNotFoundError' });
      expect(refused?.body.error).toMatch(
        /is not running \((killed: killed by request|its processes ended)\)/,
      );
      expect((await a.api.post(`/v1/sandboxes/${id}/connect`)).status).toBe(404);
    },
  );

  test.skipIf(NEEDS_POSTGRES !== '')(
    'a daemon with another token secret refuses to start, naming the file to copy',
    async ({ replicas }) => {
      await replicas.start();
      const start = replicas.start({ tokenSecret: 'not-the-shared-secret' });
      await expect(start).rejects.toThrow(/token secret of this daemon \(.*token-secret\) is not/);
    },
  );

  test.skipIf(NEEDS_POSTGRES !== '')(
    'sandboxes that expire are reaped once, by one of the two reapers',
    async ({ replicas }) => {
      const a = await replicas.start();
      const b = await replicas.start();
      const ids: string[] = [];
      for (let i = 0; i < 6; i++) {
        const daemon = i % 2 ? a : b;
        ids.push((await daemon.api.post('/v1/sandboxes', { timeoutMs: 200 })).body.sandboxId);
      }
      await until(
        async () =>
          (await a.api.get('/v1/sandboxes?state=expired')).body.sandboxes.length === ids.length,
        'every sandbox to expire',
        10_000,
      );
      // Both reapers pass a few more times over the ended rows.
      const kills = replicas.provider.kills;
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(replicas.provider.kills).toBe(kills);
      for (const id of ids) {
        expect(replicas.provider.killed.filter((killed) => killed === id)).toHaveLength(1);
        const row = (await b.api.get(`/v1/sandboxes/${id}`)).body;
        expect(row.state).toBe('expired');
        expect(row.endReason).toBe(`expired at ${row.expiresAt}`);
      }
    },
  );

  test.skipIf(NEEDS_POSTGRES !== '')(
    'kills through both daemons at once: each sandbox ends once, and one caller is told it killed it',
    async ({ replicas }) => {
      const a = await replicas.start();
      const b = await replicas.start();
      const ids: string[] = [];
      for (let i = 0; i < 8; i++) ids.push((await a.api.post('/v1/sandboxes')).body.sandboxId);
      await Promise.all(
        ids.map(async (id) => {
          const answers = await Promise.all([
            a.api.delete(`/v1/sandboxes/${id}`),
            b.api.delete(`/v1/sandboxes/${id}`),
          ]);
          expect(answers.map((answer) => answer.status)).toEqual([200, 200]);
          expect(answers.filter((answer) => answer.body.killed === true)).toHaveLength(1);
          for (const answer of answers) {
            expect(answer.body.sandbox).toMatchObject({
              state: 'killed',
              endReason: 'killed by request',
            });
          }
        }),
      );
      expect(replicas.provider.aliveIds().filter((id) => ids.includes(id))).toEqual([]);
    },
  );

  test.skipIf(NEEDS_POSTGRES !== '')(
    'a daemon that died after recording a kill: another daemon’s reaper kills what is left',
    async ({ replicas }) => {
      const a = await replicas.start({ releaseGraceMs: 100 });
      const { sandboxId: id } = (await a.api.post('/v1/sandboxes')).body;
      // Another daemon recorded the kill and died before killing: the row says killed, the
      // sandbox's processes run on.
      const dying = new PostgresRegistry(replicas.url);
      try {
        expect(await dying.endSandbox(id, 'killed', 'killed by request')).toBe(true);
      } finally {
        await dying.close();
      }
      expect(replicas.provider.aliveIds()).toContain(id);
      await until(
        () => !replicas.provider.aliveIds().includes(id),
        'the reaper to kill what was left',
        10_000,
      );
      expect((await a.api.get(`/v1/sandboxes/${id}`)).body).toMatchObject({
        state: 'killed',
        endReason: 'killed by request',
      });
    },
  );

  test.skipIf(NEEDS_POSTGRES !== '')(
    'the warm pool is shared: concurrent creates on both daemons each get a different spare',
    async ({ replicas }) => {
      const a = await replicas.start({ warmPool: 4 });
      const b = await replicas.start({ warmPool: 4 });
      // Starts that take a while: creates arriving together count as a burst the pools follow.
      replicas.provider.createDelayMs = 200;
      // Bursts make both pools want spares; each daemon's refills fill the shared pool.
      await Promise.all([0, 1, 2].map(() => a.api.post('/v1/sandboxes')));
      await Promise.all([0, 1, 2].map(() => b.api.post('/v1/sandboxes')));
      await a.daemon.sandboxes.refill('base');
      await b.daemon.sandboxes.refill('base');
      const pooled = (await a.api.get('/v1/sandboxes?state=pooled')).body.sandboxes.map(
        (s: Json) => s.sandboxId,
      );
      expect(pooled.length).toBeGreaterThanOrEqual(3);

      // From now on nothing starts: every create below can only be served from the pool.
      replicas.provider.holdCreates();
      const created = await Promise.all(
        pooled.map((_: string, i: number) =>
          (i % 2 ? a : b).api.post('/v1/sandboxes', { metadata: { n: String(i) } }),
        ),
      );
      const ids = created.map((answer) => answer.body.sandboxId);
      expect([...ids].sort()).toEqual([...pooled].sort());
      for (const [i, answer] of created.entries()) {
        expect(answer.body).toMatchObject({ state: 'running', metadata: { n: String(i) } });
        expect(
          (await a.gateway('/health', envd(answer.body.sandboxId, answer.body.accessToken))).status,
        ).toBe(200);
      }
      const left = (await b.api.get('/v1/sandboxes?state=pooled')).body.sandboxes;
      expect(left.filter((s: Json) => ids.includes(s.sandboxId))).toEqual([]);
    },
  );

  test.skipIf(NEEDS_POSTGRES !== '')(
    'a stopping daemon kills its own spares only; the other’s stay in the pool',
    async ({ replicas }) => {
      const a = await replicas.start({ warmPool: 2 });
      const b = await replicas.start({ warmPool: 2 });
      await a.api.post('/v1/sandboxes');
      await a.daemon.sandboxes.refill('base');
      const spares = (await b.api.get('/v1/sandboxes?state=pooled')).body.sandboxes.map(
        (s: Json) => s.sandboxId,
      );
      expect(spares.length).toBeGreaterThan(0);
      await b.daemon.stop();
      const after = (await a.api.get('/v1/sandboxes?state=pooled')).body.sandboxes.map(
        (s: Json) => s.sandboxId,
      );
      expect(after).toEqual(spares);
      expect(replicas.provider.aliveIds()).toEqual(expect.arrayContaining(spares));
    },
  );
});

describe('a database that cannot be reached at start', () => {
  test('the daemon refuses to start, naming the URL without its password and what to check', async () => {
    const home = mkdtempSync(join(tmpdir(), 'abx-replica-'));
    const provider = new MemoryProvider();
    const port = await freePort();
    const daemon = new Daemon({
      home,
      provider,
      databaseUrl: `postgres://abx:hunter2@127.0.0.1:${port}/abx`,
    });
    try {
      const failure = await daemon.start().then(
        () => undefined,
        (error: Error) => error,
      );
      expect(failure?.message).toContain(
        `cannot reach the registry database postgres://abx:***@127.0.0.1:${port}/abx (connect ECONNREFUSED`,
      );
      expect(failure?.message).toContain('check that PostgreSQL runs there');
      expect(failure?.message).not.toContain('hunter2');
    } finally {
      await daemon.stop().catch(() => undefined);
      await provider.dispose();
      rmSync(home, { recursive: true, force: true });
    }
  });

  test.skipIf(NEEDS_POSTGRES !== '')(
    `a database that does not exist: the daemon says to create it${NEEDS_POSTGRES}`,
    async () => {
      const home = mkdtempSync(join(tmpdir(), 'abx-replica-'));
      const provider = new MemoryProvider();
      const url = withDatabase(TEST_DATABASE_URL as string, 'abx_no_such_database');
      const daemon = new Daemon({ home, provider, databaseUrl: url });
      try {
        await expect(daemon.start()).rejects.toThrow(
          `the registry database ${url} refused this daemon: database "abx_no_such_database" does not exist: create the database (createdb NAME) or fix its name in ABX_DATABASE_URL`,
        );
      } finally {
        await daemon.stop().catch(() => undefined);
        await provider.dispose();
        rmSync(home, { recursive: true, force: true });
      }
    },
  );

  test('`node dist/daemon.js` exits 1 with that message', async () => {
    const home = mkdtempSync(join(tmpdir(), 'abx-replica-'));
    const port = await freePort();
    try {
      const failure = await promisify(execFile)(
        process.execPath,
        [join(ROOT, 'dist', 'daemon.js')],
        {
          env: {
            ...process.env,
            ABX_HOME: home,
            ABX_DATABASE_URL: `postgresql://abx:hunter2@127.0.0.1:${port}/abx`,
          },
          timeout: 30_000,
        },
      ).then(
        () => undefined,
        (error: { code: number; stderr: string }) => error,
      );
      expect(failure?.code).toBe(1);
      expect(failure?.stderr).toContain(
        `abx daemon: cannot reach the registry database postgresql://abx:***@127.0.0.1:${port}/abx`,
      );
      expect(failure?.stderr).not.toContain('hunter2');
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });
});
