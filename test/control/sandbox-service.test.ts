import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect } from 'vitest';
import { MAX_SANDBOX_TIMEOUT_MS } from '../../runtime/protocol/constants.js';
import { DEFAULT_SANDBOX_TIMEOUT_MS } from '../../src/commands/template-runtime.js';
import { envdRequest } from '../../src/control/envd-request.js';
import { hashToken, sandboxToken } from '../../src/control/ids.js';
import { Reaper } from '../../src/control/reaper.js';
import { InvalidArgumentError, NotFoundError, SandboxStartError } from '../../src/errors.js';
import { type Plane, TOKEN_SECRET, test, until } from './plane.js';

const folderOf = (plane: Plane, id: string) => join(plane.sandboxesDir, id);

describe('SandboxService: create, get, list, kill', () => {
  test('create starts a sandbox through the provider and records it', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    const { record, accessToken } = await plane.sandboxes.create({
      envs: { GREETING: 'hi' },
      metadata: { owner: 'alice' },
    });

    expect(record).toMatchObject({
      template: 'base',
      state: 'running',
      metadata: { owner: 'alice' },
      endedAt: null,
      endReason: null,
    });
    expect(record.expiresAt - record.createdAt).toBe(DEFAULT_SANDBOX_TIMEOUT_MS);
    expect(accessToken).toBe(sandboxToken(TOKEN_SECRET, record.id));
    expect(record.tokenHash).toBe(hashToken(accessToken));

    const box = plane.provider.sandbox(record.id);
    expect(plane.provider.created).toEqual([record.id]);
    expect(box.spec).toMatchObject({
      id: record.id,
      accessToken,
      dir: folderOf(plane, record.id),
      env: { GREETING: 'hi' },
      workdir: '/home/user',
      network: 'none',
    });
    expect(record.handle).toEqual(box.handle);
    // The registry keeps the handle the provider returned, as a new daemon would read it.
    expect((await plane.registry.getSandbox(record.id))?.handle).toEqual(box.handle);

    // The token handed out is the one the sandbox's envd takes; another is refused.
    const reached = await envdRequest<{ sandbox: string }>(
      record.handle.envdSocket,
      accessToken,
      'GET',
      '/debug/request',
    );
    expect(reached).toMatchObject({ status: 200, body: { sandbox: record.id } });
    const refused = await envdRequest(
      record.handle.envdSocket,
      sandboxToken(TOKEN_SECRET, 'iother'),
      'GET',
      '/debug/request',
    );
    expect(refused.status).toBe(401);
  });

  test('a template that names no network is on the internet where the provider enforces egress, offline where not', async ({
    open,
  }) => {
    const plane = open({ warmPool: 0 });
    // This provider has no egress: base's sandboxes run offline (denied rather than allowed).
    const offline = (await plane.sandboxes.create({})).record;
    expect(plane.provider.sandbox(offline.id).spec.network).toBe('none');
    // One that enforces it gives base's sandboxes the internet, with no policy of their own.
    const provider = plane.provider as typeof plane.provider & {
      internetUnavailable?: () => string | undefined;
    };
    provider.internetUnavailable = () => undefined;
    const online = (await plane.sandboxes.create({})).record;
    expect(plane.provider.sandbox(online.id).spec).toMatchObject({ network: 'internet' });
    expect(plane.provider.sandbox(online.id).spec.egress).toBeUndefined();
    // allowInternetAccess false from it: every address denied, on the internet network still.
    const closed = (await plane.sandboxes.create({ allowInternetAccess: false })).record;
    expect(plane.provider.sandbox(closed.id).spec).toMatchObject({
      network: 'internet',
      egress: { allowOut: [], denyOut: ['0.0.0.0/0', '::/0'] },
    });
    provider.internetUnavailable = () => 'no slirp4netns';
    const closedHere = (await plane.sandboxes.create({ allowInternetAccess: false })).record;
    expect(plane.provider.sandbox(closedHere.id).spec.network).toBe('none');
  });

  test('get and list find sandboxes; filters narrow the list', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    const a = (await plane.sandboxes.create({ metadata: { owner: 'alice' } })).record;
    const b = (await plane.sandboxes.create({ metadata: { owner: 'bob' }, timeoutMs: 90_000 }))
      .record;

    expect(await plane.sandboxes.get(a.id)).toEqual(a);
    expect(b.expiresAt - b.createdAt).toBe(90_000);
    // Oldest first; two made in the same millisecond fall back to id order.
    const byAge = [a, b].sort((x, y) => x.createdAt - y.createdAt || (x.id < y.id ? -1 : 1));
    expect((await plane.sandboxes.list({})).map((r) => r.id)).toEqual(byAge.map((r) => r.id));
    expect((await plane.sandboxes.list({ metadata: { owner: 'bob' } })).map((r) => r.id)).toEqual([
      b.id,
    ]);
    expect(await plane.sandboxes.list({ template: 'other' })).toEqual([]);
    await expect(plane.sandboxes.get('inosuchsandbox00')).rejects.toThrow(NotFoundError);
    await expect(plane.sandboxes.get('inosuchsandbox00')).rejects.toThrow(
      'sandbox inosuchsandbox00 does not exist',
    );
  });

  test('kill ends the sandbox, removes its folder, and a second kill resolves false', async ({
    open,
  }) => {
    const plane = open({ warmPool: 0 });
    const { record } = await plane.sandboxes.create({});
    const other = (await plane.sandboxes.create({})).record;
    expect(existsSync(folderOf(plane, record.id))).toBe(true);

    expect(await plane.sandboxes.kill(record.id)).toBe(true);
    expect(await plane.sandboxes.get(record.id)).toMatchObject({
      state: 'killed',
      endReason: 'killed',
    });
    expect((await plane.sandboxes.get(record.id)).endedAt).toEqual(expect.any(Number));
    expect(plane.provider.isAlive(record.handle)).toBe(false);
    expect(plane.provider.killed).toEqual([record.id]);
    expect(existsSync(folderOf(plane, record.id))).toBe(false);
    // Its envd is gone with it.
    await expect(
      envdRequest(record.handle.envdSocket, 'x', 'GET', '/health', undefined, 1000),
    ).rejects.toThrow();

    expect(await plane.sandboxes.kill(record.id)).toBe(false);
    expect((await plane.sandboxes.get(record.id)).state).toBe('killed');
    // The other sandbox is untouched.
    expect(plane.provider.isAlive(other.handle)).toBe(true);
    expect((await plane.sandboxes.get(other.id)).state).toBe('running');
    await expect(plane.sandboxes.kill('inosuchsandbox00')).rejects.toThrow(NotFoundError);
  });

  test('kill of a sandbox that ended by itself resolves false and cleans up', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    const { record } = await plane.sandboxes.create({});
    await plane.provider.die(record.id, 'exited');

    expect(await plane.sandboxes.kill(record.id)).toBe(false);
    // It is recorded as what it is, dead, not as killed.
    expect(await plane.sandboxes.get(record.id)).toMatchObject({
      state: 'dead',
      endReason: 'exited',
    });
    expect(existsSync(folderOf(plane, record.id))).toBe(false);
    // Releasing what it held goes through the provider's kill, safe on an ended sandbox.
    expect(plane.provider.killed).toContain(record.id);
  });

  test('a provider that fails to start a sandbox leaves no row', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    plane.provider.failNextCreate(new SandboxStartError('sandbox did not start: no room'));
    await expect(plane.sandboxes.create({ metadata: { owner: 'alice' } })).rejects.toThrow(
      'sandbox did not start: no room',
    );
    expect(plane.provider.creates).toBe(1);
    expect(await plane.sandboxes.list({})).toEqual([]);
    // The next create works.
    const { record } = await plane.sandboxes.create({});
    expect((await plane.sandboxes.list({})).map((r) => r.id)).toEqual([record.id]);
  });

  test('setTimeout moves the expiry of a running sandbox only', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    const { record } = await plane.sandboxes.create({});
    const before = Date.now();
    const updated = await plane.sandboxes.setTimeout(record.id, 3_600_000);
    expect(updated.expiresAt).toBeGreaterThanOrEqual(before + 3_600_000);
    expect(updated.expiresAt).toBeLessThanOrEqual(Date.now() + 3_600_000);
    await expect(plane.sandboxes.setTimeout(record.id, -5)).rejects.toThrow(InvalidArgumentError);
    expect((await plane.sandboxes.get(record.id)).expiresAt).toBe(updated.expiresAt);

    await plane.sandboxes.kill(record.id);
    await expect(plane.sandboxes.setTimeout(record.id, 60_000)).rejects.toThrow(
      `sandbox ${record.id} is not running (killed: killed)`,
    );
  });
});

