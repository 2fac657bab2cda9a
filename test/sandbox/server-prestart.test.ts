import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { commandRegistry, Sandbox, Templates } from '../../src/index.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { eventually } from '../server/harness.js';

// server.start() on real sandboxes, real daemon and warm pool: a sandbox of a template with ports
// comes from the pool with a command server process started ahead (envd's idle process), and
// server.start() hands it the bundle instead of starting Node.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;
const TEMPLATE = 'server-e2e';
const cacheDirBefore = process.env.ABX_CACHE_DIR;

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
  process.env.ABX_CACHE_DIR = join(home, 'bundle-cache');
  await Templates.build(join(ROOT, 'test', 'fixtures', 'templates', `${TEMPLATE}.yaml`), { home });
  // The template's first create starts its warm pool.
  await (await Sandbox.create({ home, template: TEMPLATE })).kill();
}, 300_000);

afterAll(async () => {
  await abx?.close();
  if (cacheDirBefore === undefined) delete process.env.ABX_CACHE_DIR;
  else process.env.ABX_CACHE_DIR = cacheDirBefore;
});

const register = () => commandRegistry().registerClass(SandboxCommands);

/** True when one of the sandbox's processes (seen from the host) is `server.cjs --prestart`. */
function hasIdleProcess(sandboxId: string): boolean {
  return sandboxProcesses(sandboxId).some((pid) => {
    try {
      const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      return argv[1] === '/opt/abx/server.cjs' && argv[2] === '--prestart';
    } catch {
      return false;
    }
  });
}

/**
 * A sandbox from the warm pool, once the pool holds one and each has its idle process (the pool
 * starts it when a sandbox has waited a moment unclaimed).
 */
async function pooled(envs?: Record<string, string>): Promise<Sandbox> {
  await eventually(async () => {
    const waiting = await Sandbox.list({ home, state: 'pooled', template: TEMPLATE });
    return waiting.length > 0 && waiting.every((s) => hasIdleProcess(s.sandboxId));
  });
  return Sandbox.create({ home, template: TEMPLATE, ...(envs ? { envs } : {}) });
}

/** OS pids of the sandbox's `server.cjs --prestart` processes that no start has taken. */
async function idleProcesses(box: Sandbox): Promise<number[]> {
  const { stdout } = await box.commands.run(
    // argv[1] and argv[2] compared whole: a pattern over the command line would match this shell.
    `for p in /proc/[0-9]*; do a=$(tr '\\0' '\\n' < $p/cmdline 2>/dev/null | sed -n 2,3p | tr '\\n' ' '); [ "$a" = '/opt/abx/server.cjs --prestart ' ] && echo \${p#/proc/}; done; true`,
  );
  const listed = new Set((await box.commands.list()).map((p) => p.osPid));
  return stdout
    .split('\n')
    .filter(Boolean)
    .map(Number)
    .filter((pid) => !listed.has(pid));
}

/** The OS pid of the server on the client's port: the parent of the shell runshell starts. */
async function serverPid(box: Sandbox): Promise<number> {
  const { stdout } = await box.server.call<{ stdout: string }>('runshell', { cmd: 'echo $PPID' });
  return Number(stdout.trim());
}

async function stateFile(box: Sandbox, port = 8080): Promise<{ prestarted?: boolean }> {
  return JSON.parse(await box.files.read(`/home/user/.abx/server/server-${port}.json`));
}

