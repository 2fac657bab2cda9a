import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { BuildProgress } from '../../runtime/protocol/wire.js';
import {
  type DaemonInfo,
  InvalidArgumentError,
  NotFoundError,
  Sandbox,
  SandboxNotFoundError,
  Template,
  TemplateBuildError,
  Templates,
} from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;
const fixture = (name: string) => join(ROOT, 'test', 'fixtures', 'templates', name);

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
  await Templates.build(fixture('web.yaml'), { home });
}, 300_000);

afterAll(async () => {
  await abx?.close();
});

const gatewayUrl = () =>
  (JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as DaemonInfo).gatewayUrl;

/** An HTTP server inside the sandbox on `port`: echoes the URL, and echoes bytes after an upgrade. */
async function startServerInside(sandbox: Sandbox, port: number): Promise<void> {
  const program = `
    const http = require('http');
    const server = http.createServer((req, res) => {
      let size = 0;
      req.on('data', (c) => (size += c.length));
      req.on('end', () => res.end('pong ' + req.method + ' ' + req.url + ' ' + size));
    });
    server.on('upgrade', (req, socket) => {
      socket.write('HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: echo\\r\\nConnection: Upgrade\\r\\n\\r\\n');
      socket.pipe(socket);
    });
    server.listen(${port}, '127.0.0.1');
  `;
  await sandbox.files.write('/tmp/server.js', program);
  await sandbox.commands.run('nohup node /tmp/server.js >/tmp/server.log 2>&1 &');
  await sandbox.commands.run(
    `for i in $(seq 100); do node -e "require('net').connect(${port}).on('connect',()=>process.exit(0)).on('error',()=>process.exit(1))" && exit 0; sleep 0.05; done; exit 1`,
  );
}

