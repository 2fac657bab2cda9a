import { describe, expect } from 'vitest';
import { eventFor } from '../../src/control/events.js';
import type { Registry } from '../../src/control/registry.js';
import { STORES, storeTest } from '../control/registry-stores.js';
import { hook } from './webhook-rows.js';

async function emit(registry: Registry, sandbox: string, owner: string | null, type: string) {
  return registry.appendEvent(
    eventFor({ id: sandbox, owner, template: 'base' }, { type: type as never }),
  );
}

const created = 'sandbox.lifecycle.created';
const killed = 'sandbox.lifecycle.killed';

// The webhooks part of both registries: fan-out by owner and type, order per sandbox, leases.
for (const kind of STORES) {
  const test = storeTest(kind);

  describe.skipIf(kind.skipped !== '')(
    `webhook deliveries in the ${kind.name} registry${kind.skipped}`,
    () => {
      test('fan-out takes only its key’s events of its types after its creation; claims go in order per sandbox; a lease that ends is claimed again with the same id', async ({
        store,
      }) => {
        const registry = await store.open();
        await emit(registry, 'sbx_old', 'key_a', created);
        const mine = await registry.webhooks.insertWebhook(hook());
        const onlyKills = await registry.webhooks.insertWebhook(hook({ events: [killed] }));
        const other = await registry.webhooks.insertWebhook(hook({ owner: 'key_b' }));
        expect(mine.cursor).toBeGreaterThan(0);

        await emit(registry, 'sbx_1', 'key_a', created);
        await emit(registry, 'sbx_2', 'key_a', created);
        await emit(registry, 'sbx_1', 'key_a', killed);
        await emit(registry, 'sbx_b', 'key_b', created);
        const now = Date.now();
        expect(await registry.webhooks.fanOut(now, 500)).toBe(3 + 1 + 1);
        // Fanned out once: a second pass writes nothing.
        expect(await registry.webhooks.fanOut(now, 500)).toBe(0);

        const first = await registry.webhooks.claimDue(now, 1000, 10);
        const seen = first.map((c) => `${c.webhook.name}:${c.event?.sandboxId}:${c.event?.type}`);
        // sbx_1's kill waits for its create (in order per sandbox); the other key's event goes to
        // its own webhook only; the old event (before the webhooks existed) to none.
        expect(seen.sort()).toEqual(
          [
            `${mine.name}:sbx_1:${created}`,
            `${mine.name}:sbx_2:${created}`,
            `${onlyKills.name}:sbx_1:${killed}`,
            `${other.name}:sbx_b:${created}`,
          ].sort(),
        );
        expect(first.every((c) => c.delivery.attempts === 1)).toBe(true);
        // Held by their lease: nothing is claimed again meanwhile.
        expect(await registry.webhooks.claimDue(now + 500, 1000, 10)).toEqual([]);

        const create1 = first.find(
          (c) => c.webhook.id === mine.id && c.event?.sandboxId === 'sbx_1',
        );
        await registry.webhooks.finishDelivery(create1?.delivery.id as string, {
          state: 'delivered',
          status: 200,
          at: now + 600,
        });
        // The next of sbx_1 is due now; the rest are still leased.
        const second = await registry.webhooks.claimDue(now + 600, 1000, 10);
        expect(second.map((c) => `${c.webhook.id}:${c.event?.type}`)).toEqual([
          `${mine.id}:${killed}`,
        ]);
        await registry.webhooks.finishDelivery(second[0]?.delivery.id as string, {
          state: 'pending',
          status: 503,
          error: 'the receiver answered 503',
          nextAttemptAt: now + 5000,
        });

        // The leases end (their daemon died): claimed again, same ids, attempt 2.
        const again = await registry.webhooks.claimDue(now + 1100, 60_000, 10);
        expect(again.map((c) => c.delivery.id).sort()).toEqual(
          first
            .filter((c) => c.delivery.id !== create1?.delivery.id)
            .map((c) => c.delivery.id)
            .sort(),
        );
        expect(again.every((c) => c.delivery.attempts === 2)).toBe(true);
        const retried = await registry.webhooks.claimDue(now + 5000, 1000, 10);
        expect(retried.map((c) => [c.delivery.id, c.delivery.attempts])).toEqual([
          [second[0]?.delivery.id, 2],
        ]);

        const log = await registry.webhooks.listDeliveries(mine.id, 10);
        expect(log.map((d) => [d.sandboxId, d.state, d.lastStatus])).toEqual([
          ['sbx_1', 'pending', 503],
          ['sbx_2', 'pending', null],
          ['sbx_1', 'delivered', 200],
        ]);
        expect(await registry.webhooks.removeWebhook(mine.id)).toBe(true);
        expect(await registry.webhooks.listDeliveries(mine.id, 10)).toEqual([]);
      });

      test('a webhook registered through E2B’s face with no types gets E2B’s types only; abx’s gets all', async ({
        store,
      }) => {
        const registry = await store.open();
        const e2b = await registry.webhooks.insertWebhook(hook({ flavour: 'e2b' }));
        const abx = await registry.webhooks.insertWebhook(hook());
        await emit(registry, 'sbx_x', 'key_a', 'sandbox.lifecycle.expiring');
        await emit(registry, 'sbx_y', 'key_a', created);
        expect(await registry.webhooks.fanOut(Date.now(), 500)).toBe(3);
        expect(
          (await registry.webhooks.listDeliveries(e2b.id, 10)).map((d) => d.sandboxId),
        ).toEqual(['sbx_y']);
        expect(
          (await registry.webhooks.listDeliveries(abx.id, 10)).map((d) => d.sandboxId),
        ).toEqual(['sbx_y', 'sbx_x']);
      });

      test('a disabled webhook’s cursor moves on without deliveries; two registries on one database fan out and claim each delivery once', async ({
        store,
      }) => {
        const a = await store.open();
        const b = await store.open();
        const off = await a.webhooks.insertWebhook(hook({ enabled: false }));
        const on = await a.webhooks.insertWebhook(hook());
        for (let i = 0; i < 30; i++) await emit(a, `sbx_${i}`, 'key_a', created);
        const now = Date.now();
        const written = await Promise.all([
          a.webhooks.fanOut(now, 500),
          b.webhooks.fanOut(now, 500),
        ]);
        expect(written[0] + written[1]).toBe(30);
        expect((await a.webhooks.getWebhook(off.id))?.cursor).toBe(
          (await a.webhooks.getWebhook(on.id))?.cursor,
        );
        const claims = await Promise.all(
          [a, b, a, b].map((r) => r.webhooks.claimDue(now, 60_000, 10)),
        );
        const ids = claims.flat().map((c) => c.delivery.id);
        expect(ids).toHaveLength(30);
        expect(new Set(ids).size).toBe(30);
      });
    },
  );
}
