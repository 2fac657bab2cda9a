import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  CONTRACT_COMMANDS,
  eventually,
  isAlive,
  killLeftovers,
  type RunningServer,
  startServer,
} from './harness.js';

const TOKEN = 'contract-token-1234';
let server: RunningServer;
let work: string;

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'abx-commands-'));
  server = await startServer(['--load', CONTRACT_COMMANDS], { token: TOKEN });
});
afterAll(killLeftovers);

describe('core and authentication', () => {
  test('GET /health answers without a token', async () => {
    const answer = await server.call('/health', { token: null });
    expect(answer.status).toBe(200);
    expect(answer.json).toEqual({ status: 'ok' });
  });

  test.each([
    ['no token', null],
    ['a wrong token', 'contract-token-1235'],
    ['a token of another length', 'x'],
  ])('%s gets 401 AuthenticationError on every other route', async (_, token) => {
    for (const [method, path] of [
      ['GET', '/commands'],
      ['POST', '/commands/echo'],
      ['GET', '/info'],
      ['GET', '/no/such/route'],
    ] as const) {
      const answer = await server.call(path, {
        method,
        token,
        body: method === 'POST' ? {} : undefined,
      });
      expect(answer.status, `${method} ${path}`).toBe(401);
      expect(answer.json.type).toBe('AuthenticationError');
      expect(answer.json.error).toContain('Authorization: Bearer');
    }
  });

  test('GET /info names the server, its pid and port', async () => {
    const { status, json } = await server.call('/info');
    expect(status).toBe(200);
    expect(json).toMatchObject({ name: 'abx-server', pid: server.pid, port: server.port });
    expect(json.groups).toHaveLength(8);
  });

  test('GET /capabilities lists the eight groups and 49 endpoints', async () => {
    const { json } = await server.call('/capabilities');
    const names = json.capabilities.map((c: { name: string }) => c.name);
    expect(names).toEqual([
      'CORE',
      'COMMANDS',
      'FILE_OPS',
      'PROCESS',
      'SYSTEM',
      'TERMINAL',
      'DEV_TOOLS',
      'BROWSER',
    ]);
    const endpoints = json.capabilities.flatMap((c: { endpoints: unknown[] }) => c.endpoints);
    expect(endpoints).toHaveLength(49);
    expect(endpoints).toContainEqual(
      expect.objectContaining({ method: 'POST', path: '/process/{id}/kill' }),
    );
    expect(endpoints).toContainEqual(
      expect.objectContaining({ method: 'POST', path: '/files/upload' }),
    );
  });

  test('an unknown path is 404 RouteNotFoundError', async () => {
    const answer = await server.call('/nope/nothing');
    expect(answer.status).toBe(404);
    expect(answer.json.type).toBe('RouteNotFoundError');
  });

  test('a known path with another method is 405 with Allow', async () => {
    const answer = await server.call('/commands/echo', { method: 'DELETE' });
    expect(answer.status).toBe(405);
    expect(answer.headers.allow).toBe('GET, POST');
    expect(answer.json).toMatchObject({ type: 'MethodNotAllowedError' });
    const health = await server.call('/health', { method: 'POST', body: {} });
    expect(health.status).toBe(405);
    expect(health.headers.allow).toBe('GET');
  });
});

describe('discovery', () => {
  test('GET /commands lists the built-ins and the loaded commands with their schemas', async () => {
    const { status, json } = await server.call('/commands');
    expect(status).toBe(200);
    const byName = Object.fromEntries(json.commands.map((c: { name: string }) => [c.name, c]));
    expect(Object.keys(byName)).toEqual(
      expect.arrayContaining(['upload', 'download', 'runshell', 'echo', 'delayed', 'count']),
    );
    const schema = (name: string) =>
      byName[name].args.map((a: Record<string, unknown>) => [
        a.name,
        a.type,
        a.required,
        a.default,
      ]);
    expect(schema('upload')).toEqual([
      ['path', 'str', true, undefined],
      ['content', 'str', true, undefined],
      ['encoding', 'str', false, 'utf-8'],
    ]);
    expect(schema('download')).toEqual([
      ['path', 'str', true, undefined],
      ['encoding', 'str', false, undefined],
    ]);
    expect(schema('runshell')).toEqual([
      ['cmd', 'str', true, undefined],
      ['cwd', 'str', false, undefined],
      ['timeout', 'float', false, 60],
      ['env', 'str', false, undefined],
    ]);
    expect(byName.echo).toEqual({
      name: 'echo',
      description: 'Returns its arguments.',
      args: [
        { name: 'text', type: 'str', required: true, description: 'what to echo' },
        { name: 'times', type: 'int', required: false, default: 1 },
        { name: 'ratio', type: 'float', required: false, default: 0.5 },
        { name: 'loud', type: 'bool', required: false, default: false },
      ],
    });
    for (const command of json.commands) {
      for (const arg of command.args) expect(['str', 'int', 'float', 'bool']).toContain(arg.type);
    }
  });

  test('GET /commands/{name} describes one command; an unknown one is 404', async () => {
    const one = await server.call('/commands/delayed');
    expect(one.json).toEqual({
      name: 'delayed',
      description: 'Returns value after ms milliseconds.',
      args: [
        { name: 'value', type: 'int', required: true },
        { name: 'ms', type: 'int', required: false, default: 50 },
      ],
    });
    const missing = await server.call('/commands/nope');
    expect(missing.status).toBe(404);
    expect(missing.json.type).toBe('CommandNotFoundError');
    expect(missing.json.error).toContain('echo');
  });
});