describe('SandboxService: argument validation', () => {
  const badTimeouts: unknown[] = [
    0,
    -1,
    1.5,
    '60000',
    Number.NaN,
    MAX_SANDBOX_TIMEOUT_MS + 1,
    null,
  ];
  test('bad timeoutMs values are refused before anything starts', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    for (const timeoutMs of badTimeouts) {
      const attempt = plane.sandboxes.create({ timeoutMs: timeoutMs as number });
      await expect(attempt).rejects.toThrow(InvalidArgumentError);
      await expect(attempt).rejects.toThrow(
        `timeoutMs must be a whole number of milliseconds between 1 and ${MAX_SANDBOX_TIMEOUT_MS} (24 h), not ${JSON.stringify(timeoutMs)}`,
      );
    }
    // Nothing started, not even a warm pool.
    expect(plane.provider.creates).toBe(0);
    expect(await plane.sandboxes.list({})).toEqual([]);
    expect(await plane.sandboxes.list({ state: 'pooled' })).toEqual([]);
  });

  test('envs and metadata must be objects of strings, named in the message', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    const cases: [Record<string, unknown>, string][] = [
      [{ envs: { PATH_EXTRA: 1 } }, 'envs.PATH_EXTRA must be a string, not number'],
      [{ envs: { FLAG: true } }, 'envs.FLAG must be a string, not boolean'],
      [{ envs: { NESTED: { a: 'b' } } }, 'envs.NESTED must be a string, not object'],
      [{ envs: ['A=1'] }, 'envs must be an object of string values'],
      [{ envs: 'A=1' }, 'envs must be an object of string values'],
      [{ envs: null }, 'envs must be an object of string values'],
      [{ metadata: { n: 2 } }, 'metadata.n must be a string, not number'],
      [{ metadata: [] }, 'metadata must be an object of string values'],
    ];
    for (const [request, message] of cases) {
      const attempt = plane.sandboxes.create(request as never);
      await expect(attempt).rejects.toThrow(InvalidArgumentError);
      await expect(attempt).rejects.toThrow(message);
    }
    expect(plane.provider.creates).toBe(0);
    expect(await plane.sandboxes.list({})).toEqual([]);
  });

  test('an unknown template is a NotFoundError naming the known ones', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    await expect(plane.sandboxes.create({ template: 'nope' })).rejects.toThrow(NotFoundError);
    await expect(plane.sandboxes.create({ template: 'nope' })).rejects.toThrow(
      "template 'nope' is not built; known templates: base",
    );
    expect(plane.provider.creates).toBe(0);
  });
});

