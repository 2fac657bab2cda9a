import { existsSync, readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { afterEach, describe, expect, test } from 'vitest';
import {
  CLIENT_TOKEN,
  descendants,
  FRONT_BINARY,
  FRONT_NODE_IDLE_MS,
  type FrontUnderTest,
  startFront,
} from './harness.js';

// envd's front (native/envd-front) on the host, with the built Node envd behind it: what it
// answers itself, what it leaves to Node's envd, and that the two read as one envd (ids, the
// process list, the environment, the log). The exec contract itself runs on both in exec.test.ts.

const TOKEN = 'envd-test-token';
const fronts: FrontUnderTest[] = [];

afterEach(async () => {
  for (const front of fronts.splice(0)) await front.stop();
});

async function start(extra: { capabilities?: string } = {}): Promise<FrontUnderTest> {
  const front = await startFront(extra);
  fronts.push(front);
  return front;
}

/** Node's envd behind the front, if it runs. */
function nodeEnvd(front: FrontUnderTest): number | undefined {
  return descendants(front.front.pid as number).find((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('envd.cjs');
    } catch {
      return false;
    }
  });
}

/** `check`'s value once it gives one, retried every 20 ms for up to `ms`. */
async function until<T>(check: () => T | undefined, ms = 10_000, what = 'it'): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`${what} did not happen within ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

interface Raw {
  status: number;
  headers: string;
  body: string;
}

/**
 * Requests written as they are on one connection, all at once (pipelined); their answers, read
 * until `count` have come whole (by content-length or chunks).
 */
async function rawRequests(front: FrontUnderTest, text: string, count: number): Promise<Raw[]> {
  const socket = connect(front.socket);
  // A refusal may end the connection (a reset): the answers read by then are what counts.
  socket.on('error', () => undefined);
  const chunks: Buffer[] = [];
  socket.on('data', (chunk) => chunks.push(chunk));
  socket.write(text);
  const parse = (): Raw[] | undefined => {
    const all = Buffer.concat(chunks).toString('latin1');
    const answers: Raw[] = [];
    let at = 0;
    while (answers.length < count) {
      const end = all.indexOf('\r\n\r\n', at);
      if (end < 0) return undefined;
      const headers = all.slice(at, end);
      const status = Number(headers.split(' ')[1]);
      const length = /content-length: (\d+)/i.exec(headers);
      let body = '';
      at = end + 4;
      if (length) {
        body = all.slice(at, at + Number(length[1]));
        if (body.length < Number(length[1])) return undefined;
        at += body.length;
      } else if (/transfer-encoding: chunked/i.test(headers)) {
        for (;;) {
          const line = all.indexOf('\r\n', at);
          if (line < 0) return undefined;
          const size = Number.parseInt(all.slice(at, line), 16);
          if (all.length < line + 2 + size + 2) return undefined;
          body += all.slice(line + 2, line + 2 + size);
          at = line + 2 + size + 2;
          if (size === 0) break;
        }
      }
      answers.push({ status, headers, body });
    }
    return answers;
  };
  try {
    return await until(parse, 10_000, `${count} answers`);
  } finally {
    socket.destroy();
  }
}

const get = (path: string, token = TOKEN) =>
  `GET ${path} HTTP/1.1\r\nhost: envd\r\nauthorization: Bearer ${token}\r\n\r\n`;
const post = (path: string, body: string, token = TOKEN, method = 'POST') =>
  `${method} ${path} HTTP/1.1\r\nhost: envd\r\nauthorization: Bearer ${token}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;

/** The NDJSON lines of an answer's body. */
const events = (raw: Raw) =>
  raw.body
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line));

/** The stdout text of an answer's events. */
const stdoutOf = (raw: Raw) =>
  events(raw)
    .filter((e) => e.stream === 'stdout')
    .map((e) => e.data)
    .join('');

