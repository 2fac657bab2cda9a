import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, vi } from 'vitest';
import { MAX_SANDBOX_TIMEOUT_MS } from '../../runtime/protocol/constants.js';
import { setSandboxEnv } from '../../src/control/envd-request.js';
import { sandboxToken } from '../../src/control/ids.js';
import { Reaper } from '../../src/control/reaper.js';
import { type SandboxPoolOptions, SandboxService } from '../../src/control/sandbox-service.js';
import { openSqlite } from '../../src/control/sqlite.js';
import type { PoolHost } from '../../src/control/warm-pool.js';
import { InvalidArgumentError, SandboxStartError } from '../../src/errors.js';
import type { MemoryProviderOptions } from '../helpers/memory-provider.js';
import { type Plane, test as planeTest, TOKEN_SECRET, until } from './plane.js';

/** A plane whose pool has settings of the test's, on a clock the test moves. */
interface PoolPlane extends Plane {
  clock: { now: number };
}

type PoolPlaneOptions = Partial<SandboxPoolOptions> & MemoryProviderOptions;

/** A sandbox service on `base`'s registry, provider and templates, with the pool's settings. */
const poolService = (base: Plane, pool: SandboxPoolOptions) =>
  new SandboxService(
    base.registry,
    base.provider,
    base.templates,
    base.sandboxesDir,
    (id, kind) => sandboxToken(TOKEN_SECRET, id, kind),
    setSandboxEnv,
    pool,
  );

/**
 * `open`, plus `openPool`: a plane whose sandbox service has the warm pool's settings of the test
 * (maximum, window, start concurrency) and measures demand on `clock` unless it passes `now`.
 * Its service is closed after the test, held creates released first.
 */
const test = planeTest.extend<{ openPool: (options?: PoolPlaneOptions) => PoolPlane }>({
  openPool: async ({ open }, use) => {
    const opened: PoolPlane[] = [];
    await use(({ createDelayMs, killDelayMs, ...pool } = {}) => {
      const base = open({
        warmPool: 0,
        ...(createDelayMs === undefined ? {} : { createDelayMs }),
        ...(killDelayMs === undefined ? {} : { killDelayMs }),
      });
      const clock = { now: 1_000_000 };
      const sandboxes = poolService(base, { max: 10, now: () => clock.now, ...pool });
      const plane = { ...base, sandboxes, reaper: new Reaper(sandboxes.reaperHost()), clock };
      opened.push(plane);
      return plane;
    });
    for (const plane of opened) {
      plane.provider.releaseCreates();
      await plane.sandboxes.close();
    }
  },
});

const pooledIds = async (plane: Plane) =>
  (await plane.sandboxes.list({ state: 'pooled' })).map((r) => r.id);

/** `n` creates at once; their sandboxes' ids, in the order of the calls. */
async function burst(plane: Plane, n: number, request = {}): Promise<string[]> {
  const created = await Promise.all(
    Array.from({ length: n }, () => plane.sandboxes.create(request)),
  );
  return created.map(({ record }) => record.id);
}

/** A few turns of the event loop: time for anything that would start to show. */
async function turns(n = 5): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve));
}

/** Creates a first sandbox of `base` and waits for the pool to hold one; returns the pooled id. */
async function fillPool(plane: Plane): Promise<{ first: string; pooled: string }> {
  const first = (await plane.sandboxes.create({})).record.id;
  await plane.sandboxes.refill('base');
  const pooled = await plane.sandboxes.list({ state: 'pooled' });
  expect(pooled).toHaveLength(1);
  return { first, pooled: (pooled[0] as { id: string }).id };
}

