import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { commandRegistry, Sandbox, Templates } from '../../src/index.js';
import { abxIn } from '../cli/abx.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import {
  daemonInfo,
  gatewayPort,
  httpText,
  type RawAnswer,
  random,
  rawRequest,
  scale,
} from './helpers.js';

// Hostile input against both HTTP services a client reaches through the gateway: envd (port
// 49983) and the command server (port 8080). Each bad request must get a 4xx in the contract's
// `{error, type}` shape and change nothing in the sandbox.
//
// Covered elsewhere, not repeated here: body over the limit (413) and a stalled body (408) on a
// bare server (test/server/lifecycle.test.ts); a NUL byte in a file path
// (test/server/files.test.ts, commands.test.ts); malformed JSON and non-object bodies on a bare
// server (test/server/commands.test.ts); the type rules of the shared parser on client and server
// (test/server/validate.test.ts, test/commands/arguments.test.ts, test/cli/custom-commands.test.ts);
// shell metacharacters in BaseSandbox paths, patterns and text
// (test/agent/contract.ts "values never reach a shell unquoted", run against a real sandbox by
// test/agent/sandbox.test.ts); placeholder quoting (test/commands/shell-template.test.ts);
// the gateway's missing/other token and a port without the ports capability
// (test/sandbox/control-plane.test.ts).

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;
let box: Sandbox;
let other: Sandbox;
let serverToken: string;
let port: number;
const SENTINEL = 'sentinel.txt';
const ORIGINAL = 'original content\n';

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
  await Templates.build(join(ROOT, 'test', 'fixtures', 'templates', 'server-e2e.yaml'), { home });
  box = await Sandbox.create({ home, template: 'server-e2e' });
  other = await Sandbox.create({ home, template: 'server-e2e' });
  commandRegistry().registerClass(SandboxCommands);
  await box.server.start({ commands: [SandboxCommands] });
  serverToken = JSON.parse(await box.files.read('/home/user/.abx/server/server-8080.json')).token;
  await box.files.write(SENTINEL, ORIGINAL);
  port = gatewayPort(home);
}, 300_000);

afterAll(async () => {
  await box?.kill().catch(() => undefined);
  await other?.kill().catch(() => undefined);
  await abx?.close();
});

/** Every file under the sandbox's home and /tmp with its size and checksum. */
async function snapshot(): Promise<string> {
  const { stdout } = await box.commands.run(
    'find /home/user /tmp -xdev -type f ! -path "/home/user/.abx/*" -exec md5sum {} + | sort',
  );
  return stdout;
}

const envdHeaders = () => ({
  'X-Sandbox-Id': box.sandboxId,
  'X-Sandbox-Port': '49983',
  'X-Access-Token': box.accessToken,
});
const serverHeaders = () => ({
  'X-Sandbox-Id': box.sandboxId,
  'X-Sandbox-Port': '8080',
  'X-Access-Token': box.accessToken,
  Authorization: `Bearer ${serverToken}`,
});

/** For each service: a JSON route that writes the sentinel when given a good body. */
const TARGETS = {
  envd: {
    headers: envdHeaders,
    path: '/files/batch',
    body: (content: string) => ({ files: [{ path: SENTINEL, content }] }),
  },
  server: {
    headers: serverHeaders,
    path: '/commands/upload',
    body: (content: string) => ({ path: SENTINEL, content }),
  },
};

function expectRefused(answer: RawAnswer, status?: number, label = '') {
  const context = `${label}\n${answer.head}\n${answer.body.slice(0, 300)}`;
  expect(answer.status, context).toBeGreaterThanOrEqual(400);
  expect(answer.status, context).toBeLessThan(500);
  if (status !== undefined) expect(answer.status, context).toBe(status);
  expect(typeof answer.json?.error, context).toBe('string');
  expect(typeof answer.json?.type, context).toBe('string');
}

