import { availableParallelism } from 'node:os';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { type DockerHome, dockerHome } from '../compat/e2b/docker-home.js';
import { dockerEngine } from '../helpers/docker-images.js';
import { sampleWhere } from '../helpers/metrics.js';

const MiB = 1024 ** 2;
const engine = await dockerEngine();

if (!engine.docker) {
  describe.skip(`sandbox metrics on Docker: skipped, ${engine.reason}`, () => {
    test('metrics', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: DockerHome;

  beforeAll(async () => {
    // Read by this file's daemon: samples every 200 ms rather than every 5 s.
    process.env.ABX_METRICS_INTERVAL_MS = '200';
    abx = await dockerHome(docker);
  }, 900_000);

  afterAll(async () => {
    await abx?.close();
    delete process.env.ABX_METRICS_INTERVAL_MS;
  }, 120_000);

  test("a container sandbox's samples: a busy loop and 100 MB held show, against the host", async () => {
    const box = await Sandbox.create({ home: abx.home });
    try {
      const idle = await sampleWhere(box, 'a quiet CPU', (m) => m.cpuUsedPct < 20);
      expect(idle.cpuCount).toBe(availableParallelism());
      expect(idle.processes).toBeGreaterThanOrEqual(1);
      expect(idle.diskTotal).toBeGreaterThan(idle.diskUsed);
      await box.commands.start('while :; do :; done');
      await sampleWhere(box, 'a busy CPU', (m) => m.cpuUsedPct >= 60 / idle.cpuCount);
      // tail keeps a line without an end in memory: 100 MB of zeros, held while the sleep lasts.
      await box.commands.start('{ head -c 104857600 /dev/zero; sleep 600; } | tail');
      await sampleWhere(box, '100 MB more memory', (m) => m.memUsed >= idle.memUsed + 95 * MiB);
    } finally {
      await box.kill();
    }
  }, 300_000);
}
