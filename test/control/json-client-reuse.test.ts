import { once } from 'node:events';
import { createServer, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, test } from 'vitest';
import { DaemonUnavailableError } from '../../src/errors.js';
import { exchange, NodeJsonClient } from '../../src/installation/json-client.js';

// The SDK's requests to a daemon (or a remote control plane) go over Node's kept-alive
// connections. One the peer closed (idle, or a daemon SIGKILLed and started again on the same
// address) is reset when reused, before the peer read the request: exchange() sends it once more
// on a new connection. A reset of a new connection is the peer's answer, and is not retried.

const servers: { server: Server; sockets: Set<Socket> }[] = [];
afterEach(async () => {
  for (const { server, sockets } of servers.splice(0)) {
    server.close();
    // The client's kept-alive connections would hold the close for seconds.
    for (const socket of sockets) socket.destroy();
    await once(server, 'close');
  }
});

/**
 * A loopback HTTP peer that answers `"ok"` to the first request on each connection (keeping it
 * alive), and resets the connection on its `resetFrom`-th request and after (1: every one).
 */
async function peer(resetFrom: number) {
  const seen = { connections: 0, requests: 0, resets: 0 };
  const sockets = new Set<Socket>();
  const server = createServer((socket: Socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    seen.connections++;
    let onThis = 0;
    let pending = '';
    socket.on('data', (chunk) => {
      pending += chunk.toString('latin1');
      for (let end = pending.indexOf('\r\n\r\n'); end >= 0; end = pending.indexOf('\r\n\r\n')) {
        const head = pending.slice(0, end);
        const length = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
        if (pending.length < end + 4 + length) return;
        pending = pending.slice(end + 4 + length);
        onThis++;
        seen.requests++;
        if (onThis >= resetFrom) {
          seen.resets++;
          socket.resetAndDestroy();
          return;
        }
        socket.write('HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: keep-alive\r\n\r\n"ok"');
      }
    });
    socket.on('error', () => undefined);
  });
  servers.push({ server, sockets });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as { port: number };
  return { url: new URL(`http://127.0.0.1:${port}/v1/x`), seen };
}

/** A loopback port nothing listens on (one just closed). */
async function closedPort(): Promise<number> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as { port: number };
  server.close();
  await once(server, 'close');
  return port;
}

describe('exchange over a kept-alive connection', () => {
  test('a reused connection reset before any answer is sent once more on a new one, a POST too', async () => {
    const { url, seen } = await peer(2);
    const first = await exchange(url, { method: 'GET', timeoutMs: 5000 });
    expect(first).toEqual({ status: 200, text: '"ok"' });
    // The agent reuses the first connection: the peer resets it; the request goes again.
    const body = JSON.stringify({ a: 1 });
    const second = await exchange(url, { method: 'POST', body, timeoutMs: 5000 });
    expect(second).toEqual({ status: 200, text: '"ok"' });
    expect(seen).toEqual({ connections: 2, requests: 3, resets: 1 });
  });

  test('a new connection reset is an error at once, sent once', async () => {
    const { url, seen } = await peer(1);
    await expect(exchange(url, { method: 'POST', body: '{}', timeoutMs: 5000 })).rejects.toThrow(
      /ECONNRESET|socket hang up/,
    );
    expect(seen).toEqual({ connections: 1, requests: 1, resets: 1 });
  });
});

describe("a local daemon's client when its daemon refuses a connection", () => {
  test('finds the daemon again once (rediscover) and sends the request to it, a POST too', async () => {
    const { url, seen } = await peer(99);
    let looked = 0;
    const client = new NodeJsonClient(
      `http://127.0.0.1:${await closedPort()}`,
      {},
      5000,
      'the abx daemon',
      DaemonUnavailableError,
      {
        rediscover: async () => {
          looked++;
          return url.origin;
        },
      },
    );
    expect(await client.json('POST', '/v1/x', { body: { a: 1 } })).toBe('ok');
    expect(looked).toBe(1);
    // From then on, the daemon found again.
    expect(await client.json('GET', '/v1/x')).toBe('ok');
    expect(looked).toBe(1);
    expect(seen.requests).toBe(2);
  });

  test('a daemon that is not found again is the error; a remote control plane is not looked for', async () => {
    const port = await closedPort();
    const local = new NodeJsonClient(
      `http://127.0.0.1:${port}`,
      {},
      5000,
      'the abx daemon',
      DaemonUnavailableError,
      {
        rediscover: async () => {
          throw new DaemonUnavailableError(
            'no abx daemon runs for /home/x; start one with `abx daemon start`',
          );
        },
      },
    );
    await expect(local.json('POST', '/v1/x', { body: {} })).rejects.toThrow(/no abx daemon runs/);
    const remote = new NodeJsonClient(
      `http://127.0.0.1:${port}`,
      {},
      5000,
      'the control plane',
      DaemonUnavailableError,
    );
    await expect(remote.json('POST', '/v1/x', { body: {} })).rejects.toThrow(/ECONNREFUSED/);
  });
});
