import { Sandbox } from 'e2b';
import { describe, expect, test } from 'vitest';
import { e2bOnTestInternet } from '../helpers/e2b-internet.js';
import { internetUnavailable } from '../helpers/internet.js';

/**
 * E2B's own SDK asking for egress rules (`network.allowOut`/`denyOut`, `allowInternetAccess`,
 * `updateNetwork`) against a root daemon whose egress namespace is a test "internet".
 */
const unavailable = internetUnavailable();

describe.skipIf(unavailable)("E2B's network options on abx's internet network", () => {
  const net = e2bOnTestInternet();

  test('create with allowOut and denyOut: the rules hold in the sandbox, and getInfo shows them', async () => {
    const sandbox = await Sandbox.create({
      ...net.opts,
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    net.made.push(sandbox);
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
    const sandbox = await Sandbox.create({ ...net.opts, allowInternetAccess: true });
    net.made.push(sandbox);
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
    const closed = await Sandbox.create({ ...net.opts, allowInternetAccess: false });
    net.made.push(closed);
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
