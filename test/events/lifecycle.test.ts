import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox as E2bSandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import type { SandboxLifecycleEvent } from '../../src/sandbox/sandbox-events.js';
import { abxIn } from '../cli/abx.js';
import { until } from '../control/plane.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { type Api, apiAs, call, type Json } from '../helpers/api-call.js';
import { openEventStream } from './event-stream.js';

/**
 * Lifecycle events of a real daemon (SQLite, the local provider): each change of a scripted
 * sandbox once, in order, with its data; key A's events never reach key B; the stream resumes
 * from Last-Event-ID with nothing missed; E2B's routes read them for E2B's SDK's users.
 */

/** Fast passes: the stream and the reaper look every 200 ms. */
const ENV = { ABX_EVENTS_INTERVAL_MS: '200', ABX_EVENTS_EXPIRING_LEAD_MS: '60000' };
const saved: Record<string, string | undefined> = {};

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let keyA: string;
let keyB: string;
let a: Api;
let b: Api;

beforeAll(async () => {
  for (const [name, value] of Object.entries(ENV)) {
    saved[name] = process.env[name];
    process.env[name] = value;
  }
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  const admin = apiAs(info, readFileSync(join(abx.home, 'api-key'), 'utf8').trim());
  keyA = (await admin.post('/v1/keys', { name: 'events-a' })).body.key;
  keyB = (await admin.post('/v1/keys', { name: 'events-b' })).body.key;
  a = apiAs(info, keyA);
  b = apiAs(info, keyB);
}, 120_000);

afterAll(async () => {
  await abx?.close();
  for (const [name, value] of Object.entries(saved)) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
});

const short = (type: string) => type.replace('sandbox.lifecycle.', '');

/** A sandbox's events as `api`'s key reads them (`/v1/events?sandbox=`). */
async function eventsOf(api: Api, id: string, query = ''): Promise<Json[]> {
  const page = await api.get(`/v1/events?sandbox=${id}${query}`);
  expect(page.status).toBe(200);
  return page.body.events;
}

/** An open `GET /v1/events` stream of `key`'s (test/events/event-stream.ts). */
const stream = (key: string, query: string, headers: Record<string, string> = {}) =>
  openEventStream(info.apiUrl, key, query, headers);

