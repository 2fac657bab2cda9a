import { createHash } from 'node:crypto';
import { Agent } from 'node:http';
import {
  AuthenticationError,
  CommandExitError,
  type Sandbox as E2bSandbox,
  SandboxError,
  TimeoutError,
} from 'e2b';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../../src/index.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { attach as attachTo } from './attach.js';
import { type RawAnswer, rawRequest } from './raw-request.js';

// The unmodified `e2b` SDK drives processes of a real abx sandbox through the daemon's gateway
// (E2B_SANDBOX_URL mode: one URL, the sandbox named by E2b-Sandbox-Id/-Port headers). The
// sandbox is created natively: the E2B control API is another slice, so the E2B object is made
// the way its `Sandbox.connect` makes it, without the API call.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let native: Sandbox;
let gateway: string;
let sbx: E2bSandbox;

function attach(sandboxId: string, token: string): E2bSandbox {
  return attachTo(gateway, sandboxId, token);
}

/** One raw request to the gateway, as an E2B SDK would address it. */
function raw(
  path: string,
  body: Buffer | string,
  headers: Record<string, string>,
  token = native.accessToken,
  agent: Agent | false = false,
  method = 'POST',
): Promise<RawAnswer> {
  return rawRequest(gateway, {
    method,
    path,
    agent,
    body,
    headers: {
      'e2b-sandbox-id': native.sandboxId,
      'e2b-sandbox-port': '49983',
      'x-access-token': token,
      'connect-protocol-version': '1',
      ...headers,
    },
  });
}

/** A Connect stream request's one envelope. */
function envelope(json: unknown, flag = 0): Buffer {
  const data = Buffer.from(JSON.stringify(json));
  const out = Buffer.alloc(5 + data.length);
  out[0] = flag;
  out.writeUInt32BE(data.length, 1);
  data.copy(out, 5);
  return out;
}

/** The envelopes of a Connect stream answer; throws when the stream is not well framed. */
function envelopes(body: Buffer): { flag: number; json: Record<string, unknown> }[] {
  const out: { flag: number; json: Record<string, unknown> }[] = [];
  let pos = 0;
  while (pos < body.length) {
    if (body.length - pos < 5) throw new Error('a truncated envelope header');
    const flag = body[pos] as number;
    const length = body.readUInt32BE(pos + 1);
    const end = pos + 5 + length;
    if (end > body.length) throw new Error('a truncated envelope');
    out.push({ flag, json: JSON.parse(body.toString('utf8', pos + 5, end)) });
    pos = end;
  }
  return out;
}

/** The end-stream error of a stream answer (the last envelope, flag 2). */
function streamError(answer: RawAnswer): { code: string; message: string } | undefined {
  expect(answer.status).toBe(200);
  const all = envelopes(answer.body);
  const last = all.at(-1);
  expect(last?.flag).toBe(2);
  return (last?.json as { error?: { code: string; message: string } } | undefined)?.error;
}

