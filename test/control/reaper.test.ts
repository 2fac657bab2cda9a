import { expect, test } from 'vitest';
import { Reaper, type ReaperHost } from '../../src/control/reaper.js';
import type { Registry } from '../../src/control/registry.js';

/** A host with no sandboxes: only the sweeps it is asked for are counted. */
function emptyHost(sweep?: () => Promise<void>): ReaperHost {
  const none = async () => [];
  return {
    registry: {
      expired: none,
      listSandboxes: none,
      endedSince: none,
      purgeAudit: async () => 0,
      purgeEvents: async () => 0,
    } as unknown as Registry,
    isAlive: () => true,
    isEnding: () => false,
    markDead: async () => undefined,
    expire: async () => true,
    release: async () => undefined,
    ...(sweep ? { sweep } : {}),
  };
}

test('a reaper whose host sweeps does so once per sweep period, the first a period after its first pass', async () => {
  let sweeps = 0;
  const reaper = new Reaper(
    emptyHost(async () => {
      sweeps++;
    }),
    1000,
    undefined,
    undefined,
    undefined,
    60_000,
  );
  await reaper.pass(1_000_000);
  await reaper.pass(1_059_999);
  expect(sweeps).toBe(0);
  await reaper.pass(1_060_000);
  await reaper.pass(1_060_500);
  expect(sweeps).toBe(1);
  await reaper.pass(1_120_000);
  expect(sweeps).toBe(2);
  // A host that does not sweep (one daemon's registry, a provider of this host) is never asked.
  await expect(new Reaper(emptyHost()).pass(2_000_000)).resolves.toEqual([]);
});
