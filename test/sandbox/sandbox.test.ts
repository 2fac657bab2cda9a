import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  CommandExitError,
  InvalidArgumentError,
  NotFoundError,
  Sandbox,
  type SandboxInfo,
} from '../../src/index.js';
import { createAbxHome, processesMentioning, sandboxProcesses } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;

beforeAll(async () => {
  // A host variable that must not leak into sandboxes (the daemon inherits it).
  process.env.ABX_TEST_HOST_SECRET = 'host-secret-value';
  abx = await createAbxHome();
  home = abx.home;
}, 300_000);

afterAll(async () => {
  delete process.env.ABX_TEST_HOST_SECRET;
  await abx?.close();
});

/** Creates a sandbox for one test and kills it afterwards, even when the test fails. */
async function withSandbox<T>(
  run: (sandbox: Sandbox) => Promise<T>,
  options: Parameters<typeof Sandbox.create>[0] = {},
): Promise<T> {
  const sandbox = await Sandbox.create({ home, ...options });
  try {
    return await run(sandbox);
  } finally {
    await sandbox.kill();
  }
}

describe('a sandbox', () => {
  test('create → run → files → kill', async () => {
    const sandbox = await Sandbox.create({ home, metadata: { suite: 'basic' } });
    try {
      const { stdout, exitCode } = await sandbox.commands.run('echo hello; id -un; pwd; hostname');
      expect(exitCode).toBe(0);
      expect(stdout.split('\n')).toEqual(['hello', 'user', '/home/user', sandbox.sandboxId, '']);

      const bytes = new Uint8Array([0, 1, 2, 250, 255]);
      await sandbox.files.write('data/blob.bin', bytes);
      expect(await sandbox.files.read('data/blob.bin', { format: 'bytes' })).toEqual(bytes);
      await sandbox.files.write([
        { path: 'a.txt', data: 'first' },
        { path: '/home/user/data/b.txt', data: 'second' },
      ]);
      expect(await sandbox.files.read('a.txt')).toBe('first');
      expect((await sandbox.files.list('data')).map((e) => [e.name, e.type]).sort()).toEqual([
        ['b.txt', 'file'],
        ['blob.bin', 'file'],
      ]);
      expect((await sandbox.files.stat('data')).type).toBe('directory');
      await sandbox.files.rename('a.txt', 'c.txt');
      expect(await sandbox.files.exists('a.txt')).toBe(false);
      expect((await sandbox.commands.run('cat c.txt')).stdout).toBe('first');
      await sandbox.files.makeDir('x/y/z');
      // A read-only place is refused as such, not as a missing parent.
      await expect(sandbox.files.makeDir('/usr/abx-made/deep')).rejects.toThrow(
        /EROFS: read-only file system/,
      );
      await sandbox.files.remove('x');
      expect(await sandbox.files.exists('x')).toBe(false);
      await expect(sandbox.files.read('nope.txt')).rejects.toThrow(NotFoundError);

      const listed = await Sandbox.list({ home, metadata: { suite: 'basic' } });
      expect(listed.map((s) => [s.sandboxId, s.state])).toEqual([[sandbox.sandboxId, 'running']]);
    } finally {
      expect(await sandbox.kill()).toBe(true);
    }
    expect(await sandbox.isRunning()).toBe(false);
    expect((await sandbox.getInfo()).endReason).toBe('killed by request');
    // Listing shows live sandboxes unless asked for more, as E2B's does.
    const ids = (list: SandboxInfo[]) => list.map((s) => s.sandboxId);
    const filter = { home, metadata: { suite: 'basic' } };
    expect(ids(await Sandbox.list(filter))).toEqual([]);
    expect(ids(await Sandbox.list({ ...filter, all: true }))).toEqual([sandbox.sandboxId]);
    expect(ids(await Sandbox.list({ ...filter, state: ['running', 'killed'] }))).toEqual([
      sandbox.sandboxId,
    ]);
    expect(ids(await Sandbox.list({ ...filter, state: 'expired' }))).toEqual([]);
    expect(await sandbox.kill()).toBe(false);
    await expect(sandbox.commands.run('echo too late')).rejects.toThrow(
      `sandbox ${sandbox.sandboxId} is not running (killed: killed by request)`,
    );
  });

  test('many files in one call; a bad entry writes none of them', async () => {
    await withSandbox(async (sandbox) => {
      const files = Array.from({ length: 200 }, (_, i) => ({
        path: `many/file-${i}.txt`,
        data: `content ${i}`,
      }));
      const written = await sandbox.files.write(files);
      expect(written.map((w) => [w.path, w.size])).toEqual(
        files.map((f, i) => [`/home/user/${f.path}`, `content ${i}`.length]),
      );
      expect((await sandbox.commands.run('cat many/file-7.txt; ls many | wc -l')).stdout).toBe(
        'content 7200\n',
      );
      const bad = [
        { path: 'batch/ok.txt', data: 'fine' },
        { path: 'batch/bad\0name.txt', data: 'nope' },
      ];
      await expect(sandbox.files.write(bad)).rejects.toThrow(
        /files\[1\]\.path contains a NUL byte/,
      );
      expect(await sandbox.files.exists('batch/ok.txt')).toBe(false);
    });
  });

  test('file metadata: written with a file, shown by stat and list, kept through a rename', async () => {
    await withSandbox(async (sandbox) => {
      const written = await sandbox.files.write('tagged/a.txt', 'a', {
        metadata: { Stage: 'raw' },
      });
      expect(written).toMatchObject({
        path: '/home/user/tagged/a.txt',
        metadata: { stage: 'raw' },
      });
      await sandbox.commands.run('mv tagged/a.txt tagged/b.txt');
      expect((await sandbox.files.stat('tagged/b.txt')).metadata).toEqual({ stage: 'raw' });
      // Several files with metadata: each is its own write, each gets the set.
      await sandbox.files.write(
        [
          { path: 'tagged/c.txt', data: 'c' },
          { path: 'tagged/d.txt', data: 'd' },
        ],
        { metadata: { batch: '1' } },
      );
      const listed = await sandbox.files.list('tagged');
      expect(Object.fromEntries(listed.map((e) => [e.name, e.metadata]))).toEqual({
        'b.txt': { stage: 'raw' },
        'c.txt': { batch: '1' },
        'd.txt': { batch: '1' },
      });
      // A bad set is refused before anything is sent; nothing is written.
      await expect(
        sandbox.files.write('tagged/e.txt', 'e', { metadata: { k: 'caf\u00e9' } }),
      ).rejects.toThrow(/invalid metadata: metadata value for key "k" is not printable/);
      expect(await sandbox.files.exists('tagged/e.txt')).toBe(false);
    });
  });

  test('a non-zero exit throws CommandExitError carrying the result', async () => {
    await withSandbox(async (sandbox) => {
      const error = await sandbox.commands.run('echo out; echo err >&2; exit 3').catch((e) => e);
      expect(error).toBeInstanceOf(CommandExitError);
      expect(error.result).toEqual({ stdout: 'out\n', stderr: 'err\n', exitCode: 3 });
      const allowed = await sandbox.commands.run('exit 4', { allowNonZeroExit: true });
      expect(allowed.exitCode).toBe(4);
    });
  });

  test('the environment is the template’s and the caller’s, never the host’s', async () => {
    await withSandbox(
      async (sandbox) => {
        const { stdout } = await sandbox.commands.run('env', { envs: { PER_CALL: 'yes' } });
        const env = Object.fromEntries(
          stdout
            .trim()
            .split('\n')
            .map((l) => l.split(/=(.*)/s)),
        );
        expect(env).toMatchObject({
          HOME: '/home/user',
          USER: 'user',
          FROM_CREATE: '1',
          PER_CALL: 'yes',
        });
        expect(env.ABX_TEST_HOST_SECRET).toBeUndefined();
        expect(env.ABX_ACCESS_TOKEN).toBeUndefined();
        expect(stdout).not.toContain('host-secret-value');
        expect(stdout).not.toContain(sandbox.accessToken);
      },
      { envs: { FROM_CREATE: '1' } },
    );
  });

  test('a sandbox created in one process is used from another by id', async () => {
    await withSandbox(async (sandbox) => {
      const script = `
        import 'reflect-metadata';
        const { Sandbox } = await import(${JSON.stringify(join(ROOT, 'dist', 'index.js'))});
        const sandbox = await Sandbox.connect(process.argv[1], { home: process.argv[2] });
        await sandbox.files.write('from-other.txt', 'written by pid ' + process.pid);
        console.log((await sandbox.commands.run('hostname')).stdout.trim());
      `;
      const output = execFileSync(
        process.execPath,
        ['--input-type=module', '-e', script, sandbox.sandboxId, home],
        { cwd: ROOT, encoding: 'utf8', timeout: 60_000 },
      );
      expect(output.trim()).toBe(sandbox.sandboxId);
      expect(await sandbox.files.read('from-other.txt')).toMatch(/^written by pid \d+$/);
    });
  });

  test('bad create options are refused before anything starts', async () => {
    await expect(Sandbox.create({ home, template: 'no-such-template' })).rejects.toThrow(
      /template 'no-such-template' is not built; known templates: base/,
    );
    await expect(Sandbox.create({ home, timeoutMs: -5 })).rejects.toThrow(InvalidArgumentError);
    await expect(Sandbox.create({ home, envs: { A: 1 as unknown as string } })).rejects.toThrow(
      'envs.A must be a string, not number',
    );
    await expect(Sandbox.connect('inosuchsandbox00', { home })).rejects.toThrow(NotFoundError);
  });
});