describe('lifecycle events of a real daemon', () => {
  test('each change of a scripted sandbox once, in order, with its data; a short one expires', async () => {
    const made = await a.post('/v1/sandboxes', { metadata: { job: 'events' } });
    expect(made.status).toBe(200);
    const id = made.body.sandboxId as string;
    try {
      expect((await a.post(`/v1/sandboxes/${id}/timeout`, { timeoutMs: 120_000 })).status).toBe(
        200,
      );
      expect((await a.post(`/v1/sandboxes/${id}/pause`, { memory: true })).status).toBe(200);
      // Refused: it is paused. A refused change writes nothing.
      expect((await a.post(`/v1/sandboxes/${id}/timeout`, { timeoutMs: 5000 })).status).not.toBe(
        200,
      );
      expect((await a.post(`/v1/sandboxes/${id}/resume`, {})).status).toBe(200);
      const snapshot = await a.post(`/v1/sandboxes/${id}/snapshot`, { name: `events-${id}` });
      expect(snapshot.status).toBe(200);
      expect((await a.delete(`/v1/sandboxes/${id}`)).status).toBe(200);
    } finally {
      await a.delete(`/v1/sandboxes/${id}`).catch(() => undefined);
    }
    const events = await eventsOf(a, id);
    expect(events.map((e) => short(e.type))).toEqual([
      'created',
      'updated',
      'paused',
      'resumed',
      'checkpointed',
      'killed',
    ]);
    const [created, updated, paused, resumed, checkpointed, killed] = events;
    expect(created.data).toMatchObject({ source: expect.any(String), metadata: { job: 'events' } });
    expect(updated.data).toMatchObject({ change: 'timeout', expiresAt: expect.any(Number) });
    expect(paused.data).toMatchObject({ kind: 'memory', reason: 'api' });
    expect(resumed.data).toMatchObject({ kind: 'memory' });
    expect(checkpointed.data).toEqual({ snapshot: `events-${id}` });
    expect(killed.data).toMatchObject({ reason: 'api', state: 'killed' });
    expect(events.every((e) => e.sandboxId === id && e.template === 'base')).toBe(true);
    // seq grows, ids are UUIDs, times do not go back.
    for (let i = 1; i < events.length; i++) {
      expect(events[i].seq).toBeGreaterThan(events[i - 1].seq);
      expect(Date.parse(events[i].at)).toBeGreaterThanOrEqual(Date.parse(events[i - 1].at));
    }
    expect(new Set(events.map((e) => e.id)).size).toBe(events.length);
    // Paged by cursor, both ways; filtered by type.
    const first = await a.get(`/v1/events?sandbox=${id}&limit=4`);
    expect(first.body.more).toBe(true);
    const second = await a.get(`/v1/events?sandbox=${id}&limit=4&cursor=${first.body.cursor}`);
    expect([...first.body.events, ...second.body.events].map((e: Json) => e.id)).toEqual(
      events.map((e) => e.id),
    );
    const newest = await a.get(`/v1/events?sandbox=${id}&order=desc&limit=2`);
    const older = await a.get(
      `/v1/events?sandbox=${id}&order=desc&limit=10&cursor=${newest.body.cursor}`,
    );
    expect([...newest.body.events, ...older.body.events].map((e: Json) => e.seq)).toEqual(
      events.map((e) => e.seq).reverse(),
    );
    expect(
      (await eventsOf(a, id, '&type=sandbox.lifecycle.paused,sandbox.lifecycle.resumed')).map((e) =>
        short(e.type),
      ),
    ).toEqual(['paused', 'resumed']);
    expect(
      (await eventsOf(a, id, `&since=${encodeURIComponent(killed.at)}`)).map((e) => e.id),
    ).toEqual([killed.id]);

    // A sandbox with a short timeout: warned of, then expired by the reaper.
    const brief = await a.post('/v1/sandboxes', { timeoutMs: 1500 });
    const briefId = brief.body.sandboxId as string;
    await until(
      async () => (await eventsOf(a, briefId)).some((e) => short(e.type) === 'killed'),
      'the expiry',
      15_000,
    );
    const briefEvents = await eventsOf(a, briefId);
    expect(briefEvents.map((e) => short(e.type))).toEqual(['created', 'expiring', 'killed']);
    expect(briefEvents[1].data).toMatchObject({ leadMs: 60_000, onTimeout: 'kill' });
    expect(briefEvents[2].data).toMatchObject({ reason: 'expired', state: 'expired' });
  }, 90_000);

  test('bad queries are 400s that say what to give', async () => {
    for (const [query, says] of [
      ['limit=0', /limit must be a whole number from 1 to 1000/],
      ['limit=1001', /limit/],
      ['order=up', /order must be asc or desc/],
      ['cursor=-1', /cursor must be an event's seq/],
      ['type=sandbox.lifecycle.exploded', /not an event type: give one or more of/],
      ['since=yesterday', /since must be a time/],
      ['since=2000&until=1000', /since .* is after until/],
    ] as const) {
      const answer = await a.get(`/v1/events?${query}`);
      expect(answer.status, query).toBe(400);
      expect(answer.body.error, query).toMatch(says);
    }
    const e2b = await call(`${info.apiUrl}/events/sandboxes?limit=101`, {
      headers: { 'x-api-key': keyA },
    });
    expect(e2b.status).toBe(400);
    expect(e2b.body).toMatchObject({ code: 400, message: expect.stringMatching(/limit/) });
  });

  test("key B never lists or follows key A's events; A's sandbox is 404 to B on both faces", async () => {
    const streamB = await stream(keyB, '?only=lifecycle&after=0');
    let id = '';
    try {
      id = (await a.post('/v1/sandboxes', {})).body.sandboxId;
      expect((await a.delete(`/v1/sandboxes/${id}`)).status).toBe(200);
      const mine = (await b.post('/v1/sandboxes', {})).body.sandboxId as string;
      await b.delete(`/v1/sandboxes/${mine}`);
      await until(
        () =>
          streamB.events.some(
            (e) => e.event.sandboxId === mine && short(e.event.type) === 'killed',
          ),
        "B's own events",
        10_000,
      );
      expect(streamB.events.every((e) => e.event.sandboxId === mine)).toBe(true);
    } finally {
      await streamB.close();
    }
    const listed = (await b.get('/v1/events?limit=1000')).body.events as Json[];
    expect(listed.length).toBeGreaterThan(0);
    expect(listed.some((e) => e.sandboxId === id)).toBe(false);
    const refused = await b.get(`/v1/events?sandbox=${id}`);
    expect(refused.status).toBe(404);
    expect(refused.body.error).toBe(`sandbox ${id} does not exist`);
    const unknown = await b.get('/v1/events?sandbox=inosuchsandbox00');
    expect(unknown.body).toEqual({
      ...refused.body,
      error: 'sandbox inosuchsandbox00 does not exist',
    });
    const followed = await fetch(`${info.apiUrl}/v1/events?sandbox=${id}`, {
      headers: { authorization: `Bearer ${keyB}`, accept: 'text/event-stream' },
    });
    expect(followed.status).toBe(404);
    await followed.body?.cancel();
    const e2bB = await call(`${info.apiUrl}/events/sandboxes/${id}`, {
      headers: { 'x-api-key': keyB },
    });
    expect(e2bB.status).toBe(404);
    const e2bAll = await call(`${info.apiUrl}/events/sandboxes?limit=100`, {
      headers: { 'x-api-key': keyB },
    });
    expect(e2bAll.body.some((e: Json) => e.sandboxId === id)).toBe(false);
    // The admin key reads every key's.
    const adminKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
    expect((await apiAs(info, adminKey).get(`/v1/events?sandbox=${id}`)).body.events).toHaveLength(
      2,
    );
  }, 60_000);

  test('the stream resumes from Last-Event-ID: what happened while it was away arrives, nothing twice; the dashboard events go on', async () => {
    const full = await stream(keyA, '');
    const first = (await a.post('/v1/sandboxes', {})).body.sandboxId as string;
    let away: string | undefined;
    try {
      await until(() => full.events.some((e) => e.event.sandboxId === first), 'created', 10_000);
      // The dashboard's view is still there beside the lifecycle events.
      expect(full.others).toContain('snapshot');
      const last = full.events.at(-1)?.id as number;
      await full.close();
      // While away: its kill, and a whole other sandbox's life.
      await a.delete(`/v1/sandboxes/${first}`);
      away = (await a.post('/v1/sandboxes', {})).body.sandboxId as string;
      await a.post(`/v1/sandboxes/${away}/timeout`, { timeoutMs: 100_000 });
      await a.delete(`/v1/sandboxes/${away}`);
      const missed = (await a.get(`/v1/events?after=${last}&limit=1000`)).body.events as Json[];
      const back = await stream(keyA, '?only=lifecycle', { 'last-event-id': String(last) });
      try {
        await until(
          () =>
            back.events.some((e) => e.event.sandboxId === away && short(e.event.type) === 'killed'),
          'the missed events',
          10_000,
        );
        const got = back.events.map((e) => e.id);
        expect(got[0]).toBe(last + 1);
        expect(new Set(got).size).toBe(got.length);
        expect(got).toEqual(missed.map((e: Json) => e.seq).slice(0, got.length));
        expect(
          back.events.filter((e) => e.event.sandboxId === away).map((e) => short(e.event.type)),
        ).toEqual(['created', 'updated', 'killed']);
        expect(back.others).not.toContain('snapshot');
      } finally {
        await back.close();
      }
    } finally {
      await full.close();
      await a.delete(`/v1/sandboxes/${first}`).catch(() => undefined);
      if (away) await a.delete(`/v1/sandboxes/${away}`).catch(() => undefined);
    }
  }, 60_000);

  test("E2B's routes serve them to the unmodified e2b SDK's users (which has no events method: fetch, as E2B's docs do)", async () => {
    const sandbox = await E2bSandbox.create({
      apiKey: keyA,
      apiUrl: info.apiUrl,
      sandboxUrl: info.gatewayUrl,
      timeoutMs: 30_000,
      requestTimeoutMs: 60_000,
    });
    const headers = { 'X-API-Key': keyA };
    const read = async (path: string): Promise<Json[]> => {
      const answer = await fetch(`${info.apiUrl}${path}`, { headers });
      expect(answer.status).toBe(200);
      return (await answer.json()) as Json[];
    };
    const id = sandbox.sandboxId;
    try {
      // Its timeout is within the lead (60 s): the reaper warns of it (abx's own type).
      await until(
        async () =>
          (await read(`/events/sandboxes/${id}?types=sandbox.lifecycle.expiring`)).length === 1,
        'the expiring event',
        10_000,
      );
      await sandbox.setTimeout(90_000);
      await sandbox.kill();
    } finally {
      await sandbox.kill().catch(() => undefined);
    }
    // E2B's types only unless abx's are asked for by name.
    const events = await read(`/events/sandboxes/${id}?orderAsc=true`);
    expect(events.map((e) => short(e.type))).toEqual(['created', 'updated', 'killed']);
    expect(events[0]).toMatchObject({
      version: 'v1',
      id: expect.stringMatching(/^[0-9a-f-]{36}$/),
      sandboxId: id,
      sandboxTemplateId: 'base',
      sandboxTeamId: expect.stringMatching(/^key_/),
      timestamp: expect.stringMatching(/Z$/),
    });
    expect(events[1].eventData).toMatchObject({ change: 'timeout' });
    const [expiring] = await read(`/events/sandboxes/${id}?types=sandbox.lifecycle.expiring`);
    expect(expiring.eventData).toMatchObject({ leadMs: 60_000, onTimeout: 'kill' });
    // Newest first by default; offset and limit page; types filter the team's list.
    expect((await read(`/events/sandboxes/${id}?limit=1`)).map((e) => e.id)).toEqual([
      events[2].id,
    ]);
    expect((await read(`/events/sandboxes/${id}?offset=1&orderAsc=true`)).map((e) => e.id)).toEqual(
      [events[1].id, events[2].id],
    );
    const team = await read('/events/sandboxes?types=sandbox.lifecycle.killed&limit=100');
    expect(team.every((e) => e.type === 'sandbox.lifecycle.killed')).toBe(true);
    expect(team.some((e) => e.sandboxId === id)).toBe(true);
  }, 60_000);

  test("abx's SDK pages and follows them (a dropped follow would resume from its seq); abx events prints them", async () => {
    const connection = { apiUrl: info.apiUrl, apiKey: keyA };
    const controller = new AbortController();
    const followed: SandboxLifecycleEvent[] = [];
    const following = (async () => {
      for await (const event of Sandbox.followEvents({
        ...connection,
        signal: controller.signal,
      })) {
        followed.push(event);
      }
    })();
    let box: Sandbox | undefined;
    try {
      box = await Sandbox.create({ ...connection, metadata: { via: 'sdk' } });
      await box.pause();
      await box.resume();
      await box.kill();
      const id = box.sandboxId;
      await until(
        () => followed.some((e) => e.sandboxId === id && short(e.type) === 'killed'),
        'the followed kill',
        10_000,
      );
      const page = await box.events();
      expect(page.events.map((e) => short(e.type))).toEqual([
        'created',
        'paused',
        'resumed',
        'killed',
      ]);
      expect(followed.filter((e) => e.sandboxId === id)).toEqual(page.events);
      const [newest] = (await Sandbox.events({ ...connection, order: 'desc', limit: 1 })).events;
      expect(newest?.id).toBe(page.events[3]?.id);
      const killedOnly = await Sandbox.events({
        ...connection,
        sandboxId: id,
        type: ['sandbox.lifecycle.killed'],
      });
      expect(killedOnly.events.map((e) => e.data.reason)).toEqual(['api']);
      // Another key's sandbox is refused as an unknown one.
      await expect(
        Sandbox.events({ apiUrl: info.apiUrl, apiKey: keyB, sandboxId: id }),
      ).rejects.toThrow(`sandbox ${id} does not exist`);

      // The CLI, as the daemon's own (admin) key.
      const cli = abxIn(abx.home);
      const printed = await cli.abx(['events', '--sandbox', id]);
      expect(printed.code).toBe(0);
      expect(printed.stdout).toMatch(new RegExp(`${id} created +base from (start|pool), until `));
      expect(printed.stdout).toMatch(new RegExp(`${id} paused +frozen \\(asked\\)`));
      expect(printed.stdout).toMatch(new RegExp(`${id} killed +api: `));
      const lines = await cli.abx([
        'events',
        '--sandbox',
        id,
        '--type',
        'paused,killed',
        '--jsonl',
      ]);
      expect(lines.code).toBe(0);
      expect(
        lines.stdout
          .trim()
          .split('\n')
          .map((line) => JSON.parse(line).type),
      ).toEqual(['sandbox.lifecycle.paused', 'sandbox.lifecycle.killed']);
      const bad = await cli.abx(['events', '--type', 'exploded']);
      expect(bad.code).not.toBe(0);
      expect(bad.stderr).toContain("'exploded' is not an event type");
    } finally {
      controller.abort();
      await following;
      await box?.kill().catch(() => false);
    }
  }, 60_000);
});
