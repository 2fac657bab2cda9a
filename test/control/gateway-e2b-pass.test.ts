import { mkdtempSync, rmSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { E2bEnvdFace } from '../../src/compat/e2b/envd-face.js';
import { Gateway } from '../../src/control/gateway.js';
import { gatewayRecord } from '../helpers/gateway-record.js';

// E2B's `/files` requests go to envd as bytes; envd's answer goes back as bytes, and an error
// answer comes back to the face, which rewrites it (the gateway's "pass-on"). Here envd is a raw
// socket server scripted per test, as a hostile or broken sandbox could answer: an error too
// large, a garbled head, a cut connection, an answer before the upload ended. The client always
// gets envd's 2xx as it was sent, an error in E2B's shape, or a cut connection, never a hang, and
// the gateway goes on serving.

const ID = 'ipassonsandbox';
const TOKEN = 'token-of-pass-on';
const dir = mkdtempSync(join(tmpdir(), 'abx-gateway-pass-'));
const socketPath = join(dir, 'envd.sock');

/** What the fake envd does with the next request it reads whole (or with its head, `early`). */
let script: {
  early?: boolean;
  answer: (request: string, socket: Socket) => void;
};
/** The requests the fake envd read, as text. */
const seen: string[] = [];

let envd: Server;
let gateway: Gateway;
let port: number;

const record = gatewayRecord({
  id: ID,
  token: TOKEN,
  envdSocket: socketPath,
  portsDir: join(dir, 'ports'),
  capabilities: ['shell', 'files'],
});

beforeAll(async () => {
  envd = createServer((socket) => {
    let text = '';
    let answered = false;
    socket.on('error', () => undefined);
    socket.on('data', (chunk: Buffer) => {
      text += chunk.toString('latin1');
      const headEnd = text.indexOf('\r\n\r\n');
      if (headEnd < 0 || answered) return;
      const head = text.slice(0, headEnd);
      const length = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
      const chunked = /transfer-encoding: chunked/i.test(head);
      const whole = chunked ? text.endsWith('0\r\n\r\n') : text.length >= headEnd + 4 + length;
      if (!script.early && !whole) return;
      answered = true;
      seen.push(text);
      script.answer(text, socket);
      text = '';
      answered = false;
    });
  });
  await new Promise<void>((resolve) => envd.listen(socketPath, () => resolve()));
  gateway = new Gateway(
    { find: () => record, isAlive: () => true, openPort: async () => socketPath },
    'localhost',
    {},
    new E2bEnvdFace(),
  );
  await new Promise<void>((resolve) => gateway.server.listen(0, '127.0.0.1', () => resolve()));
  port = (gateway.server.address() as { port: number }).port;
});

afterAll(async () => {
  gateway?.close();
  await new Promise<void>((resolve) => gateway?.server.close(() => resolve()));
  await new Promise<void>((resolve) => envd?.close(() => resolve()));
  rmSync(dir, { recursive: true, force: true });
});

beforeEach(() => {
  seen.length = 0;
});

/** An HTTP answer as bytes, with a length. */
function answer(status: number, body: string, extra = ''): string {
  return `HTTP/1.1 ${status} X\r\ncontent-type: application/json\r\n${extra}content-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

const FORM =
  '--b\r\nContent-Disposition: form-data; name="file"; filename="/tmp/a.txt"\r\n\r\nhello\r\n--b--\r\n';

function upload(path = '/files?path=%2Ftmp%2Fa.txt', body = FORM, extra: string[] = []): string {
  return [
    `POST ${path} HTTP/1.1`,
    'host: localhost',
    `e2b-sandbox-id: ${ID}`,
    'e2b-sandbox-port: 49983',
    `x-access-token: ${TOKEN}`,
    'content-type: multipart/form-data; boundary=b',
    `content-length: ${body.length}`,
    ...extra,
    '',
    body,
  ].join('\r\n');
}

/**
 * Sends `request` on a new connection; resolves with everything the gateway sent until it closed
 * the connection or `settle` ms passed without more bytes.
 */
function exchange(request: string, settle = 400): Promise<{ text: string; closed: boolean }> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1', () => socket.write(request));
    let text = '';
    let timer: NodeJS.Timeout | undefined;
    const done = (closed: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      resolve({ text, closed });
    };
    const wait = () => {
      clearTimeout(timer);
      timer = setTimeout(() => done(false), settle);
    };
    socket.on('data', (chunk: Buffer) => {
      text += chunk.toString('latin1');
      wait();
    });
    socket.on('error', () => undefined);
    socket.on('close', () => done(true));
    wait();
  });
}

function parsed(text: string): { status: number; head: string; body: string } {
  const headEnd = text.indexOf('\r\n\r\n');
  const head = text.slice(0, headEnd);
  return { status: Number(head.split(' ')[1]), head, body: text.slice(headEnd + 4) };
}

describe("E2B's /files passed to envd as bytes", () => {
  test("an upload reaches envd's /files/upload as sent, asking for E2B's answer, which passes as sent", async () => {
    const entries = JSON.stringify([{ name: 'a.txt', type: 'file', path: '/tmp/a.txt' }]);
    script = { answer: (_request, socket) => socket.write(answer(200, entries)) };
    const { text, closed } = await exchange(upload());
    expect(closed).toBe(false);
    const got = parsed(text);
    expect(got.status).toBe(200);
    expect(got.head).toMatch(/\r\ncontent-length: \d+/i);
    expect(got.body).toBe(entries);
    // envd got its own route, the body as the client sent it, the sandbox's token, and none of
    // the gateway's or E2B's addressing headers.
    const request = seen[0] as string;
    expect(request.startsWith('POST /files/upload?e2b=true&path=%2Ftmp%2Fa.txt HTTP/1.1\r\n')).toBe(
      true,
    );
    expect(request.endsWith(`\r\n\r\n${FORM}`)).toBe(true);
    expect(request).toMatch(new RegExp(`\\r\\nauthorization: Bearer ${TOKEN}\\r\\n`, 'i'));
    expect(request).not.toMatch(/e2b-sandbox-id|x-access-token/i);
  });

  const broken: [string, (socket: Socket) => void][] = [
    [
      'an error answer over 1 MiB',
      (socket) => socket.write(answer(500, JSON.stringify({ error: 'x'.repeat(1.5e6) }))),
    ],
    ['a garbled head', (socket) => socket.write('HTTP/9 nonsense\r\n\r\n')],
    ['a connection cut before an answer', (socket) => socket.destroy()],
  ];
  for (const [name, misbehave] of broken) {
    test(`envd's ${name}: the client gets E2B's 502, and the gateway goes on`, async () => {
      script = { answer: (_request, socket) => misbehave(socket) };
      const { text } = await exchange(upload());
      const got = parsed(text);
      expect(got.status).toBe(502);
      expect(JSON.parse(got.body)).toMatchObject({ code: 502, message: expect.any(String) });
      // The next upload, on a new connection, is answered.
      script = { answer: (_request, socket) => socket.write(answer(200, '[]')) };
      const next = parsed((await exchange(upload())).text);
      expect(next.status).toBe(200);
    });
  }

  test("envd's 2xx goes to the client as sent, whatever it holds, as a download does; one cut in its body cuts the client's connection", async () => {
    script = { answer: (_request, socket) => socket.write(answer(200, '<html>')) };
    const odd = parsed((await exchange(upload())).text);
    expect(odd.status).toBe(200);
    expect(odd.body).toBe('<html>');
    const whole = answer(200, '[{"name":"a.txt","type":"file","path":"/tmp/a.txt"}]');
    script = { answer: (_request, socket) => socket.end(whole.slice(0, -5)) };
    const cut = await exchange(upload());
    expect(cut.closed).toBe(true);
    expect(cut.text).toBe(whole.slice(0, -5));
    script = { answer: (_request, socket) => socket.write(answer(200, '[]')) };
    expect(parsed((await exchange(upload())).text).status).toBe(200);
  });

  test("envd's refusal before the body ended: E2B's shape, its status, and the connection ends", async () => {
    script = {
      early: true,
      answer: (_request, socket) =>
        socket.write(
          answer(
            507,
            JSON.stringify({ error: 'cannot write /tmp/a.txt: ENOSPC', code: 'ENOSPC' }),
            'connection: close\r\n',
          ),
        ),
    };
    // The head says 1 MiB; only a part of it is sent.
    const head = upload('/files?path=%2Ftmp%2Fa.txt', 'x'.repeat(1000)).replace(
      'content-length: 1000',
      `content-length: ${1024 * 1024}`,
    );
    const { text, closed } = await exchange(head, 2000);
    const got = parsed(text);
    expect(got.status).toBe(507);
    expect(JSON.parse(got.body)).toEqual({
      code: 507,
      message: "the sandbox's disk is full: cannot write /tmp/a.txt: ENOSPC",
    });
    expect(got.head).toMatch(/\r\nconnection: close/i);
    expect(closed).toBe(true);
  });

  test('a download passes as envd sent it; its error comes back in E2B’s shape', async () => {
    script = {
      answer: (_request, socket) =>
        socket.write(
          'HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n',
        ),
    };
    const get = (path: string) =>
      [
        `GET /files?path=${path} HTTP/1.1`,
        'host: localhost',
        `e2b-sandbox-id: ${ID}`,
        'e2b-sandbox-port: 49983',
        `x-access-token: ${TOKEN}`,
        '',
        '',
      ].join('\r\n');
    const ok = parsed((await exchange(get('%2Ftmp%2Fa.txt'))).text);
    expect(ok.status).toBe(200);
    expect(ok.body).toBe('3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n');
    expect(seen[0]?.startsWith('GET /files/read?path=%2Ftmp%2Fa.txt HTTP/1.1\r\n')).toBe(true);
    script = {
      answer: (_request, socket) =>
        socket.write(
          answer(404, JSON.stringify({ error: 'no such file: /tmp/z', type: 'NotFoundError' })),
        ),
    };
    const missing = parsed((await exchange(get('%2Ftmp%2Fz'))).text);
    expect(missing.status).toBe(404);
    expect(JSON.parse(missing.body)).toEqual({
      code: 404,
      message: 'read /tmp/z: no such file: /tmp/z',
    });
  });

  test('`username=root` is refused by the face, and nothing reaches envd', async () => {
    script = { answer: () => undefined };
    const got = parsed((await exchange(upload('/files?path=%2Ftmp%2Fa.txt&username=root'))).text);
    expect(got.status).toBe(403);
    expect(JSON.parse(got.body).message).toMatch(/username 'root' is refused/);
    expect(seen).toEqual([]);
  });
});
