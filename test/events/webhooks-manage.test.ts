/**
 * Webhooks a user manages and debugs (docs/events.md, "Test-send and redelivery"): a test event
 * to one webhook, a delivery sent again with its id, who may do either, and what is refused.
 * One daemon, a receiver on loopback, the SDK, the routes and the built CLI.
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { WebhookNotFoundError } from '../../src/errors.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { Webhook } from '../../src/sandbox/webhook.js';
import { verifyWebhook } from '../../src/util/webhook-signature.js';
import { until } from '../control/plane.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { call, type Json } from '../helpers/api-call.js';
import { ROOT } from '../helpers/build.js';

interface Got {
  path: string;
  headers: IncomingMessage['headers'];
  body: string;
}

/** A receiver on 127.0.0.1 that answers `status` (or holds the request while `hang`). */
class Receiver {
  readonly got: Got[] = [];
  status = 200;
  hang = false;
  private readonly held: ServerResponse[] = [];
  private server: Server | undefined;
  port = 0;

  async up(): Promise<void> {
    const server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        this.got.push({
          path: req.url ?? '',
          headers: req.headers,
          body: Buffer.concat(chunks).toString('utf8'),
        });
        if (this.hang) this.held.push(res);
        else res.writeHead(this.status).end(this.status === 200 ? 'ok' : 'receiver says no');
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
  }

  async down(): Promise<void> {
    for (const res of this.held.splice(0)) res.destroy();
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  url(path: string): string {
    return `http://127.0.0.1:${this.port}/${path}`;
  }
}

const ENV = {
  ABX_WEBHOOK_PERMIT: '127.0.0.0/8',
  ABX_WEBHOOK_POLL_MS: '50',
  ABX_WEBHOOK_BACKOFF_MS: '200',
  ABX_WEBHOOK_BACKOFF_MAX_MS: '1000',
  ABX_WEBHOOK_TIMEOUT_MS: '1500',
  ABX_WEBHOOK_LEASE_MS: '3000',
};
const saved: Record<string, string | undefined> = {};

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let adminKey: string;
let keyA: string;
let keyB: string;
const receiver = new Receiver();

function as(key: string) {
  const headers = { authorization: `Bearer ${key}` };
  return {
    get: (path: string) => call(`${info.apiUrl}${path}`, { headers }),
    post: (path: string, body?: unknown) =>
      call(`${info.apiUrl}${path}`, {
        method: 'POST',
        headers,
        ...(body === undefined ? {} : { body }),
      }),
    patch: (path: string, body: unknown) =>
      call(`${info.apiUrl}${path}`, { method: 'PATCH', headers, body }),
    delete: (path: string) => call(`${info.apiUrl}${path}`, { method: 'DELETE', headers }),
  };
}

/** `abx ARGS` with `key`, from the built CLI (not spawnSync: the receiver runs in this process). */
function cli(
  key: string,
  ...args: string[]
): Promise<{ status: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [join(ROOT, 'dist', 'cli.js'), ...args],
      {
        encoding: 'utf8',
        env: { ...process.env, NO_COLOR: '1', ABX_API_URL: info.apiUrl, ABX_API_KEY: key },
        timeout: 30_000,
      },
      (error, stdout, stderr) =>
        resolve({ status: error ? Number(error.code ?? -1) : 0, stdout, stderr }),
    );
  });
}

beforeAll(async () => {
  for (const [name, value] of Object.entries(ENV)) {
    saved[name] = process.env[name];
    process.env[name] = value;
  }
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  adminKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  keyA = (await as(adminKey).post('/v1/keys', { name: 'manage-a' })).body.key;
  keyB = (await as(adminKey).post('/v1/keys', { name: 'manage-b' })).body.key;
  await receiver.up();
}, 120_000);

afterAll(async () => {
  await receiver.down();
  await abx?.close();
  for (const [name, value] of Object.entries(saved)) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
});

const gotAt = (path: string) => receiver.got.filter((g) => g.path === `/${path}`);

