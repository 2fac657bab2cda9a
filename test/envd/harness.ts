import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, type Dispatcher, request } from 'undici';
import { test as base } from 'vitest';
import { EXEC } from '../../runtime/envd/exec.js';
import { CORE } from '../../runtime/server/groups/core.js';
import { PROCESS } from '../../runtime/server/groups/process.js';
import { SandboxServer } from '../../runtime/server/server.js';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { type Answer, type CallOptions, call } from '../server/harness.js';

// biome-ignore lint/suspicious/noExplicitAny: events are checked field by field
export type Event = any;

/** envd's process routes served in-process on loopback, with a client for them. */
export interface EnvdUnderTest {
  /** The process that starts envd's commands (their parent). */
  pid: number;
  call(path: string, options?: CallOptions): Promise<Answer>;
  /** Opens an NDJSON route; its events one by one, as they arrive. */
  open(path: string, body?: unknown, signal?: AbortSignal): Promise<AsyncIterator<Event>>;
  /** Every event of an NDJSON route, until the server ends the answer. */
  events(path: string, body?: unknown): Promise<Event[]>;
}

const TOKEN = 'envd-test-token';

/** The parsed lines of an NDJSON body; a stream that ends inside a line is an error. */
export async function* lines(body: AsyncIterable<Buffer>): AsyncGenerator<Event> {
  let pending = '';
  for await (const chunk of body) {
    pending += chunk.toString('utf8');
    const parts = pending.split('\n');
    pending = parts.pop() ?? '';
    for (const part of parts) yield JSON.parse(part);
  }
  if (pending !== '') throw new Error(`the stream ended inside a line: ${pending}`);
}

/** A client of envd's routes at `url` (through `dispatcher`: a Unix socket's agent). */
function clientOf(pid: number, url: string, dispatcher?: Dispatcher): EnvdUnderTest {
  const via = dispatcher ? { dispatcher } : {};
  const open = async (path: string, body?: unknown, signal?: AbortSignal) => {
    const response = await request(`${url}${path}`, {
      method: body === undefined ? 'GET' : 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
      ...(signal ? { signal } : {}),
      ...via,
    });
    if (response.statusCode !== 200) {
      throw new Error(`${path} answered ${response.statusCode}: ${await response.body.text()}`);
    }
    return lines(response.body)[Symbol.asyncIterator]();
  };
  return {
    pid,
    call: (path, options = {}) => call(url, path, { token: TOKEN, ...via, ...options }),
    open,
    events: async (path, body) => {
      const all: Event[] = [];
      const iterator = await open(path, body);
      for (let next = await iterator.next(); !next.done; next = await iterator.next()) {
        all.push(next.value);
      }
      return all;
    },
  };
}

/**
 * A vitest `test` with an `envd` fixture: a SandboxServer with envd's process groups, stopped
 * after each test (which kills every process the test started), even when the test fails.
 */
export const test = base.extend<{ envd: EnvdUnderTest }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  envd: async ({}, use) => {
    const server = new SandboxServer({ token: TOKEN, catalog: [CORE, PROCESS, EXEC] });
    const { host, port } = await server.start();
    try {
      await use(clientOf(process.pid, `http://${host}:${port}`));
    } finally {
      await server.stop();
    }
  },
});

/** envd's front as `npm run build` leaves it (absent where cargo was not). */
export const FRONT_BINARY = join(ROOT, 'dist', 'runtime', 'envd-front');

/** How long the front's Node envd waits idle before it sleeps, in {@link startFront}. */
export const FRONT_NODE_IDLE_MS = 1000;

/** A front with Node's envd behind it (the built programs), on a Unix socket of a new folder. */
export interface FrontUnderTest {
  dir: string;
  socket: string;
  front: ChildProcess;
  agent: Agent;
  stderr(): string;
  /** Every process it started (Node's envd, commands and theirs) and itself: gone. */
  stop(): Promise<void>;
}