describe('calls', () => {
  test('kwargs come back with defaults applied', async () => {
    const answer = await server.call('/commands/echo', { body: { text: 'hi', loud: true } });
    expect(answer.status).toBe(200);
    expect(answer.headers['content-type']).toContain('application/json');
    expect(answer.json).toEqual({ result: { text: 'hi', times: 1, ratio: 0.5, loud: true } });
  });

  test('an empty body means no arguments', async () => {
    const answer = await server.call('/commands/count', { method: 'POST' });
    expect(answer.status).toBe(200);
    expect(typeof answer.json.result).toBe('number');
  });

  test('every argument problem is listed in one 400 ArgumentError', async () => {
    const answer = await server.call('/commands/echo', {
      body: { times: 1.5, ratio: '0.3', loud: 1, txt: 'x' },
    });
    expect(answer.status).toBe(400);
    expect(answer.json.type).toBe('ArgumentError');
    expect(answer.json.problems).toEqual([
      'times must be an integer, not number 1.5',
      'ratio must be a number, not string "0.3"',
      'loud must be true or false, not the number 1',
      "unknown argument 'txt' (did you mean 'text'?)",
      'missing required argument: text',
    ]);
    expect(answer.json.error).toContain('Usage: echo -a text=<str>');
  });

  test('int takes only safe integers; float takes integers too', async () => {
    const big = await server.call('/commands/echo', { body: { text: 'a', times: 2 ** 53 } });
    expect(big.status).toBe(400);
    const ok = await server.call('/commands/echo', { body: { text: 'a', ratio: 3 } });
    expect(ok.json.result.ratio).toBe(3);
  });

  test('a body that is not a JSON object is 400 ArgumentError', async () => {
    const answer = await server.call('/commands/echo', { body: [1, 2] });
    expect(answer.status).toBe(400);
    expect(answer.json.type).toBe('ArgumentError');
    expect(answer.json.error).toContain('not an array');
  });

  test('malformed JSON is 400 InvalidJsonError', async () => {
    const answer = await server.call('/commands/echo', {
      body: '{"text": ',
      headers: { 'content-type': 'application/json' },
    });
    expect(answer.status).toBe(400);
    expect(answer.json.type).toBe('InvalidJsonError');
  });

  test('calling an unknown command is 404 CommandNotFoundError', async () => {
    const answer = await server.call('/commands/missing', { body: {} });
    expect(answer.status).toBe(404);
    expect(answer.json.type).toBe('CommandNotFoundError');
  });

  test('a thrown error is 500 with its class name as type', async () => {
    const sync = await server.call('/commands/fail', { body: {} });
    expect(sync.status).toBe(500);
    expect(sync.json).toEqual({ error: 'quota exceeded for today', type: 'QuotaExceededError' });
    const rejected = await server.call('/commands/fail_async', { body: {} });
    expect(rejected.status).toBe(500);
    expect(rejected.json).toEqual({ error: 'bad thing', type: 'TypeError' });
  });

  test.each(['cyclic', 'bigint'])(
    'an unserializable result (%s) is 500 SerializationError',
    async (name) => {
      const answer = await server.call(`/commands/${name}`, { body: {} });
      expect(answer.status).toBe(500);
      expect(answer.json.type).toBe('SerializationError');
      expect(answer.json.error).toContain(name);
    },
  );

  test('undefined comes back as null', async () => {
    const answer = await server.call('/commands/nothing', { body: {} });
    expect(answer.json).toEqual({ result: null });
  });

  test('a command past its timeoutMs is 504 CommandTimeoutError', async () => {
    const answer = await server.call('/commands/slow', { body: {} });
    expect(answer.status).toBe(504);
    expect(answer.json.type).toBe('CommandTimeoutError');
    expect(answer.json.error).toContain('200 ms');
    // The server is still healthy after it.
    expect((await server.call('/health')).status).toBe(200);
  });

  test('50 concurrent calls each get their own result', async () => {
    const values = Array.from({ length: 50 }, (_, i) => i * 7);
    const answers = await Promise.all(
      values.map((value, i) =>
        server.call('/commands/delayed', { body: { value, ms: (i % 5) * 20 } }),
      ),
    );
    expect(answers.map((a) => a.json.result)).toEqual(values);
  });

  test('slow async commands do not hold up /health or other commands', async () => {
    let slowDone = 0;
    const slow = Array.from({ length: 5 }, (_, value) =>
      server.call('/commands/delayed', { body: { value, ms: 1500 } }).then((a) => {
        slowDone++;
        return a;
      }),
    );
    const health = await server.call('/health');
    const quick = await server.call('/commands/echo', { body: { text: 'quick' } });
    expect(health.json).toEqual({ status: 'ok' });
    expect(quick.json.result.text).toBe('quick');
    expect(slowDone).toBe(0);
    expect((await Promise.all(slow)).map((a) => a.json.result)).toEqual([0, 1, 2, 3, 4]);
  });

  test('state persists from one call to the next', async () => {
    const first = (await server.call('/commands/count', { body: {} })).json.result;
    const second = (await server.call('/commands/count', { body: {} })).json.result;
    expect(second).toBe(first + 1);
  });
});

