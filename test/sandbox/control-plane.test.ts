import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { openSqlite } from '../../src/control/sqlite.js';
import { type DaemonInfo, Sandbox } from '../../src/index.js';
import { isProcessAlive } from '../../src/installation/daemon-connection.js';
import { createAbxHome, sandboxProcesses, sigkillAll } from '../helpers/abx-home.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
}, 300_000);

afterAll(async () => {
  await abx?.close();
});

const daemonInfo = () => JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as DaemonInfo;

async function gateway(path: string, headers: Record<string, string>) {
  const response = await request(`${daemonInfo().gatewayUrl}${path}`, { headers });
  const text = await response.body.text();
  return { status: response.statusCode, body: text ? JSON.parse(text) : undefined };
}

describe('the gateway', () => {
  test('routes by host name or headers, and wants that sandbox’s token', async () => {
    const a = await Sandbox.create({ home });
    const b = await Sandbox.create({ home });
    try {
      const host = `49983-${a.sandboxId}.localhost`;
      expect(await gateway('/health', { host, 'x-access-token': a.accessToken })).toEqual({
        status: 200,
        body: { status: 'ok' },
      });
      const ok = await gateway(`/files/stat?path=.&token=${a.accessToken}`, { host });
      expect(ok).toMatchObject({ status: 200, body: { path: '/home/user', type: 'directory' } });
      const byHeaders = await gateway('/files/stat?path=.', {
        'x-sandbox-id': a.sandboxId,
        'x-sandbox-port': '49983',
        'x-access-token': a.accessToken,
      });
      expect(byHeaders.status).toBe(200);

      const none = await gateway('/files/stat?path=.', { host });
      expect(none.status).toBe(401);
      expect(none.body.type).toBe('AuthenticationError');
      const othersToken = await gateway('/files/stat?path=.', {
        host,
        'x-access-token': b.accessToken,
      });
      expect(othersToken).toMatchObject({ status: 401, body: { type: 'AuthenticationError' } });
      // Even health, through the gateway, needs the token: it says the sandbox exists and runs.
      expect((await gateway('/health', { host })).status).toBe(401);

      const unknown = await gateway('/health', {
        host: `49983-inosuchsandbox00.localhost`,
        'x-access-token': a.accessToken,
      });
      expect(unknown).toMatchObject({ status: 404, body: { type: 'SandboxNotFoundError' } });

      const port = await gateway('/', {
        host: `8080-${a.sandboxId}.localhost`,
        'x-access-token': a.accessToken,
      });
      expect(port.status).toBe(403);
      expect(port.body).toEqual({
        type: 'CapabilityError',
        error: `template 'base' does not have the ports capability, so reaching port 8080 of sandbox ${a.sandboxId} is refused; add ports to its capabilities`,
      });

      const nothing = await gateway('/health', {});
      expect(nothing).toMatchObject({ status: 400, body: { type: 'BadRequestError' } });
      // The local daemon's domain is `localhost`, which Node cannot resolve: the path form.
      expect(a.getHost(8080)).toBe(
        `127.0.0.1:${new URL(daemonInfo().gatewayUrl).port}/sandboxes/${a.sandboxId}/ports/8080`,
      );
    } finally {
      await a.kill();
      await b.kill();
    }
    const dead = await gateway('/health', {
      host: `49983-${a.sandboxId}.localhost`,
      'x-access-token': a.accessToken,
    });
    expect(dead.status).toBe(404);
    expect(dead.body.error).toBe(
      `sandbox ${a.sandboxId} is not running (killed: killed by request)`,
    );
  });

  test('the API wants the API key', async () => {
    const response = await request(`${daemonInfo().apiUrl}/v1/sandboxes`);
    expect(response.statusCode).toBe(401);
    expect(await response.body.json()).toMatchObject({ type: 'AuthenticationError' });
  });
});

describe('daemon restarts', () => {
  test('a daemon killed with SIGKILL: live sandboxes are adopted, dead ones marked', async () => {
    const survivor = await Sandbox.create({ home });
    const victim = await Sandbox.create({ home });
    const orphan = await Sandbox.create({ home });
    try {
      await survivor.files.write('state.txt', 'kept');
      const oldDaemon = daemonInfo().pid;
      process.kill(oldDaemon, 'SIGKILL');
      for (let i = 0; i < 200 && isProcessAlive(oldDaemon); i++)
        await new Promise((r) => setTimeout(r, 10));
      // While no daemon runs, one sandbox dies, and another loses its registry row (as a
      // sandbox started just before a crash, before its row was written, would have none).
      sigkillAll(sandboxProcesses(victim.sandboxId));
      const db = openSqlite(join(home, 'abx.db'));
      db.prepare('DELETE FROM sandboxes WHERE id = ?').run(orphan.sandboxId);
      db.close();
      expect(sandboxProcesses(orphan.sandboxId)).not.toEqual([]);

      // The next SDK call starts a new daemon, which adopts the sandboxes left behind.
      const again = await Sandbox.connect(survivor.sandboxId, { home });
      expect(daemonInfo().pid).not.toBe(oldDaemon);
      expect(await again.files.read('state.txt')).toBe('kept');
      expect((await again.commands.run('echo still here')).stdout).toBe('still here\n');

      const states = Object.fromEntries(
        (await Sandbox.list({ home, all: true })).map((s) => [s.sandboxId, [s.state, s.endReason]]),
      );
      expect(states[survivor.sandboxId]).toEqual(['running', null]);
      expect(states[victim.sandboxId]).toEqual(['dead', 'exited']);
      // The sandbox nobody knew about was killed: nothing runs without a registry row.
      expect(sandboxProcesses(orphan.sandboxId)).toEqual([]);
      await expect(Sandbox.connect(victim.sandboxId, { home })).rejects.toThrow(
        `sandbox ${victim.sandboxId} is not running (dead: exited)`,
      );
    } finally {
      await survivor.kill();
      await victim.kill();
    }
  });

  test('a daemon stopped and started again by another process is the next call’s, within the SDK’s health-check trust', async () => {
    // This process's calls trust a daemon that answered within DAEMON_ANSWERED_TRUST_MS without
    // asking it again; one that another process stopped meanwhile is not trusted.
    await Sandbox.list({ home });
    const first = daemonInfo().pid;
    const cli = (...args: string[]) =>
      execFileSync(process.execPath, [join(process.cwd(), 'dist', 'cli.js'), ...args], {
        env: { ...process.env, ABX_HOME: home },
        stdio: 'pipe',
      });
    cli('daemon', 'stop');
    expect(isProcessAlive(first)).toBe(false);
    await expect(Sandbox.list({ home, autoStart: false })).rejects.toThrow(
      `no abx daemon runs for ${home}`,
    );
    cli('daemon', 'start');
    const second = daemonInfo().pid;
    expect(second).not.toBe(first);
    const sandbox = await Sandbox.create({ home });
    try {
      expect((await sandbox.commands.run('echo new daemon')).stdout).toBe('new daemon\n');
      expect(daemonInfo().pid).toBe(second);
    } finally {
      await sandbox.kill();
    }
  });
});
