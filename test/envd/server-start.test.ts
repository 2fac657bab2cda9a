import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, test as base, beforeAll, describe, expect } from 'vitest';
import { EXEC } from '../../runtime/envd/exec.js';
import { ServerStarter, serverStartGroup } from '../../runtime/envd/server-start.js';
import { CORE } from '../../runtime/server/groups/core.js';
import { PROCESS } from '../../runtime/server/groups/process.js';
import { SandboxServer } from '../../runtime/server/server.js';
import {
  type Answer,
  type CallOptions,
  call,
  ensureServerBuilt,
  eventually,
  isAlive,
  ROOT,
  SERVER_BUNDLE,
} from '../server/harness.js';
import { type Event, lines, textOf } from './harness.js';

// envd's command server starts (`/exec/server`, runtime/envd/server-start.ts) served in-process
// with the real dist/runtime/server.cjs: the idle process started ahead, the hand-over of the
// command line and environment, a start afresh when there is none or it does not fit, the refill.

const TOKEN = 'envd-test-token';
const MANIFEST = join(ROOT, 'bench', 'reference', 'add-manifest.cjs');
const sha256 = (file: string) => createHash('sha256').update(readFileSync(file)).digest('hex');
let dir: string;

beforeAll(() => {
  ensureServerBuilt();
  dir = mkdtempSync(join(tmpdir(), 'abx-envd-server-start-'));
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Envd {
  starter: ServerStarter;
  call(path: string, options?: CallOptions): Promise<Answer>;
  /** `POST /exec/server`: the events until the server's `listening` line (or its exit). */
  start(
    body: Record<string, unknown>,
  ): Promise<{ events: Event[]; iterator: AsyncIterator<Event> }>;
}

const test = base.extend<{ envd: Envd }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  envd: async ({}, use) => {
    const starter = new ServerStarter(SERVER_BUNDLE);
    const server = new SandboxServer({
      token: TOKEN,
      catalog: [CORE, PROCESS, EXEC, serverStartGroup(starter)],
    });
    const { host, port } = await server.start();
    const url = `http://${host}:${port}`;
    const aborts: AbortController[] = [];
    try {
      await use({
        starter,
        call: (path, options = {}) => call(url, path, { token: TOKEN, ...options }),
        start: async (body) => {
          const abort = new AbortController();
          aborts.push(abort);
          const response = await request(`${url}/exec/server`, {
            method: 'POST',
            headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
            body: JSON.stringify(body),
            signal: abort.signal,
          });
          if (response.statusCode !== 200) {
            throw new Error(`answered ${response.statusCode}: ${await response.body.text()}`);
          }
          const iterator = lines(response.body)[Symbol.asyncIterator]();
          const events: Event[] = [];
          for (;;) {
            const next = await iterator.next();
            if (next.done) break;
            events.push(next.value);
            if ('exit' in next.value || textOf(events, 'stdout').includes('"listening"')) break;
          }
          return { events, iterator };
        },
      });
    } finally {
      for (const abort of aborts) abort.abort();
      starter.stop();
      // Kills every server the test started (they are in its process table).
      await server.stop();
    }
  },
});

/** A server's arguments: the bench's `add` manifest, on a free port and a socket of its own. */
function serverArgs(name: string, extra: string[] = []): string[] {
  return [
    ...['--port', '0', '--socket', join(dir, `${name}.sock`)],
    ...['--load', MANIFEST, ...extra],
  ];
}

/** The `listening` line's address. */
function listening(events: Event[]): { port: number; pid: number } {
  const line = textOf(events, 'stdout')
    .split('\n')
    .find((l) => l.startsWith('{"event":"listening"'));
  if (!line) throw new Error(`no listening line: ${JSON.stringify(events)}`);
  return JSON.parse(line);
}

async function callAdd(port: number, token: string): Promise<unknown> {
  const answer = await call(`http://127.0.0.1:${port}`, '/commands/add', {
    token,
    body: { x: 40 },
  });
  return answer.json;
}