describe.each(Object.entries(TARGETS))('hostile bodies: %s through the gateway', (_, target) => {
  const send = (body: string | Buffer, headers: Record<string, string> = {}) =>
    rawRequest(port, [
      httpText(
        'POST',
        target.path,
        { ...target.headers(), 'Content-Type': 'application/json', ...headers },
        body,
      ),
    ]);

  test('a good body works (the cases below differ only in what is wrong)', async () => {
    const answer = await send(JSON.stringify(target.body(ORIGINAL)));
    expect(answer.status, answer.body).toBe(200);
  });

  test('malformed, truncated and non-UTF-8 JSON, wrong shapes: 400, nothing written', async () => {
    const before = await snapshot();
    const good = JSON.stringify(target.body('pwned'));
    const cases: (string | Buffer)[] = [
      good.slice(0, -1),
      good.slice(0, good.length / 2),
      good.replace('"pwned"', 'pwned'),
      `${good}garbage`,
      '{"a":1,}',
      'null',
      '[]',
      '"just a string"',
      // Bytes that are not UTF-8 inside a string: decoding would turn them into U+FFFD.
      Buffer.concat([
        Buffer.from(good.replace('pwned', '')).subarray(0, good.length - 5),
        Buffer.from([0xff, 0xfe, 0x22, 0x7d, 0x5d, 0x7d]),
      ]),
      Buffer.from(JSON.stringify(target.body('\uFFFD')).replace('\uFFFD', '\xff'), 'latin1'),
      // Overlong UTF-8 for '/' and a lone surrogate's bytes.
      Buffer.from([...Buffer.from('{"path":"'), 0xc0, 0xaf, ...Buffer.from('x","content":"y"}')]),
      Buffer.from([
        ...Buffer.from('{"path":"'),
        0xed,
        0xa0,
        0x80,
        ...Buffer.from('","content":"y"}'),
      ]),
    ];
    for (const body of cases) expectRefused(await send(body), 400);
    expect(await snapshot()).toBe(before);
  });

  test('wrong content types: 415, nothing written', async () => {
    const before = await snapshot();
    const good = JSON.stringify(target.body('pwned'));
    for (const type of [
      'text/plain',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=x',
      'application/octet-stream',
    ]) {
      expectRefused(await send(good, { 'Content-Type': type }), 415);
    }
    expectRefused(
      await send(`path=${SENTINEL}&content=pwned`, {
        'Content-Type': 'application/x-www-form-urlencoded',
      }),
      415,
    );
    expect(await snapshot()).toBe(before);
  });

  test('deep nesting, 10 000 keys, huge strings: 4xx, nothing written', async () => {
    const before = await snapshot();
    const deep = 100_000;
    expectRefused(await send(`${'['.repeat(deep)}${']'.repeat(deep)}`), 400);
    expectRefused(await send(`{"path":${'['.repeat(deep)}${']'.repeat(deep)},"content":"x"}`), 400);
    expectRefused(await send(`${'{"a":'.repeat(deep)}1${'}'.repeat(deep)}`), 400);
    const keys = Object.fromEntries(Array.from({ length: 10_000 }, (_, i) => [`k${i}`, i]));
    const many = await send(JSON.stringify({ ...target.body('pwned'), ...keys }));
    expectRefused(many, 400);
    // The answer names the problem without echoing ten thousand keys back.
    expect(many.body.length).toBeLessThan(64 * 1024);
    const huge = 'x'.repeat(8 * 1024 * 1024);
    expectRefused(
      await send(JSON.stringify({ ...target.body('pwned'), [huge.slice(0, 100_000)]: huge })),
      400,
    );
    expectRefused(
      await send(
        JSON.stringify({
          path: huge.slice(0, 100_000),
          content: 'x',
          files: [{ path: huge.slice(0, 100_000), content: 'x' }],
        }),
      ),
      400,
    );
    // Over the 64 MiB JSON limit, declared: refused before the body is read.
    expect(await snapshot()).toBe(before);
  });

  // The sandbox answers 413 and lingers (reads and drops what is still sent for a moment) before
  // it closes, so the gateway gets the answer, not a reset it would report as 502.
  test('a body declared over the limit is 413 through the gateway too', async () => {
    expectRefused(await send('', { 'Content-Length': String(65 * 1024 * 1024) }), 413);
  });

  test('generated garbage bodies (seeded): always a 4xx of the contract shape', async () => {
    const before = await snapshot();
    const rng = random(0xab5);
    const atoms = [
      '{',
      '}',
      '[',
      ']',
      ',',
      ':',
      '"',
      '\\',
      'null',
      'true',
      '1e999',
      '-0',
      '"path"',
      '"content"',
      `"${SENTINEL}"`,
      '"\\u0000"',
      '"\\ud800"',
      ' ',
      '\n',
      '😀',
      '\u0000',
    ];
    for (let i = 0; i < scale(40, 1000); i++) {
      let body = '';
      for (let j = rng.int(30); j >= 0; j--) body += rng.pick(atoms);
      let valid = true;
      try {
        const value = JSON.parse(body);
        valid =
          value !== null &&
          typeof value === 'object' &&
          !Array.isArray(value) &&
          Object.keys(value).length > 0;
      } catch {
        valid = false;
      }
      if (valid) continue; // a valid object might be a real request; garbage is what is tested
      const answer = await send(body);
      if (body.trim() === '') continue; // an empty body is "no arguments"
      expectRefused(answer);
    }
    expect(await snapshot()).toBe(before);
  });
});

