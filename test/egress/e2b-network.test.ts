import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../helpers/internet.js';

/**
 * E2B's own SDK asking for egress rules (`network.allowOut`/`denyOut`, `allowInternetAccess`,
 * `updateNetwork`) against a root daemon whose egress namespace is a test "internet".
 */
const unavailable = internetUnavailable();

describe.skipIf(unavailable)("E2B's network options on abx's internet network", () => {
  let internet: TestInternet;
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let info: DaemonInfo;
  let opts: { apiKey: string; requestTimeoutMs: number };
  const made: Sandbox[] = [];

  beforeAll(async () => {
    internet = await makeInternet();
    abx = await createAbxHome();
    process.env.ABX_EGRESS_NETNS = internet.path;
    process.env.ABX_EGRESS_HOSTS = internet.hostsFile;
    info = await startDaemon(abx.home);
    process.env.E2B_API_URL = info.apiUrl;
    process.env.E2B_SANDBOX_URL = info.gatewayUrl;
    opts = {
      apiKey: readFileSync(join(abx.home, 'api-key'), 'utf8').trim(),
      requestTimeoutMs: 60_000,
    };
  }, 120_000);

  afterAll(async () => {
    for (const sandbox of made) await sandbox.kill().catch(() => undefined);
    delete process.env.E2B_API_URL;
    delete process.env.E2B_SANDBOX_URL;
    await abx?.close();
    internet?.remove();
  });

  test('create with allowOut and denyOut: the rules hold in the sandbox, and getInfo shows them', async () => {
    const sandbox = await Sandbox.create({
      ...opts,
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    made.push(sandbox);
    const fetched = await sandbox.commands.run('curl -fsS -m 10 http://allowed.test/', {
      timeoutMs: 30_000,
    });
    expect(fetched.stdout).toContain('hello from 203.0.113.10');
    const refused = await sandbox.commands
      .run('curl -fsS -m 10 http://other.test/', { timeoutMs: 30_000 })
      .catch((e: { exitCode?: number }) => e);
    expect(refused.exitCode).not.toBe(0);
    const details = await sandbox.getInfo();
    expect(details.network).toMatchObject({ allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] });
    // Every address denied but what allowOut names: E2B's allowInternetAccess false.
    expect(details.allowInternetAccess).toBe(false);
  });

  test('updateNetwork replaces the rules at once; allowInternetAccess true opens the internet', async () => {
    const sandbox = await Sandbox.create({ ...opts, allowInternetAccess: true });
    made.push(sandbox);
    expect((await sandbox.getInfo()).allowInternetAccess).toBe(true);
    const run = (command: string) =>
      sandbox.commands
        .run(command, { timeoutMs: 30_000 })
        .catch((e: { exitCode?: number; stdout?: string }) => e);
    expect((await run('curl -fsS -m 10 http://other.test/')).stdout).toContain(
      'hello from 192.0.2.44',
    );
    await sandbox.updateNetwork({ allowOut: ['other.test'], allowInternetAccess: false });
    expect((await run('curl -fsS -m 10 http://other.test/')).stdout).toContain(
      'hello from 192.0.2.44',
    );
    expect((await run('curl -fsS -m 10 http://allowed.test/')).exitCode).not.toBe(0);
    const details = await sandbox.getInfo();
    expect(details.network?.allowOut).toEqual(['other.test']);
    expect(details.network?.denyOut).toEqual(['0.0.0.0/0', '::/0']);
  });

  test('a sandbox made with allowInternetAccess false is closed, and updateNetwork opens it, as on E2B', async () => {
    const closed = await Sandbox.create({ ...opts, allowInternetAccess: false });
    made.push(closed);
    const get = (url: string) =>
      closed.commands
        .run(`curl -fsS -m 10 ${url}`, { timeoutMs: 30_000 })
        .then((r) => r.stdout)
        .catch((e: { exitCode?: number }) => `exit ${e.exitCode}`);
    expect((await closed.getInfo()).allowInternetAccess).toBe(false);
    expect(await get('http://allowed.test/')).toMatch(/^exit [1-9]/);
    await closed.updateNetwork({ allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] });
    expect(await get('http://allowed.test/')).toContain('hello from 203.0.113.10');
    expect(await get('http://other.test/')).toMatch(/^exit [1-9]/);
    const bad = await closed.updateNetwork({ denyOut: ['10.0.0.0/33'] }).catch((e: Error) => e);
    expect(String(bad)).toContain('network.denyOut[0]');
  });
});
