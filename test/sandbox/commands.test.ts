import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, test as base, beforeAll, describe, expect } from 'vitest';
import { ENVD_PORT } from '../../runtime/protocol/constants.js';
import {
  CommandExitError,
  CommandTimeoutError,
  InvalidArgumentError,
  SandboxError,
  TimeoutError,
} from '../../src/errors.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { eventually } from '../server/harness.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
beforeAll(async () => {
  abx = await createAbxHome();
});
afterAll(() => abx?.close());

/** Each test gets a sandbox of its own, killed afterwards (with everything running in it). */
const test = base.extend<{ sandbox: Sandbox }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  sandbox: async ({}, use) => {
    const sandbox = await Sandbox.create({ home: abx.home });
    try {
      await use(sandbox);
    } finally {
      await sandbox.kill().catch(() => false);
    }
  },
});

describe('commands.run', () => {
  test('callbacks get stdout and stderr apart, live and in order', async ({ sandbox }) => {
    const out: string[] = [];
    const err: string[] = [];
    let release: Promise<unknown> | undefined;
    // The command waits for a file that only the stdout callback creates: it cannot finish
    // unless the callback saw "ready" while the command was still running.
    const result = await sandbox.commands.run(
      'for i in 1 2 3; do echo out$i; echo err$i >&2; done; echo ready; while [ ! -e go ]; do sleep 0.05; done; echo done',
      {
        onStdout: (data) => {
          out.push(data);
          if (out.join('').includes('ready')) release ??= sandbox.files.write('go', '');
        },
        onStderr: (data) => err.push(data),
      },
    );
    await release;
    expect(out.join('')).toBe('out1\nout2\nout3\nready\ndone\n');
    expect(err.join('')).toBe('err1\nerr2\nerr3\n');
    expect(result).toEqual({ stdout: out.join(''), stderr: err.join(''), exitCode: 0 });
  });

  test('a callback that throws makes run reject with its error', async ({ sandbox }) => {
    const failing = sandbox.commands.run('echo hi', {
      onStdout: () => {
        throw new RangeError('callback failed');
      },
    });
    await expect(failing).rejects.toThrow(RangeError);
  });

  test('cwd and envs apply to the command', async ({ sandbox }) => {
    const { stdout } = await sandbox.commands.run('pwd; echo "$GREETING"', {
      cwd: '/tmp',
      envs: { GREETING: 'hi there' },
    });
    expect(stdout).toBe('/tmp\nhi there\n');
  });

  test('a non-zero exit throws CommandExitError with the result', async ({ sandbox }) => {
    const failing = 'echo out; echo err >&2; exit 3';
    const error = await sandbox.commands.run(failing).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandExitError);
    expect((error as CommandExitError).result).toEqual({
      stdout: 'out\n',
      stderr: 'err\n',
      exitCode: 3,
    });
    const allowed = await sandbox.commands.run(failing, { allowNonZeroExit: true });
    expect(allowed).toEqual({ stdout: 'out\n', stderr: 'err\n', exitCode: 3 });
  });

  test('a timeout kills the process group and keeps the partial output', async ({ sandbox }) => {
    const error = await sandbox.commands
      .run('sleep 300 & echo $! > child.pid; echo partial; echo oops >&2; sleep 300', {
        timeoutMs: 500,
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandTimeoutError);
    expect(error).toBeInstanceOf(TimeoutError);
    expect((error as CommandTimeoutError).result).toMatchObject({
      stdout: 'partial\n',
      stderr: 'oops\n',
      exitCode: 137,
    });
    // The background sleep was in the same group, so it is gone too.
    const probe = 'kill -0 "$(cat child.pid)" 2>/dev/null && echo alive || echo gone';
    await eventually(async () => (await sandbox.commands.run(probe)).stdout === 'gone\n');
  });
});

describe('who runs commands', () => {
  test('a sandbox runs everything as its user; envd refuses to run anything as root', async ({
    sandbox,
  }) => {
    expect((await sandbox.commands.run('id -u; id -un')).stdout).toBe('1000\nuser\n');
    // Asking envd itself (through the gateway, with the sandbox's token) for another user.
    const { gatewayUrl } = JSON.parse(readFileSync(join(abx.home, 'daemon.json'), 'utf8'));
    const answer = await request(`${gatewayUrl}/process/exec`, {
      method: 'POST',
      headers: {
        'x-sandbox-id': sandbox.sandboxId,
        'x-sandbox-port': String(ENVD_PORT),
        'x-access-token': sandbox.accessToken,
        'content-type': 'application/json',
      },
      body: JSON.stringify({ cmd: 'id -u', user: 'root' }),
    });
    expect(answer.statusCode).toBe(403);
    expect(await answer.body.json()).toMatchObject({
      type: 'PermissionDeniedError',
      error: expect.stringContaining('runs as uid 1000; it cannot run processes as root'),
    });
  });
});

