import { EventEmitter } from 'node:events';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import { type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test as base, describe, expect } from 'vitest';
import { ENVD_PORT, Gateway, type GatewayBackend } from '../../src/control/gateway.js';
import { type UpstreamOwner, UpstreamPool } from '../../src/control/gateway-upstream.js';
import type { SandboxRecord } from '../../src/control/registry.js';
import { HttpClient } from '../../src/sandbox/http-client.js';
import { gatewayRecord } from '../helpers/gateway-record.js';
import { type Answer, http, RawConnection } from '../helpers/raw-http.js';

// The gateway routes whole keep-alive connections: these tests speak raw HTTP/1.1 on one
// connection and check that every request on it is routed, checked and rewritten as the first.

/** One fake sandbox: an "envd" and a port-8080 server on Unix sockets, both echoing requests. */
interface FakeSandbox {
  id: string;
  token: string;
  record: SandboxRecord;
  /** What reached its envd: method, url, headers and body, and the connection it came on. */
  requests: Seen[];
  /** Connections its servers accepted. */
  connections: number;
}

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: string;
  connection: number;
}

interface Fixture {
  gateway: Gateway;
  backend: GatewayBackend;
  port: number;
  a: FakeSandbox;
  b: FakeSandbox;
  /** Checks the gateway made (backend lookups). */
  lookups: () => number;
  open(): RawConnection;
}

function echo(box: FakeSandbox, server: Server, label: string): void {
  const ids = new WeakMap<Socket, number>();
  server.on('connection', (socket) => ids.set(socket, ++box.connections));
  server.on('request', (req, res) => {
    if (req.url === '/early-close') {
      // Answers before reading the body, then closes (as a server refusing a large upload).
      const text = JSON.stringify({ error: 'too large', type: 'PayloadTooLargeError' });
      res.writeHead(413, {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(text),
        connection: 'close',
      });
      res.end(text);
      return;
    }
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const seen: Seen = {
        method: req.method as string,
        url: req.url as string,
        headers: req.headers,
        body: Buffer.concat(chunks).toString(),
        connection: ids.get(req.socket) ?? 0,
      };
      if (label === 'envd') box.requests.push(seen);
      const text = JSON.stringify({ sandbox: box.id, server: label, ...seen });
      res.writeHead(200, {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(text),
      });
      res.end(text);
    });
  });
  // A protocol switch that echoes bytes back.
  server.on('upgrade', (_req, socket: Socket, head: Buffer) => {
    socket.write(
      'HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n',
    );
    if (head.length > 0) socket.write(head);
    socket.pipe(socket);
  });
}

const listen = (server: Server, path: string) =>
  new Promise<void>((resolve) => server.listen(path, () => resolve()));

const test = base.extend<{ fx: Fixture }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  fx: async ({}, use) => {
    const dir = mkdtempSync(join(tmpdir(), 'abx-gateway-'));
    const servers: Server[] = [];
    const connections: RawConnection[] = [];
    const boxes = new Map<string, FakeSandbox>();
    for (const [id, capabilities] of [
      ['isandboxa', ['files', 'code', 'ports']],
      ['isandboxb', ['shell', 'files', 'code']],
    ] as const) {
      const run = join(dir, id);
      mkdirSync(join(run, 'ports'), { recursive: true });
      const token = `token-of-${id}`;
      const box: FakeSandbox = {
        id,
        token,
        requests: [],
        connections: 0,
        record: gatewayRecord({
          id,
          token,
          envdSocket: join(run, 'envd.sock'),
          portsDir: join(run, 'ports'),
          capabilities: [...capabilities],
        }),
      };
      for (const [label, path] of [
        ['envd', join(run, 'envd.sock')],
        ['8080', join(run, 'ports', '8080.sock')],
      ] as const) {
        const server = createServer();
        echo(box, server, label);
        await listen(server, path);
        servers.push(server);
      }
      boxes.set(id, box);
    }
    let lookups = 0;
    const backend: GatewayBackend = {
      find: (id) => {
        lookups++;
        return boxes.get(id)?.record;
      },
      isAlive: () => true,
      openPort: async (record, _token, port) => join(record.handle.portsDir, `${port}.sock`),
    };
    // Connections to the sandboxes are reused however slow the machine is.
    const gateway = new Gateway(backend, 'localhost', { upstreamIdle: 60_000 });
    await new Promise<void>((resolve) => gateway.server.listen(0, '127.0.0.1', () => resolve()));
    const port = (gateway.server.address() as { port: number }).port;
    try {
      await use({
        gateway,
        backend,
        port,
        a: boxes.get('isandboxa') as FakeSandbox,
        b: boxes.get('isandboxb') as FakeSandbox,
        lookups: () => lookups,
        open() {
          const connection = new RawConnection(port);
          connections.push(connection);
          return connection;
        },
      });
    } finally {
      for (const connection of connections) connection.socket.destroy();
      gateway.close();
      await new Promise<void>((resolve) => gateway.server.close(() => resolve()));
      for (const server of servers) {
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      }
      rmSync(dir, { recursive: true, force: true });
    }
  },
});

