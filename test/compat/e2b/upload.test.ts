import { createHash, randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { request } from 'node:http';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Sandbox as E2bSandbox, NotEnoughSpaceError } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { E2bEnvdFace } from '../../../src/compat/e2b/envd-face.js';
import { Gateway } from '../../../src/control/gateway.js';
import { SqliteRegistry } from '../../../src/control/sqlite-registry.js';
import { Sandbox, Templates } from '../../../src/index.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { attach } from './attach.js';

// E2B's `POST /files` streamed end to end: the unmodified `e2b` SDK uploads files far larger than
// anything the daemon holds (200 MiB, multipart and octet-stream, gzip) into a real sandbox, and
// the daemon's memory does not grow with them; cut, slow and refused uploads leave no file.

const MiB = 1024 * 1024;
const UPLOAD = 200 * MiB;

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let native: Sandbox;
let sbx: E2bSandbox;
let gatewayUrl: string;
let daemonPid: number;

beforeAll(async () => {
  abx = await createAbxHome();
  native = await Sandbox.create({ home: abx.home });
  gatewayUrl = new URL(native.getUrl(49983)).origin;
  sbx = attach(gatewayUrl, native.sandboxId, native.accessToken);
  daemonPid = (JSON.parse(readFileSync(join(abx.home, 'daemon.json'), 'utf8')) as { pid: number })
    .pid;
}, 300_000);

afterAll(async () => {
  await native?.kill().catch(() => undefined);
  await abx?.close();
});

/** `size` bytes as a web stream of 1 MiB pieces (random, or one repeated byte pattern), and their sha256. */
function generated(size: number, compressible = false) {
  const hash = createHash('sha256');
  const block = compressible
    ? Buffer.from('abx streams E2B uploads\n'.repeat(Math.ceil(MiB / 24)).slice(0, MiB))
    : randomBytes(MiB);
  let sent = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (sent >= size) {
        controller.close();
        return;
      }
      const piece = Buffer.from(block.subarray(0, Math.min(MiB, size - sent)));
      // Each piece differs from the last, so a repeated or dropped piece changes the hash.
      piece.writeUInt32BE(sent / MiB, 0);
      sent += piece.length;
      hash.update(piece);
      controller.enqueue(piece);
    },
  });
  return { stream, sha256: () => hash.digest('hex') };
}

/** The peak resident memory of the daemon so far (kB), from /proc. */
function daemonPeakKb(): number {
  const status = readFileSync(`/proc/${daemonPid}/status`, 'utf8');
  return Number(/VmHWM:\s+(\d+) kB/.exec(status)?.[1]);
}

/** Size and sha256 of a file, as the sandbox sees it. */
async function inSandbox(path: string): Promise<{ size: number; sha256: string }> {
  const out = await sbx.commands.run(`stat -c %s ${path} && sha256sum ${path}`);
  const [size, sum] = out.stdout.trim().split('\n');
  return { size: Number(size), sha256: (sum as string).split(' ')[0] as string };
}

/** What a directory holds, hidden names (envd's temporary files) included. */
async function entries(dir: string): Promise<string[]> {
  const out = await sbx.commands.run(`mkdir -p ${dir} && ls -A ${dir}`);
  return out.stdout.split('\n').filter((name) => name !== '');
}

/** Waits for `check` to hold (a cut write's temporary file is removed once envd sees the cut). */
async function eventually(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 120; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw new Error(`${what} did not happen within 30 s`);
}

const e2bHeaders = () => ({
  'e2b-sandbox-id': native.sandboxId,
  'e2b-sandbox-port': '49983',
  'x-access-token': native.accessToken,
});

