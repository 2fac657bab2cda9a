import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import {
  CONTRACT_COMMANDS,
  call,
  eventually,
  failToStart,
  isAlive,
  killLeftovers,
  type RunningServer,
  startServer,
} from './harness.js';

afterEach(killLeftovers);

async function inFlight(server: RunningServer): Promise<number> {
  // The metrics request itself is one of them.
  return (await server.call('/system/metrics')).json.in_flight - 1;
}

async function refusesConnections(url: string): Promise<boolean> {
  return call(url, '/health').then(
    () => false,
    () => true,
  );
}

describe('stopping', () => {
  test('SIGTERM lets the call in flight finish, refuses new connections, exits 0', async () => {
    const server = await startServer(['--load', CONTRACT_COMMANDS]);
    const pending = server.call('/commands/delayed', { body: { value: 42, ms: 1500 } });
    await eventually(async () => (await inFlight(server)) === 1);
    server.child.kill('SIGTERM');
    await eventually(() => refusesConnections(server.url));
    const answer = await pending;
    expect(answer.status).toBe(200);
    expect(answer.json).toEqual({ result: 42 });
    expect(await server.exited).toBe(0);
  });

  test('a call past the grace period is cut off and the server still exits 0', async () => {
    const server = await startServer(['--load', CONTRACT_COMMANDS, '--grace-ms', '200']);
    // Settled right away, so its rejection is never unhandled.
    const pending = server.call('/commands/delayed', { body: { value: 1, ms: 20_000 } }).then(
      () => 'answered',
      (error: Error) => error.message,
    );
    await eventually(async () => (await inFlight(server)) === 1);
    server.child.kill('SIGTERM');
    expect(await server.exited).toBe(0);
    expect(await pending).not.toBe('answered');
  });

  test('POST /shutdown answers 202 and the server exits 0', async () => {
    const server = await startServer([], { token: 't0k' });
    const answer = await server.call('/shutdown', { body: {} });
    expect(answer.status).toBe(202);
    expect(answer.json).toEqual({ status: 'stopping' });
    expect(await server.exited).toBe(0);
  });

  test('stopping kills background processes and terminals', async () => {
    const server = await startServer([]);
    const proc = (await server.call('/process/start', { body: { cmd: 'sleep 300' } })).json;
    const term = (await server.call('/terminal', { body: { command: 'sleep 300' } })).json;
    server.child.kill('SIGTERM');
    expect(await server.exited).toBe(0);
    await eventually(() => !isAlive(proc.pid) && !isAlive(term.pid));
  });
});

/** Sends `text` on a new connection and no more; resolves with all the server sent until it closed. */
function sentThenStalled(port: number, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    let reply = '';
    socket.on('data', (c) => {
      reply += c.toString();
    });
    socket.on('close', () => resolve(reply));
    socket.on('error', reject);
    socket.write(text);
  });
}

describe('request limits', () => {
  test('a body over --body-limit is 413, by Content-Length and when chunked', async () => {
    const server = await startServer(['--body-limit', '1024']);
    const declared = await server.call('/commands/runshell', {
      body: { cmd: 'true', env: { PAD: 'x'.repeat(4096) } },
    });
    expect(declared.status).toBe(413);
    expect(declared.json.type).toBe('PayloadTooLargeError');
    expect(declared.json.error).toContain('1024 bytes');
    const chunked = await new Promise<{ status?: number; body: string }>((resolve, reject) => {
      const req = httpRequest(`${server.url}/files/write?path=${tmpdir()}/abx-never-written`, {
        method: 'PUT',
      });
      req.on('response', (res) => {
        let body = '';
        res.on('data', (c: Buffer) => {
          body += c.toString();
        });
        res.on('end', () => resolve({ status: res.statusCode, body }));
      });
      req.on('error', reject);
      // Chunks keep coming: the server must answer without waiting for the end.
      req.write(Buffer.alloc(800));
      req.write(Buffer.alloc(800));
    });
    expect(chunked.status).toBe(413);
    expect(JSON.parse(chunked.body).type).toBe('PayloadTooLargeError');
    expect((await server.call('/health')).status).toBe(200);
  });

  test('a body that stalls gets 408 after --body-timeout-ms instead of holding the request', async () => {
    const server = await startServer(['--body-timeout-ms', '300']);
    const reply = await sentThenStalled(
      server.port,
      'POST /commands/runshell HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"cmd":',
    );
    expect(reply).toMatch(/^HTTP\/1\.1 408/);
    expect(reply).toContain('"type":"RequestTimeoutError"');
  });

  test('a file body that stalls gets 408 too, within its first 64 KiB (read whole) and past them (streamed), and nothing is written', async () => {
    const server = await startServer(['--body-timeout-ms', '400']);
    const dir = mkdtempSync(join(tmpdir(), 'abx-stalled-'));
    for (const sent of [10, 100 * 1024]) {
      const path = join(dir, `stalled-${sent}`);
      const reply = await sentThenStalled(
        server.port,
        `PUT /files/write?path=${encodeURIComponent(path)} HTTP/1.1\r\nHost: x\r\nContent-Length: ${1024 * 1024}\r\n\r\n${'a'.repeat(sent)}`,
      );
      expect(reply).toMatch(/^HTTP\/1\.1 408/);
      expect(reply).toContain('"type":"RequestTimeoutError"');
      expect(existsSync(path)).toBe(false);
    }
  });
});

describe('refusing to start', () => {
  test('an unknown group', async () => {
    const { code, stderr } = await failToStart(['--groups', 'files,gpu']);
    expect(code).toBe(2);
    expect(stderr).toContain("unknown route group 'gpu'");
    expect(stderr).toContain('file_ops');
  });

  test('a manifest of an unknown version', async () => {
    const file = join(mkdtempSync(join(tmpdir(), 'abx-manifest-')), 'future.cjs');
    writeFileSync(file, 'module.exports = { version: 2, template: "t", commands: [] };');
    const { code, stderr } = await failToStart(['--load', file]);
    expect(code).toBe(2);
    expect(stderr).toContain('version 2');
    expect(stderr).toContain('reads version 1');
  });

  test('a --load file that does not exist, or is not a manifest', async () => {
    const missing = await failToStart(['--load', '/nonexistent/bundle.cjs']);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain('cannot load /nonexistent/bundle.cjs');
    const file = join(mkdtempSync(join(tmpdir(), 'abx-manifest-')), 'plain.cjs');
    writeFileSync(file, 'module.exports = { hello: 1 };');
    const plain = await failToStart(['--load', file]);
    expect(plain.stderr).toContain('does not export a command manifest');
  });

  test('a command that clashes with a built-in', async () => {
    const file = join(mkdtempSync(join(tmpdir(), 'abx-manifest-')), 'clash.cjs');
    writeFileSync(
      file,
      'module.exports = { version: 1, template: "t", commands: [{ name: "runshell", description: "", args: [], invoke() {} }] };',
    );
    const { code, stderr } = await failToStart(['--load', file]);
    expect(code).toBe(2);
    expect(stderr).toContain("command 'runshell' is registered twice");
  });

  test('a port in use exits 1', async () => {
    const server = await startServer([]);
    const { code, stderr } = await failToStart(['--port', String(server.port)]);
    expect(code).toBe(1);
    expect(stderr).toContain('cannot listen');
    expect(stderr).toContain('EADDRINUSE');
  });
});
