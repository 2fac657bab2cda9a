import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { FileMetadataStore } from '../../runtime/server/file-metadata.js';
import { CORE } from '../../runtime/server/groups/core.js';
import { fileOps } from '../../runtime/server/groups/files.js';
import { SandboxServer } from '../../runtime/server/server.js';

// envd's `POST /files/upload` (what E2B's SDKs send to `POST /files`, passed on by the daemon as
// bytes): FILE_OPS with a metadata store, served in-process on loopback over real files, each
// body sent with a length and chunked in small pieces as E2B's SDK sends it.

const TOKEN = 'envd-upload-token';
const dir = mkdtempSync(join(tmpdir(), 'abx-envd-upload-'));
const servers: SandboxServer[] = [];
let url: string;
let bare: string;

beforeAll(async () => {
  const withStore = new SandboxServer({
    token: TOKEN,
    catalog: [CORE, fileOps({ metadata: new FileMetadataStore(join(dir, 'metadata.json')) })],
  });
  // The command server's FILE_OPS: no metadata store.
  const without = new SandboxServer({ token: TOKEN, catalog: [CORE, fileOps()] });
  servers.push(withStore, without);
  const a = await withStore.start();
  const b = await without.start();
  url = `http://${a.host}:${a.port}`;
  bare = `http://${b.host}:${b.port}`;
});

afterAll(async () => {
  for (const server of servers) await server.stop();
  rmSync(dir, { recursive: true, force: true });
});

interface Part {
  name?: string;
  filename?: string;
  data: Buffer | string;
}

function form(parts: Part[], boundary = 'abx-boundary'): Buffer {
  const pieces: Buffer[] = [];
  for (const p of parts) {
    const file = p.filename === undefined ? '' : `; filename="${p.filename}"`;
    pieces.push(
      Buffer.from(
        `--${boundary}\r\nContent-Disposition: form-data; name="${p.name ?? 'file'}"${file}\r\nContent-Type: application/octet-stream\r\n\r\n`,
      ),
      Buffer.from(p.data),
      Buffer.from('\r\n'),
    );
  }
  pieces.push(Buffer.from(`--${boundary}--\r\n`));
  return Buffer.concat(pieces);
}

const FORM_TYPE = 'multipart/form-data; boundary=abx-boundary';

/** `body` in pieces of at most 7 bytes: chunked, with no length, as a streamed fetch sends it. */
async function* trickle(body: Buffer): AsyncGenerator<Buffer> {
  for (let at = 0; at < body.length; at += 7) yield body.subarray(at, at + 7);
}

async function upload(
  query: string,
  body: Buffer,
  headers: Record<string, string> = {},
  options: { chunked?: boolean; server?: string } = {},
) {
  const response = await request(`${options.server ?? url}/files/upload${query}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${TOKEN}`, ...headers },
    body: options.chunked ? Readable.from(trickle(body)) : body,
  });
  const text = await response.body.text();
  return { status: response.statusCode, json: JSON.parse(text) };
}

const at = (...names: string[]) => join(dir, ...names);
const q = (path: string) => `?path=${encodeURIComponent(path)}`;
/** What a directory holds, hidden names (temporary files) included. */
const entries = (path: string) => (existsSync(path) ? readdirSync(path).sort() : []);

