import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startReadyTimeoutMs } from '../../src/commands/template-runtime.js';
import {
  type EventsDaemon,
  failedFork,
  failedStart,
  startEventsDaemon,
  wokenDeliveries,
  wokenStreams,
} from './daemon-events.js';

/**
 * A real daemon on SQLite: starts and forks that fail for real leave `failed` events; deliveries
 * are woken by the event's write (test/events/daemon-events-postgres.test.ts: the same on
 * PostgreSQL).
 */
let d: EventsDaemon;

beforeAll(async () => {
  d = await startEventsDaemon();
}, 120_000);

afterAll(async () => {
  await d?.close();
}, 60_000);

describe('failed events and woken deliveries of a real daemon (SQLite)', () => {
  test('a start whose ready command never passes within ABX_START_READY_TIMEOUT_MS: a failed event with its reason, on both faces', async () => {
    await failedStart(d);
  }, 60_000);

  test('a fork whose source lost its kept disk: a failed event under the fork id, naming the source', async () => {
    await failedFork(d);
  }, 60_000);

  test('a /v1/events stream is woken by the event write, not its ten-minute read', async () => {
    await wokenStreams(d as EventsDaemon);
  }, 60_000);

  test('deliveries are woken by the event write, not the 5 s poll', async () => {
    await wokenDeliveries(d);
  }, 60_000);

  test('ABX_START_READY_TIMEOUT_MS: a bad value is refused, naming it', () => {
    expect(startReadyTimeoutMs({})).toBe(120_000);
    expect(startReadyTimeoutMs({ ABX_START_READY_TIMEOUT_MS: '2500' })).toBe(2500);
    for (const bad of ['soon', '999', '-1', '1.5']) {
      expect(() => startReadyTimeoutMs({ ABX_START_READY_TIMEOUT_MS: bad })).toThrow(
        `ABX_START_READY_TIMEOUT_MS must be a whole number of milliseconds, 1000 or more, not '${bad}'`,
      );
    }
  });
});
