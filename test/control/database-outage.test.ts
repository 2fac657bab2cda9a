import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from 'undici';
import { describe, expect, test } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import { call, type Json } from '../helpers/api-call.js';
import { MemoryProvider } from '../helpers/memory-provider.js';
import { NEEDS_POSTGRES, ownCluster } from '../helpers/postgres.js';
import { until } from './plane.js';

/** A 503 of the API's error shape that names the database. */
function expectDatabaseDown(answer: { status: number; body: Json }, url: string): void {
  expect(answer.status).toBe(503);
  expect(Object.keys(answer.body).sort()).toEqual(['code', 'error', 'type']);
  expect(answer.body).toMatchObject({ type: 'UnavailableError', code: 'database_unavailable' });
  expect(answer.body.error).toContain(`the registry database ${url} does not answer`);
}

// Its own PostgreSQL cluster (stopped and started by the test), not the server other files use.
describe.skipIf(NEEDS_POSTGRES !== '')(
  `a database outage while the daemon runs${NEEDS_POSTGRES}`,
  () => {
    test('requests that need the database answer 503 naming it, nothing is half-written, and it all works again once the database is back', async () => {
      const cluster = await ownCluster();
      const home = mkdtempSync(join(tmpdir(), 'abx-outage-'));
      const provider = new MemoryProvider();
      const daemon = new Daemon({
        home,
        provider,
        databaseUrl: cluster.url,
        apiPort: 0,
        gatewayPort: 0,
        reapIntervalMs: 20,
        warmPool: 0,
      });
      const logged: string[] = [];
      const originalError = console.error;
      console.error = (...args: unknown[]) => logged.push(args.map(String).join(' '));
      try {
        const info = await daemon.start();
        const auth = {
          authorization: `Bearer ${readFileSync(join(home, 'api-key'), 'utf8').trim()}`,
        };
        const api = (method: string, path: string, body?: unknown) =>
          call(`${info.apiUrl}${path}`, { method, headers: auth, body });
        const gateway = async (id: string, token: string) => {
          const client = new Client(info.gatewayUrl);
          try {
            const response = await client.request({
              method: 'GET',
              path: '/health',
              headers: { host: `49983-${id}.localhost`, 'x-access-token': token },
            });
            return { status: response.statusCode, body: await response.body.json() };
          } finally {
            await client.close();
          }
        };

        const created = (await api('POST', '/v1/sandboxes', { metadata: { job: 'kept' } })).body;
        const { sandboxId: id, accessToken } = created;
        expect((await gateway(id, accessToken)).status).toBe(200);
        // One the gateway has not looked up yet.
        const unseen = (await api('POST', '/v1/sandboxes', {})).body;
        const before = (await api('GET', '/v1/sandboxes')).body.sandboxes;
        const alive = provider.aliveIds();

        await cluster.stop();
        expectDatabaseDown(await api('GET', '/v1/sandboxes'), cluster.url);
        expectDatabaseDown(await api('GET', `/v1/sandboxes/${id}`), cluster.url);
        expectDatabaseDown(await api('POST', '/v1/sandboxes', {}), cluster.url);
        expectDatabaseDown(await api('DELETE', `/v1/sandboxes/${id}`), cluster.url);
        expectDatabaseDown(
          await api('POST', `/v1/sandboxes/${id}/timeout`, { timeoutMs: 1000 }),
          cluster.url,
        );
        // What does not need the database still answers: health, and the gateway to a sandbox it
        // has seen running.
        expect((await call(`${info.apiUrl}/v1/health`)).status).toBe(200);
        expect(await gateway(id, accessToken)).toEqual({ status: 200, body: { status: 'ok' } });
        const unknown = await gateway(unseen.sandboxId, unseen.accessToken);
        expectDatabaseDown({ status: unknown.status, body: unknown.body }, cluster.url);
        // The create that failed left no sandbox behind.
        expect(provider.aliveIds()).toEqual(alive);

        await cluster.start();
        await until(
          async () => (await api('GET', '/v1/sandboxes')).status === 200,
          'the API to answer again',
          20_000,
        );
        // The sandbox is as it was: the failed kill and timeout changed nothing.
        expect((await api('GET', '/v1/sandboxes')).body.sandboxes).toEqual(before);
        expect((await gateway(unseen.sandboxId, unseen.accessToken)).status).toBe(200);
        const again = await api('POST', '/v1/sandboxes', {});
        expect(again.status).toBe(200);
        expect((await api('DELETE', `/v1/sandboxes/${id}`)).body).toMatchObject({
          killed: true,
          sandbox: { state: 'killed' },
        });
        // The background work said once that the database was gone, not once per pass.
        const reaperLines = logged.filter((line) => line.startsWith('reaper: UnavailableError'));
        expect(reaperLines.length).toBeGreaterThan(0);
        expect(new Set(reaperLines).size).toBe(reaperLines.length);

        // A daemon stops even while the database is down.
        await cluster.stop();
        await daemon.stop();
      } finally {
        console.error = originalError;
        await daemon.stop().catch(() => undefined);
        await provider.dispose();
        rmSync(home, { recursive: true, force: true });
        await cluster.destroy();
      }
    });
  },
);
