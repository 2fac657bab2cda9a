import { describe, expect, test } from 'vitest';
import { MetricsSampler, metricsInterval } from '../../src/control/metrics.js';
import type { Registry, SandboxRecord } from '../../src/control/registry.js';
import type { SandboxProvider, SandboxUsage } from '../../src/providers/provider.js';

// The sampler's own rules (its ring's bound, the CPU share, forgetting ended sandboxes) with a
// provider whose readings the test sets; test/sandbox/metrics.test.ts measures real sandboxes.

function setup(capacity: number) {
  const running = new Map<string, SandboxRecord>();
  const usage = new Map<string, SandboxUsage>();
  const registry = {
    listSandboxes: async () => [...running.values()],
  } as unknown as Registry;
  const provider = {
    name: 'test',
    isAlive: (handle: { pid: number }) =>
      [...running.values()].some((r) => r.handle.pid === handle.pid),
    metrics: async (handle: { pid: number }) => {
      const record = [...running.values()].find((r) => r.handle.pid === handle.pid);
      return usage.get(record?.id as string) as SandboxUsage;
    },
  } as unknown as SandboxProvider;
  const sampler = new MetricsSampler(registry, provider, 1000, capacity);
  const add = (id: string, pid: number, createdAt: number) =>
    running.set(id, { id, createdAt, handle: { pid } } as unknown as SandboxRecord);
  const reading = (id: string, cpuTimeUs: number, cpuCount = 2) =>
    usage.set(id, {
      cpuTimeUs,
      cpuCount,
      memUsed: 1,
      memCache: 0,
      memTotal: 2,
      diskUsed: 3,
      diskTotal: 4,
      processes: 5,
      netRxBytes: cpuTimeUs * 2,
      netTxBytes: null,
    });
  return { sampler, running, add, reading };
}

describe('the metrics sampler', () => {
  test('keeps at most its capacity of samples per sandbox, the newest', async () => {
    const { sampler, add, reading } = setup(3);
    add('a', 1, Date.now() - 1000);
    for (let i = 0; i < 5; i++) {
      reading('a', i);
      await sampler.pass();
    }
    const samples = sampler.samples('a');
    expect(samples).toHaveLength(3);
    expect(samples.map((s) => s.at)).toEqual([...samples.map((s) => s.at)].sort((x, y) => x - y));
    // The network counters are kept as read: growing totals, null where not measured.
    expect(samples.map((s) => [s.netRxBytes, s.netTxBytes])).toEqual([
      [4, null],
      [6, null],
      [8, null],
    ]);
  });

  test('the CPU share is the time used between samples over the cores it may use, within 0 to 100', async () => {
    const { sampler, add, reading } = setup(10);
    // Created a second ago, one core-second used since: half of two cores (give or take the pass's time).
    add('a', 1, Date.now() - 1000);
    reading('a', 1_000_000);
    await sampler.pass();
    const first = sampler.samples('a')[0]?.cpuUsedPct as number;
    expect(first).toBeGreaterThan(40);
    expect(first).toBeLessThanOrEqual(50);
    // No CPU time since: 0. A counter that went back (a reading of another kind): never below 0.
    await new Promise((resolve) => setTimeout(resolve, 20));
    await sampler.pass();
    reading('a', 0);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await sampler.pass();
    // Far more than its cores allow in the time (readings off): never above 100.
    reading('a', 1e12);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await sampler.pass();
    expect(
      sampler
        .samples('a')
        .map((s) => s.cpuUsedPct)
        .slice(1),
    ).toEqual([0, 0, 100]);
  });

  test('a sandbox that is no longer running, or dropped, loses its samples; start and end bound them', async () => {
    const { sampler, running, add, reading } = setup(10);
    add('a', 1, Date.now());
    add('b', 2, Date.now());
    reading('a', 0);
    reading('b', 0);
    await sampler.pass();
    expect(sampler.size()).toBe(2);
    running.delete('a');
    await sampler.pass();
    expect(sampler.samples('a')).toEqual([]);
    sampler.drop('b');
    expect(sampler.samples('b')).toEqual([]);
    expect(sampler.size()).toBe(0);
    add('c', 3, Date.now());
    reading('c', 0);
    await sampler.pass();
    const at = sampler.samples('c')[0]?.at as number;
    expect(sampler.samples('c', at, at)).toHaveLength(1);
    expect(sampler.samples('c', at + 1)).toEqual([]);
    expect(sampler.samples('c', undefined, at - 1)).toEqual([]);
  });

  test('a provider that measures nothing: no samples, and the reason names it', async () => {
    const registry = { listSandboxes: async () => [] } as unknown as Registry;
    const provider = { name: 'kubernetes', isAlive: () => true } as unknown as SandboxProvider;
    const sampler = new MetricsSampler(registry, provider, 1000);
    expect(sampler.unavailable()).toBe('the kubernetes provider measures no sandbox metrics');
    sampler.start();
    await sampler.pass();
    await sampler.stop();
    expect(sampler.size()).toBe(0);
  });

  test('ABX_METRICS_INTERVAL_MS: a whole number of ms, 100 or more, else a clear error', () => {
    expect(metricsInterval({})).toBe(5000);
    expect(metricsInterval({ ABX_METRICS_INTERVAL_MS: '250' })).toBe(250);
    for (const bad of ['fast', '50', '1.5', '-1']) {
      expect(() => metricsInterval({ ABX_METRICS_INTERVAL_MS: bad })).toThrow(
        `ABX_METRICS_INTERVAL_MS must be a whole number of milliseconds, 100 or more, not '${bad}'`,
      );
    }
  });
});
