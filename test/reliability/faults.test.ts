import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, test as base, beforeAll, describe, expect } from 'vitest';
import {
  commandRegistry,
  InvalidArgumentError,
  NotFoundError,
  Sandbox,
  SandboxError,
  ServerCommandError,
  Templates,
  UpstreamError,
} from '../../src/index.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome, processesMentioning, sandboxProcesses } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { daemonInfo, settle, sigkillSandbox } from './helpers.js';

// Faults: sandboxes dying under a call, the command server crashing, a full disk, the daemon
// SIGKILLed. Every failing call must settle with a specific error before the test's timeout.
//
// Covered elsewhere, not repeated here:
// - a sandbox killed through the API during run/wait/connect: test/sandbox/commands.test.ts
// - a timeout kills the process group and keeps partial output: test/sandbox/commands.test.ts,
//   test/envd/exec.test.ts, test/server/commands.test.ts (runshell), test/server/process.test.ts
// - a command past its timeoutMs is 504: test/server/commands.test.ts
// - expiry (reaped; an extended one lives on): test/sandbox/sandbox.test.ts "lifecycle"
// - daemon SIGKILL: live sandboxes adopted, dead ones marked, unknown ones killed:
//   test/sandbox/control-plane.test.ts (extended below with a process-table check)

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
  await Templates.build(join(ROOT, 'test', 'fixtures', 'templates', 'server-e2e.yaml'), { home });
  await Templates.build(join(ROOT, 'test', 'fixtures', 'templates', 'web.yaml'), { home });
}, 300_000);

afterAll(async () => {
  await abx?.close();
});

/** A sandbox of its own per test (template server-e2e: ports), killed afterwards. */
const test = base.extend<{ box: Sandbox }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  box: async ({}, use) => {
    const box = await Sandbox.create({ home, template: 'server-e2e' });
    try {
      await use(box);
    } finally {
      await box.kill().catch(() => false);
    }
  },
});

/** What a call that failed because its sandbox died must look like. */
function expectSandboxGone(error: unknown, id: string) {
  expect(error).toBeInstanceOf(SandboxError);
  expect((error as Error).message).toMatch(
    new RegExp(`sandbox ${id} (stopped during the call|is not running)`),
  );
}

const timed = async <T>(label: string, promise: Promise<T>): Promise<T> => {
  const started = Date.now();
  try {
    return await promise;
  } finally {
    console.log(`${label}: settled after ${Date.now() - started} ms`);
  }
};

describe('a sandbox SIGKILLed during a call', () => {
  test('commands.run rejects with a sandbox-stopped error', { timeout: 60_000 }, async ({
    box,
  }) => {
    const running = box.commands.run('echo started; sleep 300', { timeoutMs: 0 });
    const settled = running.catch((e: unknown) => e);
    await settle(() => processesMentioning('sleep 300').length > 0);
    expect(sigkillSandbox(home, box.sandboxId)).toBeGreaterThan(0);
    expectSandboxGone(await timed('commands.run', settled), box.sandboxId);
  });

  test('server.call rejects with a sandbox-stopped error', { timeout: 60_000 }, async ({ box }) => {
    commandRegistry().registerClass(SandboxCommands);
    await box.server.start({ commands: [SandboxCommands] });
    const call = box.server.call('slowEcho', { value: 'x', delayMs: 300_000 });
    const settled = call.catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 300));
    sigkillSandbox(home, box.sandboxId);
    expectSandboxGone(await timed('server.call', settled), box.sandboxId);
  });

  test('a streamed upload rejects with a sandbox-stopped error', { timeout: 60_000 }, async ({
    box,
  }) => {
    await box.files.write('upload.bin', 'before');
    let sent = 0;
    // An upload that never ends on its own: 64 KiB every 20 ms.
    const endless = new Readable({
      read() {
        setTimeout(() => {
          sent += 65536;
          this.push(Buffer.alloc(65536, 1));
        }, 20);
      },
    });
    const settled = box.files.write('upload.bin', endless).catch((e: unknown) => e);
    await settle(() => sent > 1024 * 1024);
    sigkillSandbox(home, box.sandboxId);
    const error = await timed('files.write', settled);
    endless.destroy();
    expectSandboxGone(error, box.sandboxId);
  });

  test('an upload into a sandbox that died before it started fails at once', async ({ box }) => {
    sigkillSandbox(home, box.sandboxId);
    await settle(() => sandboxProcesses(box.sandboxId).length === 0);
    const error = await box.files.write('x.txt', 'data').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(NotFoundError);
    expectSandboxGone(error, box.sandboxId);
  });
});

describe('the command server crashing', () => {
  test('a call in flight gets an error; server.start() works again', { timeout: 90_000 }, async ({
    box,
  }) => {
    commandRegistry().registerClass(SandboxCommands);
    await box.server.start({ commands: [SandboxCommands] });
    expect(await box.server.call('add', { x: 1 })).toBe(3);
    const state = JSON.parse(await box.files.read('/home/user/.abx/server/server-8080.json'));
    const settled = box.server.call('slowEcho', { value: 'x', delayMs: 300_000 }).catch((e) => e);
    await new Promise((r) => setTimeout(r, 300));
    // The server process (and its group) dies as a crash would: SIGKILL, no clean shutdown.
    await box.commands.kill(state.pid, 'SIGKILL');
    const error = await timed('server.call during crash', settled);
    expect(error).toBeInstanceOf(SandboxError);
    expect(error).not.toBeInstanceOf(ServerCommandError);
    expect(error).toBeInstanceOf(UpstreamError);
    // The sandbox itself is fine.
    expect((await box.commands.run('echo alive')).stdout).toBe('alive\n');
    // The same client starts a new server (not the dead one it knew) and calls work again.
    await box.server.start({ commands: [SandboxCommands] });
    expect(await box.server.call('add', { x: 40 })).toBe(42);
    // And so does a client that only knows the sandbox id.
    const again = await Sandbox.connect(box.sandboxId, { home });
    expect(await again.server.call('add', { x: 1, y: 1 })).toBe(2);
  });
});

