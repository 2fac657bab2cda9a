import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { WebhookNotFoundError } from '../../src/errors.js';
import { isProcessAlive, startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { Webhook } from '../../src/sandbox/webhook.js';
import { e2bWebhookSignature, verifyWebhook } from '../../src/util/webhook-signature.js';
import { until } from '../control/plane.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { call, type Json } from '../helpers/api-call.js';
import { ROOT } from '../helpers/build.js';

/** One request a receiver got. */
interface Got {
  headers: IncomingMessage['headers'];
  body: string;
  at: number;
}

/**
 * A webhook receiver on 127.0.0.1: records every request; answers 200 (`ok`), or holds requests
 * unanswered (`hang`); `down()` stops listening, `up()` listens on the same port again.
 */
class Receiver {
  readonly got: Got[] = [];
  readonly held: { res: ServerResponse; closed: boolean; got: Got }[] = [];
  mode: 'ok' | 'hang' = 'ok';
  private server: Server | undefined;
  port = 0;

  async up(): Promise<void> {
    const server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const got = {
          headers: req.headers,
          body: Buffer.concat(chunks).toString('utf8'),
          at: Date.now(),
        };
        this.got.push(got);
        if (this.mode === 'hang') {
          const entry = { res, closed: false, got };
          res.on('close', () => {
            entry.closed = true;
          });
          this.held.push(entry);
          return;
        }
        res.writeHead(200).end('ok');
      });
    });
    await new Promise<void>((resolve) => server.listen(this.port, '127.0.0.1', resolve));
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
  }

  async down(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}/hook`;
  }
}

const ENV = {
  ABX_WEBHOOK_PERMIT: '127.0.0.0/8',
  ABX_WEBHOOK_POLL_MS: '50',
  ABX_WEBHOOK_BACKOFF_MS: '200',
  ABX_WEBHOOK_BACKOFF_MAX_MS: '1000',
  ABX_WEBHOOK_TIMEOUT_MS: '5000',
  ABX_WEBHOOK_LEASE_MS: '6000',
};
const saved: Record<string, string | undefined> = {};

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let keyA: string;
let keyB: string;
let admin: ReturnType<typeof as>;
const receiverA = new Receiver();
const receiverB = new Receiver();

const E2B_SECRET = 'e2b-secret-for-the-test';
let e2bHook: Json;
let nativeHook: Json;
let nativeSecret: string;

function as(key: string) {
  const headers = { authorization: `Bearer ${key}` };
  return {
    get: (path: string) => call(`${info.apiUrl}${path}`, { headers }),
    post: (path: string, body: unknown = {}) =>
      call(`${info.apiUrl}${path}`, { method: 'POST', headers, body }),
    delete: (path: string) => call(`${info.apiUrl}${path}`, { method: 'DELETE', headers }),
    e2b: (method: string, path: string, body?: unknown) =>
      call(`${info.apiUrl}${path}`, {
        method,
        headers: { 'x-api-key': key },
        ...(body === undefined ? {} : { body }),
      }),
  };
}

beforeAll(async () => {
  for (const [name, value] of Object.entries(ENV)) {
    saved[name] = process.env[name];
    process.env[name] = value;
  }
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  admin = as(readFileSync(join(abx.home, 'api-key'), 'utf8').trim());
  keyA = (await admin.post('/v1/keys', { name: 'hooks-a' })).body.key;
  keyB = (await admin.post('/v1/keys', { name: 'hooks-b' })).body.key;
  await receiverA.up();
  await receiverB.up();
}, 120_000);

afterAll(async () => {
  await receiverA.down();
  await receiverB.down();
  await abx?.close();
  for (const [name, value] of Object.entries(saved)) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
});

/** The deliveries a receiver got of a sandbox's events, by the header naming the webhook. */
function deliveriesOf(receiver: Receiver, webhookId: string, sandboxId: string) {
  return receiver.got
    .filter((g) => {
      const body = JSON.parse(g.body);
      const hook = g.headers['e2b-webhook-id'] ?? body.webhookId;
      return hook === webhookId && body.sandboxId === sandboxId;
    })
    .map((g) => ({ ...g, json: JSON.parse(g.body) }));
}

const waitFor = (check: () => boolean, ms: number, before?: () => Promise<void>) =>
  until(
    async () => {
      await before?.();
      return check();
    },
    'the deliveries expected',
    ms,
  );

const typesOf = (list: { json: Json }[]) =>
  list.map((d) => (d.json.type as string).replace('sandbox.lifecycle.', ''));

describe('webhooks of a real daemon (SQLite), a receiver on loopback', () => {
  test('a URL to loopback or a private, link-local or metadata address is refused (400) without the operator’s permission, on both faces', async () => {
    const a = as(keyA);
    for (const url of ['http://[::1]:9/', 'http://169.254.169.254/latest', 'http://10.1.2.3/']) {
      const refused = await a.post('/v1/webhooks', { url });
      expect(refused.status).toBe(400);
      expect(refused.body.error).toMatch(/ABX_WEBHOOK_PERMIT/);
      expect(refused.body.code).toBe('webhook_url_refused');
    }
    const e2b = await a.e2b('POST', '/events/webhooks', {
      name: 'x',
      url: 'http://192.168.1.1/',
      enabled: true,
      events: [],
      signatureSecret: E2B_SECRET,
    });
    expect(e2b.status).toBe(400);
    expect(e2b.body).toMatchObject({ code: 400, message: expect.stringMatching(/private/) });
    expect((await a.post('/v1/webhooks', { url: 'ftp://example.com/' })).status).toBe(400);
    expect((await a.get('/v1/webhooks')).body.webhooks).toEqual([]);
  });

  test('every lifecycle change of a scripted sandbox arrives once, in order, signed (E2B’s formula on the E2B face, verifyWebhook natively); key B’s webhook gets none of key A’s', async () => {
    const a = as(keyA);
    const b = as(keyB);
    const registered = await a.e2b('POST', '/events/webhooks', {
      name: 'e2b face',
      url: receiverA.url,
      enabled: true,
      events: [],
      signatureSecret: E2B_SECRET,
    });
    expect(registered.status).toBe(201);
    e2bHook = registered.body;
    expect(e2bHook).toMatchObject({ name: 'e2b face', url: receiverA.url, enabled: true });
    expect(JSON.stringify(e2bHook)).not.toContain(E2B_SECRET);
    const native = await a.post('/v1/webhooks', { url: receiverA.url, name: 'native' });
    expect(native.status).toBe(201);
    nativeHook = native.body;
    nativeSecret = native.body.secret;
    expect(nativeSecret).toMatch(/^whsec_/);
    expect((await a.get(`/v1/webhooks/${nativeHook.id}`)).body.secret).toBeUndefined();
    const other = await b.post('/v1/webhooks', { url: receiverB.url, secret: 'b-secret-123' });
    expect(other.status).toBe(201);
    // Another key's webhook is unknown to A, on both faces.
    expect((await a.get(`/v1/webhooks/${other.body.id}`)).status).toBe(404);
    expect((await a.e2b('GET', `/events/webhooks/${other.body.id}`)).status).toBe(404);
    // A key's webhooks are listed on both faces, whichever face registered them.
    expect((await a.e2b('GET', '/events/webhooks')).body.map((w: Json) => w.id)).toEqual([
      e2bHook.id,
      nativeHook.id,
    ]);

    const created = await a.post('/v1/sandboxes', {});
    expect(created.status).toBe(200);
    const id = created.body.sandboxId as string;
    expect((await a.post(`/v1/sandboxes/${id}/timeout`, { timeoutMs: 120_000 })).status).toBe(200);
    expect((await a.post(`/v1/sandboxes/${id}/pause`, {})).status).toBe(200);
    expect((await a.post(`/v1/sandboxes/${id}/resume`, {})).status).toBe(200);
    expect((await a.delete(`/v1/sandboxes/${id}`)).status).toBe(200);
    const expected = ['created', 'updated', 'paused', 'resumed', 'killed'];
    await waitFor(
      () =>
        deliveriesOf(receiverA, e2bHook.id, id).length >= expected.length &&
        deliveriesOf(receiverA, nativeHook.id, id).length >= expected.length,
      20_000,
    );
    const viaE2b = deliveriesOf(receiverA, e2bHook.id, id);
    const viaNative = deliveriesOf(receiverA, nativeHook.id, id);
    expect(typesOf(viaE2b)).toEqual(expected);
    expect(typesOf(viaNative)).toEqual(expected);
    for (const d of viaE2b) {
      expect(d.headers['e2b-signature']).toBe(e2bWebhookSignature(E2B_SECRET, d.body));
      expect(d.json).toMatchObject({
        version: 'v1',
        sandboxId: id,
        sandboxTeamId: expect.any(String),
      });
    }
    const ids = new Set<string>();
    for (const d of viaNative) {
      const checked = verifyWebhook(nativeSecret, d.headers, d.body);
      ids.add(checked.deliveryId);
      expect(() => verifyWebhook('whsec_d3Jvbmc=', d.headers, d.body)).toThrow(/does not match/);
      // A capture replayed after the window is refused.
      expect(() => verifyWebhook(nativeSecret, d.headers, d.body, { now: d.at + 301_000 })).toThrow(
        /window/,
      );
    }
    expect(ids.size).toBe(expected.length);
    expect(new Set(viaE2b.map((d) => d.headers['e2b-delivery-id'])).size).toBe(expected.length);
    expect(new Set(viaE2b.map((d) => d.json.id)).size).toBe(expected.length);
    const log = await a.get(`/v1/webhooks/${nativeHook.id}/deliveries`);
    expect(log.body.deliveries.filter((d: Json) => d.sandboxId === id)).toHaveLength(5);
    expect(
      log.body.deliveries.every((d: Json) => d.state === 'delivered' && d.attempts === 1),
    ).toBe(true);
    expect(receiverB.got.filter((g) => g.body.includes(id))).toEqual([]);
  }, 60_000);

  test('the SDK and the CLI register, list, change, read the log of and remove a webhook; bad input is refused by name, changing nothing', async () => {
    const connection = { apiUrl: info.apiUrl, apiKey: keyB };
    const made = await Webhook.create(receiverB.url, { ...connection, name: 'sdk', events: [] });
    expect(made.secret).toMatch(/^whsec_/);
    await expect(
      Webhook.update(made.id, { ...connection, events: ['sandbox.lifecycle.exploded'] }),
    ).rejects.toThrow(/events must be a list of event types/);
    await expect(
      Webhook.update(made.id, { ...connection, enabled: 'no' as never }),
    ).rejects.toThrow(/enabled must be true or false/);
    expect((await Webhook.getInfo(made.id, connection)).enabled).toBe(true);
    const updated = await Webhook.update(made.id, { ...connection, enabled: false });
    expect(updated).toMatchObject({ id: made.id, enabled: false, flavour: 'abx' });
    await expect(Webhook.getInfo(made.id, { apiUrl: info.apiUrl, apiKey: keyA })).rejects.toThrow(
      WebhookNotFoundError,
    );
    const cli = spawnSync(
      process.execPath,
      [join(ROOT, 'dist', 'cli.js'), 'webhook', 'list', '--json'],
      {
        encoding: 'utf8',
        env: { ...process.env, NO_COLOR: '1', ABX_API_URL: info.apiUrl, ABX_API_KEY: keyB },
        timeout: 30_000,
      },
    );
    expect(cli.status).toBe(0);
    expect(JSON.parse(cli.stdout).map((w: Json) => [w.name, w.enabled])).toEqual([
      [`127.0.0.1:${receiverB.port}`, true],
      ['sdk', false],
    ]);
    const log = spawnSync(
      process.execPath,
      [join(ROOT, 'dist', 'cli.js'), 'webhook', 'deliveries', made.id],
      {
        encoding: 'utf8',
        env: { ...process.env, NO_COLOR: '1', ABX_API_URL: info.apiUrl, ABX_API_KEY: keyB },
        timeout: 30_000,
      },
    );
    expect(log.stdout).toContain('no deliveries yet');
    expect(await Webhook.destroy(made.id, connection)).toBe(true);
    expect(await Webhook.destroy(made.id, connection)).toBe(false);

    // A revoked key's webhooks get nothing more: its sandbox's kill (at the revocation) is failed.
    const hooks = await Webhook.list(connection);
    const box = await as(keyB).post('/v1/sandboxes', {});
    const boxId = box.body.sandboxId as string;
    await waitFor(() => receiverB.got.some((g) => g.body.includes(boxId)), 10_000);
    const keyId = (await admin.get('/v1/keys')).body.keys.find(
      (k: Json) => k.name === 'hooks-b',
    ).id;
    expect((await admin.delete(`/v1/keys/${keyId}?kill=true`)).status).toBe(200);
    let revokedLog: Json[] = [];
    await waitFor(
      () => revokedLog.some((d) => d.state === 'failed'),
      10_000,
      async () => {
        revokedLog = (await admin.get(`/v1/webhooks/${hooks[0]?.id}/deliveries`)).body.deliveries;
      },
    );
    expect(revokedLog.find((d) => d.state === 'failed').lastError).toMatch(/was revoked/);
    expect(receiverB.got.filter((g) => g.body.includes(boxId))).toHaveLength(1);
  }, 60_000);

  test('the receiver down for 10 s then up: every event arrives, retried with the same ids', async () => {
    const a = as(keyA);
    await receiverA.down();
    const created = await a.post('/v1/sandboxes', {});
    const id = created.body.sandboxId as string;
    expect((await a.delete(`/v1/sandboxes/${id}`)).status).toBe(200);
    await new Promise((resolve) => setTimeout(resolve, 10_000));
    await receiverA.up();
    await waitFor(
      () =>
        deliveriesOf(receiverA, e2bHook.id, id).length >= 2 &&
        deliveriesOf(receiverA, nativeHook.id, id).length >= 2,
      15_000,
    );
    expect(typesOf(deliveriesOf(receiverA, e2bHook.id, id))).toEqual(['created', 'killed']);
    expect(typesOf(deliveriesOf(receiverA, nativeHook.id, id))).toEqual(['created', 'killed']);
    const log = (await a.get(`/v1/webhooks/${nativeHook.id}/deliveries`)).body.deliveries.filter(
      (d: Json) => d.sandboxId === id,
    );
    expect(log.map((d: Json) => d.state)).toEqual(['delivered', 'delivered']);
    // The create's delivery was tried while the receiver was down (refused), then delivered.
    expect(log[1].attempts).toBeGreaterThan(1);
  }, 60_000);

  test('a receiver that never answers does not delay a create; the daemon SIGKILLed mid-delivery and started again loses nothing, and the retry carries the same id', async () => {
    const a = as(keyA);
    receiverA.mode = 'hang';
    const first = await a.post('/v1/sandboxes', {});
    const id = first.body.sandboxId as string;
    await waitFor(() => receiverA.held.length > 0, 10_000);
    const held = receiverA.held[0] as (typeof receiverA.held)[number];
    // A create while a delivery hangs: it returns with the delivery still held open.
    const started = Date.now();
    const second = await a.post('/v1/sandboxes', {});
    const createMs = Date.now() - started;
    expect(second.status).toBe(200);
    expect({ closed: held.closed, createMs }).toEqual({ closed: false, createMs });
    expect(createMs).toBeLessThan(Number(ENV.ABX_WEBHOOK_TIMEOUT_MS));
    const heldId =
      (held.got.headers['e2b-delivery-id'] as string | undefined) ??
      (held.got.headers['abx-webhook-id'] as string);

    const pid = info.pid;
    process.kill(pid, 'SIGKILL');
    await waitFor(() => !isProcessAlive(pid), 10_000);
    receiverA.mode = 'ok';
    for (const h of receiverA.held) if (!h.closed) h.res.writeHead(200).end('late');
    info = await startDaemon(abx.home);

    await waitFor(
      () =>
        receiverA.got.filter(
          (g) => (g.headers['e2b-delivery-id'] ?? g.headers['abx-webhook-id']) === heldId,
        ).length >= 2,
      20_000,
    );
    const ids = [id, second.body.sandboxId as string];
    for (const sandbox of ids)
      expect((await a.delete(`/v1/sandboxes/${sandbox}`)).status).toBe(200);
    for (const sandbox of ids) {
      await waitFor(
        () =>
          typesOf(deliveriesOf(receiverA, e2bHook.id, sandbox)).includes('killed') &&
          typesOf(deliveriesOf(receiverA, nativeHook.id, sandbox)).includes('killed'),
        20_000,
      );
      for (const hook of [e2bHook.id, nativeHook.id]) {
        // Every event is there; a duplicate is a retry of a delivery, under its id.
        const got = deliveriesOf(receiverA, hook, sandbox);
        const unique = new Map(got.map((d) => [d.json.id, d]));
        expect(
          [...unique.values()].map((d) => d.json.type.replace('sandbox.lifecycle.', '')),
        ).toEqual(['created', 'killed']);
        const byEvent = new Map<string, Set<string>>();
        for (const d of got) {
          const delivery = (d.headers['e2b-delivery-id'] ?? d.headers['abx-webhook-id']) as string;
          byEvent.set(d.json.id, (byEvent.get(d.json.id) ?? new Set()).add(delivery));
        }
        for (const deliveries of byEvent.values()) expect(deliveries.size).toBe(1);
      }
    }
  }, 90_000);
});
