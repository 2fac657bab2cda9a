import pg from 'pg';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase, NEEDS_POSTGRES, TEST_DATABASE_URL } from '../helpers/postgres.js';
import {
  type EventsDaemon,
  failedFork,
  failedStart,
  killedMidDelivery,
  scriptedLife,
  startEventsDaemon,
  wokenDeliveries,
  wokenStreams,
} from './daemon-events.js';

/**
 * The daemon-level event tests where the registry matters, on PostgreSQL (ABX_TEST_DATABASE_URL;
 * skipped, saying so, without it): a real daemon whose registry is a database of its own.
 */
let d: EventsDaemon | undefined;
let database: Awaited<ReturnType<typeof createTestDatabase>> | undefined;

beforeAll(async () => {
  if (!TEST_DATABASE_URL) return;
  database = await createTestDatabase();
  d = await startEventsDaemon({ ABX_DATABASE_URL: database.url });
}, 120_000);

afterAll(async () => {
  try {
    await d?.close();
  } finally {
    await database?.drop();
  }
}, 60_000);

describe.skipIf(!TEST_DATABASE_URL)(
  `events of a real daemon on PostgreSQL${NEEDS_POSTGRES}`,
  () => {
    test('each change of a scripted sandbox once, in order, the snapshot among them; key B sees none', async () => {
      await scriptedLife(d as EventsDaemon);
      // The daemon's registry is this database: the events are its rows.
      const client = new pg.Client({ connectionString: database?.url });
      await client.connect();
      try {
        const { rows } = await client.query(
          "SELECT count(*)::int AS n FROM events WHERE type = 'sandbox.lifecycle.checkpointed'",
        );
        expect(rows[0].n).toBe(1);
      } finally {
        await client.end();
      }
    }, 60_000);

    test('a start whose ready command never passes: a failed event with its reason, on both faces', async () => {
      await failedStart(d as EventsDaemon);
    }, 60_000);

    test('a fork whose source lost its kept disk: a failed event under the fork id', async () => {
      await failedFork(d as EventsDaemon);
    }, 60_000);

    test('a /v1/events stream is woken by the event write through NOTIFY, not its ten-minute read', async () => {
      await wokenStreams(d as EventsDaemon);
    }, 60_000);

    test('deliveries are woken by the event write through NOTIFY, not the 5 s poll', async () => {
      await wokenDeliveries(d as EventsDaemon);
    }, 60_000);

    // Last: it leaves a new daemon in place of the first.
    test('the daemon SIGKILLed mid-delivery and started again on the database loses nothing; the retry carries the same id', async () => {
      await killedMidDelivery(d as EventsDaemon);
    }, 60_000);
  },
);