describe.each(Object.entries(TARGETS))(
  'hostile paths and methods: %s through the gateway',
  (_, target) => {
    const get = (path: string, method = 'GET', body = '') =>
      rawRequest(port, [httpText(method, path, target.headers(), body)]);

    test('`..`, `%2e%2e`, encoded slashes and NUL in the URL path reach no other route', async () => {
      const before = await snapshot();
      const paths = [
        `${target.path}/../../shutdown`,
        `${target.path}/%2e%2e/%2e%2e/shutdown`,
        `${target.path.replace(/\/[^/]+$/, '')}/%2e%2e/shutdown`,
        `${target.path.replace(/\/[^/]+$/, '')}/..%2fshutdown`,
        `/commands/%2E%2E/shutdown`,
        `/files/..%2F..%2Fshutdown`,
        `/commands/%00`,
        `/commands/a%00b`,
        `/commands/%ff%fe`,
        `/commands/${'a'.repeat(4000)}`,
        `/%`,
      ];
      for (const path of paths) expectRefused(await get(path, 'POST', '{}'));
      // The server is still up: nothing was shut down through a path that normalised to /shutdown.
      expect((await get('/health')).status).toBe(200);
      expect(await snapshot()).toBe(before);
    });

    test('raw NUL bytes, control characters and overlong URLs are refused in the contract shape', async () => {
      for (const path of [
        '/health\0',
        '/commands/a\0b',
        '/he alth',
        `/files/read?path=${'a'.repeat(64 * 1024)}`,
      ]) {
        expectRefused(await get(path));
      }
    });

    test('unknown and unsupported methods: 4xx, not a dropped connection', async () => {
      for (const method of ['FOO', 'PATCH', 'PROPFIND', 'TRACE', 'CONNECT_', 'G\0T']) {
        expectRefused(
          await get(method === 'PATCH' || method === 'PROPFIND' ? target.path : '/health', method),
        );
      }
    });

    test('file paths with .., NUL and overlong names are refused or stay in the sandbox', async () => {
      const before = await snapshot();
      const write = (path: string) =>
        rawRequest(port, [
          httpText('PUT', `/files/write?path=${encodeURIComponent(path)}`, envdHeaders(), 'pwned'),
        ]);
      expectRefused(await write(`a\0b`), 400);
      expectRefused(await write(`${'n'.repeat(300)}`), 400);
      expectRefused(await write(`${'d/'.repeat(3000)}x`), 400);
      expectRefused(await write('/usr/bin/../../etc/passwd'));
      expectRefused(await write('/proc/1/mem'));
      expect(await snapshot()).toBe(before);
    });
  },
);

