import { describe, expect } from 'vitest';
import type { Registry } from '../../src/control/registry.js';
import {
  apiKeyRow,
  STORES,
  sandboxRow,
  sealedRow,
  secretRow,
  storeTest,
  volumeRow,
} from './registry-stores.js';

// The same contract for both stores: what the services rely on, and what two daemons sharing one
// database rely on (each `store.open()` is another daemon's connection to the same database).
for (const kind of STORES) {
  const test = storeTest(kind);

  describe.skipIf(kind.skipped !== '')(`the ${kind.name} registry${kind.skipped}`, () => {
    test('a sandbox reads back as it was written, numbers, metadata and handle alike', async ({
      store,
    }) => {
      const registry = await store.open();
      const row = sandboxRow({
        metadata: { owner: 'alice', 'key with "quotes" and .dots': 'ünïcødé', empty: '' },
        handle: {
          ...sandboxRow().handle,
          uid: 100_123,
          cgroups: ['/sys/fs/cgroup/memory/x'],
          // A workspace mounted for a local client's uid: what an apply after a restart writes as.
          workspace: {
            from: '/srv/repo',
            path: '/home/user/workspace',
            view: '/abx/sandboxes/x/workspace/merged',
            upper: '/abx/sandboxes/x/workspace/upper',
            dir: '/abx/sandboxes/x/workspace',
            mountedAt: 1_900_000_000_123,
            uid: 65_534,
          },
        },
      });
      await registry.insertSandbox(row);
      expect(await registry.getSandbox(row.id)).toEqual(row);
      expect(await registry.getSandbox('nosuchsandbox')).toBeUndefined();
      // Metadata keys keep their order: the API shows them as the caller wrote them.
      expect(Object.keys((await registry.getSandbox(row.id))?.metadata ?? {})).toEqual(
        Object.keys(row.metadata),
      );
    });

    test('listing: oldest first, pooled only when asked, filters by state, template and metadata', async ({
      store,
    }) => {
      const registry = await store.open();
      const a = sandboxRow({ metadata: { owner: 'alice', 'a.b': 'x' } });
      const b = sandboxRow({ template: 'other', metadata: { owner: 'bob' } });
      const spare = sandboxRow({ state: 'pooled' });
      const gone = sandboxRow({ state: 'killed', endedAt: 1, endReason: 'killed' });
      for (const row of [gone, spare, b, a]) await registry.insertSandbox(row);
      const ids = async (filter?: Parameters<typeof registry.listSandboxes>[0]) =>
        (await registry.listSandboxes(filter)).map((r) => r.id);
      expect(await ids()).toEqual([a.id, b.id, gone.id]);
      expect(await ids({ state: 'pooled' })).toEqual([spare.id]);
      expect(await ids({ state: 'running' })).toEqual([a.id, b.id]);
      expect(await ids({ state: ['running', 'killed'] })).toEqual([a.id, b.id, gone.id]);
      expect(await ids({ state: ['killed', 'expired', 'dead'] })).toEqual([gone.id]);
      expect(await ids({ state: ['pooled', 'killed'], template: 'other' })).toEqual([]);
      expect(await ids({ template: 'other' })).toEqual([b.id]);
      expect(await ids({ metadata: { owner: 'alice' } })).toEqual([a.id]);
      expect(await ids({ metadata: { 'a.b': 'x' } })).toEqual([a.id]);
      expect(await ids({ metadata: { owner: 'alice', 'a.b': 'y' } })).toEqual([]);
      expect(await ids({ metadata: { nobody: 'x' } })).toEqual([]);
    });

    test('countLive counts the sandboxes not ended by state and template, as every daemon sees them', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      expect(await one.countLive()).toEqual([]);
      const running = [sandboxRow(), sandboxRow(), sandboxRow({ template: 'other' })];
      const rows = [
        ...running,
        sandboxRow({ state: 'pooled' }),
        sandboxRow({ state: 'killed', endedAt: 1, endReason: 'killed' }),
        sandboxRow({ state: 'dead', template: 'other', endedAt: 2, endReason: 'exited' }),
      ];
      for (const row of rows) await one.insertSandbox(row);
      expect(await two.countLive()).toEqual([
        { state: 'pooled', template: 'base', count: 1 },
        { state: 'running', template: 'base', count: 2 },
        { state: 'running', template: 'other', count: 1 },
      ]);
      await one.endSandbox((running[2] as (typeof running)[0]).id, 'killed', 'killed');
      expect(await two.countLive()).toEqual([
        { state: 'pooled', template: 'base', count: 1 },
        { state: 'running', template: 'base', count: 2 },
      ]);
    });

    test('a sandbox ends once: of racing ends (two daemons) one wins and its reason stays', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const rows = Array.from({ length: 10 }, () => sandboxRow());
      for (const row of rows) await one.insertSandbox(row);
      for (const row of rows) {
        const results = await Promise.all([
          one.endSandbox(row.id, 'killed', 'killed by request'),
          two.endSandbox(row.id, 'expired', 'expired at some time'),
        ]);
        expect(results.filter(Boolean)).toHaveLength(1);
        const ended = await two.getSandbox(row.id);
        expect(ended).toMatchObject(
          results[0]
            ? { state: 'killed', endReason: 'killed by request' }
            : { state: 'expired', endReason: 'expired at some time' },
        );
        expect(ended?.endedAt).toEqual(expect.any(Number));
      }
      // Ended is final: neither a later end nor a new expiry changes it.
      const [first] = rows as [(typeof rows)[0]];
      const before = await one.getSandbox(first.id);
      expect(await one.endSandbox(first.id, 'dead', 'exited')).toBe(false);
      expect(await one.setExpiry(first.id, Date.now() + 1000)).toBe(false);
      expect(await one.getSandbox(first.id)).toEqual(before);
    });

    test("setHandle replaces a running sandbox's handle (its network policy), and no ended one's", async ({
      store,
    }) => {
      const registry = await store.open();
      const row = sandboxRow({});
      await registry.insertSandbox(row);
      const handle = {
        ...row.handle,
        net: {
          id: row.id,
          holder: 7,
          holderStart: '1',
          slirp: 8,
          userns: false,
          ports: { http: 1, tls: 2, dns: 3 },
          policy: { allowOut: ['a.test'], denyOut: ['0.0.0.0/0'] },
        },
      };
      expect(await registry.setHandle(row.id, handle)).toBe(true);
      expect((await registry.getSandbox(row.id))?.handle).toEqual(handle);
      await registry.endSandbox(row.id, 'killed', 'killed');
      expect(await registry.setHandle(row.id, row.handle)).toBe(false);
      expect((await registry.getSandbox(row.id))?.handle).toEqual(handle);
      expect(await registry.setHandle('nope', row.handle)).toBe(false);
    });

    test('an expiry ends a sandbox only if it is still due (a lifetime extended meanwhile wins)', async ({
      store,
    }) => {
      const registry = await store.open();
      const row = sandboxRow({ expiresAt: 1000 });
      await registry.insertSandbox(row);
      expect((await registry.expired(2000)).map((r) => r.id)).toEqual([row.id]);
      // Another caller extends it after the reaper read it as expired.
      expect(await registry.setExpiry(row.id, 5000)).toBe(true);
      expect(await registry.endSandbox(row.id, 'expired', 'expired', { expiredBy: 2000 })).toBe(
        false,
      );
      expect(await registry.getSandbox(row.id)).toMatchObject({
        state: 'running',
        expiresAt: 5000,
      });
      expect(await registry.expired(2000)).toEqual([]);
      expect(await registry.endSandbox(row.id, 'expired', 'expired', { expiredBy: 5000 })).toBe(
        true,
      );
      expect(await registry.expired(9000)).toEqual([]);
    });

    test('endedSince: the sandboxes that ended since a time, whatever the end', async ({
      store,
    }) => {
      const registry = await store.open();
      const rows = [sandboxRow(), sandboxRow(), sandboxRow(), sandboxRow()];
      for (const row of rows) await registry.insertSandbox(row);
      const since = Date.now();
      await registry.endSandbox(rows[0]?.id as string, 'killed', 'killed by request');
      await registry.endSandbox(rows[1]?.id as string, 'dead', 'oom');
      await registry.endSandbox(rows[2]?.id as string, 'expired', 'expired');
      const ended = await registry.endedSince(since);
      expect(ended.map((r) => r.id).sort()).toEqual(
        rows
          .slice(0, 3)
          .map((r) => r.id)
          .sort(),
      );
      expect(ended.map((r) => r.state).sort()).toEqual(['dead', 'expired', 'killed']);
      expect(await registry.endedSince(Date.now() + 60_000)).toEqual([]);
    });

    test('the pool hands out its oldest sandbox, each to one claim only, even when claims race', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const pooled = Array.from({ length: 5 }, () => sandboxRow({ state: 'pooled' }));
      for (const row of pooled) await one.insertSandbox(row);
      await one.insertSandbox(sandboxRow({ state: 'pooled', template: 'other' }));
      expect(await two.countPooled('base')).toBe(5);

      const oldest = await one.claimPooled('base', { owner: 'first' }, 7, 70);
      expect(oldest).toMatchObject({
        id: pooled[0]?.id,
        state: 'running',
        metadata: { owner: 'first' },
        createdAt: 7,
        expiresAt: 70,
      });
      // 20 claims at once from two connections for the 4 left.
      const claims = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          (i % 2 ? one : two).claimPooled('base', { claim: String(i) }, 8, 80),
        ),
      );
      const won = claims.filter((c) => c !== undefined).map((c) => c?.id);
      expect([...won].sort()).toEqual(
        pooled
          .slice(1)
          .map((r) => r.id)
          .sort(),
      );
      expect(await one.countPooled('base')).toBe(0);
      expect(await one.countPooled('other')).toBe(1);
      expect(await one.claimPooled('base', {}, 9, 90)).toBeUndefined();
    });

    test('a row is deleted only from the state the caller saw (a claimed spare stays)', async ({
      store,
    }) => {
      const registry = await store.open();
      const spare = sandboxRow({ state: 'pooled' });
      await registry.insertSandbox(spare);
      await registry.claimPooled('base', {}, 1, 2);
      // The pool tries to evict it as a spare: it is somebody's sandbox now.
      expect(await registry.deleteSandbox(spare.id, 'pooled')).toBe(false);
      expect((await registry.getSandbox(spare.id))?.state).toBe('running');
      expect(await registry.deleteSandbox(spare.id, 'running')).toBe(true);
      expect(await registry.getSandbox(spare.id)).toBeUndefined();
      expect(await registry.deleteSandbox(spare.id, 'running')).toBe(false);
    });

    test('templates: an upsert and a removal answer the record they replaced', async ({
      store,
    }) => {
      const registry = await store.open();
      const first = {
        name: 'web',
        spec: { name: 'web', env: { B: '1', A: '2' } },
        dir: '/t/web',
        image: null,
        builtAt: 1,
        owner: null,
        shared: true,
      };
      expect(await registry.upsertTemplate(first)).toBeUndefined();
      const second = { ...first, dir: null, image: 'abx-template/web:2', builtAt: 2 };
      expect(await registry.upsertTemplate(second)).toEqual(first);
      await registry.upsertTemplate({ ...first, name: 'api', spec: { name: 'api' } });
      expect((await registry.listTemplates()).map((t) => t.name)).toEqual(['api', 'web']);
      const read = await registry.getTemplate('web');
      expect(read).toEqual(second);
      expect(Object.keys((read?.spec as { env: object } | undefined)?.env ?? {})).toEqual([
        'B',
        'A',
      ]);
      expect(await registry.removeTemplate('web')).toEqual(second);
      expect(await registry.removeTemplate('web')).toBeUndefined();
      expect(await registry.getTemplate('web')).toBeUndefined();
    });

    test('templates have owners: a rebuild keeps its owner and sharing, a check refuses a write, publish shares', async ({
      store,
    }) => {
      const registry = await store.open();
      const mine = {
        name: 'snap',
        spec: { name: 'snap' },
        dir: '/t/snap',
        image: null,
        builtAt: 1,
        owner: 'key_alice0000000',
        shared: false,
      };
      expect(await registry.upsertTemplate(mine)).toBeUndefined();
      // An admin's rebuild (its record says shared, no owner) keeps alice's ownership.
      const rebuilt = { ...mine, builtAt: 2, owner: null, shared: true };
      expect(await registry.upsertTemplate(rebuilt)).toEqual(mine);
      expect(await registry.getTemplate('snap')).toEqual({
        ...rebuilt,
        owner: mine.owner,
        shared: false,
      });
      // A refused check writes nothing and is thrown as it was.
      const seen: unknown[] = [];
      const refusal = new Error('not yours');
      await expect(
        registry.upsertTemplate({ ...mine, builtAt: 3, dir: '/t/other' }, (previous) => {
          seen.push(previous?.owner);
          throw refusal;
        }),
      ).rejects.toBe(refusal);
      expect(seen).toEqual([mine.owner]);
      expect((await registry.getTemplate('snap'))?.builtAt).toBe(2);
      // A new name's check is told there is nothing.
      const fresh: unknown[] = [];
      await registry.upsertTemplate({ ...mine, name: 'new' }, (previous) => fresh.push(previous));
      expect(fresh).toEqual([undefined]);
      expect(await registry.setTemplateShared('snap', true)).toMatchObject({ shared: true });
      expect((await registry.getTemplate('snap'))?.shared).toBe(true);
      expect(await registry.setTemplateShared('snap', false)).toMatchObject({ shared: false });
      expect(await registry.setTemplateShared('none', true)).toBeUndefined();
    });

    test('templates: two keys racing for one new name on two connections: one writes, the other is refused by its check', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const write = (registry: typeof one, owner: string) =>
        registry.upsertTemplate(
          {
            name: 'race',
            spec: { name: 'race', by: owner },
            dir: `/t/${owner}`,
            image: null,
            builtAt: 1,
            owner,
            shared: false,
          },
          (previous) => {
            if (previous && previous.owner !== owner) throw new Error(`taken by ${previous.owner}`);
          },
        );
      for (let round = 0; round < 10; round++) {
        await one.removeTemplate('race');
        const results = await Promise.allSettled([write(one, 'key_a'), write(two, 'key_b')]);
        const won = results.filter((r) => r.status === 'fulfilled');
        expect(won).toHaveLength(1);
        const row = await one.getTemplate('race');
        // The winner's row is the winner's whole: its owner with its own build.
        expect(row).toBeDefined();
        expect((row?.spec as { by?: string } | undefined)?.by).toBe(row?.owner);
        expect(row?.dir).toBe(`/t/${row?.owner}`);
      }
    });

    test('agree: the first value of a key is kept, later ones are answered with it', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const answers = await Promise.all([one.agree('k', 'from-one'), two.agree('k', 'from-two')]);
      expect(answers[0]).toBe(answers[1]);
      expect(await two.agree('k', 'later')).toBe(answers[0]);
      expect(await one.agree('other', 'x')).toBe('x');
    });

    test('API keys: found by hash, listed with their running sandboxes, revoked once, names unique among active keys', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const alice = apiKeyRow({ name: 'alice', maxRunning: 2 });
      const ops = apiKeyRow({ name: 'ops', admin: true });
      expect(await one.insertApiKey(alice)).toBe(true);
      expect(await one.insertApiKey(ops)).toBe(true);
      expect(await two.findApiKey(alice.keyHash)).toEqual(alice);
      expect(await two.findApiKey('cd'.repeat(32))).toBeUndefined();
      expect(await two.getApiKey(alice.id)).toEqual(alice);
      expect(await two.getApiKey('key_nosuchkey00')).toBeUndefined();
      // A second active key of one name is refused, and nothing is written.
      const again = apiKeyRow({ name: 'alice' });
      expect(await two.insertApiKey(again)).toBe(false);
      expect(await one.findApiKey(again.keyHash)).toBeUndefined();
      for (const row of [
        sandboxRow({ owner: alice.id }),
        sandboxRow({ owner: alice.id }),
        sandboxRow({ owner: alice.id, state: 'killed', endedAt: 1, endReason: 'killed' }),
        sandboxRow({ owner: ops.id }),
        sandboxRow(),
      ]) {
        await one.insertSandbox(row);
      }
      expect(
        (await two.listApiKeys()).map((key) => [key.name, key.running, key.admin, key.maxRunning]),
      ).toEqual([
        ['alice', 2, false, 2],
        ['ops', 1, true, null],
      ]);
      expect((await one.listSandboxes({ owner: alice.id })).length).toBe(3);
      expect((await one.listSandboxes({ owner: alice.id, state: 'running' })).length).toBe(2);
      // Revoked once: a second revocation keeps the first time; an unknown id is undefined.
      expect((await one.revokeApiKey(alice.id, 5000))?.revokedAt).toBe(5000);
      expect((await two.revokeApiKey(alice.id, 6000))?.revokedAt).toBe(5000);
      expect(await two.revokeApiKey('key_nosuchkey000', 6000)).toBeUndefined();
      expect((await two.findApiKey(alice.keyHash))?.revokedAt).toBe(5000);
      // The name of a revoked key is free again.
      expect(await two.insertApiKey(again)).toBe(true);
      await one.touchApiKey(ops.id, 7000);
      expect((await two.findApiKey(ops.keyHash))?.lastUsedAt).toBe(7000);
    });

    test('a pause and a resume: one state change each, paused rows counted by no key, ended from either state', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const key = apiKeyRow({ maxRunning: 1 });
      await one.insertApiKey(key);
      const lifecycle = { onTimeout: 'pause', keepMemory: false } as const;
      const row = sandboxRow({ owner: key.id, lifecycle });
      expect(await one.insertSandbox(row, 1)).toBe(true);
      expect((await two.getSandbox(row.id))?.lifecycle).toEqual(lifecycle);
      const pause = { memory: false, at: 1_900_000_000_000 };
      // Of two daemons pausing at once, one wins.
      const paused = await Promise.all([
        one.pauseSandbox(row.id, pause, 1_900_000_060_000),
        two.pauseSandbox(row.id, pause, 1_900_000_060_000),
      ]);
      expect(paused.filter(Boolean)).toHaveLength(1);
      const read = await two.getSandbox(row.id);
      expect(read).toMatchObject({ state: 'paused', paused: pause, expiresAt: 1_900_000_060_000 });
      // Paused, it counts against no limit: its key may start another, which fills the limit.
      const other = sandboxRow({ owner: key.id });
      expect(await two.insertSandbox(other, 1)).toBe(true);
      expect(await one.setExpiry(row.id, 1)).toBe(false);
      expect(await one.setLifecycle(row.id, null)).toBe(false);
      // Over the limit, a resume writes nothing; once the other ended, it goes through (once).
      const handle = { ...row.handle, pid: 777, startTime: 'woken' };
      expect(await one.resumeSandbox(row.id, handle, 1_900_000_120_000, 1)).toBe(false);
      expect((await two.getSandbox(row.id))?.state).toBe('paused');
      await two.endSandbox(other.id, 'killed', 'killed');
      const resumed = await Promise.all([
        one.resumeSandbox(row.id, handle, 1_900_000_120_000, 1),
        two.resumeSandbox(row.id, handle, 1_900_000_120_000, 1),
      ]);
      expect(resumed.filter(Boolean)).toHaveLength(1);
      expect(await one.getSandbox(row.id)).toMatchObject({
        state: 'running',
        paused: null,
        handle,
        expiresAt: 1_900_000_120_000,
        lifecycle,
      });
      // Without a limit (the daemon's own key) a resume counts nothing.
      await one.pauseSandbox(row.id, pause, 5);
      expect(await two.resumeSandbox(row.id, handle, 6)).toBe(true);
      // A paused sandbox's paused timeout is an expiry like any; it ends from paused.
      await one.pauseSandbox(row.id, pause, 50);
      expect((await two.expired(49)).map((r) => r.id)).not.toContain(row.id);
      expect((await two.expired(50)).map((r) => r.id)).toContain(row.id);
      expect(await two.endSandbox(row.id, 'expired', 'paused too long', { expiredBy: 50 })).toBe(
        true,
      );
      expect(await one.resumeSandbox(row.id, handle, 100)).toBe(false);
      expect(await one.pauseSandbox(row.id, pause, 100)).toBe(false);
      expect(await one.getSandbox(row.id)).toMatchObject({
        state: 'expired',
        endReason: 'paused too long',
      });
      expect(await one.setLifecycle(other.id, lifecycle)).toBe(false);
    });

    test("a key's limit holds when many creates race on four daemons", async ({ store }) => {
      const daemons = await Promise.all(Array.from({ length: 4 }, () => store.open()));
      for (let round = 0; round < 5; round++) {
        const key = apiKeyRow({ maxRunning: 5 });
        await (daemons[0] as Registry).insertApiKey(key);
        const results = await Promise.all(
          Array.from({ length: 40 }, (_, i) =>
            (daemons[i % 4] as Registry).insertSandbox(sandboxRow({ owner: key.id }), 5),
          ),
        );
        expect(results.filter(Boolean)).toHaveLength(5);
        expect(
          await (daemons[1] as Registry).listSandboxes({ owner: key.id, state: 'running' }),
        ).toHaveLength(5);
      }
    });

    test("a key's limit holds when creates race on two daemons: inserts and pool claims together", async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const key = apiKeyRow({ maxRunning: 3 });
      await one.insertApiKey(key);
      const owner = { keyId: key.id, maxRunning: 3 };
      await one.insertSandbox(sandboxRow({ owner: key.id }), 3);
      for (let i = 0; i < 6; i++) await one.insertSandbox(sandboxRow({ state: 'pooled' }));
      const now = Date.now();
      const results = await Promise.all([
        ...Array.from({ length: 6 }, (_, i) =>
          (i % 2 ? one : two).insertSandbox(sandboxRow({ owner: key.id }), 3),
        ),
        ...Array.from({ length: 6 }, (_, i) =>
          (i % 2 ? two : one).claimPooled('base', {}, now, now + 1000, owner),
        ),
      ]);
      const won = results.filter((result) => result === true || typeof result === 'object');
      expect(won).toHaveLength(2);
      const running = await two.listSandboxes({ owner: key.id, state: 'running' });
      expect(running).toHaveLength(3);
      // The spares not handed out are still spares, and belong to no key.
      const spares = await one.listSandboxes({ state: 'pooled' });
      expect(spares.length + results.filter((r) => typeof r === 'object').length).toBe(6);
      expect(spares.every((row) => row.owner === null)).toBe(true);
      // Without a limit (the daemon's own key, or a key with none) nothing is counted.
      expect(await one.insertSandbox(sandboxRow({ owner: key.id }))).toBe(true);
      // Another key's sandboxes do not count against this one.
      const other = apiKeyRow({ maxRunning: 1 });
      await one.insertApiKey(other);
      expect(await two.insertSandbox(sandboxRow({ owner: other.id }), 1)).toBe(true);
      expect(await two.insertSandbox(sandboxRow({ owner: other.id }), 1)).toBe(false);
      // A spare handed out becomes its claimer's.
      const claimed = await two.claimPooled('base', { a: 'b' }, now, now + 1000, {
        keyId: 'key_unlimited000',
        maxRunning: null,
      });
      expect(claimed?.owner).toBe('key_unlimited000');
      expect((await one.getSandbox(claimed?.id as string))?.owner).toBe('key_unlimited000');
    });
    test('volumes: names unique per owner, found by owner and name, listed by name', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const data = volumeRow({ name: 'data' });
      expect(await one.insertVolume(data)).toBe(true);
      expect(await two.insertVolume(volumeRow({ name: 'data' }))).toBe(false);
      const alices = volumeRow({ name: 'data', owner: 'key_alice0000000' });
      expect(await two.insertVolume(alices)).toBe(true);
      expect(await one.insertVolume(volumeRow({ name: 'another' }))).toBe(true);
      expect(await two.getVolume(data.id)).toEqual(data);
      expect(await two.findVolume(null, 'data')).toEqual(data);
      expect(await one.findVolume('key_alice0000000', 'data')).toEqual(alices);
      expect(await one.findVolume('key_bob000000000', 'data')).toBeUndefined();
      expect((await two.listVolumes(null)).map((v) => v.name)).toEqual(['another', 'data']);
      expect((await two.listVolumes('key_alice0000000')).map((v) => v.id)).toEqual([alices.id]);
      expect(await one.listVolumes()).toHaveLength(3);
    });

    test('secrets: names unique per owner, versions follow updates, a removal takes every version', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const mine = secretRow({ name: 'openai', metadata: { team: 'ml' } });
      expect(await one.insertSecret(mine, sealedRow(1))).toBe(true);
      // The name is the owner's: the same owner cannot take it twice, another owner can.
      expect(await two.insertSecret(secretRow({ name: 'openai' }), sealedRow(1))).toBe(false);
      const alices = secretRow({ name: 'openai', owner: 'key_alice0000000' });
      expect(await two.insertSecret(alices, sealedRow(1, 'alice-1'))).toBe(true);
      expect(await two.getSecret(mine.id)).toEqual(mine);
      expect(await two.findSecret(null, 'openai')).toEqual(mine);
      expect(await one.findSecret('key_alice0000000', 'openai')).toEqual(alices);
      expect(await one.findSecret('key_bob000000000', 'openai')).toBeUndefined();
      expect((await one.listSecrets('key_alice0000000')).map((s) => s.id)).toEqual([alices.id]);
      expect(await one.listSecrets()).toHaveLength(2);
      expect(await two.currentSecretVersion(mine.id)).toEqual(sealedRow(1));

      // A new value is the next version, from the version the caller read; metadata alone keeps it.
      const v2 = await two.updateSecret(mine.id, { from: 1, value: sealedRow(2), at: 5 });
      expect(v2).toMatchObject({ version: 2, metadata: { team: 'ml' }, updatedAt: 5 });
      expect(await one.currentSecretVersion(mine.id)).toEqual(sealedRow(2));
      const meta = await one.updateSecret(mine.id, { from: 2, metadata: { team: 'ops' }, at: 6 });
      expect(meta).toMatchObject({ version: 2, metadata: { team: 'ops' } });
      // A change made on a version that is no longer current writes nothing (the caller retries).
      expect(
        await two.updateSecret(mine.id, { from: 1, value: sealedRow(2, 'late'), at: 7 }),
      ).toBeUndefined();
      expect(await one.currentSecretVersion(mine.id)).toEqual(sealedRow(2));
      expect(await one.getSecret(mine.id)).toMatchObject({ version: 2, updatedAt: 6 });
      expect(await one.secretKeyChecks()).toEqual(['check-a']);

      expect(await two.removeSecret(mine.id)).toBe(true);
      expect(await one.removeSecret(mine.id)).toBe(false);
      expect(await one.getSecret(mine.id)).toBeUndefined();
      expect(await one.currentSecretVersion(mine.id)).toBeUndefined();
      expect(await one.updateSecret(mine.id, { from: 2, metadata: {}, at: 8 })).toBeUndefined();
      const left = await store.rows('SELECT secret_id FROM secret_versions');
      expect(left.map((row) => row.secret_id)).toEqual([alices.id]);
      // The name is free again for its owner.
      expect(await two.insertSecret(secretRow({ name: 'openai' }), sealedRow(1))).toBe(true);
    });

    test('two updates of one secret racing on two daemons: one writes the next version, the other is told and writes nothing', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const secret = secretRow({ name: 'raced' });
      await one.insertSecret(secret, sealedRow(1));
      const results = await Promise.all([
        one.updateSecret(secret.id, { from: 1, value: sealedRow(2, 'one'), at: 2 }),
        two.updateSecret(secret.id, { from: 1, value: sealedRow(2, 'two'), at: 2 }),
      ]);
      // Exactly one wins version 2; the other is told and nothing of it is written.
      expect(results.filter(Boolean)).toHaveLength(1);
      const versions = await store.rows(
        `SELECT version, sealed FROM secret_versions WHERE secret_id = '${secret.id}' ORDER BY version`,
      );
      expect(versions.map((row) => Number(row.version))).toEqual([1, 2]);
    });

    test('a volume is removed only while no live sandbox mounts it; a sandbox needs its volumes to exist', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      const volume = volumeRow({ name: 'busy' });
      // A name that looks like the id must not count as mounting it.
      const decoy = volumeRow({ name: volume.id });
      await one.insertVolume(volume);
      await one.insertVolume(decoy);
      const mount = (v: typeof volume, path = '/mnt/x') => ({
        id: v.id,
        name: v.name,
        path,
        readOnly: false,
      });
      const user = sandboxRow({ volumeMounts: [mount(volume), mount(volume, '/mnt/y')] });
      const paused = sandboxRow({ state: 'paused', volumeMounts: [mount(volume)] });
      const ended = sandboxRow({ state: 'killed', endedAt: 1, volumeMounts: [mount(volume)] });
      const decoyUser = sandboxRow({ volumeMounts: [mount(decoy)] });
      for (const row of [user, paused, ended, decoyUser]) {
        expect(await one.insertSandbox(row)).toBe(true);
      }
      expect(await two.getSandbox(user.id)).toEqual(user);
      expect(await two.volumeUsers(volume.id)).toEqual([user.id, paused.id]);
      expect(await two.removeVolume(volume.id)).toEqual({
        removed: false,
        users: [user.id, paused.id],
      });
      await one.endSandbox(user.id, 'killed', 'test');
      await one.endSandbox(paused.id, 'killed', 'test');
      expect(await two.removeVolume(volume.id)).toEqual({ removed: true, users: [] });
      expect(await two.removeVolume(volume.id)).toEqual({ removed: false, users: [] });
      expect(await one.getVolume(volume.id)).toBeUndefined();
      // A sandbox that mounts a volume that is gone is not recorded.
      const late = sandboxRow({ volumeMounts: [mount(volume)] });
      expect(await two.insertSandbox(late)).toBe(false);
      expect(await one.getSandbox(late.id)).toBeUndefined();
      expect(await one.volumeUsers(decoy.id)).toEqual([decoyUser.id]);
    });

    test('a removal and creates that mount the volume race on two daemons: never a sandbox of a removed volume', async ({
      store,
    }) => {
      const [one, two] = [await store.open(), await store.open()];
      for (let round = 0; round < 5; round++) {
        const volume = volumeRow();
        await one.insertVolume(volume);
        const mounts = [{ id: volume.id, name: volume.name, path: '/mnt/v', readOnly: false }];
        const rows = Array.from({ length: 4 }, () => sandboxRow({ volumeMounts: mounts }));
        const [removal, ...inserts] = await Promise.all([
          (round % 2 ? one : two).removeVolume(volume.id),
          ...rows.map((row, i) => (i % 2 ? one : two).insertSandbox(row)),
        ]);
        const written = rows.filter((_, i) => inserts[i] === true).map((row) => row.id);
        if (removal?.removed) {
          // Removed: no sandbox of it was recorded before or after.
          expect(written).toEqual([]);
          expect(await one.getVolume(volume.id)).toBeUndefined();
        } else {
          // Refused: it names the sandboxes recorded before it, and the volume is still there.
          expect(removal?.users.length).toBeGreaterThan(0);
          expect(written).toEqual(expect.arrayContaining(removal?.users ?? []));
          expect(await one.getVolume(volume.id)).toBeDefined();
        }
      }
    });
  });
}
