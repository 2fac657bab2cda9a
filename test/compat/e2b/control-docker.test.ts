import { Sandbox, SandboxNotFoundError } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { DaemonInfo } from '../../../src/installation/daemon-info.js';
import { dockerEngine } from '../../helpers/docker-images.js';
import { type DockerHome, dockerHome } from './docker-home.js';

// The control API does not depend on the provider; this runs its lifecycle once on a daemon whose
// sandboxes are Docker containers, with the real `e2b` package. Skipped, saying why, only when no
// Docker engine answers.
const engine = await dockerEngine();

if (!engine.docker) {
  describe.skip(`E2B control API on Docker: skipped, ${engine.reason}`, () => {
    test('lifecycle', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: DockerHome;
  let info: DaemonInfo;
  let apiKey: string;
  const made: string[] = [];

  beforeAll(async () => {
    abx = await dockerHome(docker);
    ({ info, apiKey } = abx);
    // The SDK's documented way to name the API: no call can go anywhere but the daemon.
    process.env.E2B_API_URL = info.apiUrl;
    // Sandbox calls (files, commands) through the gateway: one URL.
    process.env.E2B_SANDBOX_URL = info.gatewayUrl;
  }, 900_000);

  afterAll(async () => {
    for (const id of made) await Sandbox.kill(id, { apiKey }).catch(() => {});
    delete process.env.E2B_API_URL;
    delete process.env.E2B_SANDBOX_URL;
    await abx?.close();
  }, 120_000);

  /** Containers of one sandbox (the provider labels each with its sandbox id). */
  const containersOf = async (id: string) =>
    (await docker.listContainers({ all: true })).filter((container) =>
      Object.values(container.Labels ?? {}).includes(id),
    );

  test('create, info, list, connect and kill drive Docker containers', async () => {
    const options = { apiKey };
    const sandbox = await Sandbox.create({ ...options, metadata: { on: 'docker' } });
    made.push(sandbox.sandboxId);
    expect(await containersOf(sandbox.sandboxId)).toHaveLength(1);
    expect(await sandbox.getInfo()).toMatchObject({
      sandboxId: sandbox.sandboxId,
      templateId: 'base',
      state: 'running',
      metadata: { on: 'docker' },
    });
    const listed = await Sandbox.list({ ...options, query: { metadata: { on: 'docker' } } });
    expect((await listed.nextItems()).map((item) => item.sandboxId)).toEqual([sandbox.sandboxId]);
    expect((await Sandbox.connect(sandbox.sandboxId, options)).sandboxId).toBe(sandbox.sandboxId);
    expect(await sandbox.kill()).toBe(true);
    expect(await containersOf(sandbox.sandboxId)).toEqual([]);
    await expect(sandbox.getInfo()).rejects.toBeInstanceOf(SandboxNotFoundError);
  }, 300_000);

  test('pause freezes the container and connect resumes it with its process; a hibernate keeps its files', async () => {
    const options = { apiKey, requestTimeoutMs: 120_000 };
    const sandbox = await Sandbox.create(options);
    made.push(sandbox.sandboxId);
    await sandbox.files.write('/home/user/kept.txt', 'before the pause');
    const sleeper = await sandbox.commands.run('sleep 600', { background: true, timeoutMs: 0 });

    expect(await sandbox.pause()).toBe(true);
    expect(await sandbox.pause()).toBe(false);
    expect((await sandbox.getInfo()).state).toBe('paused');
    const [frozen] = await containersOf(sandbox.sandboxId);
    expect(frozen?.State).toBe('paused');
    const resumed = await Sandbox.connect(sandbox.sandboxId, options);
    expect(await resumed.files.read('/home/user/kept.txt')).toBe('before the pause');
    expect((await resumed.commands.list()).map((p) => p.pid)).toContain(sleeper.pid);

    expect(await resumed.pause({ keepMemory: false })).toBe(true);
    expect((await sandbox.getInfo()).state).toBe('paused');
    const woken = await Sandbox.connect(sandbox.sandboxId, options);
    expect(await woken.files.read('/home/user/kept.txt')).toBe('before the pause');
    expect((await woken.commands.list()).map((p) => p.pid)).not.toContain(sleeper.pid);
    expect(await Sandbox.kill(sandbox.sandboxId, options)).toBe(true);
    expect(await containersOf(sandbox.sandboxId)).toEqual([]);
  }, 300_000);
}