describe('a full disk (file size limit) inside a sandbox', () => {
  test('files.write and the server upload fail clearly; the old content stays whole', {
    timeout: 90_000,
  }, async () => {
    // web-test: resources.file_size = 1M (RLIMIT_FSIZE for every process in the sandbox).
    const box = await Sandbox.create({ home, template: 'web-test' });
    try {
      await box.files.write('keep.txt', 'the old content\n');
      const big = Buffer.alloc(2 * 1024 * 1024, 7);
      for (const data of [big, Readable.from([big.subarray(0, 1 << 20), big.subarray(1 << 20)])]) {
        const error = await box.files.write('keep.txt', data).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(SandboxError);
        expect((error as Error).message).toMatch(/file (is )?too large|EFBIG|size limit/i);
        expect(await box.files.read('keep.txt')).toBe('the old content\n');
      }
      // Several files at once: refused as a whole.
      const batch = await box.files
        .write([
          { path: 'a.txt', data: 'small' },
          { path: 'keep.txt', data: big },
        ])
        .catch((e: unknown) => e);
      expect(batch).toBeInstanceOf(SandboxError);
      expect(await box.files.read('keep.txt')).toBe('the old content\n');
      // The sandbox (and its envd) lives on, and no temp file is left behind.
      const { stdout } = await box.commands.run('ls -A /home/user/app');
      expect(
        stdout.split('\n').filter((name) => name.includes('.tmp') || name.includes('abx')),
      ).toEqual([]);
      expect((await box.commands.run('echo alive')).stdout).toBe('alive\n');
    } finally {
      await box.kill();
    }
  });

  test('the command server upload fails clearly; the old content stays whole', {
    timeout: 90_000,
  }, async () => {
    // Room for the command server's bundle (over 1 MiB), not for a 6 MiB upload.
    const dir = mkdtempSync(join(tmpdir(), 'abx-fsize-'));
    const yaml = join(dir, 'template.yaml');
    writeFileSync(
      yaml,
      'name: small-files\ncapabilities: [shell, files, code, ports]\nresources:\n  file_size: 4M\n',
    );
    await Templates.build(yaml, { home });
    rmSync(dir, { recursive: true, force: true });
    const box = await Sandbox.create({ home, template: 'small-files' });
    try {
      commandRegistry().registerClass(SandboxCommands);
      await box.server.start({ commands: [SandboxCommands] });
      await box.files.write('keep.txt', 'the old content\n');
      const content = Buffer.alloc(6 * 1024 * 1024, 7).toString('base64');
      const error = await box.server
        .call('upload', { path: 'keep.txt', content, encoding: 'base64' })
        .catch((e: unknown) => e);
      // The file system's refusal, as the protocol's class with the errno as code.
      expect(error).toBeInstanceOf(InvalidArgumentError);
      expect([(error as SandboxError).status, (error as SandboxError).code]).toEqual([
        400,
        'EFBIG',
      ]);
      expect(await box.files.read('keep.txt')).toBe('the old content\n');
      expect(await box.server.call('add', { x: 1 })).toBe(3);
    } finally {
      await box.kill();
    }
  });
});

describe('the daemon SIGKILLed and restarted', () => {
  test('nothing is orphaned: the process table holds the new daemon and the live sandboxes only', {
    timeout: 90_000,
  }, async () => {
    const live = await Sandbox.create({ home });
    try {
      await live.commands.run('true');
      const oldDaemon = daemonInfo(home).pid;
      const sandboxPids = () => new Set(sandboxProcesses(live.sandboxId));
      const before = sandboxPids();
      process.kill(oldDaemon, 'SIGKILL');
      // Used at once: the old daemon may still be dying (alive in /proc, answering nothing), and
      // it answered less than 10 s ago, so the SDK takes it without a health check; its refused
      // connection sends the SDK to find (here: start) the daemon again.
      const again = await Sandbox.connect(live.sandboxId, { home });
      expect((await again.commands.run('echo adopted')).stdout).toBe('adopted\n');
      const newDaemon = daemonInfo(home).pid;
      expect(newDaemon).not.toBe(oldDaemon);
      // Everything that mentions this ABX_HOME is the new daemon, its warm-pool sandboxes, or a
      // process of a sandbox the registry lists as running: no process is left without an owner.
      const running = new Set(
        (await Sandbox.list({ home, state: 'running' })).map((s) => s.sandboxId),
      );
      const pooled = new Set(
        (await Sandbox.list({ home, state: 'pooled' }).catch(() => [])).map((s) => s.sandboxId),
      );
      for (const pid of processesMentioning(home)) {
        if (pid === newDaemon) continue;
        const cmdline = readCmdline(pid);
        const id = /sandboxes\/([a-z0-9]+)/.exec(cmdline)?.[1];
        expect(id, `pid ${pid}: ${cmdline}`).toBeTypeOf('string');
        expect(running.has(id as string) || pooled.has(id as string), cmdline).toBe(true);
      }
      // The adopted sandbox kept its processes: adoption did not restart it.
      for (const pid of before) expect(sandboxPids().has(pid)).toBe(true);
    } finally {
      await live.kill();
    }
  });
});

function readCmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
  } catch {
    return '';
  }
}
