import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { isProcessAlive } from '../../src/installation/daemon-connection.js';
import { type DockerHome, dockerHome } from '../compat/e2b/docker-home.js';
import { dockerEngine } from '../helpers/docker-images.js';
import { freezeKeepsProcesses, hibernateKeepsFiles, sdkCallsResume } from './pause-scenarios.js';

// Pause and resume on Docker: `docker pause` freezes; a hibernate stops the container and keeps
// it (its writable layer holds the files), and a resume starts it again.

const engine = await dockerEngine();

if (!engine.docker) {
  describe.skip(`pause on Docker: skipped, ${engine.reason}`, () => {
    test('pause', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: DockerHome;

  beforeAll(async () => {
    abx = await dockerHome(docker);
  }, 900_000);

  afterAll(async () => {
    await abx?.close();
  }, 120_000);

  /** SIGKILLs the daemon; the next SDK call starts another (ABX_PROVIDER=docker is still set). */
  async function killDaemon(): Promise<void> {
    const pid = (JSON.parse(readFileSync(join(abx.home, 'daemon.json'), 'utf8')) as { pid: number })
      .pid;
    process.kill(pid, 'SIGKILL');
    for (let i = 0; i < 500 && isProcessAlive(pid); i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  test('a frozen container stops where it is and goes on after a resume', async () => {
    await freezeKeepsProcesses({ home: abx.home });
  }, 120_000);

  test('a hibernated container keeps its files and environment across a daemon SIGKILL', async () => {
    await hibernateKeepsFiles({ home: abx.home }, killDaemon);
  }, 180_000);

  test('SDK calls resume a paused container', async () => {
    await sdkCallsResume({ home: abx.home });
  }, 120_000);

  test('a paused container is paused in the engine; a hibernated one is stopped and kept', async () => {
    const box = await Sandbox.create({ home: abx.home });
    try {
      const container = docker.getContainer(`abx-${box.sandboxId}`);
      await box.pause();
      expect((await container.inspect()).State.Paused).toBe(true);
      await box.resume();
      await box.pause({ memory: false });
      const stopped = (await container.inspect()).State;
      expect(stopped.Running).toBe(false);
      await box.resume();
      expect((await container.inspect()).State.Running).toBe(true);
    } finally {
      await box.kill();
    }
    await expect(docker.getContainer(`abx-${box.sandboxId}`).inspect()).rejects.toMatchObject({
      statusCode: 404,
    });
  }, 120_000);
}