describe('SandboxService: the reaper', () => {
  test('an expired sandbox is killed with state expired; others are left', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    const short = (await plane.sandboxes.create({ timeoutMs: 1000 })).record;
    const long = (await plane.sandboxes.create({ timeoutMs: 600_000 })).record;

    expect(await plane.reaper.pass(short.expiresAt - 1)).toEqual([]);
    expect(plane.provider.kills).toBe(0);

    expect(await plane.reaper.pass(short.expiresAt)).toEqual([short.id]);
    expect(await plane.sandboxes.get(short.id)).toMatchObject({
      state: 'expired',
      endReason: `expired at ${new Date(short.expiresAt).toISOString()}`,
    });
    expect(plane.provider.isAlive(short.handle)).toBe(false);
    expect(existsSync(folderOf(plane, short.id))).toBe(false);
    expect((await plane.sandboxes.get(long.id)).state).toBe('running');
    expect(plane.provider.isAlive(long.handle)).toBe(true);
    expect(plane.provider.killed).toEqual([short.id]);
  });

  test('sandboxes that end by themselves are marked dead with their cause by reap()', async ({
    open,
  }) => {
    const plane = open({ warmPool: 0 });
    const oom = (await plane.sandboxes.create({})).record;
    const exited = (await plane.sandboxes.create({})).record;
    const alive = (await plane.sandboxes.create({})).record;
    await plane.provider.die(oom.id, 'oom');
    await plane.provider.die(exited.id, 'exited');

    // Not expired: reap returns no expired ids, yet it marks the dead ones.
    expect(await plane.reaper.pass()).toEqual([]);
    expect(await plane.registry.getSandbox(oom.id)).toMatchObject({
      state: 'dead',
      endReason: 'oom',
    });
    expect(await plane.registry.getSandbox(exited.id)).toMatchObject({
      state: 'dead',
      endReason: 'exited',
    });
    expect((await plane.registry.getSandbox(oom.id))?.endedAt).toEqual(expect.any(Number));
    expect(existsSync(folderOf(plane, oom.id))).toBe(false);
    expect(existsSync(folderOf(plane, exited.id))).toBe(false);
    expect((await plane.registry.getSandbox(alive.id))?.state).toBe('running');
    expect(existsSync(folderOf(plane, alive.id))).toBe(true);
    // The next pass finds nothing more to do.
    const kills = plane.provider.kills;
    expect(await plane.reaper.pass()).toEqual([]);
    expect(plane.provider.kills).toBe(kills);
  });

  test('started, the reaper expires sandboxes by itself; stop() waits for its pass', async ({
    open,
  }) => {
    const plane = open({ warmPool: 0 });
    const errors: unknown[] = [];
    const reaper = new Reaper(plane.sandboxes.reaperHost(), 10, (error) => errors.push(error));
    const box = (await plane.sandboxes.create({ timeoutMs: 50 })).record;
    reaper.start();
    try {
      for (
        let i = 0;
        i < 200 && (await plane.registry.getSandbox(box.id))?.state === 'running';
        i++
      ) {
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      expect((await plane.registry.getSandbox(box.id))?.state).toBe('expired');
    } finally {
      await reaper.stop();
    }
    // Stopped: nothing touches the registry any more, so closing it now is safe.
    await plane.registry.close();
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(errors).toEqual([]);
  });

  test('get() of a sandbox that died unnoticed marks it dead and cleans up', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    const { record } = await plane.sandboxes.create({});
    await plane.provider.die(record.id, 'oom');
    // The registry still says running: nobody looked yet.
    expect((await plane.registry.getSandbox(record.id))?.state).toBe('running');

    expect(await plane.sandboxes.get(record.id)).toMatchObject({ state: 'dead', endReason: 'oom' });
    expect((await plane.registry.getSandbox(record.id))?.state).toBe('dead');
    await until(() => !existsSync(folderOf(plane, record.id)), 'the dead sandbox’s folder to go');
    await expect(plane.sandboxes.running(record.id)).rejects.toThrow(
      `sandbox ${record.id} is not running (dead: oom)`,
    );
  });
});
