import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import type { SandboxLogLine } from '../../src/sandbox/sandbox-logs.js';
import { type DockerHome, dockerHome } from '../compat/e2b/docker-home.js';
import { dockerEngine } from '../helpers/docker-images.js';

// The same log on the Docker provider: the daemon reads envd in the container as on the local
// provider (test/sandbox/logs.test.ts has the rest).

const engine = await dockerEngine();

if (!engine.docker) {
  describe.skip(`sandbox logs on Docker: skipped, ${engine.reason}`, () => {
    test('logs', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: DockerHome;

  beforeAll(async () => {
    process.env.ABX_SANDBOX_LOG_PASS_MS = '200';
    abx = await dockerHome(docker);
  }, 900_000);

  afterAll(async () => {
    await abx?.close();
    delete process.env.ABX_SANDBOX_LOG_PASS_MS;
  }, 120_000);

  test("a container sandbox's log: envd, a command's exit, kept after the kill", async () => {
    const box = await Sandbox.create({ home: abx.home });
    try {
      await box.commands.run('exit 4').catch(() => undefined);
      const deadline = Date.now() + 15_000;
      let lines: SandboxLogLine[] = [];
      while (!lines.some((line) => line.fields.exitCode === '4')) {
        if (Date.now() > deadline) throw new Error(`not in the log: ${JSON.stringify(lines)}`);
        await new Promise((resolve) => setTimeout(resolve, 100));
        lines = await box.logs();
      }
      expect(lines.some((line) => line.message === 'envd started')).toBe(true);
      expect(lines.find((line) => line.fields.exitCode === '4')?.level).toBe('warn');
      expect(await box.kill()).toBe(true);
      const after = await Sandbox.logs(box.sandboxId, { home: abx.home });
      expect(after.some((line) => line.fields.exitCode === '4')).toBe(true);
    } finally {
      await box.kill().catch(() => undefined);
    }
  }, 120_000);
}
