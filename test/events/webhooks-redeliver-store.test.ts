import { describe, expect, test as plainTest } from 'vitest';
import { eventFor } from '../../src/control/events.js';
import { deliveryRequest } from '../../src/control/webhook-dispatcher.js';
import {
  type DeliveryRecord,
  TEST_PENDING_MAX,
  testEventOf,
} from '../../src/control/webhook-store.js';
import { e2bWebhookSignature } from '../../src/util/webhook-signature.js';
import { STORES, storeTest } from '../control/registry-stores.js';
import { hook } from './webhook-rows.js';

// The store's part of test-send and redelivery (docs/events.md), on both registries.
for (const kind of STORES) {
  const test = storeTest(kind);

  describe.skipIf(kind.skipped !== '')(
    `webhook test-send and redelivery in the ${kind.name} registry${kind.skipped}`,
    () => {
      test('a test row is claimed before events, in the order asked, without an event row; a finished delivery restarts under its id, a pending or purged one does not', async ({
        store,
      }) => {
        const registry = await store.open();
        const mine = await registry.webhooks.insertWebhook(hook());
        const other = await registry.webhooks.insertWebhook(hook());
        await registry.appendEvent(
          eventFor(
            { id: 'sbx_1', owner: 'key_a', template: 'base' },
            { type: 'sandbox.lifecycle.created' },
          ),
        );
        const now = Date.now();
        expect(await registry.webhooks.fanOut(now, 500)).toBe(2);
        const t1 = (await registry.webhooks.insertTestDelivery(mine.id, now)) as DeliveryRecord;
        const t2 = (await registry.webhooks.insertTestDelivery(mine.id, now + 1)) as DeliveryRecord;
        for (const t of [t1, t2]) {
          expect(t).toMatchObject({ webhookId: mine.id, sandboxId: '', state: 'pending' });
          expect(t.eventSeq).toBeLessThan(0);
        }
        expect(t2.eventSeq).toBeGreaterThan(t1.eventSeq);

        // The first test, then the event of each webhook; the second test waits behind the first.
        const claimed = await registry.webhooks.claimDue(now + 2, 5000, 10);
        expect(claimed[0]?.delivery.id).toBe(t1.id);
        expect(claimed[0]?.event).toBeUndefined();
        expect(
          claimed
            .slice(1)
            .map((c) => `${c.webhook.id}:${c.event?.type}`)
            .sort(),
        ).toEqual([mine.id, other.id].map((id) => `${id}:sandbox.lifecycle.created`).sort());
        await registry.webhooks.finishDelivery(t1.id, {
          state: 'failed',
          status: 500,
          error: 'no',
        });
        const event = claimed.find(
          (c) => c.webhook.id === mine.id && c.event,
        ) as (typeof claimed)[0];
        await registry.webhooks.finishDelivery(event.delivery.id, {
          state: 'delivered',
          status: 200,
          at: now + 3,
        });
        expect(
          (await registry.webhooks.claimDue(now + 4, 5000, 10)).map((c) => c.delivery.id),
        ).toEqual([t2.id]);

        // Reading one: only under its own webhook.
        expect(await registry.webhooks.getDelivery(mine.id, t1.id)).toMatchObject({
          state: 'failed',
          lastStatus: 500,
          attempts: 1,
        });
        expect(await registry.webhooks.getDelivery(other.id, t1.id)).toBeUndefined();

        // Restart: a finished one, under its webhook only; a pending one (t2, claimed) is not.
        expect(await registry.webhooks.restartDelivery(other.id, t1.id, now + 5)).toBeUndefined();
        expect(await registry.webhooks.restartDelivery(mine.id, t2.id, now + 5)).toBeUndefined();
        const again = (await registry.webhooks.restartDelivery(
          mine.id,
          event.delivery.id,
          now + 5,
        )) as DeliveryRecord;
        expect(again).toMatchObject({
          id: event.delivery.id,
          eventSeq: event.delivery.eventSeq,
          state: 'pending',
          attempts: 0,
          lastStatus: null,
          lastError: null,
          deliveredAt: null,
          claimedUntil: null,
          createdAt: now + 5,
          nextAttemptAt: now + 5,
        });
        const reclaimed = await registry.webhooks.claimDue(now + 6, 5000, 10);
        expect(reclaimed.map((c) => [c.delivery.id, c.event?.id])).toEqual([
          [event.delivery.id, event.event?.id],
        ]);
        await registry.webhooks.finishDelivery(event.delivery.id, {
          state: 'delivered',
          status: 200,
          at: now + 7,
        });
        expect((await registry.webhooks.restartDelivery(mine.id, t1.id, now + 8))?.state).toBe(
          'pending',
        );

        // At most TEST_PENDING_MAX tests pending per webhook (t1 again and t2 are): the next is
        // refused, writing nothing; another webhook's are counted apart.
        for (let i = 2; i < TEST_PENDING_MAX; i++) {
          expect((await registry.webhooks.insertTestDelivery(mine.id, now + 10 + i))?.state).toBe(
            'pending',
          );
        }
        expect(await registry.webhooks.insertTestDelivery(mine.id, now + 20)).toBeUndefined();
        expect(await registry.webhooks.listDeliveries(mine.id, 500)).toHaveLength(
          1 + TEST_PENDING_MAX,
        );
        expect((await registry.webhooks.insertTestDelivery(other.id, now + 20))?.state).toBe(
          'pending',
        );

        // Its event purged: a lifecycle delivery cannot be sent again.
        await registry.purgeEvents(now + 1_000_000);
        expect(
          await registry.webhooks.restartDelivery(mine.id, event.delivery.id, now + 9),
        ).toBeUndefined();
        expect((await registry.webhooks.getDelivery(mine.id, event.delivery.id))?.state).toBe(
          'delivered',
        );
      });
    },
  );
}

plainTest(
  "a test delivery to an E2B-face webhook has E2B's shape and signature, and the same event id each time",
  () => {
    const webhook = { ...hook({ flavour: 'e2b' }), cursor: 0 };
    const delivery: DeliveryRecord = {
      id: 'whd_0123456789abcdef01234567',
      webhookId: webhook.id,
      eventSeq: -5,
      sandboxId: '',
      state: 'pending',
      attempts: 1,
      nextAttemptAt: 0,
      claimedUntil: null,
      lastStatus: null,
      lastError: null,
      createdAt: 1_800_000_000_000,
      deliveredAt: null,
    };
    const event = testEventOf(delivery, webhook);
    expect(event.id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-a[0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(testEventOf({ ...delivery, attempts: 3 }, webhook).id).toBe(event.id);
    const { body, headers } = deliveryRequest({ delivery, webhook, event }, 'the-secret', 0);
    expect(JSON.parse(body)).toMatchObject({ id: event.id, type: 'webhook.test', sandboxId: '' });
    expect(headers['e2b-delivery-id']).toBe(delivery.id);
    expect(headers['e2b-signature']).toBe(e2bWebhookSignature('the-secret', body));
  },
);
