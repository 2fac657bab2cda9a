import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test as base, describe, expect } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import { verifyWebhook } from '../../src/util/webhook-signature.js';
import { until } from '../control/plane.js';
import { call, type Json } from '../helpers/api-call.js';
import { MemoryProvider } from '../helpers/memory-provider.js';
import { createTestDatabase, NEEDS_POSTGRES } from '../helpers/postgres.js';

const ENV = {
  ABX_WEBHOOK_PERMIT: '127.0.0.0/8',
  ABX_WEBHOOK_POLL_MS: '20',
  ABX_WEBHOOK_BACKOFF_MS: '100',
};

interface Got {
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** Two daemons on one PostgreSQL database and a receiver on 127.0.0.1; all stopped afterwards. */
const test = base.extend<{
  pair: {
    apis: ((path: string, body?: unknown, method?: string) => Promise<Json>)[];
    got: Got[];
    url: string;
  };
}>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  pair: async ({}, use) => {
    const saved = Object.fromEntries(Object.keys(ENV).map((k) => [k, process.env[k]]));
    Object.assign(process.env, ENV);
    const database = await createTestDatabase();
    const provider = new MemoryProvider();
    const homes: string[] = [];
    const daemons: Daemon[] = [];
    const got: Got[] = [];
    const server: Server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        got.push({ headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
        res.writeHead(204).end();
      });
    });
    try {
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      const apis = [];
      for (let i = 0; i < 2; i++) {
        const home = mkdtempSync(join(tmpdir(), 'abx-hooks-pg-'));
        homes.push(home);
        // Replicas share the token and secrets keys, as mounted secrets would be.
        if (i > 0) {
          for (const file of ['token-secret', 'secrets-key']) {
            copyFileSync(join(homes[0] as string, file), join(home, file));
          }
        }
        const daemon = new Daemon({
          home,
          provider,
          databaseUrl: database.url,
          apiPort: 0,
          gatewayPort: 0,
          warmPool: 0,
        });
        daemons.push(daemon);
        const info = await daemon.start();
        const key = readFileSync(join(homes[0] as string, 'api-key'), 'utf8').trim();
        const own = readFileSync(join(home, 'api-key'), 'utf8').trim();
        // Each daemon's own key is its home's; both are the daemon key (owner null) of one plane.
        apis.push((path: string, body?: unknown, method = body === undefined ? 'GET' : 'POST') =>
          call(`${info.apiUrl}${path}`, {
            method,
            headers: { authorization: `Bearer ${i === 0 ? key : own}` },
            ...(body === undefined ? {} : { body }),
          }),
        );
      }
      await use({ apis, got, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/` });
    } finally {
      provider.releaseCreates();
      for (const daemon of daemons) await daemon.stop().catch(() => undefined);
      await provider.dispose();
      server.closeAllConnections();
      server.close();
      for (const home of homes) rmSync(home, { recursive: true, force: true });
      await database.drop();
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  },
});

describe(`webhooks of two daemons on one PostgreSQL database${NEEDS_POSTGRES}`, () => {
  test.skipIf(NEEDS_POSTGRES !== '')(
    'each event is delivered once, whichever daemon made it or changed its sandbox',
    async ({ pair }) => {
      const [a, b] = pair.apis as [(typeof pair.apis)[0], (typeof pair.apis)[0]];
      const hook = await a('/v1/webhooks', { url: pair.url, secret: 'replica-secret' });
      expect(hook.status).toBe(201);
      // Seen by the other daemon: the webhook is a row of the shared registry.
      expect((await b(`/v1/webhooks/${hook.body.id}`)).status).toBe(200);
      const ids: string[] = [];
      for (let i = 0; i < 6; i++) {
        const created = await (i % 2 ? b : a)('/v1/sandboxes', {});
        expect(created.status).toBe(200);
        ids.push(created.body.sandboxId);
      }
      for (const [i, id] of ids.entries()) {
        expect((await (i % 2 ? a : b)(`/v1/sandboxes/${id}`, undefined, 'DELETE')).status).toBe(
          200,
        );
      }
      await until(() => pair.got.length >= ids.length * 2, 'every delivery', 20_000);
      // A moment more: a second delivery of any event would come now.
      await new Promise((resolve) => setTimeout(resolve, 1000));
      const events = pair.got.map((g) => verifyWebhook('replica-secret', g.headers, g.body));
      expect(events).toHaveLength(ids.length * 2);
      expect(new Set(events.map((e) => e.deliveryId)).size).toBe(ids.length * 2);
      const payloads = events.map((e) => e.payload as Json);
      expect(new Set(payloads.map((p) => p.id)).size).toBe(ids.length * 2);
      for (const id of ids) {
        expect(payloads.filter((p) => p.sandboxId === id).map((p) => p.type)).toEqual([
          'sandbox.lifecycle.created',
          'sandbox.lifecycle.killed',
        ]);
      }
      const log = await b(`/v1/webhooks/${hook.body.id}/deliveries`);
      expect(log.body.deliveries.map((d: Json) => [d.state, d.attempts])).toEqual(
        ids.flatMap(() => [
          ['delivered', 1],
          ['delivered', 1],
        ]),
      );
    },
    60_000,
  );
});