describe('the warm pool', () => {
  test('after the first create of a template, one sandbox waits, pooled and unlisted', async ({
    open,
  }) => {
    const plane = open({ warmPool: 1 });
    expect(await plane.sandboxes.list({ state: 'pooled' })).toEqual([]);
    const { first, pooled } = await fillPool(plane);

    expect(pooled).not.toBe(first);
    expect(plane.provider.created).toEqual([first, pooled]);
    const record = await plane.registry.getSandbox(pooled);
    expect(record).toMatchObject({ state: 'pooled', template: 'base', metadata: {} });
    expect(plane.provider.isAlive(record?.handle as never)).toBe(true);
    // Never listed unless asked for by state.
    expect((await plane.sandboxes.list({})).map((r) => r.id)).toEqual([first]);
    // Topping up again changes nothing: the pool is full.
    await plane.sandboxes.refill('base');
    expect(plane.provider.creates).toBe(2);
  });

  test('a pooled sandbox of a template with ports that waits unclaimed gets its command server started; one claimed at once does not', async ({
    openPool,
  }) => {
    const plane = openPool({ readyDelayMs: 1500 });
    await plane.templates.build({ yaml: 'name: served\ncapabilities: [shell, files, ports]\n' });
    const prestarts = (id: string) =>
      plane.provider.sandbox(id).requests.filter((r) => r === 'POST /exec/server/prestart');
    await plane.sandboxes.create({ template: 'served' });
    await plane.sandboxes.refill('served');
    const [waiting] = await pooledIds(plane);
    await until(() => prestarts(waiting as string).length === 1, 'the prestart', 10_000);
    // Claimed before the delay: the caller's sandbox is left as it is.
    const claimed = (await plane.sandboxes.create({ template: 'served' })).record.id;
    expect(claimed).toBe(waiting);
    await plane.sandboxes.refill('served');
    const [next] = await pooledIds(plane);
    const taken = (await plane.sandboxes.create({ template: 'served' })).record.id;
    expect(taken).toBe(next);
    await new Promise((resolve) => setTimeout(resolve, 2000));
    expect(prestarts(taken)).toEqual([]);
    // A template without ports never gets one.
    await plane.sandboxes.create({});
    await plane.sandboxes.refill('base');
    const plain = (await plane.sandboxes.list({ state: 'pooled' })).filter(
      (r) => r.template === 'base',
    );
    expect(plain).toHaveLength(1);
    await new Promise((resolve) => setTimeout(resolve, 2000));
    expect(prestarts((plain[0] as { id: string }).id)).toEqual([]);
  });

  test('a pooled sandbox is warmed through envd before it is offered; a created one is not', async ({
    open,
  }) => {
    const plane = open({ warmPool: 1 });
    const { first, pooled } = await fillPool(plane);
    expect(plane.provider.sandbox(pooled).requests).toContain('POST /exec/warmup');
    expect(plane.provider.sandbox(first).requests).not.toContain('POST /exec/warmup');
    // This envd has no such route (an older runtime): the sandbox is pooled all the same.
    expect((await plane.sandboxes.create({})).record.id).toBe(pooled);
  });

  test('the next create hands the pooled sandbox out at once, with the caller’s envs', async ({
    open,
  }) => {
    const plane = open({ warmPool: 1 });
    const { pooled } = await fillPool(plane);
    // From now on provider creates wait for the test: a create that waited for one would hang.
    plane.provider.holdCreates();
    const createdBefore = plane.provider.created.length;

    const { record, accessToken } = await plane.sandboxes.create({
      envs: { API_URL: 'http://example.test', MODE: 'fast' },
      metadata: { owner: 'alice' },
      timeoutMs: 120_000,
    });

    expect(record.id).toBe(pooled);
    // The refill starts in the background, and is held there.
    await until(() => plane.provider.pendingCreates === 1, 'the refill to start');
    expect(plane.provider.created.slice(createdBefore)).not.toContain(record.id);
    expect(record).toMatchObject({ state: 'running', metadata: { owner: 'alice' } });
    expect(record.expiresAt - record.createdAt).toBe(120_000);
    expect((await plane.sandboxes.get(pooled)).state).toBe('running');
    expect((await plane.sandboxes.list({})).map((r) => r.id)).toContain(pooled);
    expect((await plane.registry.getSandbox(pooled))?.tokenHash).toBeDefined();
    expect(accessToken).toBe(plane.sandboxes.tokenOf(pooled));
    // The envs went to the running sandbox through envd's PUT /env, once.
    const box = plane.provider.sandbox(pooled);
    expect(box.envUpdates).toEqual([{ API_URL: 'http://example.test', MODE: 'fast' }]);
    expect(box.env).toMatchObject({ API_URL: 'http://example.test', MODE: 'fast' });

    // The refill puts a new sandbox in the pool.
    plane.provider.releaseCreates();
    await plane.sandboxes.refill('base');
    const next = (await plane.sandboxes.list({ state: 'pooled' })).map((r) => r.id);
    expect(next).toHaveLength(1);
    expect(next[0]).not.toBe(pooled);
  });

  test('a pooled sandbox handed out without envs gets no PUT /env', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    const { pooled } = await fillPool(plane);
    const { record } = await plane.sandboxes.create({});
    expect(record.id).toBe(pooled);
    expect(plane.provider.sandbox(pooled).envUpdates).toEqual([]);
  });

  test('pooled sandboxes keep the longest lifetime until handed out', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    const { pooled } = await fillPool(plane);
    const record = await plane.registry.getSandbox(pooled);
    expect((record?.expiresAt ?? 0) - (record?.createdAt ?? 0)).toBe(MAX_SANDBOX_TIMEOUT_MS);
    // The reaper does not expire a pooled sandbox.
    expect(await plane.reaper.pass(Date.now() + MAX_SANDBOX_TIMEOUT_MS * 2)).not.toContain(pooled);
    expect((await plane.registry.getSandbox(pooled))?.state).toBe('pooled');
  });

  test('a pooled sandbox that died is skipped: the caller gets a live one', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    const { pooled } = await fillPool(plane);
    await plane.provider.die(pooled, 'exited');

    const { record } = await plane.sandboxes.create({ metadata: { owner: 'alice' } });
    expect(record.id).not.toBe(pooled);
    expect(plane.provider.isAlive(record.handle)).toBe(true);
    await until(() => !existsSync(join(plane.sandboxesDir, pooled)), 'the dead one’s folder to go');
    expect(plane.provider.killed).toContain(pooled);
    // It is not handed out to a later create either.
    await plane.sandboxes.refill('base');
    expect((await plane.sandboxes.create({})).record.id).not.toBe(pooled);
  });

  // Regression, fixed (src/control/sandbox-service.ts, claimPooled + markDead): Registry.claimPooled turns the
  // dead pooled row into a `running` row with the caller's metadata before isAlive is checked, so
  // markDead then records it as `dead` instead of deleting it: a sandbox the caller never got
  // shows up in `list()` (and `abx list --all`), with the caller's metadata.
  test('a pooled sandbox that died leaves no row behind when skipped', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    const { first, pooled } = await fillPool(plane);
    await plane.provider.die(pooled, 'exited');

    const { record } = await plane.sandboxes.create({ metadata: { owner: 'alice' } });
    expect(await plane.registry.getSandbox(pooled)).toBeUndefined();
    expect((await plane.sandboxes.list({})).map((r) => r.id)).toEqual([first, record.id]);
  });

  test('reap() removes a pooled sandbox that died, row and folder', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    const { first, pooled } = await fillPool(plane);
    await plane.provider.die(pooled, 'oom');

    await plane.reaper.pass();
    expect(await plane.registry.getSandbox(pooled)).toBeUndefined();
    expect(existsSync(join(plane.sandboxesDir, pooled))).toBe(false);
    expect((await plane.sandboxes.list({})).map((r) => r.id)).toEqual([first]);
  });

  test('drainPool kills the pooled sandboxes of a template only', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    const { first, pooled } = await fillPool(plane);

    await plane.sandboxes.drainPool('other-template');
    expect(plane.provider.isAlive(plane.provider.sandbox(pooled).handle)).toBe(true);

    await plane.sandboxes.drainPool('base');
    expect(plane.provider.killed).toEqual([pooled]);
    expect(plane.provider.isAlive(plane.provider.sandbox(pooled).handle)).toBe(false);
    expect(await plane.registry.getSandbox(pooled)).toBeUndefined();
    expect(existsSync(join(plane.sandboxesDir, pooled))).toBe(false);
    // Running sandboxes are not the pool's.
    expect((await plane.sandboxes.get(first)).state).toBe('running');
    expect(plane.provider.isAlive(plane.provider.sandbox(first).handle)).toBe(true);
  });

  test('drainPool waits for a refill under way, and kills what it started', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    // The create's own start goes through; the refill's, started after it, is held.
    plane.provider.holdCreates(1);
    const { record } = await plane.sandboxes.create({});
    await until(() => plane.provider.pendingCreates === 1, 'the refill to start');
    const draining = plane.sandboxes.drainPool();
    plane.provider.releaseCreates();
    await draining;
    expect(plane.provider.pendingCreates).toBe(0);
    expect(await plane.sandboxes.list({ state: 'pooled' })).toEqual([]);
    expect(plane.provider.aliveIds()).toEqual([record.id]);
  });

  test('close() empties the pool, stops refilling and leaves running sandboxes', async ({
    open,
  }) => {
    const plane = open({ warmPool: 1 });
    const { first, pooled } = await fillPool(plane);

    await plane.sandboxes.close();
    expect(plane.provider.killed).toEqual([pooled]);
    expect(await plane.sandboxes.list({ state: 'pooled' })).toEqual([]);
    expect(plane.provider.aliveIds()).toEqual([first]);

    // A create after close starts a sandbox and no spare one.
    const { record } = await plane.sandboxes.create({});
    await plane.sandboxes.refill('base');
    expect(await plane.sandboxes.list({ state: 'pooled' })).toEqual([]);
    expect(plane.provider.aliveIds().sort()).toEqual([first, record.id].sort());
  });

  // Regression, fixed (src/control/sandbox-service.ts, kill): kill() treats any state but `running` as ended,
  // so killing a `pooled` sandbox (DELETE /v1/sandboxes/{id} with an id from ?state=pooled) kills
  // its processes and removes its folder, resolves false ("already ended"), and leaves the row
  // `pooled`. The pool then counts a sandbox that is gone and is not refilled until a reaper pass;
  // a create in between claims it and leaves a phantom `dead` row (see above).
  test('killing a pooled sandbox leaves no pooled row whose sandbox is gone', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    const { pooled } = await fillPool(plane);
    await plane.sandboxes.kill(pooled);
    for (const row of await plane.sandboxes.list({ state: 'pooled' })) {
      expect(plane.provider.isAlive(row.handle)).toBe(true);
    }
  });

  // Regression, fixed (src/control/sandbox-service.ts, create/checkStringMap): envs' names are not checked, yet
  // envd's PUT /env refuses names that are not variable names (and NUL bytes). With the warm pool
  // such a create fails with a plain Error (a 500 from the API, not a 400), after killing the
  // pooled sandbox it had claimed; without the pool the same request goes to the provider as is.
  test('envs whose names are not variable names are refused as bad arguments', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    await fillPool(plane);
    await expect(plane.sandboxes.create({ envs: { 'BAD-NAME': 'x' } })).rejects.toThrow(
      InvalidArgumentError,
    );
  });

  test('warmPool: 0 turns the pool off', async ({ open }) => {
    const plane = open({ warmPool: 0 });
    const { record } = await plane.sandboxes.create({});
    await plane.sandboxes.refill('base');
    await plane.sandboxes.create({});
    expect(plane.provider.creates).toBe(2);
    expect(await plane.sandboxes.list({ state: 'pooled' })).toEqual([]);
    expect(plane.sandboxes.poolSize('base')).toBe(0);
    expect(plane.provider.created[0]).toBe(record.id);
  });

  test('warmPool: 2 is a maximum: one create keeps one sandbox waiting', async ({ open }) => {
    const plane = open({ warmPool: 2 });
    await plane.sandboxes.create({});
    await plane.sandboxes.refill('base');
    expect(await plane.sandboxes.list({ state: 'pooled' })).toHaveLength(1);
    expect(plane.provider.creates).toBe(2);
  });

  // Regression, fixed (src/control/sandbox-service.ts, drainPool): drainPool lists the pooled rows, then kills
  // each sandbox and deletes its row, without taking it out of the pool first. A create that runs
  // while the kill is under way (a template rebuild's drain, or a stopping daemon's, racing
  // POST /v1/sandboxes) claims the sandbox being killed; drainPool then kills it and deletes its
  // row, and the caller holds a sandbox that no longer exists.
  test('a create racing drainPool never gets the sandbox being drained', async ({ open }) => {
    const plane = open({ warmPool: 1, killDelayMs: 100 });
    const { pooled } = await fillPool(plane);

    const draining = plane.sandboxes.drainPool('base');
    await until(() => plane.provider.killed.includes(pooled), 'the drain to start killing');
    const { record } = await plane.sandboxes.create({});
    await draining;

    expect(plane.provider.isAlive(record.handle)).toBe(true);
    expect((await plane.sandboxes.get(record.id)).state).toBe('running');
  });
});