describe('commands.start', () => {
  test('sendStdin, closeStdin, wait', async ({ sandbox }) => {
    const seen: string[] = [];
    const handle = await sandbox.commands.start('cat; echo closed >&2', {
      onStdout: (data) => seen.push(data),
    });
    await handle.sendStdin('hello ');
    await handle.sendStdin('world\n');
    await handle.closeStdin();
    const result = await handle.wait();
    expect(result).toEqual({ stdout: 'hello world\n', stderr: 'closed\n', exitCode: 0 });
    expect(seen.join('')).toBe('hello world\n');
    await expect(handle.sendStdin('late')).rejects.toBeInstanceOf(InvalidArgumentError);
  });

  test('kill ends the command; wait reports the signal', async ({ sandbox }) => {
    const handle = await sandbox.commands.start('echo started; sleep 300', { timeoutMs: 0 });
    await eventually(() => handle.stdout === 'started\n');
    expect(await handle.kill()).toBe(true);
    const error = await handle.wait().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandExitError);
    expect((error as CommandExitError).result).toEqual({
      stdout: 'started\n',
      stderr: '',
      exitCode: 137,
      error: 'killed by SIGKILL',
    });
    expect(await sandbox.commands.kill('p999')).toBe(false);
  });

  test('list shows background processes with their state', async ({ sandbox }) => {
    const sleeper = await sandbox.commands.start('sleep 300', { timeoutMs: 0 });
    const quick = await sandbox.commands.start('exit 4');
    await quick.wait().catch(() => undefined);
    const listed = await sandbox.commands.list();
    expect(listed.find((p) => p.pid === sleeper.pid)).toMatchObject({
      cmd: 'sleep 300',
      cwd: '/home/user',
      running: true,
      exitCode: null,
    });
    expect(listed.find((p) => p.pid === quick.pid)).toMatchObject({
      cmd: 'exit 4',
      running: false,
      exitCode: 4,
    });
  });
});

describe('commands.connect', () => {
  test('another client replays the output from the start and follows to the end', async ({
    sandbox,
  }) => {
    const first = await sandbox.commands.start(
      'echo before; echo e1 >&2; read x; echo "after $x"; echo e2 >&2',
    );
    await eventually(() => first.stdout === 'before\n' && first.stderr === 'e1\n');
    const other = await Sandbox.connect(sandbox.sandboxId, { home: abx.home });
    const seen: string[] = [];
    const attached = await other.commands.connect(first.pid, {
      onStdout: (data) => seen.push(data),
    });
    // Replayed although it was written before this client attached.
    await eventually(() => attached.stdout === 'before\n');
    await first.sendStdin('go\n');
    const result = await attached.wait();
    expect(result).toEqual({ stdout: 'before\nafter go\n', stderr: 'e1\ne2\n', exitCode: 0 });
    expect(seen.join('')).toBe(result.stdout);
    expect(await first.wait()).toEqual(result);
    const fromOffset = await other.commands.connect(first.pid, { stdoutOffset: 7 });
    expect((await fromOffset.wait()).stdout).toBe('after go\n');
  });

  test('disconnect stops following; the command runs on and can be reattached', async ({
    sandbox,
  }) => {
    const handle = await sandbox.commands.start('echo one; read x; echo two');
    await eventually(() => handle.stdout === 'one\n');
    handle.disconnect();
    await expect(handle.wait()).rejects.toThrow(/disconnect\(\) was called/);
    await handle.sendStdin('\n');
    const again = await sandbox.commands.connect(handle.pid);
    expect((await again.wait()).stdout).toBe('one\ntwo\n');
  });

  test('onStdoutBytes and onStderrBytes get the bytes as written, the text is decoded from them; sendStdin takes bytes', async ({
    sandbox,
  }) => {
    const script =
      "printf '\\377\\376\\000A'; printf 'e\\342\\202' >&2; sleep 0.2; printf '\\254\\342' >&2";
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    const text: string[] = [];
    const result = await sandbox.commands.run(script, {
      onStdoutBytes: (data) => out.push(data),
      onStderrBytes: (data) => err.push(data),
      onStderr: (data) => text.push(data),
    });
    expect(Buffer.concat(out)).toEqual(Buffer.from([0xff, 0xfe, 0x00, 0x41]));
    expect(Buffer.concat(err)).toEqual(Buffer.from([0x65, 0xe2, 0x82, 0xac, 0xe2]));
    // The euro sign split across writes is whole; the lone lead byte at the end is U+FFFD.
    expect(result).toEqual({ stdout: '\uFFFD\uFFFD\u0000A', stderr: 'e€\uFFFD', exitCode: 0 });
    expect(text.join('')).toBe(result.stderr);
    // Without a bytes callback the text is envd's, the same.
    expect(await sandbox.commands.run(script)).toEqual(result);
    const handle = await sandbox.commands.start(
      "head -c 200000 /dev/zero | tr '\\0' x | sed 's/x/€/g'",
    );
    const replayed: Uint8Array[] = [];
    const again = await sandbox.commands.connect(handle.pid, {
      onStdoutBytes: (data) => replayed.push(data),
    });
    const long = await again.wait();
    expect(long.stdout).toBe('€'.repeat(200_000));
    expect(Buffer.concat(replayed)).toEqual(Buffer.from('€'.repeat(200_000)));
    expect(replayed.length).toBeGreaterThan(1);
    const cat = await sandbox.commands.start('od -An -tx1');
    await cat.sendStdin(new Uint8Array([0xff, 0xfe, 0x00, 0x41]));
    await cat.closeStdin();
    expect((await cat.wait()).stdout.trim()).toBe('ff fe 00 41');
  });

  test('an unknown pid is an error', async ({ sandbox }) => {
    await expect(sandbox.commands.connect('p999')).rejects.toThrow(/no process with id 'p999'/);
  });
});

describe('a sandbox killed during a call', () => {
  test('fails run and wait with an error instead of hanging', async ({ sandbox }) => {
    const running = sandbox.commands.run('sleep 300', { timeoutMs: 0 }).catch((e: unknown) => e);
    const handle = await sandbox.commands.start('sleep 301', { timeoutMs: 0 });
    await eventually(async () =>
      (await sandbox.commands.list()).some((p) => p.cmd === 'sleep 300' && p.running),
    );
    await sandbox.kill();
    expect(await running).toBeInstanceOf(SandboxError);
    await expect(handle.wait()).rejects.toBeInstanceOf(SandboxError);
    await expect(sandbox.commands.connect(handle.pid)).rejects.toBeInstanceOf(SandboxError);
  });
});
