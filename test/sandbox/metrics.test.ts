import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, Templates } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { call } from '../helpers/api-call.js';
import { ROOT } from '../helpers/build.js';
import { sampleWhere } from '../helpers/metrics.js';

const MiB = 1024 ** 2;

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;
let info: DaemonInfo;
let adminKey: string;
let work: string;

beforeAll(async () => {
  // Read by this file's daemon: samples every 200 ms rather than every 5 s.
  process.env.ABX_METRICS_INTERVAL_MS = '200';
  abx = await createAbxHome();
  home = abx.home;
  info = await startDaemon(home);
  adminKey = readFileSync(join(home, 'api-key'), 'utf8').trim();
  work = mkdtempSync(join(tmpdir(), 'abx-metrics-'));
  const yaml = join(work, 'limited.yaml');
  writeFileSync(yaml, 'name: limited\nresources: { cpu: 1, memory: 512m, disk: 256m }\n');
  await Templates.build(yaml, { home });
}, 300_000);

afterAll(async () => {
  await abx?.close();
  rmSync(work, { recursive: true, force: true });
  delete process.env.ABX_METRICS_INTERVAL_MS;
}, 120_000);

/** Raw GET of the native API with the daemon's key. */
const get = (path: string) =>
  call(`${info.apiUrl}${path}`, { headers: { authorization: `Bearer ${adminKey}` } });

/**
 * A busy loop, 100 MB held in memory and a 20 MB file each show in the samples of `box`, each
 * against an idle sample taken before; `cpuCount` and `memTotal` are what the sandbox may use.
 */
async function usageShows(box: Sandbox, cpuCount: number, memTotal: number): Promise<void> {
  const idle = await sampleWhere(box, 'a quiet CPU', (m) => m.cpuUsedPct < 20);
  expect(idle.cpuCount).toBe(cpuCount);
  expect(idle.memTotal).toBe(memTotal);
  expect(idle.processes).toBeGreaterThanOrEqual(1);
  expect(idle.diskTotal).toBeGreaterThan(0);
  expect(idle.diskUsed).toBeLessThan(idle.diskTotal);

  // One core busy: all of a one-core limit, 1/N of an N-core host.
  const loop = await box.commands.start('while :; do :; done');
  const busy = await sampleWhere(box, 'a busy CPU', (m) => m.cpuUsedPct >= 60 / cpuCount);
  expect(busy.cpuUsedPct).toBeLessThanOrEqual(100);
  await loop.kill();

  const held = await box.commands.start(
    `python3 -c "import time; b = b'x' * (100 * 1024 * 1024); time.sleep(600)"`,
  );
  const full = await sampleWhere(
    box,
    '100 MB more memory',
    (m) => m.memUsed >= idle.memUsed + 95 * MiB,
  );
  expect(full.memUsed).toBeLessThanOrEqual(full.memTotal);
  expect(full.processes).toBeGreaterThan(idle.processes);
  await held.kill();

  await box.commands.run('dd if=/dev/zero of=$HOME/big bs=1M count=20 status=none && sync');
  await sampleWhere(box, '20 MB more on disk', (m) => m.diskUsed >= idle.diskUsed + 19 * MiB);
}

