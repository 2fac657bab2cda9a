import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox as E2bSandbox, Template as E2bTemplate } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { PermissionDeniedError, Sandbox, Template, Templates } from '../../../src/index.js';
import { startDaemon } from '../../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../../src/installation/daemon-info.js';
import { abxIn } from '../../cli/abx.js';
import { createAbxHome, removeTemplates } from '../../helpers/abx-home.js';
import { DEBIAN_IMAGE, dockerEngine, ensureDebianImage } from '../../helpers/docker-images.js';

// Root inside an image sandbox whose template allows it (allow_root), on the local provider
// with a root daemon: the native SDK's `sandbox.root`, `sudo` for the default user (a .deb
// installed with `sudo dpkg -i`), and E2B's unmodified SDK with `user: 'root'`. A template
// without allow_root, and a bad X-Abx-User, are refused. One build, one daemon.
const engine = process.getuid?.() === 0 ? await dockerEngine() : { reason: 'not root' };

if (!('docker' in engine) || !engine.docker) {
  describe.skip(`root inside image sandboxes: skipped, ${engine.reason}`, () => {
    test('root', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let home: string;
  let info: DaemonInfo;
  let apiKey: string;
  let rooty: Sandbox;
  let plain: Sandbox;
  const name = `rooty-${Date.now().toString(36)}`;

  beforeAll(async () => {
    await ensureDebianImage(docker);
    process.env.ABX_WARM_POOL = '0';
    // E2B's base is the root-allowing template on this daemon (as E2B's own base has sudo).
    process.env.ABX_E2B_BASE_TEMPLATE = name;
    abx = await createAbxHome();
    home = abx.home;
    info = await startDaemon(home);
    apiKey = readFileSync(join(home, 'api-key'), 'utf8').trim();
    await Promise.all([
      Templates.build(Template.fromImage(DEBIAN_IMAGE).allowRoot(), { home, name }),
      Templates.build(Template.fromImage(DEBIAN_IMAGE).setNetwork('none'), {
        home,
        name: `${name}-no`,
      }),
    ]);
    [rooty, plain] = await Promise.all([
      Sandbox.create({ template: name, home }),
      Sandbox.create({ template: `${name}-no`, home }),
    ]);
  }, 900_000);

  afterAll(async () => {
    await removeTemplates(home);
    await abx?.close();
    delete process.env.ABX_WARM_POOL;
    delete process.env.ABX_E2B_BASE_TEMPLATE;
  });

  test('sandbox.root runs commands as uid 0 and writes files the image owns; the default user cannot', async () => {
    const id = await rooty.root.commands.run('id -u; id -un');
    expect(id.stdout).toBe('0\nroot\n');
    await rooty.root.files.write('/etc/abx-root-test', 'written by root\n');
    const seen = await rooty.commands.run(
      'stat -c "%U %a" /etc/abx-root-test; cat /etc/abx-root-test; id -u; touch /etc/by-user 2>&1 || echo refused',
    );
    expect(seen.stdout).toBe(
      "root 644\nwritten by root\n1000\ntouch: cannot touch '/etc/by-user': Permission denied\nrefused\n",
    );
    // Root's processes are its own envd's.
    const sleeper = await rooty.root.commands.start('sleep 30');
    expect((await rooty.root.commands.list()).map((p) => p.pid)).toContain(sleeper.pid);
    expect((await rooty.commands.list()).map((p) => p.pid)).not.toContain(sleeper.pid);
    await sleeper.kill();
  });

  test("the sandbox's log has root's processes too, marked user root", async () => {
    await rooty.root.commands.run('exit 4').catch(() => undefined);
    await rooty.commands.run('exit 5').catch(() => undefined);
    const deadline = Date.now() + 20_000;
    let lines = await rooty.logs();
    const exited = (code: string) => lines.find((line) => line.fields.exitCode === code);
    while (!(exited('4') && exited('5')) && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 200));
      lines = await rooty.logs();
    }
    expect(exited('4')?.fields.user).toBe('root');
    expect(exited('5')?.fields.user).toBeUndefined();
    expect(lines.filter((line) => line.message === 'envd started').length).toBe(2);
  });

  test('abx exec --user root runs as root; --user with another name is a usage error', async () => {
    const { abx } = abxIn(home);
    const root = await abx(['exec', '--user', 'root', rooty.sandboxId, '--', 'id -u']);
    expect([root.code, root.stdout, root.stderr]).toEqual([0, '0\n', '']);
    const refused = await abx(['exec', '--user', 'root', plain.sandboxId, '--', 'id -u']);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/has no root: its template does not allow root/);
    const wrong = await abx(['exec', '--user', 'nobody', rooty.sandboxId, '--', 'id -u']);
    expect(wrong.code).toBe(2);
    expect(wrong.stderr).toMatch(/a sandbox has two users: root .* and user/);
  });

  test('sudo installs a package: dpkg -i of a .deb built in the sandbox, then it is installed', async () => {
    const script = [
      'set -e',
      'mkdir -p /tmp/pkg/DEBIAN /tmp/pkg/usr/local/bin',
      'printf "Package: abx-hello\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: abx <abx@localhost>\\nDescription: test\\n" > /tmp/pkg/DEBIAN/control',
      'printf "#!/bin/sh\\necho hello from the package\\n" > /tmp/pkg/usr/local/bin/abx-hello',
      'chmod 755 /tmp/pkg/usr/local/bin/abx-hello',
      'dpkg-deb --root-owner-group --build /tmp/pkg /tmp/abx-hello.deb > /dev/null',
      'sudo dpkg -i /tmp/abx-hello.deb > /dev/null',
      "dpkg-query -W -f '${Status}\\n' abx-hello",
      'abx-hello',
      'stat -c "%U" /usr/local/bin/abx-hello',
    ].join('\n');
    const run = await rooty.commands.run(script, { timeoutMs: 60_000 });
    expect(run.stdout).toBe('install ok installed\nhello from the package\nroot\n');
  });

  test('a template without allow_root: sandbox.root is refused, saying how to allow it; no sudo', async () => {
    const refused = await plain.root.commands.run('id -u').catch((error: Error) => error);
    expect(refused).toBeInstanceOf(PermissionDeniedError);
    expect((refused as Error).message).toMatch(/does not allow root \(allow_root: true/);
    const sudo = await plain.commands.run('sudo id -u', { allowNonZeroExit: true } as never);
    expect(sudo.exitCode).not.toBe(0);
    expect(sudo.stdout).toBe('');
  });

  test('X-Abx-User names root or user, on envd only: anything else is a 400 that says so', async () => {
    const ask = (user: string, port: number) =>
      fetch(`${info.gatewayUrl}/health`, {
        headers: {
          'x-sandbox-id': rooty.sandboxId,
          'x-sandbox-port': String(port),
          'x-access-token': rooty.accessToken,
          'x-abx-user': user,
        },
      });
    const bogus = await ask('nobody', 49983);
    expect(bogus.status).toBe(400);
    expect(((await bogus.json()) as { error: string }).error).toMatch(
      /^X-Abx-User "nobody" is not a user of an abx sandbox/,
    );
    const port = await ask('root', 8080);
    expect(port.status).toBe(400);
    expect(((await port.json()) as { error: string }).error).toMatch(
      /^X-Abx-User is for envd's port \(49983\), not port 8080/,
    );
  });

  test("E2B's SDK: user 'root' for commands and files, sudo for the default user", async () => {
    const options = {
      apiKey,
      apiUrl: info.apiUrl,
      sandboxUrl: info.gatewayUrl,
      requestTimeoutMs: 60_000,
    } as never;
    const sandbox = await E2bSandbox.connect(rooty.sandboxId, options);
    const root = await sandbox.commands.run('id -u', { user: 'root' });
    expect(root.stdout).toBe('0\n');
    await sandbox.files.write('/etc/e2b-root', 'from e2b as root\n', { user: 'root' });
    // A relative path is root's home's, as on E2B; a command as root starts there too.
    const relative = await sandbox.files.write('notes.txt', 'root notes\n', { user: 'root' });
    expect(relative.path).toBe('/root/notes.txt');
    expect((await sandbox.commands.run('pwd', { user: 'root' })).stdout).toBe('/root\n');
    expect(await sandbox.files.read('/etc/e2b-root')).toBe('from e2b as root\n');
    const sudo = await sandbox.commands.run('sudo -n id -u && id -u');
    expect(sudo.stdout).toBe('0\n1000\n');
    // A create without a template (E2B's base) starts ABX_E2B_BASE_TEMPLATE's.
    const based = await E2bSandbox.create(options);
    try {
      expect((await based.commands.run('sudo -n id -u')).stdout).toBe('0\n');
    } finally {
      await based.kill();
    }
    const other = await E2bSandbox.connect(plain.sandboxId, options);
    await expect(other.commands.run('id -u', { user: 'root' })).rejects.toThrow(/root/);
  });

  test("E2B's Template SDK: steps after setUser('root') run as root; the built sandboxes have root and sudo", async () => {
    process.env.E2B_API_URL = info.apiUrl;
    process.env.E2B_SANDBOX_URL = info.gatewayUrl;
    const alias = `${name}-e2b`;
    try {
      await E2bTemplate.build(
        E2bTemplate()
          .fromImage(DEBIAN_IMAGE)
          .setUser('root')
          .runCmd('id -u > /etc/built-as')
          .setUser('user')
          .runCmd('id -u > /home/user/then-as'),
        alias,
        { apiKey, requestTimeoutMs: 60_000 },
      );
      const sandbox = await E2bSandbox.create(alias, { apiKey, requestTimeoutMs: 60_000 });
      try {
        const run = await sandbox.commands.run(
          'cat /etc/built-as /home/user/then-as; id -u; sudo -n id -u',
        );
        expect(run.stdout).toBe('0\n1000\n1000\n0\n');
        expect((await sandbox.commands.run('id -u', { user: 'root' })).stdout).toBe('0\n');
      } finally {
        await sandbox.kill();
      }
    } finally {
      delete process.env.E2B_API_URL;
      delete process.env.E2B_SANDBOX_URL;
    }
  });
}