describe('templates', () => {
  test('setup runs once at build; each sandbox starts from its result', async () => {
    const templates = await Templates.list({ home });
    expect(templates.map((t) => t.name)).toEqual(['base', 'web-test']);
    const info = templates[1];
    expect(info).toMatchObject({
      capabilities: ['shell', 'files', 'code', 'ports'],
      workdir: '/home/user/app',
      timeoutMs: 120_000,
      env: { GREETING: 'hello from the template' },
    });

    const first = await Sandbox.create({ home, template: 'web-test' });
    const second = await Sandbox.create({ home, template: 'web-test' });
    try {
      for (const sandbox of [first, second]) {
        const { stdout } = await sandbox.commands.run(
          'pwd; cat setup-marker.txt greeting.txt; echo "$GREETING"',
        );
        expect(stdout).toBe(
          '/home/user/app\nbuilt at setup\nhello from the template\nhello from the template\n',
        );
      }
      // Sandboxes of one template do not share files.
      await first.files.write('mine.txt', 'first');
      expect(await second.files.exists('mine.txt')).toBe(false);
      const created = await first.getInfo();
      expect(Date.parse(created.expiresAt) - Date.parse(created.createdAt)).toBe(120_000);
    } finally {
      await first.kill();
      await second.kill();
    }
  });

  test('resource limits of the template hold inside the sandbox', async () => {
    const sandbox = await Sandbox.create({ home, template: 'web-test' });
    try {
      const { stdout } = await sandbox.commands.run('cat /proc/self/limits');
      const limit = (name: string) =>
        new RegExp(`^${name}\\s+(\\S+)\\s+(\\S+)`, 'm').exec(stdout)?.slice(1, 3);
      expect(limit('Max processes')).toEqual(['512', '512']);
      expect(limit('Max open files')).toEqual(['256', '256']);
      expect(limit('Max file size')).toEqual([String(1024 * 1024), String(1024 * 1024)]);
      const big = await sandbox.commands.run('head -c 2000000 /dev/zero > big.bin', {
        allowNonZeroExit: true,
      });
      expect(big.exitCode).not.toBe(0);
      expect((await sandbox.files.stat('big.bin')).size).toBe(1024 * 1024);
    } finally {
      await sandbox.kill();
    }
  });

  test('a failing setup step fails the build with its output', async () => {
    const error = await Templates.build(fixture('failing-setup.yaml'), { home }).catch((e) => e);
    expect(error).toBeInstanceOf(TemplateBuildError);
    expect([error.step, error.exitCode, error.status]).toEqual([1, 7, 422]);
    expect(error.output).toContain('about to fail');
    expect(error.message).toContain(
      'template \'failing-setup\': setup[1] `echo "about to fail" >&2; exit 7` exited with code 7',
    );
    expect(error.message).toContain('about to fail');
    expect((await Templates.list({ home })).map((t) => t.name)).not.toContain('failing-setup');
  });

  test('a template made in code builds like its YAML: copy steps bring host files in', async () => {
    const data = mkdtempSync(join(tmpdir(), 'abx-copy-'));
    try {
      mkdirSync(join(data, 'nested'));
      writeFileSync(join(data, 'nested', 'rows.csv'), 'a,b\n1,2\n');
      writeFileSync(join(data, 'notes.txt'), 'from the host\n');
      const tpl = Template.fromBase()
        .copy(data, '/home/user/data')
        .copy(join(data, 'notes.txt'), '/home/user/notes.txt')
        .runCmd('wc -l < data/nested/rows.csv > lines.txt')
        .runCmd("printf 'one\\ntwo <b>\\n'; printf 'three, no newline' >&2")
        .setEnvs({ STAGE: 'code' });
      await expect(Templates.build(tpl, { home })).rejects.toThrow(/needs a name/);
      const progress: BuildProgress[] = [];
      const built = await Templates.build(tpl, {
        home,
        name: 'from-code',
        onProgress: (event) => progress.push(event),
      });
      expect(progress).toEqual([
        { phase: 'step', step: 0, of: 4, text: `copy ${data} → /home/user/data` },
        {
          phase: 'step',
          step: 1,
          of: 4,
          text: `copy ${join(data, 'notes.txt')} → /home/user/notes.txt`,
        },
        { phase: 'step', step: 2, of: 4, text: 'wc -l < data/nested/rows.csv > lines.txt' },
        {
          phase: 'step',
          step: 3,
          of: 4,
          text: "printf 'one\\ntwo <b>\\n'; printf 'three, no newline' >&2",
        },
        // What a step prints comes line by line, stderr too, the last line without its newline
        // (stdout's and stderr's lines each in their order; the two may interleave).
        ...progress.slice(4),
      ]);
      expect(progress.slice(4)).toHaveLength(3);
      expect(progress.slice(4)).toEqual(
        expect.arrayContaining([
          { phase: 'output', step: 3, of: 4, text: 'one' },
          { phase: 'output', step: 3, of: 4, text: 'two <b>' },
          { phase: 'output', step: 3, of: 4, text: 'three, no newline' },
        ]),
      );
      const stdout = progress
        .slice(4)
        .map((event) => event.text)
        .filter((text) => text !== 'three, no newline');
      expect(stdout).toEqual(['one', 'two <b>']);
      expect(built).toMatchObject({ name: 'from-code', image: null, user: 'user', path: null });
      expect(built.setup.map((s) => ('copy' in s ? 'copy' : 'run'))).toEqual([
        'copy',
        'copy',
        'run',
        'run',
      ]);
      const sandbox = await Sandbox.create({ home, template: 'from-code' });
      try {
        expect(await sandbox.files.read('data/nested/rows.csv')).toBe('a,b\n1,2\n');
        expect(await sandbox.files.read('notes.txt')).toBe('from the host\n');
        expect((await sandbox.files.read('lines.txt')).trim()).toBe('2');
        expect((await sandbox.commands.run('echo $STAGE')).stdout).toBe('code\n');
      } finally {
        await sandbox.kill();
      }
      // A copy of something that is not there fails the build at that step.
      // With progress too, the error arrives as its class at the end of the stream.
      const missing = await Templates.build(
        Template.fromBase().copy(join(data, 'nope'), '/home/user/x'),
        { home, name: 'from-code', onProgress: () => {} },
      ).catch((e) => e);
      expect(missing).toBeInstanceOf(TemplateBuildError);
      expect(missing.message).toContain("template 'from-code': setup[0] copy");
      expect(missing.message).toContain('nope');
      // The earlier build stays.
      expect((await Templates.get('from-code', { home })).setup).toHaveLength(4);
    } finally {
      rmSync(data, { recursive: true, force: true });
    }
  });

  test('snapshot: a running sandbox becomes a template; new sandboxes start from its files', async () => {
    const source = await Sandbox.create({ home, template: 'from-code' }).catch(() =>
      Sandbox.create({ home }),
    );
    let copy: Sandbox | undefined;
    try {
      await source.commands.run(
        'mkdir -p work && echo state > work/state.txt && echo tmp > /tmp/gone',
      );
      await expect(source.snapshot({ name: 'bad name!' })).rejects.toThrow(InvalidArgumentError);
      await expect(source.snapshot({ name: 'base' })).rejects.toThrow(/built in/);
      const template = await source.snapshot({ name: 'snap-1' });
      expect(template).toMatchObject({
        name: 'snap-1',
        description: `snapshot of sandbox ${source.sandboxId} (template ${source.template})`,
        setup: [],
      });
      expect((await Templates.list({ home })).map((t) => t.name)).toContain('snap-1');
      // The source goes on; a change after the snapshot is not in it.
      await source.files.write('work/after.txt', 'later');
      copy = await Sandbox.create({ home, template: 'snap-1' });
      expect(await copy.files.read('work/state.txt')).toBe('state\n');
      expect(await copy.files.exists('work/after.txt')).toBe(false);
      // /tmp is not part of a snapshot on the local provider (only the home is kept).
      expect(await copy.files.exists('/tmp/gone')).toBe(false);
      await copy.kill();
      copy = undefined;
      await Templates.remove('snap-1', { home });
      await expect(Sandbox.create({ home, template: 'snap-1' })).rejects.toThrow(NotFoundError);
      await source.kill();
      await expect(source.snapshot({ name: 'snap-2' })).rejects.toThrow(SandboxNotFoundError);
    } finally {
      await copy?.kill().catch(() => false);
      await source.kill().catch(() => false);
    }
  });

  test('a bad template.yaml is refused with its location', async () => {
    await expect(Templates.build(join(ROOT, 'package.json'), { home })).rejects.toThrow(
      InvalidArgumentError,
    );
    await expect(Templates.build(join(ROOT, 'no-such.yaml'), { home })).rejects.toThrow(
      /cannot read template .*no-such\.yaml/,
    );
  });

  test('a removed template can no longer start sandboxes', async () => {
    await Templates.remove('web-test', { home });
    await expect(Sandbox.create({ home, template: 'web-test' })).rejects.toThrow(NotFoundError);
    await expect(Templates.remove('web-test', { home })).rejects.toThrow(
      "template 'web-test' does not exist",
    );
    await Templates.build(fixture('web.yaml'), { home });
  });
});