describe('POST /exec/server', () => {
  test('takes the idle process: started ahead, unlisted until then, then the server with its command line', async ({
    envd,
  }) => {
    const prestart = await envd.call('/exec/server/prestart', { body: {} });
    const idle = prestart.json.idle as { pid: number; ready: boolean };
    expect(idle.ready).toBe(true);
    expect((await envd.call('/exec/server')).json).toEqual({ idle });
    // Idle, it is nobody's process.
    expect((await envd.call('/process')).json.processes).toEqual([]);

    const { events } = await envd.start({
      args: serverArgs('taken'),
      command: 'node server.cjs (taken)',
      env: { ABX_SERVER_TOKEN: 'token-1', GREETING: 'hello' },
    });
    expect(events[0].prestarted).toBe(true);
    expect(events[0].start).toMatchObject({ pid: idle.pid, command: 'node server.cjs (taken)' });
    const { port, pid } = listening(events);
    expect(pid).toBe(idle.pid);
    expect(await callAdd(port, 'token-1')).toEqual({ result: 42 });
    // The environment the start asked for, not the one the process started with.
    const env = await call(`http://127.0.0.1:${port}`, '/system/env', { token: 'token-1' });
    expect(env.json.env.GREETING).toBe('hello');
    const listed = (await envd.call('/process')).json.processes;
    expect(listed.map((p: { pid: number; running: boolean }) => [p.pid, p.running])).toEqual([
      [idle.pid, true],
    ]);
  });

  test('a moment after a start, the next idle process is ready, and the next start takes it', async ({
    envd,
  }) => {
    const first = await envd.start({
      args: serverArgs('first'),
      env: { ABX_SERVER_TOKEN: 'token-1' },
    });
    // No idle process yet: started afresh.
    expect(first.events[0].prestarted).toBe(false);
    await eventually(() => envd.starter.status()?.ready === true);
    const next = envd.starter.status()?.pid;
    const second = await envd.start({
      args: serverArgs('second'),
      env: { ABX_SERVER_TOKEN: 'token-2' },
    });
    expect(second.events[0].prestarted).toBe(true);
    expect(listening(second.events).pid).toBe(next);
    expect(await callAdd(listening(second.events).port, 'token-2')).toEqual({ result: 42 });
    expect(await callAdd(listening(first.events).port, 'token-1')).toEqual({ result: 42 });
  });

  test('an idle process started with other startup variables is not used: the server starts afresh', async ({
    envd,
  }) => {
    const idle = (await envd.call('/exec/server/prestart', { body: {} })).json.idle;
    const { events } = await envd.start({
      args: serverArgs('node-options'),
      env: { ABX_SERVER_TOKEN: 'token-1', NODE_OPTIONS: '--max-old-space-size=200' },
    });
    expect(events[0].prestarted).toBe(false);
    expect(listening(events).pid).not.toBe(idle.pid);
    await eventually(() => !isAlive(idle.pid));
    const { port } = listening(events);
    expect(await callAdd(port, 'token-1')).toEqual({ result: 42 });
  });

  test('the bundle check still refuses a file with other contents (exit 3), in the idle process too', async ({
    envd,
  }) => {
    await envd.call('/exec/server/prestart', { body: {} });
    const { events } = await envd.start({
      args: serverArgs('refused', ['--load-sha256', '0'.repeat(64)]),
      env: { ABX_SERVER_TOKEN: 'token-1' },
    });
    expect(events[0].prestarted).toBe(true);
    expect(events.at(-1).exit.code).toBe(3);
    expect(textOf(events, 'stderr')).toContain(
      `does not have the expected SHA-256 ${'0'.repeat(64)}`,
    );
  });

  test('an authoring half nobody has is refused with exit 4, naming where it looked', async ({
    envd,
  }) => {
    const { events } = await envd.start({
      args: serverArgs('authoring', [
        '--load-sha256',
        sha256(MANIFEST),
        ...['--authoring', join(dir, 'missing.cjs'), '--authoring-sha256', 'f'.repeat(64)],
      ]),
      env: { ABX_SERVER_TOKEN: 'token-1' },
    });
    expect(events.at(-1).exit.code).toBe(4);
    expect(textOf(events, 'stderr')).toContain(`${join(dir, 'missing.cjs')}: ENOENT`);
  });

  test('bad requests are refused before anything starts', async ({ envd }) => {
    for (const body of [{}, { args: 'x' }, { args: [], env: { 'A B': 'x' } }, { args: [1] }]) {
      expect((await envd.call('/exec/server', { body })).status).toBe(400);
    }
    expect(envd.starter.status()).toBeNull();
  });
});

describe('server.cjs --prestart', () => {
  test('exits when its stdin ends before a command line comes (envd went away)', async () => {
    const child = spawn(process.execPath, [SERVER_BUNDLE, '--prestart'], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    try {
      let out = '';
      child.stdout.on('data', (chunk: Buffer) => {
        out += chunk.toString();
      });
      await eventually(() => out.includes('"event":"prestarted"'));
      const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
      child.stdin.end();
      expect(await exited).toBe(0);
    } finally {
      child.kill('SIGKILL');
    }
  });

  test('a command line that is not JSON is a bad command line (exit 2)', async () => {
    const child = spawn(process.execPath, [SERVER_BUNDLE, '--prestart'], {
      stdio: ['pipe', 'ignore', 'pipe'],
    });
    try {
      let err = '';
      child.stderr.on('data', (chunk: Buffer) => {
        err += chunk.toString();
      });
      const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
      child.stdin.end('not json\n');
      expect(await exited).toBe(2);
      expect(err).toContain("--prestart: stdin's first line is not JSON");
    } finally {
      child.kill('SIGKILL');
    }
  });
});