async function waitUntil(check: () => Promise<boolean>, what: string, ms = 60_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`${what} did not happen within ${ms / 1000} s`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

beforeAll(async () => {
  abx = await createAbxHome();
  native = await Sandbox.create({ home: abx.home });
  gateway = new URL(native.getUrl(49983)).origin;
  sbx = attach(native.sandboxId, native.accessToken);
}, 300_000);

afterAll(async () => {
  await native?.kill().catch(() => undefined);
  await abx?.close();
});

describe('commands through the e2b SDK', () => {
  test('run: stdout, stderr and exit code 0', async () => {
    const result = await sbx.commands.run('echo out; echo err >&2');
    expect(result).toMatchObject({ exitCode: 0, stdout: 'out\n', stderr: 'err\n' });
  });

  test('a non-zero exit is a CommandExitError with the output', async () => {
    const failure = await sbx.commands.run('echo partial; exit 3').catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(CommandExitError);
    expect(failure).toMatchObject({ exitCode: 3, stdout: 'partial\n' });
    expect((failure as CommandExitError).error).toBe('exit status 3');
  });

  test('envs, cwd and the user', async () => {
    const result = await sbx.commands.run('echo "$GREETING"; pwd', {
      envs: { GREETING: "it's a quote" },
      cwd: '/tmp',
      user: 'user',
    });
    expect(result.stdout).toBe("it's a quote\n/tmp\n");
  });

  test('user root is refused with permission_denied saying why, and nothing runs', async () => {
    const failure = await sbx.commands
      .run('touch /tmp/ran-as-root', { user: 'root' })
      .catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(SandboxError);
    expect((failure as Error).message).toMatch(
      /permission_denied.*never runs a sandbox's processes as root/,
    );
    const check = await sbx.commands.run('test -e /tmp/ran-as-root || echo absent');
    expect(check.stdout).toBe('absent\n');
  });

  test('background, connect and wait', async () => {
    const handle = await sbx.commands.run('sleep 1; echo done', { background: true });
    expect(handle.pid).toBeGreaterThan(0);
    const again = await sbx.commands.connect(handle.pid);
    const result = await again.wait();
    expect(result.stdout).toBe('done\n');
    expect((await handle.wait()).exitCode).toBe(0);
  });

  test('a command silent for longer than an idle connection lives still completes', async () => {
    const result = await sbx.commands.run('sleep 7; echo awake');
    expect(result.stdout).toBe('awake\n');
  });

  test('sendStdin and closeStdin', async () => {
    const handle = await sbx.commands.run('cat; echo "<eof>"', { background: true, stdin: true });
    await sbx.commands.sendStdin(handle.pid, 'hello\n');
    await sbx.commands.closeStdin(handle.pid);
    const result = await handle.wait();
    expect(result.stdout).toBe('hello\n<eof>\n');
  });

  test('list shows a running command as E2B started it; kill ends it; an unknown pid is false', async () => {
    const handle = await sbx.commands.run('sleep 120', { background: true, timeoutMs: 0 });
    const listed = await sbx.commands.list();
    expect(listed).toContainEqual(
      expect.objectContaining({
        pid: handle.pid,
        cmd: '/bin/bash',
        args: ['-l', '-c', 'sleep 120'],
      }),
    );
    expect(await sbx.commands.kill(handle.pid)).toBe(true);
    const ended = await handle.wait().catch((e: unknown) => e);
    expect(ended).toBeInstanceOf(CommandExitError);
    expect(ended).toMatchObject({ exitCode: -1, error: 'signal: killed' });
    expect((await sbx.commands.list()).map((p) => p.pid)).not.toContain(handle.pid);
    expect(await sbx.commands.kill(handle.pid)).toBe(false);
    expect(await sbx.commands.kill(4_000_000)).toBe(false);
  });

  test('timeoutMs (Connect-Timeout-Ms) ends the call with TimeoutError and the process is gone', async () => {
    const handle = await sbx.commands.run('sleep 300', { background: true, timeoutMs: 1500 });
    const failure = await handle.wait().catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(TimeoutError);
    await waitUntil(
      async () => !(await sbx.commands.list()).some((p) => p.pid === handle.pid),
      'the timed-out process ending',
    );
    const native = await sbx.commands.run(`kill -0 ${handle.pid} 2>/dev/null || echo gone`);
    expect(native.stdout).toBe('gone\n');
  });
});

describe('the Start stream on the wire', () => {
  test('start first, keepalives per Keepalive-Ping-Interval, output, end, then the end-stream message', async () => {
    const answer = await raw(
      '/process.Process/Start',
      envelope({
        process: { cmd: '/bin/sh', args: ['-c', 'sleep 2.5; printf done'] },
        stdin: false,
      }),
      { 'content-type': 'application/connect+json', 'keepalive-ping-interval': '1' },
    );
    expect(answer.status).toBe(200);
    expect(answer.type).toBe('application/connect+json');
    const all = envelopes(answer.body);
    const events = all.slice(0, -1).map((e) => Object.keys((e.json.event ?? {}) as object)[0]);
    expect(events[0]).toBe('start');
    expect(events.filter((e) => e === 'keepalive').length).toBeGreaterThanOrEqual(1);
    expect(events.at(-2)).toBe('data');
    expect(events.at(-1)).toBe('end');
    const data = all.at(-3)?.json.event as { data: { stdout: string } };
    expect(Buffer.from(data.data.stdout, 'base64').toString()).toBe('done');
    expect(all.at(-2)?.json.event).toMatchObject({
      end: { exited: true, status: 'exit status 0' },
    });
    expect(all.at(-1)).toEqual({ flag: 2, json: {} });
  });
});

describe('a Start runs the program itself, as E2B’s envd does', () => {
  test('each argument arrives literally, and the pid E2B sees is the program’s', async () => {
    const answer = await raw(
      '/process.Process/Start',
      envelope({
        process: { cmd: 'sh', args: ['-c', 'printf "%s|" "$@" "$$"', 'sh', 'a b', '$HOME', '*'] },
        stdin: false,
      }),
      { 'content-type': 'application/connect+json' },
    );
    const start = envelopes(answer.body)[0]?.json.event as { start: { pid: number } };
    expect(stdoutBytes(answer).toString()).toBe(`a b|$HOME|*|${start.start.pid}|`);
  });

  test('List shows a running program’s cmd and args as they were given', async () => {
    const handle = await sbx.commands.run('sleep 30', { background: true });
    try {
      const listed = await sbx.commands.list();
      const mine = listed.find((p) => p.pid === handle.pid);
      expect(mine).toMatchObject({ cmd: '/bin/bash', args: ['-l', '-c', 'sleep 30'] });
    } finally {
      await handle.kill();
    }
  });

  test('a program that cannot be started is invalid_argument naming it, nothing runs', async () => {
    const answer = await raw(
      '/process.Process/Start',
      envelope({ process: { cmd: '/no/such/program', args: [] }, stdin: false }),
      { 'content-type': 'application/connect+json' },
    );
    expect(streamError(answer)).toMatchObject({
      code: 'invalid_argument',
      message: expect.stringMatching(/cannot start \/no\/such\/program: .*ENOENT/),
    });
    // Through the SDK (a login shell runs the line), a missing command is the shell's exit 127.
    await expect(sbx.commands.run('no-such-command-here')).rejects.toMatchObject({
      exitCode: 127,
    });
  });
});

/** The stdout bytes of a Start or Connect stream answer (its `data.stdout` fields decoded). */
function stdoutBytes(answer: RawAnswer): Buffer {
  expect(streamError(answer)).toBeUndefined();
  const pieces = envelopes(answer.body)
    .map((e) => (e.json.event as { data?: { stdout?: string } } | undefined)?.data?.stdout)
    .filter((data): data is string => data !== undefined);
  return Buffer.concat(pieces.map((data) => Buffer.from(data, 'base64')));
}

/** A raw Start of `sh -c script`, its stdin closed. */
function startRaw(script: string): Promise<RawAnswer> {
  return raw(
    '/process.Process/Start',
    envelope({ process: { cmd: '/bin/sh', args: ['-c', script] }, stdin: false }),
    { 'content-type': 'application/connect+json' },
  );
}

describe('output bytes that are not UTF-8 (E2B sends protobuf bytes)', () => {
  const NOT_UTF8 = Buffer.from([0xff, 0xfe, 0x00, 0x41]);
  const PRINT = "printf '\\377\\376\\000A'";

  test('a Start stream carries them byte for byte', async () => {
    expect(stdoutBytes(await startRaw(PRINT))).toEqual(NOT_UTF8);
  });

  test('a Connect stream replays them byte for byte', async () => {
    const handle = await sbx.commands.run(`${PRINT}; sleep 2`, { background: true });
    const answer = await raw(
      '/process.Process/Connect',
      envelope({ process: { pid: handle.pid } }),
      { 'content-type': 'application/connect+json' },
    );
    expect(stdoutBytes(answer)).toEqual(NOT_UTF8);
    expect((await handle.wait()).exitCode).toBe(0);
  });

  test('PTY data is the exact bytes', async () => {
    const chunks: Uint8Array[] = [];
    const terminal = await sbx.pty.create({
      cols: 80,
      rows: 24,
      timeoutMs: 0,
      onData: (data) => {
        chunks.push(data);
      },
    });
    try {
      // The echoed command line is ASCII; only printf's output holds the bytes between X and Y.
      const wanted = Buffer.concat([Buffer.from('X'), NOT_UTF8, Buffer.from('Y')]);
      await sbx.pty.sendInput(
        terminal.pid,
        new TextEncoder().encode("printf 'X\\377\\376\\000AY'\n"),
      );
      await waitUntil(
        async () => Buffer.concat(chunks).includes(wanted),
        'the bytes on the pty',
        30_000,
      );
    } finally {
      await sbx.pty.kill(terminal.pid);
    }
  });

  test("commands.run's strings are what TextDecoder makes of the exact bytes, characters split across chunks included", async () => {
    const result = await sbx.commands.run(`${PRINT}; printf '\\342\\202' >&2`);
    expect(result.stdout).toBe(new TextDecoder().decode(NOT_UTF8));
    expect(result.stderr).toBe('\uFFFD');
    // 600 000 bytes of three-byte characters: envd reads in pieces of up to 64 KiB, which a
    // character straddles, and the SDK's decoder joins them.
    let pieces = 0;
    const long = await sbx.commands.run("head -c 200000 /dev/zero | tr '\\0' x | sed 's/x/€/g'", {
      onStdout: () => void pieces++,
    });
    expect(long.stdout).toBe('€'.repeat(200_000));
    expect(pieces).toBeGreaterThan(1);
  });

  test('SendInput writes bytes that are not UTF-8 to stdin exactly', async () => {
    const file = '/tmp/abx-stdin.bin';
    const handle = await sbx.commands.run(`cat > ${file}`, { background: true, stdin: true });
    const sent = await raw(
      '/process.Process/SendInput',
      JSON.stringify({
        process: { pid: handle.pid },
        input: { stdin: NOT_UTF8.toString('base64') },
      }),
      { 'content-type': 'application/json' },
    );
    expect(sent.status).toBe(200);
    await sbx.commands.closeStdin(handle.pid);
    await handle.wait();
    expect((await sbx.commands.run(`od -An -tx1 ${file}`)).stdout.trim()).toBe('ff fe 00 41');
  });

  test('megabytes of random bytes arrive complete (sha256 from inside the sandbox)', async () => {
    const file = '/tmp/abx-random.bin';
    const answer = await startRaw(`head -c 3000000 /dev/urandom > ${file} && cat ${file}`);
    const got = stdoutBytes(answer);
    expect(got.length).toBe(3_000_000);
    const inside = await sbx.commands.run(`sha256sum ${file}`);
    expect(inside.stdout.split(' ')[0]).toBe(createHash('sha256').update(got).digest('hex'));
  });
});

describe('PTY through the e2b SDK', () => {
  /** An 80x24 terminal and what it has shown so far. */
  async function openTerminal() {
    const shown = { screen: '' };
    const decoder = new TextDecoder();
    const terminal = await sbx.pty.create({
      cols: 80,
      rows: 24,
      timeoutMs: 0,
      onData: (data) => {
        shown.screen += decoder.decode(data, { stream: true });
      },
    });
    return { terminal, shown };
  }

  test('create, input, resize, kill', async () => {
    const { terminal, shown } = await openTerminal();
    await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode('echo $((6*7)); stty size\n'));
    await waitUntil(
      async () => /42[\s\S]*24 80/.test(shown.screen),
      'the answer and size on the pty',
      30_000,
    );
    await sbx.pty.resize(terminal.pid, { cols: 100, rows: 30 });
    await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode('stty size\n'));
    await waitUntil(async () => shown.screen.includes('30 100'), 'the new size on the pty', 30_000);
    expect(await sbx.pty.kill(terminal.pid)).toBe(true);
    const ended = await terminal.wait().catch((e: unknown) => e);
    expect(ended).toMatchObject({ exitCode: -1 });
    expect((await sbx.commands.list()).map((p) => p.pid)).not.toContain(terminal.pid);
  });
  test('a resize sent the moment create returns is the size the shell sees', async () => {
    // The pty is opened by `script` after the start: a resize racing it must not be lost, nor
    // undone by the initial size (CI saw both). Several terminals, to meet the race.
    for (let round = 0; round < 5; round++) {
      const { terminal, shown } = await openTerminal();
      await sbx.pty.resize(terminal.pid, { cols: 101 + round, rows: 31 });
      await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode('stty size\n'));
      await waitUntil(
        async () => shown.screen.includes(`31 ${101 + round}`),
        `the resized size on terminal ${round}`,
        30_000,
      );
      expect(shown.screen).not.toContain('24 80');
      expect(await sbx.pty.kill(terminal.pid)).toBe(true);
    }
  });

  test('resizing a pid that has no pty, or none at all, is a clear error', async () => {
    const plain = await sbx.commands.run('sleep 30', { background: true });
    const noPty = await sbx.pty.resize(plain.pid, { cols: 90, rows: 20 }).catch((e) => e);
    expect(String(noPty)).toContain(`process with pid ${plain.pid} has no pty to resize`);
    await plain.kill();
    const unknown = await sbx.pty.resize(999_999, { cols: 90, rows: 20 }).catch((e) => e);
    expect(unknown).toBeInstanceOf(Error);
    expect(String(unknown)).toContain('999999');
  });
});