describe('server.start() in the process started ahead', () => {
  test('a sandbox from the pool serves from the idle process, which no listing showed before', async () => {
    const box = await pooled();
    try {
      const idle = await idleProcesses(box);
      expect(idle).toHaveLength(1);
      register();
      await box.server.start({ commands: [SandboxCommands] });
      expect(await serverPid(box)).toBe(idle[0]);
      expect((await stateFile(box)).prestarted).toBe(true);
      expect(await box.server.call('add', { x: 40 })).toBe(42);
      expect(await box.server.call('whereAmI')).toEqual({
        hostname: box.sandboxId,
        cwd: '/home/user',
        uid: 1000,
      });
      const server = (await box.commands.list()).find((p) => p.running);
      expect(server?.osPid).toBe(idle[0]);
      expect(server?.cmd).toMatch(/^node \/opt\/abx\/server\.cjs --host 127\.0\.0\.1 --port 8080 /);
    } finally {
      await box.kill();
    }
  });

  test('a restart takes the next idle process; a changed bundle is still refused and uploaded again', async () => {
    const box = await pooled();
    try {
      register();
      await box.server.start({ commands: [SandboxCommands] });
      const first = await serverPid(box);
      expect(await box.server.call('increment')).toBe(1);
      // envd starts the next one a moment after the server listens.
      let next: number[] = [];
      await eventually(async () => {
        next = await idleProcesses(box);
        return next.length === 1;
      });
      expect(next[0]).not.toBe(first);
      await box.server.start({ commands: [SandboxCommands], restart: true });
      expect(await serverPid(box)).toBe(next[0]);
      expect((await stateFile(box)).prestarted).toBe(true);
      expect(await box.server.call('increment')).toBe(1);

      const bundle = /--load (\S+)/.exec(
        (await box.commands.list()).find((p) => p.running)?.cmd ?? '',
      )?.[1] as string;
      expect(bundle).toMatch(/^\/home\/user\/\.abx\/server\/bundles\/[0-9a-f]{64}\.cjs$/);
      await box.files.write(bundle, 'module.exports = {};');
      const writes: string[] = [];
      const write = box.files.write.bind(box.files);
      box.files.write = ((path: string, data: string) => {
        writes.push(path);
        return write(path, data);
      }) as typeof box.files.write;
      await box.server.start({ commands: [SandboxCommands], restart: true });
      expect(writes.filter((path) => path.includes('/bundles/'))).toEqual([bundle]);
      expect(await box.server.call('add', { x: 1 })).toBe(3);
    } finally {
      await box.kill();
    }
  });

  test("the create's envs reach a server started from the pool's idle process", async () => {
    const box = await pooled({ GREETING: 'from the create' });
    try {
      register();
      await box.server.start({ commands: [SandboxCommands] });
      expect((await stateFile(box)).prestarted).toBe(true);
      const { stdout } = await box.server.call<{ stdout: string }>('runshell', {
        cmd: 'printf %s "$GREETING"',
      });
      expect(stdout).toBe('from the create');
    } finally {
      await box.kill();
    }
  });

  test('a second server on another port starts while the first runs; stop and start again', async () => {
    const box = await pooled();
    try {
      register();
      await box.server.start({ commands: [SandboxCommands] });
      await box.server.start({ port: 8091, commands: [SandboxCommands] });
      expect(await box.server.call('add', { x: 1, y: 1 })).toBe(2);
      await box.server.attach(8080);
      expect(await box.server.call('add', { x: 2, y: 2 })).toBe(4);
      await box.server.stop();
      await box.server.start({ commands: [SandboxCommands] });
      expect(await box.server.call('add', { x: 3, y: 3 })).toBe(6);
    } finally {
      await box.kill();
    }
  });

  test('killing the sandbox leaves neither the server nor the idle process behind', async () => {
    const box = await pooled();
    register();
    await box.server.start({ commands: [SandboxCommands] });
    await eventually(async () => (await idleProcesses(box)).length === 1);
    expect(sandboxProcesses(box.sandboxId).length).toBeGreaterThan(0);
    await box.kill();
    await eventually(() => sandboxProcesses(box.sandboxId).length === 0);
  });
});

describe('ABX_PRESTART_SERVER=false', () => {
  test("the pool's sandboxes have no idle process; server.start() starts Node afresh, then keeps one", async () => {
    // The daemon the SDK starts for this home inherits it.
    process.env.ABX_PRESTART_SERVER = 'false';
    const other = await createAbxHome();
    try {
      await Templates.build(join(ROOT, 'test', 'fixtures', 'templates', `${TEMPLATE}.yaml`), {
        home: other.home,
      });
      await (await Sandbox.create({ home: other.home, template: TEMPLATE })).kill();
      let waiting: string[] = [];
      await eventually(async () => {
        waiting = (
          await Sandbox.list({ home: other.home, state: 'pooled', template: TEMPLATE })
        ).map((s) => s.sandboxId);
        return waiting.length > 0;
      });
      // Well past the moment the pool would have started one (READY_DELAY_MS, then Node's start).
      await new Promise((resolve) => setTimeout(resolve, 3000));
      expect(waiting.filter(hasIdleProcess)).toEqual([]);
      const box = await Sandbox.create({ home: other.home, template: TEMPLATE });
      expect(await idleProcesses(box)).toEqual([]);
      register();
      await box.server.start({ commands: [SandboxCommands] });
      expect((await stateFile(box)).prestarted).toBe(false);
      expect(await box.server.call('add', { x: 1 })).toBe(3);
      // A sandbox that ran a server keeps the next one ready all the same.
      await eventually(async () => (await idleProcesses(box)).length === 1);
    } finally {
      delete process.env.ABX_PRESTART_SERVER;
      await other.close();
    }
  }, 300_000);
});