const to = (box: FakeSandbox, port = ENVD_PORT, token = box.token) => ({
  'X-Sandbox-Id': box.id,
  'X-Sandbox-Port': String(port),
  'X-Access-Token': token,
});

function expectErrorShape(answer: Answer, status: number, type: string): void {
  expect(answer.status, answer.body).toBe(status);
  expect(answer.json).toEqual({ error: expect.any(String), type });
}

describe('the gateway routes whole connections', () => {
  test('two sandboxes on one keep-alive connection: each request goes to its own, rewritten', async ({
    fx,
  }) => {
    const client = fx.open();
    for (const [box, n] of [
      [fx.a, 1],
      [fx.b, 2],
      [fx.a, 3],
      [fx.a, 4],
    ] as const) {
      client.write(http('GET', `/debug?n=${n}&token=${box.token}`, to(box)));
      const answer = await client.answer();
      expect(answer.status).toBe(200);
      expect(answer.json).toMatchObject({ sandbox: box.id, server: 'envd', url: `/debug?n=${n}` });
      // envd gets the sandbox's token as it wants it, and none of the gateway's own headers,
      // on every request of the connection, not only its first.
      expect(answer.json.headers.authorization).toBe(`Bearer ${box.token}`);
      expect(answer.json.headers['x-access-token']).toBeUndefined();
      expect(answer.json.headers['x-sandbox-id']).toBeUndefined();
      expect(answer.json.headers['x-sandbox-port']).toBeUndefined();
    }
    expect(fx.a.requests.map((r) => r.url)).toEqual(['/debug?n=1', '/debug?n=3', '/debug?n=4']);
    expect(fx.b.requests.map((r) => r.url)).toEqual(['/debug?n=2']);
    // Checked when the sandbox changed, not per request: a, b, a again; the fourth went straight.
    expect(fx.lookups()).toBe(3);
    // The last two shared the connection to a's envd.
    expect(fx.a.requests[2]?.connection).toBe(fx.a.requests[1]?.connection);
  });

  test('a changed token is checked again: a wrong one is refused, the right one still works', async ({
    fx,
  }) => {
    const client = fx.open();
    client.write(http('GET', '/debug', to(fx.a)));
    expect((await client.answer()).status).toBe(200);
    // Another sandbox's token for a: refused, and nothing reaches a's envd.
    client.write(http('GET', '/debug?wrong', to(fx.a, ENVD_PORT, fx.b.token)));
    expectErrorShape(await client.answer(), 401, 'AuthenticationError');
    // No token at all, by Host this time.
    client.write(http('GET', '/debug?none', { Host: `${ENVD_PORT}-${fx.a.id}.localhost` }));
    expectErrorShape(await client.answer(), 401, 'AuthenticationError');
    expect(fx.a.requests.map((r) => r.url)).toEqual(['/debug']);
    // The connection is still usable, with the right token (now in the query).
    client.write(
      http('GET', `/debug?again=1&token=${fx.a.token}`, {
        'X-Sandbox-Id': fx.a.id,
        'X-Sandbox-Port': String(ENVD_PORT),
      }),
    );
    const again = await client.answer();
    expect(again.status).toBe(200);
    expect(again.json.url).toBe('/debug?again=1');
    expect(again.json.headers.authorization).toBe(`Bearer ${fx.a.token}`);
  });

  test('pipelined requests to two sandboxes, with bodies, are answered in order', async ({
    fx,
  }) => {
    const client = fx.open();
    const chunked = [
      'POST /debug?n=3 HTTP/1.1',
      'Host: 127.0.0.1',
      `X-Sandbox-Id: ${fx.b.id}`,
      `X-Sandbox-Port: ${ENVD_PORT}`,
      `X-Access-Token: ${fx.b.token}`,
      'Transfer-Encoding: chunked',
      '',
      '5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer-Field: x\r\n\r\n',
    ].join('\r\n');
    client.write(
      http('POST', '/debug?n=1', to(fx.a), 'first body') +
        http('GET', '/debug?n=2', to(fx.a)) +
        chunked +
        http('GET', '/debug?n=4', to(fx.a)) +
        http('GET', '/debug?n=5', to(fx.a, 8080)),
    );
    const answers = [];
    for (let i = 0; i < 5; i++) answers.push(await client.answer());
    expect(answers.map((a) => [a.status, a.json.sandbox, a.json.server, a.json.url])).toEqual([
      [200, fx.a.id, 'envd', '/debug?n=1'],
      [200, fx.a.id, 'envd', '/debug?n=2'],
      [200, fx.b.id, 'envd', '/debug?n=3'],
      [200, fx.a.id, 'envd', '/debug?n=4'],
      [200, fx.a.id, '8080', '/debug?n=5'],
    ]);
    expect(answers[0]?.json.body).toBe('first body');
    expect(answers[2]?.json.body).toBe('hello world');
    // A port other than envd's gets no token of the gateway's.
    expect(answers[4]?.json.headers.authorization).toBeUndefined();
  });

  test('a route the template lacks, after an allowed one on the same connection, is refused', async ({
    fx,
  }) => {
    // a's template has no `shell`: its process routes are refused at the gateway.
    const client = fx.open();
    client.write(http('GET', '/health', to(fx.a)));
    expect((await client.answer()).status).toBe(200);
    client.write(http('GET', '/process/list', to(fx.a)));
    const refused = await client.answer();
    expectErrorShape(refused, 403, 'CapabilityError');
    expect(refused.json.error).toContain(`template 'tpl-isandboxa' does not have the shell`);
    // Encoded the way envd's router decodes it: refused the same way.
    client.write(http('GET', '/%70rocess/list', to(fx.a)));
    expectErrorShape(await client.answer(), 403, 'CapabilityError');
    expect(fx.a.requests.map((r) => r.url)).toEqual(['/health']);
    // b has no `ports`: its port 8080 is refused, after b's envd answered on the connection.
    client.write(http('GET', '/health', to(fx.b)));
    expect((await client.answer()).status).toBe(200);
    client.write(http('GET', '/', to(fx.b, 8080)));
    expectErrorShape(await client.answer(), 403, 'CapabilityError');
    // A refused request with a body ends the connection (its body is not read as a request).
    client.write(http('POST', '/process/start', to(fx.a), '{"cmd":"id"}'));
    const withBody = await client.answer();
    expectErrorShape(withBody, 403, 'CapabilityError');
    expect(withBody.headers.connection).toBe('close');
    await client.closed();
  });

  test('an upgrade after a plain request becomes a tunnel to that port', async ({ fx }) => {
    const client = fx.open();
    client.write(http('GET', '/before', to(fx.a, 8080)));
    expect((await client.answer()).json).toMatchObject({ server: '8080', url: '/before' });
    client.write(
      `${http('GET', '/socket', { ...to(fx.a, 8080), Connection: 'Upgrade', Upgrade: 'echo' }).slice(0, -2)}\r\nearly bytes`,
    );
    const switched = await client.answer();
    expect(switched.status).toBe(101);
    expect(switched.headers.upgrade).toBe('echo');
    expect(await client.bytes('early bytes'.length)).toBe('early bytes');
    client.write('ping through the tunnel');
    expect(await client.bytes('ping through the tunnel'.length)).toBe('ping through the tunnel');
  });

  test('Expect: 100-continue gets the interim answer from the sandbox, then the final one', async ({
    fx,
  }) => {
    const client = fx.open();
    const body = '{"x":1}';
    client.write(
      http('POST', '/debug', {
        ...to(fx.a),
        Expect: '100-continue',
        'Content-Length': String(body.length),
      }),
    );
    expect((await client.answer()).status).toBe(100);
    client.write(body);
    const answer = await client.answer();
    expect(answer.status).toBe(200);
    expect(answer.json.body).toBe(body);
  });

  test('Connection: close, and a sandbox that answers early and closes, end the connection', async ({
    fx,
  }) => {
    const closing = fx.open();
    closing.write(http('GET', '/debug', { ...to(fx.a), Connection: 'close' }));
    const answer = await closing.answer();
    expect(answer.status).toBe(200);
    // The sandbox's connection is kept for others: the gateway does not pass the close on.
    expect(answer.json.headers.connection).toBeUndefined();
    await closing.closed();

    const early = fx.open();
    early.write(
      http('POST', '/early-close', { ...to(fx.a), 'Content-Length': String(10 * 1024 * 1024) }),
    );
    early.write(Buffer.alloc(64 * 1024, 'x'));
    const refused = await early.answer();
    expect(refused.status).toBe(413);
    await early.closed();
  });

  test('hostile heads and bodies mid-connection get an error of the contract shape and a close', async ({
    fx,
  }) => {
    const cases: [string, number][] = [
      ['GET /he alth HTTP/1.1\r\n\r\n', 400],
      ['G\0T /health HTTP/1.1\r\n\r\n', 400],
      ['GET /health HTTP/1.1\r\nX-Sandbox-Id : x\r\n\r\n', 400],
      ['GET /health HTTP/1.1\r\nFolded: a\r\n b\r\n\r\n', 400],
      ['GET /health HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nxx', 400],
      ['POST /health HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n', 400],
      ['POST /health HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n', 400],
      ['GET http://evil/health HTTP/1.1\r\n\r\n', 400],
      ['GET /health HTTP/2.0\r\n\r\n', 400],
      [`GET /health HTTP/1.1\r\nX-Big: ${'a'.repeat(17 * 1024)}\r\n\r\n`, 431],
    ];
    for (const [text, status] of cases) {
      const client = fx.open();
      client.write(http('GET', '/health', to(fx.a)));
      expect((await client.answer()).status).toBe(200);
      client.write(text);
      const answer = await client.answer();
      expect(answer.status, JSON.stringify(text.slice(0, 60))).toBe(status);
      expect(answer.json).toMatchObject({ error: expect.any(String), type: 'BadRequestError' });
      await client.closed();
    }
    // A malformed chunked body: the sandbox has the head, the client gets a 400 and a close.
    const client = fx.open();
    client.write(
      `${http('POST', '/debug', { ...to(fx.a), 'Transfer-Encoding': 'chunked' })}zz\r\nhello\r\n`,
    );
    expectErrorShape(await client.answer(), 400, 'BadRequestError');
    await client.closed();
  });

  test('the SDK keeps one pool per sandbox port: no connection moves between sandboxes', async ({
    fx,
  }) => {
    const url = `http://127.0.0.1:${fx.port}`;
    const clientOf = (box: FakeSandbox, port: number) =>
      new HttpClient(
        url,
        {
          'x-sandbox-id': box.id,
          'x-sandbox-port': String(port),
          'x-access-token': box.token,
        },
        10_000,
        `sandbox ${box.id}`,
      );
    let accepted = 0;
    fx.gateway.server.on('connection', () => accepted++);
    for (let i = 0; i < 5; i++) {
      // A new client object each time, as the SDK makes them: the pool is shared anyway.
      for (const [box, port] of [
        [fx.a, ENVD_PORT],
        [fx.b, ENVD_PORT],
        [fx.a, 8080],
      ] as const) {
        const answer = await clientOf(box, port).json<{ sandbox: string; server: string }>(
          'GET',
          '/debug',
        );
        expect(answer).toMatchObject({ sandbox: box.id, server: port === 8080 ? '8080' : 'envd' });
      }
    }
    // One connection per sandbox port, each checked once.
    expect(accepted).toBe(3);
    expect(fx.lookups()).toBe(3);
  });

  test('a pooled connection reads again: a client that went away full never drained it', async ({
    fx,
  }) => {
    const pool = new UpstreamPool(60_000);
    const owner: UpstreamOwner = {
      forward: () => undefined,
      responsesDone: () => undefined,
      upgraded: () => undefined,
      diverted: () => undefined,
      ended: () => undefined,
    };
    try {
      const upstream = pool.acquire(fx.a.record.handle.envdSocket, undefined, owner);
      await new Promise((resolve) => upstream.socket.once('connect', resolve));
      // Paused for a client whose buffer was full, which then closed without a 'drain'.
      upstream.pauseFor(new EventEmitter() as unknown as Socket);
      expect(upstream.socket.isPaused()).toBe(true);
      pool.release(upstream);
      const again = pool.acquire(fx.a.record.handle.envdSocket, undefined, owner);
      expect(again).toBe(upstream);
      expect(again.socket.isPaused()).toBe(false);
      again.destroy();
    } finally {
      pool.close();
    }
  });

  test('deadlines: a head that never ends gets a 408, an idle connection is closed', async ({
    fx,
  }) => {
    const gateway = new Gateway(fx.backend, 'localhost', { headers: 200, keepAlive: 200 });
    await new Promise<void>((resolve) => gateway.server.listen(0, '127.0.0.1', () => resolve()));
    const port = (gateway.server.address() as { port: number }).port;
    const clients: RawConnection[] = [];
    try {
      // Half a head after a request that was answered: refused in the contract's shape.
      const slow = new RawConnection(port);
      clients.push(slow);
      slow.write(http('GET', '/health', to(fx.a)));
      expect((await slow.answer()).status).toBe(200);
      slow.write('GET /health HTTP/1.1\r\nHost: x\r\n');
      const refused = await slow.answer();
      expect(refused.status).toBe(408);
      expect(refused.json).toMatchObject({ type: 'RequestTimeoutError' });
      await slow.closed();
      // Nothing at all on a new connection: the same.
      const silent = new RawConnection(port);
      clients.push(silent);
      expect((await silent.answer()).status).toBe(408);
      // Idle after an answer: closed without a word.
      const idle = new RawConnection(port);
      clients.push(idle);
      idle.write(http('GET', '/health', to(fx.a)));
      expect((await idle.answer()).status).toBe(200);
      await idle.closed();
      expect(idle.unread).toBe(0);
    } finally {
      for (const client of clients) client.socket.destroy();
      gateway.close();
      await new Promise<void>((resolve) => gateway.server.close(() => resolve()));
    }
  });

  test("requests that name no sandbox reach the daemon's API, but not on a listener kept from it", async ({
    fx,
  }) => {
    const api = createServer((req, res) => {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ api: true, path: req.url, host: req.headers.host }));
    });
    await new Promise<void>((resolve) => api.listen(0, '127.0.0.1', () => resolve()));
    const apiPort = (api.address() as { port: number }).port;
    const gateway = new Gateway(
      { ...fx.backend, apiTarget: () => `tcp://127.0.0.1:${apiPort}` },
      'abx.test',
      {},
    );
    const open = gateway.listener();
    const closed = gateway.listener(undefined, { api: false });
    const listenOn = (server: typeof open) =>
      new Promise<number>((resolve) =>
        server.listen(0, '127.0.0.1', () => resolve((server.address() as { port: number }).port)),
      );
    const clients: RawConnection[] = [];
    try {
      const client = new RawConnection(await listenOn(open));
      clients.push(client);
      // /v1 and E2B's control paths on the gateway's own host, and any path on api.{domain}.
      client.write(http('GET', '/v1/health', {}));
      expect((await client.answer()).json).toEqual({
        api: true,
        path: '/v1/health',
        host: '127.0.0.1',
      });
      client.write(http('GET', '/v2/sandboxes?limit=1', {}));
      expect((await client.answer()).json).toMatchObject({
        api: true,
        path: '/v2/sandboxes?limit=1',
      });
      client.write(http('GET', '/anything', { Host: 'api.abx.test:8444' }));
      expect((await client.answer()).json).toMatchObject({ api: true, path: '/anything' });
      // Then a sandbox on the same connection, and the API again.
      client.write(http('GET', '/health', to(fx.a)));
      expect((await client.answer()).status).toBe(200);
      client.write(http('GET', '/v1/health', {}));
      expect((await client.answer()).json).toMatchObject({ api: true });
      // A path of no API that names no sandbox is the gateway's own refusal.
      client.write(http('GET', '/process.Process/List', {}));
      const none = await client.answer();
      expect(none.status).toBe(400);
      expect(none.json.error).toMatch(/^no sandbox named/);

      const kept = new RawConnection(await listenOn(closed));
      clients.push(kept);
      kept.write(http('GET', '/v1/health', {}));
      const refused = await kept.answer();
      expect(refused.status).toBe(400);
      expect(refused.json.error).toMatch(/^no sandbox named/);
    } finally {
      for (const client of clients) client.socket.destroy();
      gateway.close();
      for (const server of [open, closed, api]) {
        await new Promise<void>((resolve) => server.close(() => resolve()));
      }
    }
  });
});