describe('sandbox metrics', () => {
  test('a sandbox without CPU or memory limits: measured from its processes, against the host', async () => {
    const box = await Sandbox.create({ home });
    try {
      await usageShows(box, availableParallelism(), (await import('node:os')).totalmem());
    } finally {
      await box.kill();
    }
  }, 240_000);

  test('a sandbox with limits: measured from its cgroups, against its limits', async () => {
    const box = await Sandbox.create({ home, template: 'limited' });
    try {
      await usageShows(box, 1, 512 * MiB);
      const [last] = (await box.getMetrics()).slice(-1);
      // Its 256 MiB disk image (ext4 keeps some for itself).
      expect(last?.diskTotal).toBeGreaterThan(200 * MiB);
      expect(last?.diskTotal).toBeLessThanOrEqual(256 * MiB);
    } finally {
      await box.kill();
    }
  }, 240_000);

  test('start and end bound the samples; bad bounds and unknown sandboxes are refused; an ended sandbox has none', async () => {
    const box = await Sandbox.create({ home });
    try {
      await sampleWhere(box, 'a sample', () => true);
      let all = await box.getMetrics();
      while (all.length < 5) {
        await new Promise((resolve) => setTimeout(resolve, 200));
        all = await box.getMetrics();
      }
      const times = all.map((m) => Date.parse(m.timestamp));
      expect(times).toEqual([...times].sort((a, b) => a - b));
      const middle = times[2] as number;
      const from = await box.getMetrics({ start: middle });
      expect(from[0]?.timestamp).toBe(all[2]?.timestamp);
      expect(from.every((m) => Date.parse(m.timestamp) >= middle)).toBe(true);
      const until = await box.getMetrics({ end: new Date(middle) });
      expect(until.map((m) => m.timestamp)).toEqual(all.slice(0, 3).map((m) => m.timestamp));
      expect(await box.getMetrics({ start: middle, end: middle })).toEqual([all[2]]);
      expect(await box.getMetrics({ start: Date.now() + 3_600_000 })).toEqual([]);

      const path = `/v1/sandboxes/${box.sandboxId}/metrics`;
      for (const [query, message] of [
        ['start=yesterday', /^start must be a time as a whole number of milliseconds/],
        ['end=-5', /^end must be a time/],
        ['end=1.5', /^end must be a time/],
        ['start=20&end=10', /^start \(20\) is after end \(10\)/],
      ] as const) {
        const answer = await get(`${path}?${query}`);
        expect(answer.status, query).toBe(400);
        expect(answer.body.error).toMatch(message);
        expect(answer.body.type).toBe('InvalidArgumentError');
      }
      // Another key's sandbox answers as an unknown id.
      const other = await ApiKeys.create(`other-${Date.now()}`, { home });
      const foreign = await call(`${info.apiUrl}${path}`, {
        headers: { authorization: `Bearer ${other.key}` },
      });
      expect(foreign.status).toBe(404);
      expect(foreign.body.error).toBe(`sandbox ${box.sandboxId} does not exist`);
      const unknown = await get('/v1/sandboxes/i0000000000000000/metrics');
      expect(unknown.status).toBe(404);
      expect(unknown.body.error).toContain('does not exist');

      const cli = await promisify(execFile)(
        process.execPath,
        [join(ROOT, 'dist', 'cli.js'), 'metrics', box.sandboxId, '--last', '2'],
        { env: { ...process.env, ABX_HOME: home }, timeout: 60_000 },
      );
      const lines = cli.stdout.trim().split('\n');
      expect(lines[0]).toMatch(/time\s+cpu\s+memory\s+disk\s+processes\s+network/);
      expect(lines).toHaveLength(3);
      expect(lines[1]).toMatch(/\d+\.\d% of \d/);
      const json = await promisify(execFile)(
        process.execPath,
        [join(ROOT, 'dist', 'cli.js'), 'metrics', box.sandboxId, '--json'],
        { env: { ...process.env, ABX_HOME: home }, timeout: 60_000 },
      );
      expect(JSON.parse(json.stdout).length).toBeGreaterThanOrEqual(5);
    } finally {
      await box.kill();
    }
    // Its samples went with it: the sandbox is still known, with none.
    const ended = await get(`/v1/sandboxes/${box.sandboxId}/metrics`);
    expect(ended.status).toBe(200);
    expect(ended.body.metrics).toEqual([]);
  }, 240_000);

  test('abx metrics --watch prints new samples as they come and ends with the sandbox', async () => {
    const box = await Sandbox.create({ home });
    const watch = spawn(
      process.execPath,
      [join(ROOT, 'dist', 'cli.js'), 'metrics', box.sandboxId, '--last', '1', '--watch'],
      { env: { ...process.env, ABX_HOME: home }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    watch.stdout.on('data', (chunk) => {
      out += chunk;
    });
    const exited = new Promise<number | null>((resolve) => watch.on('exit', resolve));
    try {
      const deadline = Date.now() + 60_000;
      // The header, then samples: with --last 1, all but one came while it watched.
      while (out.split('\n').filter((line) => /% of \d/.test(line)).length < 3) {
        if (Date.now() > deadline) throw new Error(`abx metrics --watch printed only: ${out}`);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect(out.split('\n')[0]).toMatch(/^time\s+cpu\s+memory\s+disk\s+processes\s+network$/);
      await box.kill();
      expect(await exited).toBe(0);
      expect(out).toContain(`sandbox ${box.sandboxId} ended (killed: killed by request)`);
    } finally {
      watch.kill('SIGKILL');
      await box.kill();
    }
  }, 120_000);
});
