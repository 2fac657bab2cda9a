import { readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { openSqlite } from '../../src/control/sqlite.js';
import { Sandbox, Templates } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { daemonInfo } from './helpers.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;
let sandbox: Sandbox;
let hostServer: Server;
/** A Unix socket of the host that a sandbox must never reach: it answers with a secret. */
const HOST_SOCKET_DIR = `/tmp/abx-host-socket-${process.pid}`;
const HOST_SOCKET = `${HOST_SOCKET_DIR}/8080.sock`;

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
  await Templates.build(join(ROOT, 'test', 'fixtures', 'templates', 'server-e2e.yaml'), { home });
  sandbox = await Sandbox.create({ home, template: 'server-e2e', envs: { CREATE_ENV: 'x' } });
  rmSync(HOST_SOCKET_DIR, { recursive: true, force: true });
  const { mkdirSync } = await import('node:fs');
  mkdirSync(HOST_SOCKET_DIR, { recursive: true });
  hostServer = createServer((socket) =>
    socket.end('HTTP/1.1 200 OK\r\ncontent-length: 11\r\nconnection: close\r\n\r\nhost secret'),
  );
  await new Promise<void>((resolve) => hostServer.listen(HOST_SOCKET, resolve));
}, 300_000);

afterAll(async () => {
  hostServer?.close();
  rmSync(HOST_SOCKET_DIR, { recursive: true, force: true });
  await sandbox?.kill().catch(() => undefined);
  await abx?.close();
});

async function throughGateway(port: number) {
  const response = await request(`${daemonInfo(home).gatewayUrl}/`, {
    headers: {
      host: `${port}-${sandbox.sandboxId}.localhost`,
      'x-access-token': sandbox.accessToken,
    },
  });
  return { status: response.statusCode, body: await response.body.text() };
}

describe('symlinks planted in the sandbox’s socket folder', () => {
  test('a port socket replaced by a link to a host socket is refused, not followed', async () => {
    await sandbox.commands.run(`ln -sf ${HOST_SOCKET} /run/abx/ports/8080.sock`);
    const answer = await throughGateway(8080);
    expect(answer.body).not.toContain('host secret');
    expect(answer.status).toBe(502);
  });

  test('the ports folder replaced by a link to a host folder is refused too', async () => {
    await sandbox.commands.run(`rm -rf /run/abx/ports && ln -s ${HOST_SOCKET_DIR} /run/abx/ports`);
    const answer = await throughGateway(8080);
    expect(answer.body).not.toContain('host secret');
    expect(answer.status).toBe(502);
    // The host's socket is still there: the daemon did not remove it through the link either.
    expect(statSync(HOST_SOCKET).isSocket()).toBe(true);
  });
});

describe('escape attempts from inside', () => {
  test('host processes cannot be seen or signalled', async () => {
    const daemonPid = daemonInfo(home).pid;
    const probe = await sandbox.commands.run(
      `kill -0 ${process.pid} 2>&1; echo "kill test: $?"; kill -9 ${daemonPid} 2>&1; echo "kill daemon: $?"`,
    );
    expect(probe.stdout).toMatch(/kill test: 1/);
    expect(probe.stdout).toMatch(/kill daemon: 1/);
    expect(daemonInfo(home).pid).toBe(daemonPid);
    expect((await sandbox.commands.run('echo alive')).stdout).toBe('alive\n');
  });

  test('files.write through a symlink replaces the link, never writes where it points', async () => {
    const hostFile = join(HOST_SOCKET_DIR, 'host-file.txt');
    writeFileSync(hostFile, 'host content');
    await sandbox.commands.run(
      `ln -sf ${hostFile} /home/user/to-host; ln -sf /etc/hostname /home/user/to-etc`,
    );
    await sandbox.files.write('to-host', 'from the sandbox');
    await sandbox.files.write('to-etc', 'from the sandbox');
    expect(readFileSync(hostFile, 'utf8')).toBe('host content');
    const { stdout } = await sandbox.commands.run(
      'test -L to-host || echo replaced; cat to-host; echo; cat /etc/hostname',
    );
    // /etc is the host's, read-only: unchanged.
    expect(stdout).toBe(`replaced\nfrom the sandbox\n${readFileSync('/etc/hostname', 'utf8')}`);
  });
});

describe('secrets at rest', () => {
  test('the API key and token secret are private; the registry holds only token hashes', () => {
    for (const file of ['api-key', 'token-secret', 'daemon.json']) {
      expect((statSync(join(home, file)).mode & 0o777).toString(8)).toBe('600');
    }
    const db = openSqlite(join(home, 'abx.db'), { readOnly: true });
    try {
      const dump = JSON.stringify(db.prepare('SELECT * FROM sandboxes').all());
      expect(dump).toContain(sandbox.sandboxId);
      expect(dump).not.toContain(sandbox.accessToken);
      expect(dump).not.toContain(readFileSync(join(home, 'api-key'), 'utf8').trim());
    } finally {
      db.close();
    }
  });

  test('no token in listings or in the errors a caller sees', async () => {
    const listed = JSON.stringify(await Sandbox.list({ home }));
    expect(listed).toContain(sandbox.sandboxId);
    expect(listed).not.toContain(sandbox.accessToken);
    const refused = await request(`${daemonInfo(home).gatewayUrl}/health`, {
      headers: {
        host: `49983-${sandbox.sandboxId}.localhost`,
        'x-access-token': `${sandbox.accessToken}x`,
      },
    });
    const text = await refused.body.text();
    expect(refused.statusCode).toBe(401);
    expect(text).not.toContain(sandbox.accessToken);
  });

  test('no token reaches the daemon log or a sandbox process’s environment', async () => {
    const log = readFileSync(join(home, 'daemon.log'), 'utf8');
    expect(log).not.toContain(sandbox.accessToken);
    expect(log).not.toContain(readFileSync(join(home, 'api-key'), 'utf8').trim());
    const environments = await sandbox.commands.run(
      "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null; done",
    );
    expect(environments.stdout).toContain('CREATE_ENV=x');
    expect(environments.stdout).not.toContain(sandbox.accessToken);
  });
});