describe('the warm pool', () => {
  test('a used template keeps a sandbox started; create hands it out with the caller’s envs', async () => {
    await withSandbox(async () => {
      let pooled = await Sandbox.list({ home, state: 'pooled' });
      for (let i = 0; i < 200 && pooled.length === 0; i++) {
        await new Promise((resolve) => setTimeout(resolve, 25));
        pooled = await Sandbox.list({ home, state: 'pooled' });
      }
      // One at least: the pool follows the creates of the tests before (a quick run of them
      // counts as a burst), so it may hold more.
      expect(pooled.length).toBeGreaterThanOrEqual(1);
      expect(new Set(pooled.map((s) => s.template))).toEqual(new Set(['base']));
      // Pooled sandboxes are not the caller's: the default listing leaves them out.
      expect((await Sandbox.list({ home })).map((s) => s.sandboxId)).not.toContain(
        pooled[0]?.sandboxId,
      );
      const handedOut = await Sandbox.create({
        home,
        envs: { FROM_POOL: 'set after start' },
        metadata: { pooled: 'yes' },
      });
      try {
        expect(handedOut.sandboxId).toBe(pooled[0]?.sandboxId);
        const info = await handedOut.getInfo();
        expect([info.state, info.metadata]).toEqual(['running', { pooled: 'yes' }]);
        const { stdout } = await handedOut.commands.run('echo "$FROM_POOL"; echo "$HOME"');
        expect(stdout).toBe('set after start\n/home/user\n');
      } finally {
        await handedOut.kill();
      }
    });
  });
});