/** Every descendant of `pid` (its children's, through every thread's children file). */
export function descendants(pid: number): number[] {
  const found: number[] = [];
  const walk = (at: number) => {
    let tasks: string[] = [];
    try {
      tasks = readdirSync(`/proc/${at}/task`);
    } catch {
      return;
    }
    for (const task of tasks) {
      let kids = '';
      try {
        kids = readFileSync(`/proc/${at}/task/${task}/children`, 'utf8');
      } catch {
        continue;
      }
      for (const kid of kids.split(/\s+/).filter(Boolean).map(Number)) {
        found.push(kid);
        walk(kid);
      }
    }
  };
  walk(pid);
  return found;
}

/**
 * Starts envd's front (the built binary) with the built Node envd behind it, as the local
 * provider does in a sandbox: the tokens in a file it empties, Node's envd on a socket of its
 * own with `--idle-exit-ms` {@link FRONT_NODE_IDLE_MS} and `--log-stdout`. Resolves once it
 * answers `/health`.
 */
export async function startFront(extra: { capabilities?: string } = {}): Promise<FrontUnderTest> {
  ensureBuilt();
  const dir = mkdtempSync(join(tmpdir(), 'abx-front-'));
  mkdirSync(join(dir, 'ports'));
  writeFileSync(join(dir, 'token'), `${CLIENT_TOKEN}\n${TOKEN}\n`, { mode: 0o600 });
  const socket = join(dir, 'envd.sock');
  const capabilities = extra.capabilities ? ['--capabilities', extra.capabilities] : [];
  const front = spawn(
    FRONT_BINARY,
    [
      '--socket',
      socket,
      '--token-file',
      join(dir, 'token'),
      ...capabilities,
      '--template',
      'front-test',
      '--',
      process.execPath,
      join(ROOT, 'dist', 'runtime', 'envd.cjs'),
      '--socket',
      join(dir, 'envd-node.sock'),
      '--ports-dir',
      join(dir, 'ports'),
      '--token-file',
      '-',
      ...capabilities,
      '--template',
      'front-test',
      '--idle-exit-ms',
      String(FRONT_NODE_IDLE_MS),
      '--log-stdout',
    ],
    { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let stderr = '';
  front.stderr?.on('data', (chunk) => {
    stderr += chunk;
  });
  front.stdout?.resume();
  const agent = new Agent({ connect: { socketPath: socket } });
  const stop = async () => {
    const all = [...descendants(front.pid as number)];
    for (const pid of [front.pid as number, ...all]) {
      try {
        // Each command leads a session of its own: its group goes with it.
        process.kill(-pid, 'SIGKILL');
      } catch {
        // not a group leader, or gone
      }
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    if (front.exitCode === null && front.signalCode === null) await once(front, 'exit');
    await agent.close();
    rmSync(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (front.exitCode !== null) {
      await stop();
      throw new Error(`envd-front exited ${front.exitCode}: ${stderr}`);
    }
    if (existsSync(socket)) {
      const health = await request('http://envd/health', { dispatcher: agent }).catch(
        () => undefined,
      );
      if (health?.statusCode === 200) {
        await health.body.text();
        break;
      }
    }
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`envd-front did not answer within 10 s: ${stderr}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  return { dir, socket, front, agent, stderr: () => stderr, stop };
}

/** The client token {@link startFront} gives the front (limited to its capabilities). */
export const CLIENT_TOKEN = 'envd-test-client-token';

/** The same fixture as {@link test}, on envd's front with Node's envd behind it. */
export const frontTest = base.extend<{ envd: EnvdUnderTest }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  envd: async ({}, use) => {
    const front = await startFront();
    try {
      await use(clientOf(front.front.pid as number, 'http://envd', front.agent));
    } finally {
      await front.stop();
    }
  },
});

/** The text of one stream, from output events. */
export function textOf(events: readonly Event[], stream: 'stdout' | 'stderr'): string {
  return events
    .filter((e) => e.stream === stream && 'data' in e)
    .map((e) => e.data)
    .join('');
}