describe('large uploads through the e2b SDK', () => {
  test('200 MiB as a stream, octet-stream: whole in the sandbox, the daemon holds none of it', async () => {
    const before = daemonPeakKb();
    const data = generated(UPLOAD);
    const info = await sbx.files.write('/tmp/big/octet.bin', data.stream);
    expect(info).toMatchObject({ path: '/tmp/big/octet.bin', type: 'file' });
    expect(await inSandbox('/tmp/big/octet.bin')).toEqual({ size: UPLOAD, sha256: data.sha256() });
    const grewKb = daemonPeakKb() - before;
    // Read whole, the upload alone would raise the peak by 200 MiB.
    expect(grewKb * 1024).toBeLessThan(UPLOAD / 2);
    await sbx.files.remove('/tmp/big/octet.bin');
  }, 600_000);

  test('200 MiB as a stream, multipart', async () => {
    const before = daemonPeakKb();
    const data = generated(UPLOAD);
    // The SDK sends a form unless told otherwise (it holds the stream whole on its side).
    const info = await sbx.files.write('/tmp/big/form.bin', data.stream, {
      useOctetStream: false,
      requestTimeoutMs: 600_000,
    });
    expect(info).toMatchObject({ path: '/tmp/big/form.bin', type: 'file' });
    expect(await inSandbox('/tmp/big/form.bin')).toEqual({ size: UPLOAD, sha256: data.sha256() });
    expect((daemonPeakKb() - before) * 1024).toBeLessThan(UPLOAD / 2);
    await sbx.files.remove('/tmp/big/form.bin');
  }, 600_000);

  test('gzip: 200 MiB unpacked from a stream as it arrives', async () => {
    const data = generated(UPLOAD, true);
    await sbx.files.write('/tmp/big/zipped.txt', data.stream, { gzip: true });
    expect(await inSandbox('/tmp/big/zipped.txt')).toEqual({
      size: UPLOAD,
      sha256: data.sha256(),
    });
    await sbx.files.remove('/tmp/big/zipped.txt');
  }, 600_000);
});

/** Sends a request head and then `body` pieces on a raw connection; resolves with the socket. */
function rawUpload(head: string): Promise<Socket> {
  const url = new URL(gatewayUrl);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(url.port), url.hostname, () => {
      socket.write(head);
      resolve(socket);
    });
    socket.on('error', reject);
  });
}

/** The first answer in `text`, when it is all there: its status, (de-chunked) body and what follows. */
function parseAnswer(text: string): { status: number; body: string; rest: string } | undefined {
  const headEnd = text.indexOf('\r\n\r\n');
  if (headEnd < 0) return undefined;
  const head = text.slice(0, headEnd);
  const status = Number(head.split(' ')[1]);
  let pos = headEnd + 4;
  if (!/transfer-encoding: chunked/i.test(head)) {
    const length = status === 204 ? 0 : Number(/content-length: (\d+)/i.exec(head)?.[1]);
    if (text.length < pos + length) return undefined;
    return { status, body: text.slice(pos, pos + length), rest: text.slice(pos + length) };
  }
  let body = '';
  for (;;) {
    const eol = text.indexOf('\r\n', pos);
    if (eol < 0) return undefined;
    const size = Number.parseInt(text.slice(pos, eol), 16);
    if (text.length < eol + 2 + size + 2) return undefined;
    if (size === 0) return { status, body, rest: text.slice(eol + 4) };
    body += text.slice(eol + 2, eol + 2 + size);
    pos = eol + 2 + size + 2;
  }
}

/**
 * Reads one answer from a raw connection (after `carried`, what came after the answer before):
 * its status, (de-chunked) body and what followed it.
 */
function readAnswer(
  socket: Socket,
  carried = '',
): Promise<{ status: number; body: string; rest: string }> {
  const ready = parseAnswer(carried);
  if (ready) return Promise.resolve(ready);
  return new Promise((resolve, reject) => {
    let text = carried;
    const onData = (chunk: Buffer) => {
      text += chunk.toString('latin1');
      const answer = parseAnswer(text);
      if (!answer) return;
      socket.off('data', onData);
      resolve(answer);
    };
    socket.on('data', onData);
    socket.on('error', reject);
    socket.on('close', () => reject(new Error(`closed before an answer: ${text.slice(0, 200)}`)));
  });
}

