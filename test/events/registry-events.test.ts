import { describe, expect } from 'vitest';
import { eventFor, type NewSandboxEvent } from '../../src/control/events.js';
import type { Registry } from '../../src/control/registry.js';
import { STORES, storeTest } from '../control/registry-stores.js';

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
