import { describe, expect } from 'vitest';
import { eventFor } from '../../src/control/events.js';
import type { Registry } from '../../src/control/registry.js';
import { until } from '../control/plane.js';
import { STORES, sandboxRow, storeTest } from '../control/registry-stores.js';

function created(sandbox: string) {
  return eventFor(
    { id: sandbox, owner: 'key_a', template: 'base' },
    { type: 'sandbox.lifecycle.created' },
  );
}

/** Listens on `registry`'s webhooks part: the wakes counted, and how to stop. */
function counting(registry: Registry) {
  const counter = { wakes: 0, off: async () => {} };
  const off = registry.webhooks.onEventWritten?.(() => counter.wakes++);
  expect(off, 'the store offers onEventWritten').toBeInstanceOf(Function);
  counter.off = off as () => Promise<void>;
  return counter;
}

// What wakes webhook deliveries: an event write, told to this daemon (SQLite) or to every daemon
// on the database (PostgreSQL, LISTEN/NOTIFY at the commit).
for (const kind of STORES) {
  const test = storeTest(kind);

  describe.skipIf(kind.skipped !== '')(
    `event wakes in the ${kind.name} registry${kind.skipped}`,
    () => {
      test('an event written wakes the listener (appended, or with its change); none after it stops', async ({
        store,
      }) => {
        const writer = await store.open();
        // SQLite: one daemon on the file, told by its own registry; PostgreSQL: another daemon.
        const reader = kind.name === 'SQLite' ? writer : await store.open();
        const counter = counting(reader);
        try {
          if (kind.name === 'PostgreSQL') {
            // Listening takes a connection of its own: wait until it is there.
            await until(
              async () =>
                (
                  await store.rows(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = 'abx-daemon-listen' AND query ILIKE 'LISTEN%'",
                  )
                ).length === 1,
              'the LISTEN connection',
              5000,
            );
          }
          await writer.appendEvent(created('sbx_one'));
          await until(() => counter.wakes >= 1, 'a wake for the appended event', 3000);
          const seen = counter.wakes;
          const row = sandboxRow({ owner: 'key_a' });
          expect(
            await writer.insertSandbox(row, 5, { type: 'sandbox.lifecycle.created', data: {} }),
          ).toBe(true);
          await until(() => counter.wakes > seen, 'a wake for the change’s event', 3000);
        } finally {
          await counter.off();
        }
        const after = counter.wakes;
        await writer.appendEvent(created('sbx_two'));
        await new Promise((resolve) => setTimeout(resolve, 300));
        expect(counter.wakes).toBe(after);
        if (kind.name === 'PostgreSQL') {
          // Its connection was closed with it.
          await until(
            async () =>
              (
                await store.rows(
                  "SELECT 1 FROM pg_stat_activity WHERE application_name = 'abx-daemon-listen'",
                )
              ).length === 0,
            'the LISTEN connection to close',
            5000,
          );
        }
      });
    },
  );
}