describe('cut, slow and refused uploads', () => {
  test('a client that goes away mid-upload leaves no file; the connection after it works', async () => {
    const head = [
      `POST /files?path=/tmp/cut/half.bin HTTP/1.1`,
      `host: ${new URL(gatewayUrl).host}`,
      ...Object.entries(e2bHeaders()).map(([k, v]) => `${k}: ${v}`),
      'content-type: application/octet-stream',
      'transfer-encoding: chunked',
      '',
      '',
    ].join('\r\n');
    const socket = await rawUpload(head);
    const piece = randomBytes(MiB);
    for (let i = 0; i < 8; i++) {
      socket.write(`${piece.length.toString(16)}\r\n`);
      socket.write(piece);
      socket.write('\r\n');
    }
    // Half-written, from envd's side: its temporary file exists before the cut.
    await eventually(async () => (await entries('/tmp/cut')).length > 0, 'the write starting');
    socket.destroy();
    await eventually(
      async () => (await entries('/tmp/cut')).length === 0,
      'the cut write leaving nothing',
    );
    // The daemon goes on, and a keep-alive connection carries an upload and the next request.
    const next = await rawUpload(
      [
        `POST /files?path=/tmp/cut/whole.txt HTTP/1.1`,
        `host: ${new URL(gatewayUrl).host}`,
        ...Object.entries(e2bHeaders()).map(([k, v]) => `${k}: ${v}`),
        'content-type: application/octet-stream',
        'content-length: 5',
        '',
        'whole',
      ].join('\r\n'),
    );
    try {
      const first = await readAnswer(next);
      expect(first.status).toBe(200);
      expect(JSON.parse(first.body)).toEqual([
        { name: 'whole.txt', type: 'file', path: '/tmp/cut/whole.txt' },
      ]);
      next.write(
        [
          'GET /health HTTP/1.1',
          `host: ${new URL(gatewayUrl).host}`,
          ...Object.entries(e2bHeaders()).map(([k, v]) => `${k}: ${v}`),
          '',
          '',
        ].join('\r\n'),
      );
      expect((await readAnswer(next)).status).toBe(204);
    } finally {
      next.destroy();
    }
    expect(await sbx.files.read('/tmp/cut/whole.txt')).toBe('whole');
  }, 120_000);

  test('pipelined on one connection: an upload, a download E2B refuses, a native read, a download, answered in order', async () => {
    const host = `host: ${new URL(gatewayUrl).host}`;
    const e2b = Object.entries(e2bHeaders()).map(([k, v]) => `${k}: ${v}`);
    const nativeHeaders = [
      `x-sandbox-id: ${native.sandboxId}`,
      'x-sandbox-port: 49983',
      `x-access-token: ${native.accessToken}`,
    ];
    const form = '--b\r\nContent-Disposition: form-data; name="file"\r\n\r\npiped\r\n--b--\r\n';
    // All four requests in one write: each waits for the answers before it.
    const socket = await rawUpload(
      [
        [
          'POST /files?path=/tmp/piped/a.txt HTTP/1.1',
          host,
          ...e2b,
          'content-type: multipart/form-data; boundary=b',
          `content-length: ${form.length}`,
          '',
          form,
        ].join('\r\n'),
        ['GET /files?path=/tmp/piped/missing.txt HTTP/1.1', host, ...e2b, '', ''].join('\r\n'),
        ['GET /files/read?path=/tmp/piped/a.txt HTTP/1.1', host, ...nativeHeaders, '', ''].join(
          '\r\n',
        ),
        ['GET /files?path=/tmp/piped/a.txt HTTP/1.1', host, ...e2b, '', ''].join('\r\n'),
      ].join(''),
    );
    try {
      const answers: { status: number; body: string }[] = [];
      let rest = '';
      for (let i = 0; i < 4; i++) {
        const answer = await readAnswer(socket, rest);
        answers.push({ status: answer.status, body: answer.body });
        rest = answer.rest;
      }
      expect(answers[0]).toEqual({
        status: 200,
        body: JSON.stringify([{ name: 'a.txt', type: 'file', path: '/tmp/piped/a.txt' }]),
      });
      expect(answers[1]?.status).toBe(404);
      expect(JSON.parse(answers[1]?.body as string)).toMatchObject({
        code: 404,
        message: expect.stringMatching(/^read \/tmp\/piped\/missing\.txt: /),
      });
      expect(answers.slice(2)).toEqual([
        { status: 200, body: 'piped' },
        { status: 200, body: 'piped' },
      ]);
    } finally {
      socket.destroy();
    }
  }, 60_000);

  test('a form broken after its first part: the first file is written, the broken one is not', async () => {
    const form = [
      '--xyz\r\nContent-Disposition: form-data; name="file"; filename="/tmp/form/one.txt"\r\n\r\n1\r\n',
      '--xyz\r\nContent-Disposition: form-data; name="file"; filename="/tmp/form/two.txt"\r\n\r\n2 never closed',
    ].join('');
    const res = await fetch(`${gatewayUrl}/files`, {
      method: 'POST',
      headers: { ...e2bHeaders(), 'content-type': 'multipart/form-data; boundary=xyz' },
      body: form,
    });
    expect(res.status).toBe(400);
    expect(await res.json()).toEqual({
      code: 400,
      message: 'the multipart body could not be read: a part is not closed by the boundary',
    });
    expect(await entries('/tmp/form')).toEqual(['one.txt']);
    // Two parts for one ?path= are refused as E2B's envd refuses them, after the first.
    const twice = await fetch(`${gatewayUrl}/files?path=/tmp/form/same.txt`, {
      method: 'POST',
      headers: { ...e2bHeaders(), 'content-type': 'multipart/form-data; boundary=xyz' },
      body: `--xyz\r\nContent-Disposition: form-data; name="file"\r\n\r\na\r\n--xyz\r\nContent-Disposition: form-data; name="file"\r\n\r\nb\r\n--xyz--\r\n`,
    });
    expect(twice.status).toBe(400);
    expect(((await twice.json()) as { message: string }).message).toMatch(
      /cannot upload multiple files to same path/,
    );
    expect(await sbx.files.read('/tmp/form/same.txt')).toBe('a');
  }, 60_000);

  test('a body that stops arriving gets 408 and writes nothing (a gateway with a short deadline)', async () => {
    // The daemon's gateway waits an hour for a body: this one, over the same real sandbox, 1.5 s.
    const registry = new SqliteRegistry(join(abx.home, 'abx.db'));
    const record = await registry.getSandbox(native.sandboxId);
    expect(record).toBeDefined();
    const gateway = new Gateway(
      {
        find: () => record,
        isAlive: () => true,
        openPort: async () => {
          throw new Error('no ports here');
        },
      },
      'localhost',
      { request: 1500 },
      new E2bEnvdFace(),
    );
    await new Promise<void>((resolve) => gateway.server.listen(0, '127.0.0.1', () => resolve()));
    const port = (gateway.server.address() as { port: number }).port;
    try {
      const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = request({
          host: '127.0.0.1',
          port,
          method: 'POST',
          path: '/files?path=/tmp/slow/never.bin',
          headers: {
            ...e2bHeaders(),
            'content-type': 'application/octet-stream',
            'content-length': String(16 * MiB),
          },
        });
        req.on('response', (res) => {
          let body = '';
          res.on('data', (chunk: Buffer) => {
            body += chunk;
          });
          res.on('end', () => resolve({ status: res.statusCode as number, body }));
          res.on('error', reject);
        });
        req.on('error', reject);
        // A first MiB, then nothing more.
        req.write(randomBytes(MiB));
      });
      expect(answer.status).toBe(408);
      expect(JSON.parse(answer.body)).toMatchObject({
        code: 408,
        message: expect.stringMatching(/did not arrive in time/),
      });
      await eventually(
        async () => (await entries('/tmp/slow')).length === 0,
        'the slow write leaving nothing',
      );
    } finally {
      gateway.close();
      await new Promise<void>((resolve) => gateway.server.close(() => resolve()));
      registry.close?.();
    }
  }, 60_000);

  test('a full disk is E2B’s 507 (the SDK’s NotEnoughSpaceError), and no file is left', async () => {
    const work = await mkdtemp(join(tmpdir(), 'abx-upload-'));
    try {
      const yaml = join(work, 'template.yaml');
      writeFileSync(yaml, 'name: tiny-disk\nresources: { disk: 32M }\n');
      await Templates.build(yaml, { home: abx.home });
      const tiny = await Sandbox.create({ home: abx.home, template: 'tiny-disk' });
      try {
        const small = attach(gatewayUrl, tiny.sandboxId, tiny.accessToken);
        const full = await small.files
          .write('/tmp/full.bin', generated(64 * MiB).stream)
          .catch((e: unknown) => e);
        expect(full).toBeInstanceOf(NotEnoughSpaceError);
        expect((full as Error).message).toMatch(/disk is full/);
        const left = await small.commands.run('ls -A /tmp');
        expect(left.stdout).not.toMatch(/full\.bin/);
        // The sandbox and the gateway go on.
        await small.files.write('/tmp/after.txt', 'fits');
        expect(await small.files.read('/tmp/after.txt')).toBe('fits');
      } finally {
        await tiny.kill();
      }
    } finally {
      await rm(work, { recursive: true, force: true });
    }
  }, 300_000);
});

describe('downloads', () => {
  test('200 MiB read as a stream through the SDK, the daemon holding none of it', async () => {
    const data = generated(UPLOAD);
    await sbx.files.write('/tmp/big/down.bin', data.stream);
    const sha256 = data.sha256();
    const before = daemonPeakKb();
    const stream = await sbx.files.read('/tmp/big/down.bin', { format: 'stream' });
    const hash = createHash('sha256');
    let size = 0;
    // Read slowly at first: a download the client does not read must not pile up in the daemon.
    let pieces = 0;
    for await (const piece of stream as unknown as AsyncIterable<Uint8Array>) {
      if (pieces++ < 20) await new Promise((resolve) => setTimeout(resolve, 50));
      hash.update(piece);
      size += piece.length;
    }
    expect({ size, sha256: hash.digest('hex') }).toEqual({ size: UPLOAD, sha256 });
    expect((daemonPeakKb() - before) * 1024).toBeLessThan(UPLOAD / 2);
    await sbx.files.remove('/tmp/big/down.bin');
  }, 600_000);
});