describe('built-in commands', () => {
  test('upload then download UTF-8 text, creating parent directories', async () => {
    const path = join(work, 'a', 'b', 'note.txt');
    const up = await server.call('/commands/upload', { body: { path, content: 'héllo\n' } });
    expect(up.status).toBe(200);
    expect(up.json.result).toEqual({ path, size: Buffer.byteLength('héllo\n') });
    expect(readFileSync(path, 'utf8')).toBe('héllo\n');
    const down = await server.call('/commands/download', { body: { path } });
    expect(down.json.result).toEqual({ content: 'héllo\n', encoding: 'utf-8', size: 7 });
  });

  test('binary content round-trips through base64 and leaves no temp file', async () => {
    const bytes = Buffer.concat([Buffer.from([0xff, 0xfe, 0x00]), randomBytes(1000)]);
    const path = join(work, 'bin', 'blob.bin');
    const up = await server.call('/commands/upload', {
      body: { path, content: bytes.toString('base64'), encoding: 'base64' },
    });
    expect(up.json.result.size).toBe(bytes.length);
    expect(readFileSync(path).equals(bytes)).toBe(true);
    expect(readdirSync(join(work, 'bin'))).toEqual(['blob.bin']);
    const down = await server.call('/commands/download', { body: { path } });
    expect(down.json.result.encoding).toBe('base64');
    expect(Buffer.from(down.json.result.content, 'base64').equals(bytes)).toBe(true);
  });

  test('upload replaces a file whole', async () => {
    const path = join(work, 'replace.txt');
    writeFileSync(path, 'old content that is longer');
    await server.call('/commands/upload', { body: { path, content: 'new' } });
    expect(readFileSync(path, 'utf8')).toBe('new');
  });

  test('bad encodings, NUL bytes and missing files get clear errors', async () => {
    const encoding = await server.call('/commands/upload', {
      body: { path: join(work, 'x'), content: 'x', encoding: 'latin1' },
    });
    expect(encoding.status).toBe(400);
    expect(encoding.json.error).toContain('utf-8, base64');
    const nul = await server.call('/commands/upload', {
      body: { path: `${work}/a\u0000b`, content: 'x' },
    });
    expect(nul.status).toBe(400);
    expect(nul.json.type).toBe('InvalidPathError');
    const missing = await server.call('/commands/download', { body: { path: join(work, 'none') } });
    expect(missing.status).toBe(404);
    expect(missing.json.type).toBe('NotFoundError');
    expect(missing.json.error).toContain(join(work, 'none'));
    expect(existsSync(join(work, 'x'))).toBe(false);
  });

  test('runshell returns stdout, stderr and exit code; cwd and env apply', async () => {
    const answer = await server.call('/commands/runshell', {
      body: {
        cmd: 'echo "$GREETING"; pwd; echo oops >&2; exit 3',
        cwd: work,
        env: { GREETING: 'hey' },
      },
    });
    expect(answer.status).toBe(200);
    expect(answer.json.result).toEqual({
      stdout: `hey\n${work}\n`,
      stderr: 'oops\n',
      exit_code: 3,
    });
    const lines = await server.call('/commands/runshell', {
      body: { cmd: 'echo "$A-$B"', env: 'A=1\nB=two' },
    });
    expect(lines.json.result.stdout).toBe('1-two\n');
  });

  test('runshell in a directory that does not exist is 400, not a missing /bin/sh', async () => {
    const answer = await server.call('/commands/runshell', {
      body: { cmd: 'true', cwd: join(work, 'no-such-dir') },
    });
    expect(answer.status).toBe(400);
    expect(answer.json).toEqual({
      error: `cwd ${join(work, 'no-such-dir')} is not an existing directory`,
      type: 'InvalidPathError',
    });
  });

  test('runshell past its timeout is 504 with the output so far, its process group killed', async () => {
    const pidFile = join(work, 'bg.pid');
    const answer = await server.call('/commands/runshell', {
      body: { cmd: `echo started; sleep 300 & echo $! > ${pidFile}; wait`, timeout: 0.5 },
    });
    expect(answer.status).toBe(504);
    expect(answer.json).toMatchObject({
      type: 'CommandTimeoutError',
      stdout: 'started\n',
      exit_code: null,
    });
    const pid = Number(readFileSync(pidFile, 'utf8'));
    await eventually(() => !isAlive(pid));
  });
});
