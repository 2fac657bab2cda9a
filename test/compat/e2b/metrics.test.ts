import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox, SandboxNotFoundError } from 'e2b';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { startDaemon } from '../../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../../src/installation/daemon-info.js';
import { Sandbox as AbxSandbox } from '../../../src/sandbox/sandbox.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { call } from '../../helpers/api-call.js';

// The real `e2b` package's getMetrics against a real daemon sampling real sandboxes, configured
// only by E2B_API_URL and the apiKey option.

const MiB = 1024 ** 2;
let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let apiKey: string;

beforeAll(async () => {
  // Read by this file's daemon: samples every 200 ms rather than every 5 s.
  process.env.ABX_METRICS_INTERVAL_MS = '200';
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  apiKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  process.env.E2B_API_URL = info.apiUrl;
}, 120_000);

afterAll(async () => {
  delete process.env.E2B_API_URL;
  delete process.env.ABX_METRICS_INTERVAL_MS;
  await abx?.close();
}, 120_000);

const raw = (path: string) => call(`${info.apiUrl}${path}`, { headers: { 'x-api-key': apiKey } });

test("the E2B SDK's getMetrics: samples in its shape, a busy loop shows, start and end bound them, bad bounds are 400", async () => {
  const sandbox = await Sandbox.create({ apiKey, requestTimeoutMs: 60_000 });
  try {
    const deadline = Date.now() + 60_000;
    let busy: Awaited<ReturnType<Sandbox['getMetrics']>>[number] | undefined;
    // The busy loop through abx's own SDK: this file is about the control API's metrics.
    const native = await AbxSandbox.connect(sandbox.sandboxId, { home: abx.home });
    await native.commands.start('while :; do :; done');
    while (!busy) {
      if (Date.now() > deadline) throw new Error('no busy sample within 60 s');
      const samples = await sandbox.getMetrics();
      busy = samples.find((m) => m.cpuUsedPct >= 30);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    expect(busy.timestamp).toBeInstanceOf(Date);
    expect(busy.cpuCount).toBeGreaterThan(0);
    expect(busy.memUsed).toBeGreaterThan(MiB);
    expect(busy.memTotal).toBeGreaterThanOrEqual(busy.memUsed);
    expect(busy.diskTotal).toBeGreaterThan(busy.diskUsed);
    expect(busy.memCache).toBeGreaterThanOrEqual(0);

    // Through the static method too; E2B's bounds are whole seconds.
    const all = await Sandbox.getMetrics(sandbox.sandboxId, { apiKey });
    expect(all.length).toBeGreaterThan(0);
    const future = new Date(Date.now() + 3_600_000);
    expect(await sandbox.getMetrics({ start: future })).toEqual([]);
    const past = new Date(Date.now() - 3_600_000);
    expect(await sandbox.getMetrics({ end: past })).toEqual([]);
    const second = Math.floor(busy.timestamp.getTime() / 1000);
    const within = await sandbox.getMetrics({
      start: new Date(second * 1000),
      end: new Date(second * 1000),
    });
    expect(within.map((m) => m.timestamp.getTime())).toContain(busy.timestamp.getTime());
    expect(within.every((m) => Math.floor(m.timestamp.getTime() / 1000) === second)).toBe(true);

    const wire = await raw(`/sandboxes/${sandbox.sandboxId}/metrics`);
    expect(wire.status).toBe(200);
    expect(wire.body[0].timestampUnix).toBe(Math.floor(Date.parse(wire.body[0].timestamp) / 1000));
    // E2B's shape only: abx's network bytes and processes are not on this face.
    expect(Object.keys(wire.body[0]).sort()).toEqual([
      'cpuCount',
      'cpuUsedPct',
      'diskTotal',
      'diskUsed',
      'memCache',
      'memTotal',
      'memUsed',
      'timestamp',
      'timestampUnix',
    ]);
    const bad = await raw(`/sandboxes/${sandbox.sandboxId}/metrics?start=soon`);
    expect(bad.status).toBe(400);
    expect(bad.body).toMatchObject({ code: 400, message: expect.stringMatching(/^start must be/) });
  } finally {
    await sandbox.kill();
  }
  await expect(Sandbox.getMetrics(sandbox.sandboxId, { apiKey })).rejects.toBeInstanceOf(
    SandboxNotFoundError,
  );
}, 180_000);
