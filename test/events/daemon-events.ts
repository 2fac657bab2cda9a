import { existsSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { expect } from 'vitest';
import { isProcessAlive, startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { until } from '../control/plane.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { type Api, apiAs, call, type Json } from '../helpers/api-call.js';
import { openEventStream } from './event-stream.js';

/**
 * What the daemon-level event tests do on either registry (test/events/daemon-events*.test.ts):
 * one real daemon (the local provider) with two keys, its registry SQLite or, with
 * `ABX_DATABASE_URL` in the environment, PostgreSQL.
 */
export interface EventsDaemon {
  /** The daemon now (a test that SIGKILLs it starts another: `info`, `a` and `b` change). */
  info: DaemonInfo;
  home: string;
  keyA: string;
  keyB: string;
  a: Api;
  b: Api;
  close(): Promise<void>;
}

/** The environment every one of these daemons gets (a receiver on loopback is permitted). */
export const EVENTS_ENV = {
  // Ten minutes: a stream's lifecycle event that comes at all was woken by its write.
  ABX_EVENTS_INTERVAL_MS: '600000',
  // Short: the template whose ready command never passes fails its create in 1.5 s.
  ABX_START_READY_TIMEOUT_MS: '1500',
  ABX_WEBHOOK_PERMIT: '127.0.0.0/8',
  // Long: a delivery that comes sooner was woken by its event's write, not found by the poll.
  ABX_WEBHOOK_POLL_MS: '5000',
  // Short: a delivery whose daemon was SIGKILLed is sent again 4 s after its claim.
  ABX_WEBHOOK_TIMEOUT_MS: '3000',
  ABX_WEBHOOK_LEASE_MS: '4000',
};

/** A daemon with `env` over {@link EVENTS_ENV}, and keys A and B; `close` stops it and restores the environment. */
export async function startEventsDaemon(env: Record<string, string> = {}): Promise<EventsDaemon> {
  const all = { ...EVENTS_ENV, ...env };
  const saved = Object.fromEntries(Object.keys(all).map((name) => [name, process.env[name]]));
  const restore = () => {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  };
  Object.assign(process.env, all);
  let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
  try {
    abx = await createAbxHome();
    const info = await startDaemon(abx.home);
    const admin = apiAs(info, readFileSync(join(abx.home, 'api-key'), 'utf8').trim());
    const keyA = (await admin.post('/v1/keys', { name: 'events-a' })).body.key as string;
    const keyB = (await admin.post('/v1/keys', { name: 'events-b' })).body.key as string;
    const home = abx.home;
    const close = abx.close;
    return {
      info,
      home,
      keyA,
      keyB,
      a: apiAs(info, keyA),
      b: apiAs(info, keyB),
      close: async () => {
        try {
          await close();
        } finally {
          restore();
        }
      },
    };
  } catch (error) {
    await abx?.close();
    restore();
    throw error;
  }
}

const short = (type: string) => type.replace('sandbox.lifecycle.', '');

/** `api`'s key's events of `type` (`/v1/events`), oldest first. */
async function ofType(api: Api, type: string): Promise<Json[]> {
  const page = await api.get(`/v1/events?type=sandbox.lifecycle.${type}&limit=1000`);
  expect(page.status).toBe(200);
  return page.body.events;
}

/** `key`'s events on E2B's face (`/events/sandboxes`), of abx's type `type`, newest first. */
async function e2bOfType(d: EventsDaemon, key: string, type: string): Promise<Json[]> {
  const answer = await call(
    `${d.info.apiUrl}/events/sandboxes?types=sandbox.lifecycle.${type}&limit=100`,
    { headers: { 'x-api-key': key } },
  );
  expect(answer.status).toBe(200);
  return answer.body;
}

/**
 * A create whose template's ready command never passes fails after ABX_START_READY_TIMEOUT_MS
 * (1.5 s here) and leaves a `failed` event with its reason, read by its key on /v1/events and
 * E2B's /events/sandboxes (with `?types=`: abx's own type), and by no other key.
 */
export async function failedStart(d: EventsDaemon): Promise<void> {
  const name = `never-ready-${Date.now().toString(36)}`;
  const built = await d.a.post('/v1/templates', {
    yaml: `name: ${name}\nstart:\n  cmd: exec sleep 600\n  ready: test -e /tmp/never-there\n`,
  });
  expect(built.status, JSON.stringify(built.body)).toBe(200);
  const began = Date.now();
  const refused = await d.a.post('/v1/sandboxes', { template: name });
  const took = Date.now() - began;
  expect(refused.status).toBeGreaterThanOrEqual(400);
  expect(JSON.stringify(refused.body)).toMatch(/did not exit 0 within 1\.5 s/);
  // The configured 1.5 s, not the default 120 s.
  expect(took).toBeLessThan(30_000);
  const failed = (await ofType(d.a, 'failed')).filter((e) => e.template === name);
  expect(failed).toHaveLength(1);
  const [event] = failed;
  expect(event.data.error).toMatch(
    /ready command `test -e \/tmp\/never-there` did not exit 0 within 1\.5 s/,
  );
  // No sandbox is left: its id names none, and its events are that one alone.
  const id = event.sandboxId as string;
  expect((await d.a.get(`/v1/sandboxes/${id}`)).status).toBe(404);
  expect(
    ((await d.a.get(`/v1/events?sandbox=${id}`)).body.events as Json[]).map((e) => short(e.type)),
  ).toEqual(['failed']);
  // E2B's face: abx's own type, asked for by name, in E2B's SandboxEvent shape.
  const e2b = (await e2bOfType(d, d.keyA, 'failed')).filter((e) => e.sandboxId === id);
  expect(e2b).toHaveLength(1);
  expect(e2b[0]).toMatchObject({
    id: event.id,
    type: 'sandbox.lifecycle.failed',
    sandboxTemplateId: name,
    eventData: { error: event.data.error },
  });
  // Without `types`, E2B's face shows E2B's six only.
  const plain = await call(`${d.info.apiUrl}/events/sandboxes?limit=100`, {
    headers: { 'x-api-key': d.keyA },
  });
  expect(plain.body.some((e: Json) => e.id === event.id)).toBe(false);
  // Key B sees none of it.
  expect((await ofType(d.b, 'failed')).some((e) => e.sandboxId === id)).toBe(false);
  expect((await d.b.get(`/v1/events?sandbox=${id}`)).status).toBe(404);
  expect((await e2bOfType(d, d.keyB, 'failed')).some((e) => e.sandboxId === id)).toBe(false);
}

/**
 * A fork of a hibernated sandbox whose kept disk is gone (removed from its folder) fails, and
 * leaves a `failed` event under the fork's id naming its source; the source is left as it was.
 */
export async function failedFork(d: EventsDaemon): Promise<void> {
  const made = await d.a.post('/v1/sandboxes', {});
  expect(made.status).toBe(200);
  const source = made.body.sandboxId as string;
  try {
    expect((await d.a.post(`/v1/sandboxes/${source}/pause`, { memory: false })).status).toBe(200);
    // What a hibernated sandbox keeps: a root daemon's disk image, a rootless one's files.
    const dir = join(d.home, 'sandboxes', source);
    const kept = ['disk.img', 'hibernated'].filter((file) => existsSync(join(dir, file)));
    expect(kept.length, `nothing kept in ${dir}`).toBeGreaterThan(0);
    for (const file of kept) rmSync(join(dir, file), { recursive: true, force: true });
    const before = (await ofType(d.a, 'failed')).length;
    const refused = await d.a.post(`/v1/sandboxes/${source}/fork`, {});
    expect(refused.status).toBeGreaterThanOrEqual(400);
    expect(JSON.stringify(refused.body)).toMatch(/could not be forked: copying its disk failed/);
    const failed = (await ofType(d.a, 'failed')).filter((e) => e.data.forkedFrom === source);
    expect(failed).toHaveLength(1);
    expect((await ofType(d.a, 'failed')).length).toBe(before + 1);
    const [event] = failed;
    expect(event.sandboxId).not.toBe(source);
    expect(event).toMatchObject({ template: 'base', data: { forkedFrom: source } });
    expect(event.data.error).toMatch(/could not be forked: copying its disk failed/);
    // No fork was left running; the source's own events say nothing of it.
    expect((await d.a.get(`/v1/sandboxes/${event.sandboxId}`)).status).toBe(404);
    const own = (await d.a.get(`/v1/events?sandbox=${source}`)).body.events as Json[];
    expect(own.map((e) => short(e.type))).toEqual(['created', 'paused']);
    const e2b = (await e2bOfType(d, d.keyA, 'failed')).filter((e) => e.id === event.id);
    expect(e2b[0]?.eventData).toMatchObject({ forkedFrom: source });
    expect((await d.b.get(`/v1/events?sandbox=${event.sandboxId}`)).status).toBe(404);
  } finally {
    await d.a.delete(`/v1/sandboxes/${source}`).catch(() => undefined);
  }
}

/**
 * Each change of a scripted sandbox once, in order, the snapshot's `checkpointed` among them;
 * key B lists none of A's.
 */
export async function scriptedLife(d: EventsDaemon): Promise<void> {
  const made = await d.a.post('/v1/sandboxes', { metadata: { job: 'events' } });
  expect(made.status).toBe(200);
  const id = made.body.sandboxId as string;
  try {
    expect((await d.a.post(`/v1/sandboxes/${id}/timeout`, { timeoutMs: 120_000 })).status).toBe(
      200,
    );
    expect((await d.a.post(`/v1/sandboxes/${id}/pause`, { memory: true })).status).toBe(200);
    expect((await d.a.post(`/v1/sandboxes/${id}/resume`, {})).status).toBe(200);
    const snapshot = await d.a.post(`/v1/sandboxes/${id}/snapshot`, { name: `events-${id}` });
    expect(snapshot.status).toBe(200);
    expect((await d.a.delete(`/v1/sandboxes/${id}`)).status).toBe(200);
  } finally {
    await d.a.delete(`/v1/sandboxes/${id}`).catch(() => undefined);
  }
  const events = (await d.a.get(`/v1/events?sandbox=${id}`)).body.events as Json[];
  expect(events.map((e) => short(e.type))).toEqual([
    'created',
    'updated',
    'paused',
    'resumed',
    'checkpointed',
    'killed',
  ]);
  expect(events[4]?.data).toEqual({ snapshot: `events-${id}` });
  for (let i = 1; i < events.length; i++) {
    expect(events[i].seq).toBeGreaterThan(events[i - 1].seq);
  }
  const listed = (await d.b.get('/v1/events?limit=1000')).body.events as Json[];
  expect(listed.some((e) => e.sandboxId === id)).toBe(false);
  expect((await d.b.get(`/v1/events?sandbox=${id}`)).status).toBe(404);
}

/**
 * With the poll at 5 s, a webhook still gets each event of a scripted sandbox within about a
 * second of its write: the write wakes the deliveries (in the daemon; on PostgreSQL through
 * NOTIFY). In order, once each.
 */
export async function wokenDeliveries(d: EventsDaemon): Promise<void> {
  const got: { at: number; body: Json }[] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      got.push({ at: Date.now(), body: JSON.parse(Buffer.concat(chunks).toString('utf8')) });
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  let hook: string | undefined;
  let id: string | undefined;
  try {
    const { port } = server.address() as AddressInfo;
    const registered = await d.a.post('/v1/webhooks', { url: `http://127.0.0.1:${port}/hook` });
    expect(registered.status).toBe(201);
    hook = registered.body.id as string;
    // Past the first poll after the registration, so what follows is not found by a poll.
    await new Promise((resolve) => setTimeout(resolve, 500));
    const wrote: number[] = [];
    const made = await d.a.post('/v1/sandboxes', {});
    expect(made.status).toBe(200);
    wrote.push(Date.now());
    id = made.body.sandboxId as string;
    await until(() => got.length >= 1, 'the created delivery', 4000);
    expect((await d.a.post(`/v1/sandboxes/${id}/timeout`, { timeoutMs: 100_000 })).status).toBe(
      200,
    );
    wrote.push(Date.now());
    await until(() => got.length >= 2, 'the updated delivery', 4000);
    expect((await d.a.delete(`/v1/sandboxes/${id}`)).status).toBe(200);
    wrote.push(Date.now());
    await until(() => got.length >= 3, 'the killed delivery', 4000);
    expect(got.map((g) => short(g.body.type as string))).toEqual(['created', 'updated', 'killed']);
    expect(got.every((g) => g.body.sandboxId === id)).toBe(true);
    // Each within a second of its change's answer (the poll would take up to 5 s).
    got.forEach((g, i) => {
      expect(g.at - (wrote[i] as number)).toBeLessThan(1000);
    });
    // Nothing more comes (once each).
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(got).toHaveLength(3);
  } finally {
    if (id) await d.a.delete(`/v1/sandboxes/${id}`).catch(() => undefined);
    if (hook) await d.a.delete(`/v1/webhooks/${hook}`).catch(() => undefined);
    await new Promise((resolve) => server.close(resolve));
  }
}

/**
 * A `/v1/events` stream whose registry read comes every ten minutes (EVENTS_ENV) gets each
 * lifecycle event of a new sandbox anyway, in order: the event's write woke it. Key B's stream,
 * woken by the same writes, gets none of them.
 */
export async function wokenStreams(d: EventsDaemon): Promise<void> {
  const mine = await openEventStream(d.info.apiUrl, d.keyA, '?only=lifecycle');
  const theirs = await openEventStream(d.info.apiUrl, d.keyB, '?only=lifecycle');
  let id: string | undefined;
  try {
    const made = await d.a.post('/v1/sandboxes', {});
    expect(made.status).toBe(200);
    id = made.body.sandboxId as string;
    const of = () => mine.events.filter((e) => e.event.sandboxId === id);
    await until(() => of().length >= 1, 'the created event on the stream', 4000);
    expect((await d.a.post(`/v1/sandboxes/${id}/timeout`, { timeoutMs: 100_000 })).status).toBe(
      200,
    );
    await until(() => of().length >= 2, 'the updated event on the stream', 4000);
    expect((await d.a.delete(`/v1/sandboxes/${id}`)).status).toBe(200);
    await until(() => of().length >= 3, 'the killed event on the stream', 4000);
    expect(of().map((e) => short(e.event.type as string))).toEqual([
      'created',
      'updated',
      'killed',
    ]);
    const seqs = of().map((e) => e.id);
    expect([...seqs].sort((x, y) => x - y)).toEqual(seqs);
    expect(theirs.events.filter((e) => e.event.sandboxId === id)).toEqual([]);
  } finally {
    if (id) await d.a.delete(`/v1/sandboxes/${id}`).catch(() => undefined);
    await mine.close();
    await theirs.close();
  }
}

/**
 * A receiver that holds its first delivery unanswered; the daemon SIGKILLed meanwhile and started
 * again on the same registry: the held delivery is sent again after its lease, under the same
 * delivery id, and every event of the sandbox arrives (a duplicate only ever of one delivery).
 * Leaves `d` pointing at the new daemon.
 */
export async function killedMidDelivery(d: EventsDaemon): Promise<void> {
  const got: { id: string; body: Json }[] = [];
  const held: { res: import('node:http').ServerResponse }[] = [];
  let hang = true;
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      got.push({
        id: req.headers['abx-webhook-id'] as string,
        body: JSON.parse(Buffer.concat(chunks).toString('utf8')),
      });
      if (hang) held.push({ res });
      else res.writeHead(200).end('ok');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  let hook: string | undefined;
  let id: string | undefined;
  try {
    const { port } = server.address() as AddressInfo;
    const registered = await d.a.post('/v1/webhooks', { url: `http://127.0.0.1:${port}/hook` });
    expect(registered.status).toBe(201);
    hook = registered.body.id as string;
    const made = await d.a.post('/v1/sandboxes', {});
    expect(made.status).toBe(200);
    id = made.body.sandboxId as string;
    await until(() => held.length === 1, 'the held delivery', 5000);
    const heldId = got[0]?.id as string;
    expect(heldId).toMatch(/^whd_/);
    const pid = d.info.pid;
    process.kill(pid, 'SIGKILL');
    await until(() => !isProcessAlive(pid), 'the daemon to die', 10_000);
    hang = false;
    for (const { res } of held) if (!res.closed) res.writeHead(200).end('late');
    d.info = await startDaemon(d.home);
    d.a = apiAs(d.info, d.keyA);
    d.b = apiAs(d.info, d.keyB);
    // Sent again once its claim's lease (4 s) ended, under the same id.
    await until(() => got.filter((g) => g.id === heldId).length >= 2, 'the retry', 20_000);
    expect((await d.a.delete(`/v1/sandboxes/${id}`)).status).toBe(200);
    await until(
      () => got.some((g) => g.body.sandboxId === id && short(g.body.type) === 'killed'),
      'the killed delivery',
      20_000,
    );
    const mine = got.filter((g) => g.body.sandboxId === id);
    const events = new Map<string, Set<string>>();
    for (const g of mine) events.set(g.body.id, (events.get(g.body.id) ?? new Set()).add(g.id));
    expect([...new Set(mine.map((g) => short(g.body.type)))]).toEqual(['created', 'killed']);
    // Each event under one delivery id, however often it was sent.
    for (const deliveries of events.values()) expect(deliveries.size).toBe(1);
    const log = await d.a.get(`/v1/webhooks/${hook}/deliveries`);
    expect(log.status).toBe(200);
    expect(
      (log.body.deliveries as Json[]).filter((row) => row.state === 'delivered').length,
    ).toBeGreaterThanOrEqual(2);
  } finally {
    for (const { res } of held) if (!res.closed) res.destroy();
    if (id) await d.a.delete(`/v1/sandboxes/${id}`).catch(() => undefined);
    if (hook) await d.a.delete(`/v1/webhooks/${hook}`).catch(() => undefined);
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
}
