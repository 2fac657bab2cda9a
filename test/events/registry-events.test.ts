import { describe, expect } from 'vitest';
import { eventFor, type NewSandboxEvent } from '../../src/control/events.js';
import type { Registry } from '../../src/control/registry.js';
import { apiKeyRow, STORES, sandboxRow, storeTest } from '../control/registry-stores.js';

const at0 = 1_800_000_000_000;

function event(
  sandboxId: string,
  owner: string | null,
  type: NewSandboxEvent['type'],
  at: number,
  data: Record<string, unknown> = {},
): NewSandboxEvent {
  return eventFor({ id: sandboxId, owner, template: 'base' }, { type, at, data });
}

async function types(registry: Registry, filter: Partial<Parameters<Registry['listEvents']>[0]>) {
  return (await registry.listEvents({ limit: 100, order: 'asc', ...filter })).map(
    (e) => `${e.sandboxId}:${e.type.replace('sandbox.lifecycle.', '')}`,
  );
}

// The events store on both registries: what every reader (API, E2B face, SDK, webhooks) relies on.
for (const kind of STORES) {
  const test = storeTest(kind);

  describe.skipIf(kind.skipped !== '')(`events in the ${kind.name} registry${kind.skipped}`, () => {
    test('append, then list by owner, sandbox, type, time and cursor, in seq order both ways', async ({
      store,
    }) => {
      const registry = await store.open();
      const a1 = await registry.appendEvent(
        event('sbxa', 'key_a', 'sandbox.lifecycle.created', at0, { nested: { x: [1, 'two'] } }),
      );
      const b1 = await registry.appendEvent(
        event('sbxb', 'key_b', 'sandbox.lifecycle.created', at0 + 1),
      );
      const own = await registry.appendEvent(
        event('sbxc', null, 'sandbox.lifecycle.created', at0 + 2),
      );
      await registry.appendEvent(event('sbxa', 'key_a', 'sandbox.lifecycle.paused', at0 + 3));
      await registry.appendEvent(event('sbxa', 'key_a', 'sandbox.lifecycle.killed', at0 + 4));
      expect(b1.seq).toBeGreaterThan(a1.seq);
      expect(a1).toMatchObject({
        sandboxId: 'sbxa',
        owner: 'key_a',
        template: 'base',
        at: at0,
        data: { nested: { x: [1, 'two'] } },
      });
      expect(a1.id).toMatch(/^[0-9a-f-]{36}$/);
      expect(own.owner).toBeNull();
      expect(await types(registry, {})).toEqual([
        'sbxa:created',
        'sbxb:created',
        'sbxc:created',
        'sbxa:paused',
        'sbxa:killed',
      ]);
      expect(await types(registry, { owner: 'key_a' })).toEqual([
        'sbxa:created',
        'sbxa:paused',
        'sbxa:killed',
      ]);
      expect(await types(registry, { owner: null })).toEqual(['sbxc:created']);
      expect(await types(registry, { owner: 'key_a', order: 'desc', limit: 2 })).toEqual([
        'sbxa:killed',
        'sbxa:paused',
      ]);
      expect(await types(registry, { owner: 'key_a', offset: 1, limit: 1 })).toEqual([
        'sbxa:paused',
      ]);
      expect(await types(registry, { sandboxId: 'sbxb' })).toEqual(['sbxb:created']);
      expect(
        await types(registry, {
          types: ['sandbox.lifecycle.paused', 'sandbox.lifecycle.killed'],
        }),
      ).toEqual(['sbxa:paused', 'sbxa:killed']);
      expect(await types(registry, { afterSeq: own.seq })).toEqual(['sbxa:paused', 'sbxa:killed']);
      expect(await types(registry, { since: at0 + 2, until: at0 + 4 })).toEqual([
        'sbxc:created',
        'sbxa:paused',
      ]);
      // Another daemon on the same database reads the same rows.
      const other = await store.open();
      expect((await other.listEvents({ limit: 10, order: 'asc' }))[0]).toEqual(a1);
    });

    test('each change writes its event with the row, only when it is made; a failed event undoes the change', async ({
      store,
    }) => {
      const registry = await store.open();
      const key = apiKeyRow();
      await registry.insertApiKey(key);
      const row = sandboxRow({ owner: key.id, template: 'tpl' });
      const draft = (type: NewSandboxEvent['type'], data: Record<string, unknown> = {}) => ({
        type,
        data,
      });
      expect(await registry.insertSandbox(row, 5, draft('sandbox.lifecycle.created'))).toBe(true);
      expect(
        await registry.setExpiry(row.id, row.expiresAt + 1, draft('sandbox.lifecycle.updated')),
      ).toBe(true);
      expect(
        await registry.setHandle(
          row.id,
          row.handle,
          draft('sandbox.lifecycle.updated', { change: 'network' }),
        ),
      ).toBe(true);
      expect(
        await registry.pauseSandbox(
          row.id,
          { memory: true, at: 1 },
          2,
          draft('sandbox.lifecycle.paused'),
        ),
      ).toBe(true);
      // Refused changes (it is not running now): no row changed, no event.
      expect(await registry.setExpiry(row.id, 5, draft('sandbox.lifecycle.updated'))).toBe(false);
      expect(
        await registry.pauseSandbox(
          row.id,
          { memory: true, at: 1 },
          2,
          draft('sandbox.lifecycle.paused'),
        ),
      ).toBe(false);
      expect(
        await registry.resumeSandbox(row.id, row.handle, 9, 5, draft('sandbox.lifecycle.resumed')),
      ).toBe(true);
      expect(
        await registry.resumeSandbox(row.id, row.handle, 9, 5, draft('sandbox.lifecycle.resumed')),
      ).toBe(false);
      // An event that cannot be written (its data is not JSON) leaves the row as it was.
      await expect(
        registry.endSandbox(row.id, 'killed', 'killed', {
          event: draft('sandbox.lifecycle.killed', { n: 1n }),
        }),
      ).rejects.toThrow(/BigInt/);
      expect((await registry.getSandbox(row.id))?.state).toBe('running');
      expect(
        await registry.endSandbox(row.id, 'killed', 'killed', {
          event: draft('sandbox.lifecycle.killed', { reason: 'api' }),
        }),
      ).toBe(true);
      expect(
        await registry.endSandbox(row.id, 'killed', 'again', {
          event: draft('sandbox.lifecycle.killed'),
        }),
      ).toBe(false);
      const events = await registry.listEvents({ sandboxId: row.id, limit: 100, order: 'asc' });
      expect(events.map((e) => e.type.replace('sandbox.lifecycle.', ''))).toEqual([
        'created',
        'updated',
        'updated',
        'paused',
        'resumed',
        'killed',
      ]);
      expect(events.every((e) => e.owner === key.id && e.template === 'tpl')).toBe(true);
      expect(events[5]?.data).toEqual({ reason: 'api' });
      // A spare claimed from the pool: its created event names the key that got it.
      const spare = sandboxRow({ state: 'pooled', template: 'pool-tpl' });
      await registry.insertSandbox(spare);
      expect(await registry.listEvents({ sandboxId: spare.id, limit: 10, order: 'asc' })).toEqual(
        [],
      );
      const claimed = await registry.claimPooled(
        'pool-tpl',
        {},
        10,
        20,
        { keyId: key.id, maxRunning: 5 },
        draft('sandbox.lifecycle.created', { source: 'pool' }),
      );
      expect(claimed?.id).toBe(spare.id);
      expect(
        await registry.claimPooled(
          'pool-tpl',
          {},
          10,
          20,
          undefined,
          draft('sandbox.lifecycle.created'),
        ),
      ).toBeUndefined();
      const [created] = await registry.listEvents({ sandboxId: spare.id, limit: 10, order: 'asc' });
      expect(created).toMatchObject({
        owner: key.id,
        template: 'pool-tpl',
        data: { source: 'pool' },
      });
      // At the key's limit, a create is refused and leaves no event.
      const over = sandboxRow({ owner: key.id });
      expect(await registry.insertSandbox(over, 1, draft('sandbox.lifecycle.created'))).toBe(false);
      expect(await registry.listEvents({ sandboxId: over.id, limit: 10, order: 'asc' })).toEqual(
        [],
      );
      // The same id twice is one event (the reaper's nearing-timeout warning, from any daemon).
      const once = event(row.id, key.id, 'sandbox.lifecycle.expiring', at0);
      const first = await registry.appendEvent(once);
      expect(await registry.appendEvent({ ...once, at: at0 + 5 })).toEqual(first);
      expect(
        await registry.listEvents({
          types: ['sandbox.lifecycle.expiring'],
          limit: 10,
          order: 'asc',
        }),
      ).toHaveLength(1);
    });

    test("a snapshot's template and its checkpointed event commit together, or neither does", async ({
      store,
    }) => {
      const registry = await store.open();
      const snapshot = {
        name: 'snap',
        spec: { name: 'snap' },
        dir: '/t/snap',
        image: null,
        builtAt: 1,
        owner: 'key_a',
        shared: false,
      };
      const checkpointed = (data: Record<string, unknown>) =>
        event('sbxs', 'key_a', 'sandbox.lifecycle.checkpointed', at0, data);
      // The event cannot be written (its data is not JSON): no template either.
      await expect(
        registry.upsertTemplate(snapshot, undefined, checkpointed({ n: 1n })),
      ).rejects.toThrow(/BigInt/);
      expect(await registry.getTemplate('snap')).toBeUndefined();
      // The template is refused (the check throws): no event either.
      await expect(
        registry.upsertTemplate(
          snapshot,
          () => {
            throw new Error('taken');
          },
          checkpointed({ snapshot: 'snap' }),
        ),
      ).rejects.toThrow('taken');
      expect(await types(registry, { sandboxId: 'sbxs' })).toEqual([]);
      // Both, once.
      const written = checkpointed({ snapshot: 'snap' });
      expect(await registry.upsertTemplate(snapshot, undefined, written)).toBeUndefined();
      expect((await registry.getTemplate('snap'))?.dir).toBe('/t/snap');
      const [only, ...more] = await registry.listEvents({
        sandboxId: 'sbxs',
        limit: 10,
        order: 'asc',
      });
      expect(more).toEqual([]);
      expect(only).toMatchObject({ id: written.id, data: { snapshot: 'snap' } });
    });

    test('purge removes what happened before the cutoff and says how many', async ({ store }) => {
      const registry = await store.open();
      for (let i = 0; i < 5; i++) {
        await registry.appendEvent(event(`sbx${i}`, null, 'sandbox.lifecycle.created', at0 + i));
      }
      expect(await registry.purgeEvents(at0 + 3)).toBe(3);
      expect(await types(registry, {})).toEqual(['sbx3:created', 'sbx4:created']);
      expect(await registry.purgeEvents(at0 + 3)).toBe(0);
    });

    test('appends racing on two connections: seq order is commit order, none lost', async ({
      store,
    }) => {
      const one = await store.open();
      const two = await store.open();
      const writes = Array.from({ length: 40 }, (_, i) =>
        (i % 2 ? one : two).appendEvent(event(`sbx${i}`, null, 'sandbox.lifecycle.created', i)),
      );
      const written = await Promise.all(writes);
      const listed = await one.listEvents({ limit: 100, order: 'asc' });
      expect(listed.map((e) => e.id).sort()).toEqual(written.map((e) => e.id).sort());
      expect(new Set(listed.map((e) => e.seq)).size).toBe(40);
    });
  });
}