describe('slow clients: explicit timeouts close them', () => {
  // Through the gateway to a second command server started with --body-timeout-ms 1000. It once
  // hung: the gateway held the request headers back until the first body chunk, and kept the
  // client's connection open after an early answer.
  test('a trickling body or headers get 408 and the connection is closed', {
    timeout: 120_000,
  }, async () => {
    // A second command server with a 1 s body deadline, so the test need not wait 30 s for the
    // default. It listens on the socket the gateway dials for port 9090.
    const slow = await box.commands.start(
      'exec node /opt/abx/server.cjs --port 9090 --socket /run/abx/ports/9090.sock --body-timeout-ms 1000',
      { timeoutMs: 0, envs: { ABX_SERVER_TOKEN: 'slow-token' } },
    );
    try {
      const headers = {
        'X-Sandbox-Id': box.sandboxId,
        'X-Sandbox-Port': '9090',
        'X-Access-Token': box.accessToken,
        Authorization: 'Bearer slow-token',
        'Content-Type': 'application/json',
        'Content-Length': '100',
      };
      for (let i = 0; i < 100; i++) {
        const health = await rawRequest(port, [httpText('GET', '/health', headers)]).catch(
          () => undefined,
        );
        if (health?.status === 200) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      const started = Date.now();
      const trickle = ['{"path":', '"a.txt",', '"content":', '"x"'];
      const server = await rawRequest(
        port,
        [httpText('POST', '/commands/upload', headers), ...trickle],
        {
          gapMs: 700,
        },
      );
      expectRefused(server, 408);
      console.log(`command server: slow body refused after ${Date.now() - started} ms`);
      expect(await box.files.exists('a.txt')).toBe(false);
    } finally {
      await slow.kill().catch(() => false);
    }
  });

  test.skipIf(!process.env.ABX_SOAK)(
    'envd and the gateway close a slow body / slow headers after 30 s',
    { timeout: 120_000 },
    async () => {
      const started = Date.now();
      const [envd, gateway] = await Promise.all([
        rawRequest(
          port,
          [
            httpText('POST', '/files/mkdir', {
              ...envdHeaders(),
              'Content-Type': 'application/json',
              'Content-Length': '100',
            }),
            '{"pa',
          ],
          { timeoutMs: 100_000 },
        ),
        rawRequest(port, ['GET /health HTTP/1.1\r\n', 'Host: x\r\n'], { timeoutMs: 100_000 }),
      ]);
      console.log(`slow body / headers refused after ${Date.now() - started} ms`);
      expectRefused(envd, 408);
      expectRefused(gateway, 408);
    },
  );
});

describe('the gateway refuses what is not for it', () => {
  const req = (headers: Record<string, string>, path = '/files/stat?path=.') =>
    rawRequest(port, [
      Buffer.from(
        `GET ${path} HTTP/1.1\r\nConnection: close\r\n${Object.entries(headers)
          .map(([k, v]) => `${k}: ${v}\r\n`)
          .join('')}\r\n`,
        'latin1',
      ),
    ]);

  test('forged Host names, sandbox ids and ports', async () => {
    const id = box.sandboxId;
    const token = box.accessToken;
    const cases: [Record<string, string>, number][] = [
      [{ Host: `49983-${id}.localhost`, 'X-Access-Token': other.accessToken }, 401],
      [{ Host: `49983-${other.sandboxId}.localhost`, 'X-Access-Token': token }, 401],
      [{ Host: `49983-${id}.localhost` }, 401],
      [{ Host: `49983-${id}.localhost`, 'X-Access-Token': '' }, 401],
      [{ Host: `49983-${id}.localhost`, 'X-Access-Token': `${token}x` }, 401],
      [{ Host: `49983-${id}.localhost`, 'X-Access-Token': token.slice(0, -1) }, 401],
      [{ Host: `49983-${id}.evil.com`, 'X-Access-Token': token }, 400],
      [{ Host: `49983-${id}.localhost.evil.com`, 'X-Access-Token': token }, 400],
      [
        {
          Host: `evil.com`,
          'X-Sandbox-Id': other.sandboxId,
          'X-Sandbox-Port': '49983',
          'X-Access-Token': token,
        },
        401,
      ],
      [
        {
          Host: `49983-${other.sandboxId}.localhost`,
          'X-Sandbox-Id': id,
          'X-Sandbox-Port': '49983',
          'X-Access-Token': other.accessToken,
        },
        401,
      ],
      [{ Host: `49983-../../${id}.localhost`, 'X-Access-Token': token }, 400],
      [{ 'X-Sandbox-Id': `${id}\0`, 'X-Sandbox-Port': '49983', 'X-Access-Token': token }, 400],
      [{ Host: `0-${id}.localhost`, 'X-Access-Token': token }, 400],
      [{ Host: `65536-${id}.localhost`, 'X-Access-Token': token }, 400],
      [{ Host: `99999-${id}.localhost`, 'X-Access-Token': token }, 400],
      [{ 'X-Sandbox-Id': id, 'X-Sandbox-Port': '-1', 'X-Access-Token': token }, 400],
      [{ 'X-Sandbox-Id': id, 'X-Sandbox-Port': '0x50', 'X-Access-Token': token }, 400],
      [{ 'X-Sandbox-Id': id, 'X-Sandbox-Port': '1e3', 'X-Access-Token': token }, 400],
      [{ 'X-Sandbox-Id': id, 'X-Sandbox-Port': ' 8080 ', 'X-Access-Token': token }, 200],
      [{ 'X-Sandbox-Id': id, 'X-Sandbox-Port': '8080.5', 'X-Access-Token': token }, 400],
      [{ 'X-Sandbox-Id': id, 'X-Sandbox-Port': '', 'X-Access-Token': token }, 400],
      [{ 'X-Sandbox-Id': id, 'X-Sandbox-Port': '70000', 'X-Access-Token': token }, 400],
    ];
    for (const [headers, status] of cases) {
      const answer = await req(headers, status === 200 ? '/health' : undefined);
      if (status === 200) {
        expect(answer.status, JSON.stringify(headers)).toBe(200);
        continue;
      }
      // 0: any refusal will do (which 4xx depends on how the id is looked up).
      expectRefused(answer, status === 0 ? undefined : status, JSON.stringify(headers));
      // An error never echoes a token.
      expect(answer.body).not.toContain(token);
      expect(answer.body).not.toContain(other.accessToken);
    }
  });

  test('an X-Sandbox-Id with path characters is refused in the contract shape', async () => {
    const headers = {
      'X-Sandbox-Id': `../${box.sandboxId}`,
      'X-Sandbox-Port': '49983',
      'X-Access-Token': box.accessToken,
    };
    expectRefused(await req(headers), 400);
  });

  test("a token in the query of another sandbox's host does not open it", async () => {
    const answer = await req(
      { Host: `49983-${box.sandboxId}.localhost` },
      `/health?token=${other.accessToken}`,
    );
    expectRefused(answer, 401);
  });

  test('nothing the daemon or a sandbox runs listens beyond loopback', () => {
    const pids = [daemonInfo(home).pid];
    const inodes = new Set<string>();
    for (const pid of pids) {
      for (const fd of readFileSyncDir(`/proc/${pid}/fd`)) {
        const match = /^socket:\[(\d+)\]$/.exec(fd);
        if (match) inodes.add(match[1] as string);
      }
    }
    const listening: string[] = [];
    for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
      for (const line of readFileSync(table, 'utf8').split('\n').slice(1)) {
        const cols = line.trim().split(/\s+/);
        if (cols[3] !== '0A' || !inodes.has(cols[9] as string)) continue; // 0A = LISTEN
        listening.push(cols[1] as string);
      }
    }
    expect(listening.length).toBeGreaterThanOrEqual(2); // API and gateway
    for (const address of listening) {
      const ip = address.split(':')[0] as string;
      // 0100007F = 127.0.0.1; ::1 in /proc/net/tcp6 = 00000000000000000000000001000000
      expect(['0100007F', '00000000000000000000000001000000'], address).toContain(ip);
    }
    // Sandboxes have their own network namespace: nothing they listen on is in the host's tables.
  });
});