describe('Connect errors in the shapes the SDK reads', () => {
  test('a wrong token is unauthenticated: AuthenticationError', async () => {
    const stranger = attach(native.sandboxId, 'x'.repeat(43));
    const failure = await stranger.commands.run('echo hi').catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(AuthenticationError);
    const unary = await raw(
      '/process.Process/List',
      '{}',
      { 'content-type': 'application/json' },
      'wrong',
    );
    expect(unary.status).toBe(401);
    expect(JSON.parse(unary.body.toString())).toMatchObject({ code: 'unauthenticated' });
  });

  test('an unknown method is unimplemented, naming it', async () => {
    const answer = await raw('/process.Process/Teleport', '{}', {
      'content-type': 'application/json',
    });
    expect(answer.status).toBe(501);
    const body = JSON.parse(answer.body.toString());
    expect(body.code).toBe('unimplemented');
    expect(body.message).toContain('process.Process/Teleport');
    const stream = await raw('/process.Process/StreamInput', envelope({}), {
      'content-type': 'application/connect+json',
    });
    expect(streamError(stream)).toMatchObject({ code: 'unimplemented' });
    expect(streamError(stream)?.message).toContain('StreamInput');
  });

  test('a malformed envelope or body is invalid_argument; the connection and daemon go on', async () => {
    // An envelope that announces 100 bytes and brings 3.
    const cut = Buffer.concat([Buffer.from([0, 0, 0, 0, 100]), Buffer.from('{}}')]);
    const answer = await raw('/process.Process/Start', cut, {
      'content-type': 'application/connect+json',
    });
    expect(streamError(answer)?.code).toBe('invalid_argument');
    const notJson = await raw('/process.Process/Start', envelope('x').subarray(0, 5 + 1), {
      'content-type': 'application/connect+json',
    });
    expect(['invalid_argument', 'internal']).toContain(streamError(notJson)?.code);
    const badUnary = await raw('/process.Process/List', '{', {
      'content-type': 'application/json',
    });
    expect(badUnary.status).toBe(400);
    expect(JSON.parse(badUnary.body.toString())).toMatchObject({ code: 'invalid_argument' });
    expect((await sbx.commands.run('echo still here')).stdout).toBe('still here\n');
  });

  test('fuzzed Connect envelopes get a Connect answer, never a hang or a crash', async () => {
    const frame = fc.record({
      flag: fc.constantFrom(0, 1, 2, 0x80, 255),
      lengthDelta: fc.integer({ min: -8, max: 8 }),
      payload: fc.oneof(
        fc.uint8Array({ maxLength: 64 }),
        fc.json().map((text) => new Uint8Array(Buffer.from(text))),
        fc
          .record({ process: fc.record({ pid: fc.integer({ min: -1, max: 5_000_000 }) }) })
          .map((o) => new Uint8Array(Buffer.from(JSON.stringify(o)))),
      ),
    });
    const request = fc.record({
      method: fc.constantFrom('Start', 'Connect', 'List', 'SendSignal', 'Update', 'Nope'),
      streaming: fc.boolean(),
      frames: fc.array(frame, { maxLength: 3 }),
      tail: fc.uint8Array({ maxLength: 6 }),
    });
    await fc.assert(
      fc.asyncProperty(request, async ({ method, streaming, frames, tail }) => {
        const parts: Buffer[] = [];
        for (const f of frames) {
          const head = Buffer.alloc(5);
          head[0] = f.flag;
          head.writeUInt32BE(Math.max(0, f.payload.length + f.lengthDelta), 1);
          parts.push(head, Buffer.from(f.payload));
        }
        parts.push(Buffer.from(tail));
        const answer = await raw(`/process.Process/${method}`, Buffer.concat(parts), {
          'content-type': streaming ? 'application/connect+json' : 'application/json',
        });
        if (answer.type?.startsWith('application/connect+json')) {
          const all = envelopes(answer.body);
          expect(all.at(-1)?.flag).toBe(2);
        } else {
          expect(answer.status).toBeGreaterThanOrEqual(200);
          const body = answer.body.length > 0 ? JSON.parse(answer.body.toString()) : {};
          if (answer.status !== 200) expect(typeof body.code).toBe('string');
        }
      }),
      { seed: 20261202, numRuns: 80 },
    );
    expect((await sbx.commands.run('echo alive')).stdout).toBe('alive\n');
  }, 240_000);

  test('one keep-alive connection mixes E2B calls and native requests', async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const json = { 'content-type': 'application/json' };
      const first = await raw('/process.Process/List', '{}', json, native.accessToken, agent);
      expect(first.status).toBe(200);
      // The native form on the same connection: X-Sandbox-* headers, envd's own route.
      const nativeList = await raw(
        '/process',
        '',
        { 'x-sandbox-id': native.sandboxId, 'x-sandbox-port': '49983' },
        native.accessToken,
        agent,
        'GET',
      );
      expect(nativeList.reused).toBe(true);
      expect(nativeList.status).toBe(200);
      expect(JSON.parse(nativeList.body.toString())).toHaveProperty('processes');
      const again = await raw('/process.Process/List', '{}', json, native.accessToken, agent);
      expect(again.reused).toBe(true);
      expect(again.status).toBe(200);
      // proto3 JSON leaves an empty list out: `{}` when nothing runs.
      expect(JSON.parse(again.body.toString())).toEqual(JSON.parse(first.body.toString()));
    } finally {
      agent.destroy();
    }
  });

  test('GET /health answers 204 for the SDK', async () => {
    const res = await fetch(`${gateway}/health`, {
      headers: {
        'e2b-sandbox-id': native.sandboxId,
        'e2b-sandbox-port': '49983',
        'x-access-token': native.accessToken,
      },
    });
    expect(res.status).toBe(204);
  });
});

describe('a sandbox that dies under a call', () => {
  test('a running command ends with TimeoutError saying so; isRunning() is false; a file call is a TimeoutError', async () => {
    const doomed = await Sandbox.create({ home: abx.home });
    try {
      const theirs = attach(doomed.sandboxId, doomed.accessToken);
      expect(await theirs.isRunning()).toBe(true);
      const sleeping = await theirs.commands.run('sleep 60', { background: true });
      await doomed.kill();
      // E2B's proxy cuts the connection; the SDK asks /health (502) and reports the sandbox gone.
      const ended = await sleeping.wait().catch((e: unknown) => e);
      expect(ended).toBeInstanceOf(TimeoutError);
      expect((ended as Error).message).toContain('sandbox was killed or reached its end of life');
      expect(await theirs.isRunning()).toBe(false);
      await expect(theirs.files.read('/home/user/x')).rejects.toBeInstanceOf(TimeoutError);
    } finally {
      await doomed.kill().catch(() => undefined);
    }
  }, 120_000);
});