/** Starts a command with POST /exec and reads only its start event; the id. */
async function startOnly(front: FrontUnderTest, body: object): Promise<string> {
  const socket = connect(front.socket);
  socket.on('error', () => undefined);
  let text = '';
  socket.on('data', (chunk) => {
    text += chunk.toString();
  });
  socket.write(post('/exec', JSON.stringify(body)));
  try {
    return await until(() => /"start":\{"id":"(\w+)"/.exec(text)?.[1], 10_000, 'a start event');
  } finally {
    socket.destroy();
  }
}

describe.skipIf(!existsSync(FRONT_BINARY))("envd's front", () => {
  test('answers health, commands, their routes, the log and the environment without starting Node’s envd', async () => {
    const front = await start();
    const [health, ran, env] = await rawRequests(
      front,
      get('/health') +
        post('/exec', JSON.stringify({ cmd: 'echo "$GREETING from $PPID"', stdin: false })) +
        post('/env', JSON.stringify({ env: { GREETING: 'hello' } }), TOKEN, 'PUT'),
      3,
    );
    expect(health?.status).toBe(200);
    expect(JSON.parse(health?.body ?? '')).toEqual({ status: 'ok' });
    const lines = events(ran as Raw);
    expect(lines[0].start).toMatchObject({
      id: 'p1',
      running: true,
      command: 'echo "$GREETING from $PPID"',
    });
    expect(lines.at(-1)).toEqual({ exit: { code: 0, signal: null, timed_out: false } });
    expect(JSON.parse(env?.body ?? '')).toEqual({ set: ['GREETING'] });
    const [again, listed, one, logs] = await rawRequests(
      front,
      post('/exec', JSON.stringify({ cmd: 'echo "$GREETING"', stdin: false })) +
        get('/process') +
        get('/process/p1') +
        get('/logs?after=0'),
      4,
    );
    // The environment set here reaches the next command (as envd's own PUT /env would).
    const started = events(again as Raw);
    expect(started[0].start.id).toBe('p2');
    expect(started.find((e) => e.stream === 'stdout')?.data).toBe('hello\n');
    const processes = JSON.parse(listed?.body ?? '').processes;
    expect(processes.map((p: { id: string }) => p.id)).toEqual(['p1', 'p2']);
    expect(JSON.parse(one?.body ?? '')).toMatchObject({ id: 'p1', running: false, exit_code: 0 });
    const log = JSON.parse(logs?.body ?? '');
    expect(log.entries[0]).toMatchObject({ seq: 1, level: 'info', message: 'envd started' });
    expect(log.entries.map((e: { message: string }) => e.message)).toContain('process sh started');
    expect(nodeEnvd(front)).toBeUndefined();
  });

  test('stdin, kill and a replay reach a process it started; Node’s envd starts for other routes and sleeps again', async () => {
    const front = await start();
    // Long-running: their starts are read, and the clients go (the processes run on).
    expect(await startOnly(front, { cmd: 'cat' })).toBe('p1');
    expect(await startOnly(front, { cmd: 'sleep 30', stdin: false })).toBe('p2');
    const [written, replay] = await rawRequests(
      front,
      post('/process/p1/stdin', JSON.stringify({ data: 'aGkK', encoding: 'base64', eof: true })) +
        get('/exec/p1/events'),
      2,
    );
    expect(JSON.parse(written?.body ?? '')).toEqual({ written: 3 });
    expect(stdoutOf(replay as Raw)).toBe('hi\n');
    expect(nodeEnvd(front)).toBeUndefined();

    // GET /env is Node's: it starts, and has the environment the front runs commands with.
    const [env] = await rawRequests(front, get('/env'), 1);
    expect(env?.status).toBe(200);
    expect(nodeEnvd(front)).toBeDefined();
    // While Node's envd runs, commands are its: ids go on, and the list is both envds'.
    const [byNode, listed] = await rawRequests(
      front,
      post('/exec', JSON.stringify({ cmd: 'echo node', stdin: false })) + get('/process'),
      2,
    );
    expect(events(byNode as Raw)[0].start.id).toBe('p3');
    expect(stdoutOf(byNode as Raw)).toBe('node\n');
    const listing = JSON.parse(listed?.body ?? '').processes;
    expect(listing.map((p: { id: string }) => p.id).sort()).toEqual(['p1', 'p2', 'p3']);
    // The front's own process is still reached through it.
    const [killed, p2] = await rawRequests(
      front,
      post('/process/p2/kill', JSON.stringify({ signal: 'TERM' })) + get('/exec/p2/events'),
      2,
    );
    expect(JSON.parse(killed?.body ?? '')).toMatchObject({ id: 'p2' });
    expect(events(p2 as Raw).at(-1)).toEqual({
      exit: { code: null, signal: 'SIGTERM', timed_out: false },
    });
    // Node's envd sleeps once idle; the front stays, and ids go on past Node's.
    await until(
      () => (nodeEnvd(front) === undefined ? true : undefined),
      FRONT_NODE_IDLE_MS * 20,
      "Node's envd's sleep",
    );
    const [later, log] = await rawRequests(
      front,
      post('/exec', JSON.stringify({ cmd: 'true', stdin: false })) + get('/logs'),
      2,
    );
    expect(events(later as Raw)[0].start.id).toBe('p4');
    const messages = JSON.parse(log?.body ?? '').entries.map((e: { message: string }) => e.message);
    expect(messages).toContain("envd's Node process started");
    expect(messages.some((m: string) => m.startsWith('envd sleeps after'))).toBe(true);
    expect(front.front.exitCode).toBeNull();
  }, 60_000);

  test('a start command’s output goes to the sandbox’s log, a line an entry, without Node’s envd', async () => {
    const front = await start();
    const [ran] = await rawRequests(
      front,
      post(
        '/exec',
        JSON.stringify({ cmd: 'echo one; echo two >&2; printf "three"', log: true, stdin: false }),
      ),
      1,
    );
    const pid = String(events(ran as Raw)[0].start.pid);
    const [logs] = await rawRequests(front, get('/logs'), 1);
    const lines = JSON.parse(logs?.body ?? '').entries.filter(
      (e: { fields: { source?: string } }) => e.fields.source === 'start',
    );
    expect(lines.map((e: { level: string; message: string }) => [e.level, e.message])).toEqual([
      ['info', 'start command started'],
      ['info', 'one'],
      ['error', 'two'],
      ['info', 'three'],
    ]);
    expect(lines.every((e: { fields: { pid: string } }) => e.fields.pid === pid)).toBe(true);
    expect(nodeEnvd(front)).toBeUndefined();
  });

  test('a wrong token is refused here; a client token meets the template’s capabilities', async () => {
    const front = await start({ capabilities: 'files' });
    const [none, wrong, limited, health] = await rawRequests(
      front,
      `POST /exec HTTP/1.1\r\nhost: envd\r\ncontent-length: 2\r\n\r\n{}` +
        post('/exec', '{"cmd":"true"}', 'wrong-token') +
        post('/exec', '{"cmd":"true"}', CLIENT_TOKEN) +
        get('/health', 'none'),
      4,
    );
    for (const refused of [none, wrong]) {
      expect(refused?.status).toBe(401);
      expect(JSON.parse(refused?.body ?? '')).toEqual({
        error: 'missing or wrong token: send the header "Authorization: Bearer <token>"',
        type: 'AuthenticationError',
      });
    }
    // Without shell, the client token's command is envd's to refuse, in its words.
    expect(limited?.status).toBe(403);
    expect(JSON.parse(limited?.body ?? '')).toMatchObject({
      type: 'CapabilityError',
      error: expect.stringContaining("template 'front-test' does not have the shell capability"),
    });
    expect(health?.status).toBe(200);
  });

  test('a token replacement envd takes is the front’s too; a browser may read its answers', async () => {
    const front = await start();
    const client = 'replaced-client-token-0123456789abcdefABCDEF';
    const control = 'replaced-control-token-0123456789abcdefABCDEF';
    const [replaced] = await rawRequests(
      front,
      post('/tokens', JSON.stringify({ client, control }), TOKEN, 'PUT'),
      1,
    );
    expect(JSON.parse(replaced?.body ?? '')).toEqual({ replaced: true });
    const [old, fresh, byNode, again] = await rawRequests(
      front,
      get('/process') +
        get('/process', control) +
        get('/env', control) +
        post('/tokens', JSON.stringify({ client, control }), control, 'PUT'),
      4,
    );
    // The old token is refused here (and by Node's envd); the new one works in both.
    expect(old?.status).toBe(401);
    expect(fresh?.status).toBe(200);
    expect(byNode?.status).toBe(200);
    // envd takes one replacement: the second is its 400, and changes nothing.
    expect(again?.status).toBe(400);
    const [cors] = await rawRequests(
      front,
      `GET /process HTTP/1.1\r\nhost: envd\r\norigin: http://page.test\r\nauthorization: Bearer ${control}\r\n\r\n`,
      1,
    );
    expect(cors?.headers).toMatch(/access-control-allow-origin: \*/);
    expect(cors?.headers).toMatch(/access-control-expose-headers: \*/);
  });

  test('bad input gets envd’s own answer, and the connection goes on', async () => {
    const front = await start();
    const [badJson, unknownArg, noCwd, after] = await rawRequests(
      front,
      post('/exec', '{"cmd": ') +
        post('/exec', JSON.stringify({ cmd: 'true', colour: 'red' })) +
        post('/exec', JSON.stringify({ cmd: 'true', cwd: '/no/such/dir' })) +
        post('/exec', JSON.stringify({ cmd: 'echo after', stdin: false })),
      4,
    );
    expect(badJson?.status).toBe(400);
    expect(JSON.parse(badJson?.body ?? '').type).toBe('InvalidJsonError');
    expect(unknownArg?.status).toBe(400);
    expect(JSON.parse(unknownArg?.body ?? '').error).toMatch(/colour/);
    expect(noCwd?.status).toBe(400);
    expect(JSON.parse(noCwd?.body ?? '')).toMatchObject({
      type: 'InvalidPathError',
      error: 'cwd /no/such/dir is not an existing directory',
    });
    expect(events(after as Raw).filter((e) => e.stream === 'stdout')[0].data).toBe('after\n');
    // A malformed head: envd's parser refuses it in the contract's shape.
    const [malformed] = await rawRequests(front, 'GET /a b c\0 HTTP/1.1\r\n\r\n', 1);
    expect(malformed?.status).toBe(400);
    expect(JSON.parse(malformed?.body ?? '').type).toBe('BadRequestError');
    const [huge] = await rawRequests(
      front,
      `GET /health HTTP/1.1\r\nx-big: ${'a'.repeat(70_000)}\r\n\r\n`,
      1,
    );
    expect(huge?.status).toBe(431);
    // The logs' query is checked here as envd checks it.
    const [badWait] = await rawRequests(front, get('/logs?wait=99999'), 1);
    expect(badWait?.status).toBe(400);
    expect(JSON.parse(badWait?.body ?? '')).toEqual({
      error: 'wait must be a whole number from 0 to 30000, not 99999',
      type: 'BadRequestError',
    });
  });
});