describe('ports through the gateway', () => {
  test('HTTP requests and upgrades reach a server inside the sandbox', async () => {
    const sandbox = await Sandbox.create({ home, template: 'web-test' });
    try {
      await startServerInside(sandbox, 8080);
      const host = `8080-${sandbox.sandboxId}.localhost`;
      const response = await request(`${gatewayUrl()}/hello?x=1&token=${sandbox.accessToken}`, {
        method: 'POST',
        headers: { host },
        body: Buffer.alloc(3 * 1024 * 1024, 7),
      });
      expect(response.statusCode).toBe(200);
      expect(await response.body.text()).toBe(`pong POST /hello?x=1 ${3 * 1024 * 1024}`);

      const echoed = await new Promise<string>((resolve, reject) => {
        const url = new URL(gatewayUrl());
        const req = httpRequest({
          host: url.hostname,
          port: url.port,
          path: '/socket',
          headers: {
            host,
            'x-access-token': sandbox.accessToken,
            connection: 'Upgrade',
            upgrade: 'echo',
          },
        });
        req.on('upgrade', (res, socket) => {
          expect(res.statusCode).toBe(101);
          socket.write('ping through the tunnel');
          socket.once('data', (data) => {
            socket.destroy();
            resolve(data.toString());
          });
        });
        req.on('error', reject);
        req.end();
      });
      expect(echoed).toBe('ping through the tunnel');

      const closed = await request(`${gatewayUrl()}/`, {
        headers: {
          host: `8081-${sandbox.sandboxId}.localhost`,
          'x-access-token': sandbox.accessToken,
        },
      });
      expect(closed.statusCode).toBe(502);
      expect(await closed.body.json()).toMatchObject({ type: 'UpstreamError' });
    } finally {
      await sandbox.kill();
    }
  });
});

describe('memory limit', () => {
  test('a process that allocates past the template’s memory is killed; the sandbox lives on', async () => {
    await Templates.build(fixture('small-memory.yaml'), { home });
    const sandbox = await Sandbox.create({ home, template: 'small-memory' });
    try {
      const hog = await sandbox.commands.run(
        `node -e "const a = []; for (let i = 0; i < 100; i++) a.push(Buffer.alloc(10 * 1024 * 1024, 1)); console.log('allocated 1000 MiB')"`,
        { allowNonZeroExit: true },
      );
      expect(hog.stdout).not.toContain('allocated');
      expect(hog.exitCode).toBe(137);
      expect((await sandbox.commands.run('echo still up')).stdout).toBe('still up\n');
      const small = await sandbox.commands.run(
        `node -e "const a = Buffer.alloc(50 * 1024 * 1024, 1); console.log('allocated', a.length)"`,
      );
      expect(small.stdout).toBe(`allocated ${50 * 1024 * 1024}\n`);
    } finally {
      await sandbox.kill();
    }
    // The cgroup (v1 or v2 layout) is removed with the sandbox.
    for (const dir of ['/sys/fs/cgroup/memory/abx', '/sys/fs/cgroup/abx']) {
      expect(existsSync(`${dir}/${sandbox.sandboxId}`)).toBe(false);
    }
  });
});