describe('isolation', () => {
  test('no host file beyond the read-only system folders, no writes to them', async () => {
    const secretDir = mkdtempSync(join(tmpdir(), 'abx-host-secret-'));
    writeFileSync(join(secretDir, 'secret.txt'), 'host secret');
    try {
      await withSandbox(async (sandbox) => {
        const run = (cmd: string) => sandbox.commands.run(cmd, { allowNonZeroExit: true });
        expect((await run(`cat ${join(secretDir, 'secret.txt')}`)).exitCode).not.toBe(0);
        expect((await run(`ls ${home}`)).exitCode).not.toBe(0);
        expect((await run('ls /root')).exitCode).not.toBe(0);
        const write = await run('touch /usr/abx-probe');
        expect(write.exitCode).not.toBe(0);
        expect(write.stderr).toMatch(/Read-only file system|Permission denied/);
        expect((await run('cat /etc/hostname; cat /etc/passwd')).stdout).toContain(
          'user:x:1000:1000::/home/user:/bin/sh',
        );
      });
    } finally {
      rmSync(secretDir, { recursive: true, force: true });
    }
  });

  test("another sandbox's home is out of reach", async () => {
    await withSandbox(async (a) => {
      await a.files.write('only-in-a.txt', 'a');
      await withSandbox(async (b) => {
        const { stdout } = await b.commands.run('ls -A /home/user; ls /home');
        expect(stdout.split('\n').filter(Boolean)).toEqual(['user']);
        const search = await b.commands.run(
          'find / -xdev -name only-in-a.txt 2>/dev/null; find /tmp /home /run -name only-in-a.txt 2>/dev/null',
          { allowNonZeroExit: true },
        );
        expect(search.stdout).toBe('');
      });
    });
  });

  test("a server on the host's loopback cannot be reached", async () => {
    const server = createServer((_, res) => res.end('host server'));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    try {
      expect(await (await fetch(`http://127.0.0.1:${port}`)).text()).toBe('host server');
      await withSandbox(async (sandbox) => {
        const probe = await sandbox.commands.run(
          `node -e "fetch('http://127.0.0.1:${port}').then(r => r.text()).then(t => console.log('reached', t), e => console.log('refused', e.cause?.code))"`,
        );
        expect(probe.stdout.trim()).toBe('refused ECONNREFUSED');
      });
    } finally {
      server.close();
    }
  });

  test('it sees only its own processes', async () => {
    await withSandbox(async (sandbox) => {
      const { stdout } = await sandbox.commands.run(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
      );
      const commands = stdout.split('\n').filter((line) => line.trim() !== '');
      expect(commands.length).toBeLessThan(8);
      expect(commands.some((c) => c.includes('envd.cjs'))).toBe(true);
      expect(commands.some((c) => c.includes('vitest'))).toBe(false);
    });
  });
});