describe('webhooks: test-send and redelivery', () => {
  test('a test event goes to that webhook only, signed, once, in its log; the CLI waits and prints the outcome', async () => {
    const connection = { apiUrl: info.apiUrl, apiKey: keyA };
    const hook = await Webhook.create(receiver.url('t1'), connection);
    const other = await Webhook.create(receiver.url('t2'), connection);
    const queued = await Webhook.test(hook.id, connection);
    expect(queued).toMatchObject({ kind: 'test', state: 'pending', attempts: 0, eventSeq: null });
    const done = await Webhook.waitForDelivery(hook.id, queued.id, {
      ...connection,
      timeoutMs: 10_000,
      intervalMs: 50,
    });
    expect(done).toMatchObject({ state: 'delivered', attempts: 1, lastStatus: 200 });
    const [got] = gotAt('t1');
    expect(gotAt('t1')).toHaveLength(1);
    expect(got?.headers['abx-webhook-id']).toBe(queued.id);
    const verified = verifyWebhook(hook.secret as string, got?.headers ?? {}, got?.body ?? '');
    expect(verified).toMatchObject({
      deliveryId: queued.id,
      payload: { type: 'webhook.test', webhookId: hook.id, sandboxId: '', data: { test: true } },
    });
    expect(() =>
      verifyWebhook(other.secret as string, got?.headers ?? {}, got?.body ?? ''),
    ).toThrow();
    expect(gotAt('t2')).toEqual([]);
    const log = await Webhook.deliveries(hook.id, connection);
    expect(log.map((d) => [d.id, d.kind, d.state])).toEqual([[queued.id, 'test', 'delivered']]);

    // The CLI: delivered (exit 0); a refusing receiver is tried once and said (exit 1).
    const ok = await cli(keyA, 'webhook', 'test', hook.id);
    expect(ok.stderr).toBe('');
    expect(ok.stdout).toMatch(
      /^test: delivery whd_[0-9a-f]{24} delivered \(HTTP 200, 1 attempt\)$/m,
    );
    expect(ok.status).toBe(0);
    receiver.status = 500;
    const before = gotAt('t1').length;
    const refused = await cli(keyA, 'webhook', 'test', hook.id, '--json');
    receiver.status = 200;
    expect(refused.status).toBe(1);
    expect(JSON.parse(refused.stdout)).toMatchObject({
      kind: 'test',
      state: 'failed',
      attempts: 1,
      lastStatus: 500,
      lastError: 'the receiver answered 500: receiver says no',
    });
    await new Promise((resolve) => setTimeout(resolve, 600)); // longer than a retry's backoff
    expect(gotAt('t1')).toHaveLength(before + 1);
  }, 60_000);

  test('redelivery sends the same delivery id and event again with a fresh attempt history; the CLI too', async () => {
    const connection = { apiUrl: info.apiUrl, apiKey: keyA };
    const hook = await Webhook.create(receiver.url('r1'), {
      ...connection,
      events: ['sandbox.lifecycle.created'],
    });
    const created = await as(keyA).post('/v1/sandboxes', {});
    expect(created.status).toBe(200);
    const boxId = created.body.sandboxId as string;
    try {
      let log: Json[] = [];
      await until(
        async () => {
          log = await Webhook.deliveries(hook.id, connection);
          return log.some((d) => d.state === 'delivered');
        },
        'the created event delivered',
        10_000,
      );
      const first = log[0];
      expect(first).toMatchObject({ kind: 'event', sandboxId: boxId, attempts: 1 });
      const original = gotAt('r1');
      expect(original).toHaveLength(1);

      const again = await Webhook.redeliver(hook.id, first.id, connection);
      expect(again).toMatchObject({
        id: first.id,
        eventSeq: first.eventSeq,
        state: 'pending',
        attempts: 0,
        lastStatus: null,
        deliveredAt: null,
      });
      const done = await Webhook.waitForDelivery(hook.id, first.id, {
        ...connection,
        timeoutMs: 10_000,
        intervalMs: 50,
      });
      expect(done).toMatchObject({ state: 'delivered', attempts: 1, lastStatus: 200 });
      const both = gotAt('r1');
      expect(both).toHaveLength(2);
      expect(both[1]?.headers['abx-webhook-id']).toBe(first.id);
      const [a, b] = both.map((g) => JSON.parse(g.body));
      expect(b.id).toBe(a.id);
      expect(b).toEqual(a);
      expect(
        verifyWebhook(hook.secret as string, both[1]?.headers ?? {}, both[1]?.body ?? ''),
      ).toMatchObject({
        deliveryId: first.id,
        payload: { type: 'sandbox.lifecycle.created', sandboxId: boxId },
      });

      // The CLI: queued, waited for, printed.
      const out = await cli(keyA, 'webhook', 'redeliver', hook.id, first.id);
      expect(out.stdout).toContain(
        `redelivery: delivery ${first.id} delivered (HTTP 200, 1 attempt)`,
      );
      expect(out.status).toBe(0);
      expect(gotAt('r1')).toHaveLength(3);

      // An admin may redeliver another key's delivery; the log still holds one row for it.
      const byAdmin = await as(adminKey).post(
        `/v1/webhooks/${hook.id}/deliveries/${first.id}/redeliver`,
      );
      expect(byAdmin.status).toBe(202);
      await until(() => gotAt('r1').length === 4, 'the admin redelivery', 10_000);
      expect(
        (await Webhook.deliveries(hook.id, connection)).filter((d) => d.id === first.id),
      ).toHaveLength(1);
    } finally {
      await as(keyA).delete(`/v1/sandboxes/${boxId}`);
    }
  }, 60_000);

  test("another key's webhook or delivery is 404 as unknown; bad ids, a pending delivery, a disabled or deleted webhook are refused by name, changing nothing", async () => {
    const a = as(keyA);
    const b = as(keyB);
    const hook = (await a.post('/v1/webhooks', { url: receiver.url('e1') })).body;
    const mine = (await b.post('/v1/webhooks', { url: receiver.url('e2') })).body;
    const sent = await a.post(`/v1/webhooks/${hook.id}/test`);
    expect(sent.status).toBe(202);
    const deliveryId = sent.body.id as string;
    await until(
      async () =>
        (await a.get(`/v1/webhooks/${hook.id}/deliveries/${deliveryId}`)).body.state ===
        'delivered',
      'the test delivered',
      10_000,
    );
    const count = () => receiver.got.length;
    const before = count();

    // Key B: A's webhook and its delivery are unknown, through A's id or through B's own webhook.
    const unknown = `no webhook "${hook.id}" among this key's webhooks; see abx webhook list`;
    for (const [path, message] of [
      [`/v1/webhooks/${hook.id}/test`, unknown],
      [`/v1/webhooks/${hook.id}/deliveries/${deliveryId}/redeliver`, unknown],
      [
        `/v1/webhooks/${mine.id}/deliveries/${deliveryId}/redeliver`,
        `no delivery "${deliveryId}" in webhook ${mine.id}'s log`,
      ],
    ] as const) {
      const res = await b.post(path);
      expect(res.status, path).toBe(404);
      expect(res.body.error, path).toContain(message);
    }
    expect((await b.get(`/v1/webhooks/${hook.id}/deliveries/${deliveryId}`)).status).toBe(404);
    await expect(
      Webhook.redeliver(hook.id, deliveryId, { apiUrl: info.apiUrl, apiKey: keyB }),
    ).rejects.toThrow(WebhookNotFoundError);

    // Bad ids and a body where none is taken.
    const badDelivery = await a.post(`/v1/webhooks/${hook.id}/deliveries/nope/redeliver`);
    expect(badDelivery.status).toBe(404);
    expect(badDelivery.body).toMatchObject({
      code: 'delivery_not_found',
      type: 'WebhookNotFoundError',
    });
    expect(badDelivery.body.error).toContain('ids look like whd_ and 24 hex digits');
    expect((await a.post('/v1/webhooks/whk_nope/test')).status).toBe(404);
    const withBody = await a.post(`/v1/webhooks/${hook.id}/test`, { event: 'x' });
    expect(withBody.status).toBe(400);
    expect(withBody.body.error).toContain('takes no body');

    // A delivery still being tried is not queued twice.
    receiver.hang = true;
    const held = (await a.post(`/v1/webhooks/${hook.id}/test`)).body.id as string;
    await until(() => count() === before + 1, 'the held test request', 10_000);
    const pending = await a.post(`/v1/webhooks/${hook.id}/deliveries/${held}/redeliver`);
    expect(pending.status).toBe(400);
    expect(pending.body.code).toBe('delivery_pending');
    expect(pending.body.error).toContain('is still pending (1 attempt so far)');
    await until(
      async () =>
        (await a.get(`/v1/webhooks/${hook.id}/deliveries/${held}`)).body.state === 'failed',
      'the held test to time out',
      10_000,
    );
    receiver.hang = false;
    const timedOut = (await a.get(`/v1/webhooks/${hook.id}/deliveries/${held}`)).body;
    expect(timedOut).toMatchObject({ attempts: 1, lastStatus: null });
    expect(timedOut.lastError).toContain('no answer within 1500 ms (ABX_WEBHOOK_TIMEOUT_MS)');

    // Disabled: refused, and the delivery stays as it was.
    expect((await a.patch(`/v1/webhooks/${hook.id}`, { enabled: false })).status).toBe(200);
    for (const path of [
      `/v1/webhooks/${hook.id}/test`,
      `/v1/webhooks/${hook.id}/deliveries/${deliveryId}/redeliver`,
    ]) {
      const res = await a.post(path);
      expect(res.status, path).toBe(400);
      expect(res.body.code, path).toBe('webhook_disabled');
      expect(res.body.error, path).toContain(`abx webhook update ${hook.id} --enable`);
    }
    expect((await a.get(`/v1/webhooks/${hook.id}/deliveries/${deliveryId}`)).body).toMatchObject({
      state: 'delivered',
      attempts: 1,
    });
    const disabledCli = await cli(keyA, 'webhook', 'test', hook.id);
    expect(disabledCli.status).toBe(2);
    expect(disabledCli.stderr).toContain('is disabled');

    // Deleted: unknown.
    expect((await a.delete(`/v1/webhooks/${hook.id}`)).status).toBe(200);
    expect((await a.post(`/v1/webhooks/${hook.id}/test`)).status).toBe(404);
    expect(
      (await a.post(`/v1/webhooks/${hook.id}/deliveries/${deliveryId}/redeliver`)).status,
    ).toBe(404);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(count()).toBe(before + 1);
  }, 60_000);
});