describe('a pool that keeps up with demand', () => {
  test('a burst raises the pool to its size; the next burst is served from it', async ({
    openPool,
  }) => {
    const plane = openPool({ max: 20 });
    await plane.sandboxes.create({});
    await plane.sandboxes.refill('base');
    expect(await pooledIds(plane)).toHaveLength(1);

    plane.clock.now += 10_000;
    const first = await burst(plane, 6);
    // One came from the pool, five started; six were wanted at once.
    expect(plane.sandboxes.poolSize('base')).toBe(6);
    await plane.sandboxes.refill('base');
    const pool = await pooledIds(plane);
    expect(pool).toHaveLength(6);
    expect(pool.filter((id) => first.includes(id))).toEqual([]);

    // Provider starts are held from now on: the next burst can only get what waits in the pool.
    plane.provider.holdCreates();
    const next = await burst(plane, 6);
    expect([...next].sort()).toEqual([...pool].sort());
    for (const id of next) expect((await plane.sandboxes.get(id)).state).toBe('running');
  });

  test('the maximum is respected, whatever the burst', async ({ openPool }) => {
    const plane = openPool({ max: 3, startConcurrency: 2 });
    await burst(plane, 8);
    expect(plane.sandboxes.poolSize('base')).toBe(3);
    await plane.sandboxes.refill('base');
    expect(await pooledIds(plane)).toHaveLength(3);
    expect(plane.provider.creates).toBe(8 + 3);
  });

  test('a steady stream keeps as many as arrive while one starts', async ({ openPool }) => {
    const plane = openPool({ max: 10, createDelayMs: 20 });
    await plane.sandboxes.create({});
    await plane.sandboxes.refill('base');
    // Starts take 20 ms or more: creates 5 ms apart want about four at any time.
    for (let i = 0; i < 12; i++) {
      plane.clock.now += 5;
      await plane.sandboxes.create({});
    }
    expect(plane.sandboxes.poolSize('base')).toBeGreaterThanOrEqual(4);
    expect(plane.sandboxes.poolSize('base')).toBeLessThanOrEqual(10);
    // Spread far apart, one at a time is enough (once the window forgot the stream).
    plane.clock.now += 120_000;
    for (let i = 0; i < 5; i++) {
      plane.clock.now += 10_000;
      await plane.sandboxes.create({});
    }
    expect(plane.sandboxes.poolSize('base')).toBe(1);
  });

  test('a pool that went quiet shrinks back to one, killing the extras', async ({ openPool }) => {
    const plane = openPool({ max: 10, windowMs: 60_000 });
    const users = await burst(plane, 5);
    await plane.sandboxes.refill('base');
    const pool = await pooledIds(plane);
    expect(pool).toHaveLength(5);

    plane.clock.now += 59_000;
    await plane.sandboxes.refill('base');
    expect(await pooledIds(plane)).toEqual(pool);

    plane.clock.now += 2_000;
    expect(plane.sandboxes.poolSize('base')).toBe(1);
    await plane.sandboxes.refill('base');
    const kept = await pooledIds(plane);
    // The newest stays (extras go oldest first); the others are killed, rows and folders.
    expect(kept).toEqual(pool.slice(-1));
    expect([...plane.provider.killed].sort()).toEqual(pool.slice(0, -1).sort());
    for (const id of pool.slice(0, -1)) {
      expect(await plane.registry.getSandbox(id)).toBeUndefined();
      expect(existsSync(join(plane.sandboxesDir, id))).toBe(false);
    }
    expect(plane.provider.aliveIds().sort()).toEqual([...users, ...kept].sort());
  });

  test('it shrinks on its own, with no create to trigger it', async ({ openPool }) => {
    const plane = openPool({ max: 10, windowMs: 500 });
    await burst(plane, 4);
    await plane.sandboxes.refill('base');
    expect(await pooledIds(plane)).toHaveLength(4);
    plane.clock.now += 1_000;
    await until(async () => (await pooledIds(plane)).length === 1, 'the pool to shrink', 10_000);
    await until(() => plane.provider.killed.length === 3, 'the extras to be killed', 10_000);
  });

  test('a burst is served from the pool first; the rest start in parallel, bounded', async ({
    openPool,
  }) => {
    const plane = openPool({ max: 20, startConcurrency: 3 });
    await burst(plane, 4);
    await plane.sandboxes.refill('base');
    const pool = await pooledIds(plane);
    expect(pool).toHaveLength(4);

    plane.provider.holdCreates();
    plane.provider.peakPendingCreates = 0;
    const served: string[] = [];
    const creates = Array.from({ length: 10 }, () =>
      plane.sandboxes.create({}).then(({ record }) => {
        served.push(record.id);
        return record.id;
      }),
    );
    await until(() => served.length === 4, 'the pooled four to be handed out');
    expect([...served].sort()).toEqual([...pool].sort());
    await until(() => plane.provider.pendingCreates === 3, 'three starts');
    await turns();
    // Three at once, never more: the other three creates and the refills wait for a slot.
    expect(plane.provider.pendingCreates).toBe(3);
    expect(served).toHaveLength(4);

    plane.provider.releaseCreates();
    const ids = await Promise.all(creates);
    expect(new Set(ids).size).toBe(10);
    expect(plane.provider.peakPendingCreates).toBe(3);
    await plane.sandboxes.refill('base');
    expect(plane.provider.peakPendingCreates).toBe(3);
  });

  test('refills start in parallel, bounded, and never before the creates waiting', async ({
    openPool,
  }) => {
    const plane = openPool({ max: 10, startConcurrency: 2 });
    const users = await burst(plane, 6);
    // Every create of the burst started before any refill did.
    expect(plane.provider.created.slice(0, 6)).toEqual(users);

    plane.provider.holdCreates();
    plane.provider.peakPendingCreates = 0;
    const refilling = plane.sandboxes.refill('base');
    await until(() => plane.provider.pendingCreates === 2, 'two refills');
    await turns();
    expect(plane.provider.pendingCreates).toBe(2);
    plane.provider.releaseCreates();
    await refilling;
    expect(await pooledIds(plane)).toHaveLength(6);
    expect(plane.provider.peakPendingCreates).toBe(2);
  });

  test('a create that takes a pooled sandbox does not wait for the refill', async ({
    openPool,
  }) => {
    const plane = openPool({ max: 1 });
    await plane.sandboxes.create({});
    await plane.sandboxes.refill('base');
    const [pooled] = await pooledIds(plane);
    plane.provider.holdCreates();

    const { record } = await plane.sandboxes.create({ envs: { A: 'b' } });
    expect(record.id).toBe(pooled);
    // The refill started after the create answered, and is still held.
    await until(() => plane.provider.pendingCreates === 1, 'the refill to start');
    plane.provider.releaseCreates();
    await plane.sandboxes.refill('base');
    expect(await pooledIds(plane)).toHaveLength(1);
    expect(await pooledIds(plane)).not.toContain(pooled);
  });

  test('a create that waited for a start slot takes what a refill pooled meanwhile', async ({
    openPool,
  }) => {
    const plane = openPool({ max: 1, startConcurrency: 1 });
    // The first create's start goes through; the refill after it is held, holding the one slot.
    plane.provider.holdCreates(1);
    await plane.sandboxes.create({});
    await until(() => plane.provider.pendingCreates === 1, 'the refill to start');
    const refilled = plane.provider.created.at(-1) as string;

    const waiting = plane.sandboxes.create({ metadata: { owner: 'bob' } });
    await turns();
    plane.provider.releaseCreates();
    const { record } = await waiting;
    expect(record.id).toBe(refilled);
    expect(record.metadata).toEqual({ owner: 'bob' });
    // It started nothing of its own: the provider's next start is the pool's next refill.
    await plane.sandboxes.refill('base');
    expect(plane.provider.creates).toBe(3);
  });

  test('pooled sandboxes are nobody’s: listed only by state, never reaped', async ({
    openPool,
  }) => {
    const plane = openPool({ max: 10 });
    const users = await burst(plane, 3, { metadata: { owner: 'alice' } });
    await plane.sandboxes.refill('base');
    const pool = await pooledIds(plane);
    expect(pool).toHaveLength(3);

    const ids = async (filter: Parameters<SandboxService['list']>[0]) =>
      (await plane.sandboxes.list(filter)).map((r) => r.id).sort();
    expect(await ids({})).toEqual([...users].sort());
    expect(await ids({ state: 'running' })).toEqual([...users].sort());
    expect(await ids({ template: 'base' })).toEqual([...users].sort());
    expect(await ids({ metadata: {} })).toEqual([...users].sort());
    expect(await ids({ metadata: { owner: 'alice' } })).toEqual([...users].sort());
    expect(await ids({ state: 'pooled', template: 'base' })).toEqual([...pool].sort());
    for (const record of await plane.sandboxes.list({ state: 'pooled' })) {
      expect(record).toMatchObject({ template: 'base', metadata: {} });
    }
    // Past every user's lifetime: the users' sandboxes expire, the pooled ones wait on.
    const expired = await plane.reaper.pass(Date.now() + MAX_SANDBOX_TIMEOUT_MS / 2);
    expect([...expired].sort()).toEqual([...users].sort());
    expect(await ids({ state: 'pooled' })).toEqual([...pool].sort());
  });

  test('a pooled sandbox another daemon claims on a shared registry is no longer held awake by its pool', async ({
    openPool,
  }) => {
    // Two daemons' sandbox services on one registry and host: any daemon's create may claim the
    // other's pooled sandbox. The pool holds its own pooled sandboxes' envd awake (local
    // provider: holdEnvdAwake); here the holds are recorded.
    const a = openPool({ max: 1 });
    const sharedB = poolService(a, { max: 1 });
    const held = new Set<string>();
    const host = (a.sandboxes as unknown as { pool: { host: PoolHost } }).pool.host;
    host.hold = (record) => {
      held.add(record.id);
      return () => held.delete(record.id);
    };
    try {
      await a.sandboxes.create({});
      await a.sandboxes.refill('base');
      const [pooled] = await pooledIds(a);
      expect([...held]).toEqual([pooled]);
      // The other daemon's create takes it.
      const { record } = await sharedB.create({});
      expect(record.id).toBe(pooled);
      // This daemon's next look at its pool lets go of it (and starts a new one, held).
      await a.sandboxes.refill('base');
      expect(held.has(pooled as string)).toBe(false);
      const [next] = await pooledIds(a);
      expect([...held]).toEqual([next]);
    } finally {
      a.provider.releaseCreates();
      await sharedB.close();
    }
  });

  test('a pooled sandbox past the longest lifetime is recycled', async ({ openPool }) => {
    const plane = openPool({ max: 1 });
    await plane.sandboxes.create({});
    await plane.sandboxes.refill('base');
    const [old] = await pooledIds(plane);
    const db = openSqlite(plane.database);
    try {
      db.prepare('UPDATE sandboxes SET expires_at = ? WHERE id = ?').run(Date.now() - 1, old);
    } finally {
      db.close();
    }
    await plane.sandboxes.refill('base');
    const now = await pooledIds(plane);
    expect(now).toHaveLength(1);
    expect(now).not.toContain(old);
    expect(plane.provider.killed).toEqual([old]);
  });

  test('drain: refills under way are killed, waiting ones never start', async ({ openPool }) => {
    const plane = openPool({ max: 10, startConcurrency: 2 });
    const users = await burst(plane, 5);
    plane.provider.holdCreates();
    await until(() => plane.provider.pendingCreates === 2, 'two refills');
    const createsBefore = plane.provider.creates;

    const draining = plane.sandboxes.drainPool('base');
    await turns();
    plane.provider.releaseCreates();
    await draining;
    expect(await pooledIds(plane)).toEqual([]);
    expect(plane.provider.aliveIds().sort()).toEqual([...users].sort());
    // The three refills that waited for a slot started nothing, now or later.
    await turns(20);
    expect(plane.provider.creates).toBe(createsBefore);
    expect(plane.provider.pendingCreates).toBe(0);
    expect(await pooledIds(plane)).toEqual([]);
    // The next create starts the pool afresh, at one.
    await plane.sandboxes.create({});
    expect(plane.sandboxes.poolSize('base')).toBe(1);
  });

  test('close: nothing pooled is left, under way or waiting, and nothing starts after', async ({
    openPool,
  }) => {
    const plane = openPool({ max: 10, startConcurrency: 2, windowMs: 100 });
    const users = await burst(plane, 5);
    plane.provider.holdCreates();
    await until(() => plane.provider.pendingCreates === 2, 'two refills');
    const createsBefore = plane.provider.creates;

    const closing = plane.sandboxes.close();
    plane.provider.releaseCreates();
    await closing;
    expect(await pooledIds(plane)).toEqual([]);
    expect(plane.provider.aliveIds().sort()).toEqual([...users].sort());
    // Past the window and a few of the pool's timer passes later, still nothing.
    plane.clock.now += 1_000;
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(plane.provider.creates).toBe(createsBefore);
    expect(await pooledIds(plane)).toEqual([]);
    expect(plane.provider.aliveIds().sort()).toEqual([...users].sort());
  });

  test('a start that fails frees its slot: the creates behind it start', async ({ openPool }) => {
    const plane = openPool({ max: 0, startConcurrency: 1 });
    plane.provider.failNextCreate(new SandboxStartError('sandbox did not start: no room'));
    const results = await Promise.allSettled([0, 1, 2].map(() => plane.sandboxes.create({})));
    expect(results.map((r) => r.status)).toEqual(['rejected', 'fulfilled', 'fulfilled']);
    expect(plane.provider.peakPendingCreates).toBe(1);
    expect(await plane.sandboxes.list({})).toHaveLength(2);
  });

  test('a refill that fails stops refilling until the next create', async ({ openPool }) => {
    const plane = openPool({ max: 2, windowMs: 100 });
    const errors: unknown[][] = [];
    const spy = vi.spyOn(console, 'error').mockImplementation((...args) => {
      errors.push(args);
    });
    try {
      // The create's own start goes through; the refill after it fails.
      plane.provider.holdCreates(1);
      await plane.sandboxes.create({});
      plane.provider.failNextCreate(new SandboxStartError('sandbox did not start: no room'));
      plane.provider.releaseCreates();
      await plane.sandboxes.refill('base');
      expect(await pooledIds(plane)).toEqual([]);
      expect(String(errors[0]?.[0])).toBe(
        'warm pool of base: SandboxStartError: sandbox did not start: no room',
      );
      // The pool's timer passes do not retry it (a broken template would fail every second).
      const creates = plane.provider.creates;
      await new Promise((resolve) => setTimeout(resolve, 100));
      await plane.sandboxes.refill('base');
      expect(plane.provider.creates).toBe(creates);
      // The next create does.
      plane.clock.now += 10_000;
      await plane.sandboxes.create({});
      await plane.sandboxes.refill('base');
      expect(await pooledIds(plane)).toHaveLength(1);
    } finally {
      spy.mockRestore();
    }
  });

  test('bad settings are refused', ({ openPool }) => {
    expect(() => openPool({ max: -1 })).toThrow(/maximum must be a whole number ≥ 0, not -1/);
    expect(() => openPool({ max: 1.5 })).toThrow(RangeError);
    expect(() => openPool({ max: 2, startConcurrency: 0 })).toThrow(
      /start concurrency must be a whole number ≥ 1, not 0/,
    );
  });
});