describe('lifecycle', () => {
  test('no process of a killed sandbox survives', async () => {
    const sandbox = await Sandbox.create({ home });
    try {
      // A unique argument lets the host find these processes in its own process table.
      await sandbox.commands.run(
        '(setsid sleep 7331.5 >/dev/null 2>&1 &) ; nohup sleep 7331.5 >/dev/null 2>&1 &',
      );
      const sleeping = () =>
        processesMentioning('7331.5').filter((pid) => {
          try {
            return readFileSync(`/proc/${pid}/cmdline`, 'utf8').startsWith('sleep');
          } catch {
            return false;
          }
        });
      // The backgrounded shells may not have exec'd sleep yet when the command returns.
      for (let i = 0; i < 100 && sleeping().length < 2; i++)
        await new Promise((r) => setTimeout(r, 20));
      expect(sleeping()).toHaveLength(2);
      await sandbox.kill();
      expect(sleeping()).toEqual([]);
      expect(sandboxProcesses(sandbox.sandboxId)).toEqual([]);
    } finally {
      await sandbox.kill();
    }
  });

  test('the reaper kills an expired sandbox; an extended one lives on', async () => {
    const short = await Sandbox.create({ home, timeoutMs: 1000 });
    const extended = await Sandbox.create({ home, timeoutMs: 1000 });
    try {
      await extended.setTimeout(120_000);
      let info = await short.getInfo();
      for (let i = 0; i < 300 && info.state === 'running'; i++) {
        await new Promise((resolve) => setTimeout(resolve, 50));
        info = await short.getInfo();
      }
      expect(info.state).toBe('expired');
      expect(info.endReason).toMatch(/^expired at /);
      expect(await extended.isRunning()).toBe(true);
      expect((await extended.commands.run('echo alive')).stdout).toBe('alive\n');
    } finally {
      await short.kill();
      await extended.kill();
    }
  });
});
