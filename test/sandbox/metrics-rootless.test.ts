import { availableParallelism } from 'node:os';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { sampleWhere } from '../helpers/metrics.js';
import { type RootlessDaemon, startRootlessDaemon } from '../helpers/rootless.js';

// A rootless daemon (an unprivileged host uid, no cgroups delegated) measures its sandboxes from
// /proc and the home's tmpfs.

const MiB = 1024 ** 2;
let daemon: RootlessDaemon;

beforeAll(async () => {
  daemon = await startRootlessDaemon({ env: { ABX_METRICS_INTERVAL_MS: '200' } });
}, 300_000);

afterAll(async () => {
  await daemon?.close();
});

test('a rootless sandbox: a busy loop, 100 MB held and a 20 MB file in its home show', async () => {
  const box = await Sandbox.create({ home: daemon.home });
  try {
    const idle = await sampleWhere(box, 'a quiet CPU', (m) => m.cpuUsedPct < 20);
    expect(idle.cpuCount).toBe(availableParallelism());
    expect(idle.processes).toBeGreaterThanOrEqual(1);
    await box.commands.start('while :; do :; done');
    await sampleWhere(box, 'a busy CPU', (m) => m.cpuUsedPct >= 60 / idle.cpuCount);
    await box.commands.start(
      `python3 -c "import time; b = b'x' * (100 * 1024 * 1024); time.sleep(600)"`,
    );
    await sampleWhere(box, '100 MB more memory', (m) => m.memUsed >= idle.memUsed + 95 * MiB);
    await box.commands.run('dd if=/dev/zero of=$HOME/big bs=1M count=20 status=none');
    await sampleWhere(box, '20 MB more on disk', (m) => m.diskUsed >= idle.diskUsed + 19 * MiB);
  } finally {
    await box.kill();
  }
}, 300_000);