describe('POST /files/upload', () => {
  for (const chunked of [false, true]) {
    test(`a form's file parts are written to their filenames (${chunked ? 'chunked' : 'with a length'})`, async () => {
      const base = at(chunked ? 'chunked' : 'length');
      const answer = await upload(
        '',
        form([
          { filename: join(base, 'a.txt'), data: 'first' },
          { name: 'note', data: 'not a file part: skipped' },
          { filename: join(base, 'sub', 'b.bin'), data: Buffer.from([0, 1, 2, 255]) },
        ]),
        { 'content-type': FORM_TYPE },
        { chunked },
      );
      expect(answer).toEqual({
        status: 200,
        json: {
          files: [
            { path: join(base, 'a.txt'), size: 5 },
            { path: join(base, 'sub', 'b.bin'), size: 4 },
          ],
        },
      });
      expect(readFileSync(join(base, 'a.txt'), 'utf8')).toBe('first');
      expect([...readFileSync(join(base, 'sub', 'b.bin'))]).toEqual([0, 1, 2, 255]);
      expect(entries(base)).toEqual(['a.txt', 'sub']);
    });
  }

  test('?path= names the file of a one-part form; a second part for it is refused after the first', async () => {
    const path = at('named', 'one.txt');
    expect(
      await upload(q(path), form([{ filename: 'ignored.txt', data: 'one' }]), {
        'content-type': FORM_TYPE,
      }),
    ).toEqual({ status: 200, json: { files: [{ path, size: 3 }] } });
    const twice = await upload(q(at('named', 'same.txt')), form([{ data: 'a' }, { data: 'b' }]), {
      'content-type': FORM_TYPE,
    });
    expect(twice.status).toBe(400);
    expect(twice.json.error).toMatch(/cannot upload multiple files to same path/);
    expect(readFileSync(at('named', 'same.txt'), 'utf8')).toBe('a');
    expect(entries(at('named'))).toEqual(['one.txt', 'same.txt']);
  });

  test("?e2b=true answers E2B's entries (name, type, path, metadata when the file has some), a form and a raw body alike; its errors stay envd's", async () => {
    const one = at('e2b', 'one.txt');
    const two = at('e2b', 'sub', 'two.bin');
    const plain = await upload(
      '?e2b=true',
      form([
        { filename: one, data: 'one' },
        { filename: two, data: 'two' },
      ]),
      { 'content-type': FORM_TYPE },
      { chunked: true },
    );
    expect(plain).toEqual({
      status: 200,
      json: [
        { name: 'one.txt', type: 'file', path: one },
        { name: 'two.bin', type: 'file', path: two },
      ],
    });
    const raw = await upload(`?e2b=true&path=${encodeURIComponent(one)}`, Buffer.from('raw'), {
      'content-type': 'application/octet-stream',
      'x-metadata-owner': 'ada',
    });
    expect(raw).toEqual({
      status: 200,
      json: [{ name: 'one.txt', type: 'file', path: one, metadata: { owner: 'ada' } }],
    });
    expect(readFileSync(one, 'utf8')).toBe('raw');
    const empty = await upload('?e2b=true', form([{ name: 'note', data: 'x' }]), {
      'content-type': FORM_TYPE,
    });
    expect(empty.status).toBe(400);
    expect(empty.json.error).toMatch(/no `file` part/);
  });

  test('a raw body goes to ?path=; without ?path= it is refused', async () => {
    const path = at('raw', 'plain.txt');
    expect(
      await upload(q(path), Buffer.from('raw bytes'), {
        'content-type': 'application/octet-stream',
      }),
    ).toEqual({ status: 200, json: { files: [{ path, size: 9 }] } });
    expect(readFileSync(path, 'utf8')).toBe('raw bytes');
    const nowhere = await upload('', Buffer.from('x'), {
      'content-type': 'application/octet-stream',
    });
    expect(nowhere.status).toBe(400);
    expect(nowhere.json.error).toMatch(/needs \?path=/);
  });

  test('gzip bodies are unpacked, a form and a raw file alike; a body that is not gzip writes nothing', async () => {
    const formPath = at('gzip', 'form.txt');
    const rawPath = at('gzip', 'raw.txt');
    const zipped = await upload(
      '',
      gzipSync(form([{ filename: formPath, data: 'zipped form' }])),
      { 'content-type': FORM_TYPE, 'content-encoding': 'gzip' },
      { chunked: true },
    );
    expect(zipped).toEqual({ status: 200, json: { files: [{ path: formPath, size: 11 }] } });
    expect(readFileSync(formPath, 'utf8')).toBe('zipped form');
    expect(
      await upload(q(rawPath), gzipSync('zipped raw'), {
        'content-type': 'application/octet-stream',
        'content-encoding': 'gzip',
      }),
    ).toEqual({ status: 200, json: { files: [{ path: rawPath, size: 10 }] } });
    const broken = await upload(q(at('gzip', 'broken.txt')), Buffer.from('not gzip at all'), {
      'content-type': 'application/octet-stream',
      'content-encoding': 'gzip',
    });
    expect(broken.status).toBe(400);
    expect(broken.json.error).toMatch(/the gzip body could not be read/);
    expect(entries(at('gzip'))).toEqual(['form.txt', 'raw.txt']);
  });

  test('an encoding or a media type it cannot take is a 415, and nothing is written', async () => {
    const br = await upload(q(at('refused', 'a.txt')), Buffer.from('x'), {
      'content-type': 'application/octet-stream',
      'content-encoding': 'br',
    });
    expect(br).toMatchObject({ status: 415, json: { type: 'UnsupportedMediaTypeError' } });
    expect(br.json.error).toMatch(/Content-Encoding "br": send gzip or none/);
    const text = await upload(q(at('refused', 'b.txt')), Buffer.from('x'), {
      'content-type': 'text/plain',
    });
    expect(text.status).toBe(415);
    expect(text.json.error).toMatch(/send multipart\/form-data or application\/octet-stream/);
    const noBoundary = await upload('', form([{ filename: at('refused', 'c.txt'), data: 'x' }]), {
      'content-type': 'multipart/form-data',
    });
    expect(noBoundary.status).toBe(400);
    expect(noBoundary.json.error).toMatch(/names no boundary/);
    expect(entries(at('refused'))).toEqual([]);
  });

  test('X-Metadata-* headers go with every file; a bad set writes nothing', async () => {
    const one = at('meta', 'one.txt');
    const two = at('meta', 'two.txt');
    const answer = await upload(
      '',
      form([
        { filename: one, data: '1' },
        { filename: two, data: '2' },
      ]),
      { 'content-type': FORM_TYPE, 'x-metadata-owner': 'ada', 'x-metadata-stage': 'draft' },
    );
    const metadata = { owner: 'ada', stage: 'draft' };
    expect(answer.json.files).toEqual([
      { path: one, size: 1, metadata },
      { path: two, size: 1, metadata },
    ]);
    for (const path of [one, two]) {
      const stat = await request(`${url}/files/stat${q(path)}`, {
        headers: { authorization: `Bearer ${TOKEN}` },
      });
      expect(((await stat.body.json()) as { metadata: unknown }).metadata).toEqual(metadata);
    }
    const bad = await upload('', form([{ filename: at('meta', 'bad.txt'), data: 'x' }]), {
      'content-type': FORM_TYPE,
      'x-metadata-note': 'caf\u00e9',
    });
    expect(bad.status).toBe(400);
    expect(bad.json.error).toMatch(/invalid metadata/);
    // The command server keeps none: refused there, with the reason.
    const there = await upload(
      '',
      form([{ filename: at('meta', 'bare.txt'), data: 'x' }]),
      { 'content-type': FORM_TYPE, 'x-metadata-owner': 'ada' },
      { server: bare },
    );
    expect(there.status).toBe(400);
    expect(there.json.error).toMatch(/keeps no file metadata/);
    expect(entries(at('meta'))).toEqual(['one.txt', 'two.txt']);
  });

  test('a form broken after its first part keeps the first file, and leaves nothing of the second', async () => {
    const body = Buffer.from(
      [
        `--abx-boundary\r\nContent-Disposition: form-data; name="file"; filename="${at('broken', 'one.txt')}"\r\n\r\n1\r\n`,
        `--abx-boundary\r\nContent-Disposition: form-data; name="file"; filename="${at('broken', 'two.txt')}"\r\n\r\n2 never closed`,
      ].join(''),
    );
    for (const chunked of [false, true]) {
      const answer = await upload('', body, { 'content-type': FORM_TYPE }, { chunked });
      expect(answer).toMatchObject({
        status: 400,
        json: {
          error: 'the multipart body could not be read: a part is not closed by the boundary',
        },
      });
      expect(entries(at('broken'))).toEqual(['one.txt']);
    }
    const none = await upload('', form([{ name: 'other', data: 'x' }]), {
      'content-type': FORM_TYPE,
    });
    expect(none.status).toBe(400);
    expect(none.json.error).toMatch(/the form has no `file` part/);
  });

  test('a large part streams to disk whole, beside a small one', async () => {
    const big = randomBytes(3 * 1024 * 1024 + 17);
    const bigPath = at('large', 'big.bin');
    const smallPath = at('large', 'small.txt');
    const body = form([
      { filename: smallPath, data: 'small' },
      { filename: bigPath, data: big },
    ]);
    // Sent in 64 KiB pieces, chunked.
    const response = await request(`${url}/files/upload`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': FORM_TYPE },
      body: Readable.from(
        (async function* () {
          for (let i = 0; i < body.length; i += 65536) yield body.subarray(i, i + 65536);
        })(),
      ),
    });
    expect(response.statusCode).toBe(200);
    expect(await response.body.json()).toEqual({
      files: [
        { path: smallPath, size: 5 },
        { path: bigPath, size: big.length },
      ],
    });
    const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
    expect(sha(readFileSync(bigPath))).toBe(sha(big));
    expect(entries(at('large'))).toEqual(['big.bin', 'small.txt']);
  });
});