describe('shell metacharacters in every value that reaches a shell', () => {
  const HOSTILE = [
    "it's",
    '$(touch PWNED)',
    '`touch PWNED`',
    '; touch PWNED',
    '| touch PWNED',
    '&& touch PWNED',
    '$HOME ${HOME} $((1+1))',
    '"; touch PWNED; "',
    "'; touch PWNED; '",
    'a\nb; touch PWNED',
    '\\',
    '*',
    '-n',
    '--',
    '{text}',
    '{{text}}',
    '%s%s%n',
    '😀 ü \t tab',
  ];

  test('YAML placeholders via the SDK: each value arrives as it was sent', async () => {
    for (const text of HOSTILE) {
      expect(await box.run('shout', { text })).toMatchObject({
        stdout: text.replace(/[a-z]/g, (c) => c.toUpperCase()),
      });
    }
    expect(
      (
        await box.commands.run('ls -a /home/user /tmp | grep -c PWNED', { allowNonZeroExit: true })
      ).stdout.trim(),
    ).toBe('0');
  });

  test('YAML placeholders via the CLI -a: each value arrives as it was sent', {
    timeout: 120_000,
  }, async () => {
    const cli = abxIn(home);
    for (const text of HOSTILE.filter((t) => !t.includes('\n'))) {
      const result = await cli.abx(['run', box.sandboxId, 'shout', '-a', `text=${text}`]);
      expect(result.stderr).toBe('');
      expect(result.stdout).toBe(text.replace(/[a-z]/g, (c) => c.toUpperCase()));
    }
    expect(
      (
        await box.commands.run('ls -a /home/user /tmp | grep -c PWNED', { allowNonZeroExit: true })
      ).stdout.trim(),
    ).toBe('0');
  });
});

function readFileSyncDir(dir: string): string[] {
  return readdirSync(dir).flatMap((fd) => {
    try {
      return [readlinkSync(`${dir}/${fd}`)];
    } catch {
      return [];
    }
  });
}
