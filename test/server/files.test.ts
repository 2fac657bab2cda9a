import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { killLeftovers, type RunningServer, startServer } from './harness.js';

let server: RunningServer;
let dir: string;
const q = (params: Record<string, string | number | boolean>) =>
  `?${new URLSearchParams(Object.entries(params).map(([k, v]): [string, string] => [k, String(v)]))}`;

beforeAll(async () => {
  server = await startServer([], { token: 'files-token' });
});
afterAll(killLeftovers);
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'abx-files-'));
});

describe('FILE_OPS', () => {
  test('PUT /files/write stores the raw body atomically; GET /files/read returns it', async () => {
    const bytes = randomBytes(200_000);
    const path = join(dir, 'deep', 'er', 'blob.bin');
    const put = await server.call(`/files/write${q({ path })}`, { method: 'PUT', body: bytes });
    expect(put.status).toBe(200);
    expect(put.json).toEqual({ path, size: bytes.length });
    expect(readdirSync(join(dir, 'deep', 'er'))).toEqual(['blob.bin']);
    const response = await fetch(`${server.url}/files/read${q({ path })}`, {
      headers: { authorization: 'Bearer files-token' },
    });
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')).toBe('application/octet-stream');
    expect(Buffer.from(await response.arrayBuffer()).equals(bytes)).toBe(true);
  });

  test('GET /files/read takes a byte range', async () => {
    const path = join(dir, 'range.txt');
    writeFileSync(path, '0123456789');
    expect((await server.call(`/files/read${q({ path, offset: 3, length: 4 })}`)).text).toBe(
      '3456',
    );
    expect((await server.call(`/files/read${q({ path, offset: 8 })}`)).text).toBe('89');
    expect((await server.call(`/files/read${q({ path, offset: 20 })}`)).text).toBe('');
    const bad = await server.call(`/files/read${q({ path, offset: 'x' })}`);
    expect(bad.status).toBe(400);
    expect(bad.json.problems).toEqual(['offset must be an integer, not string "x"']);
  });

  test('reading a directory or a missing file is a clear error', async () => {
    const missing = await server.call(`/files/read${q({ path: join(dir, 'none') })}`);
    expect(missing.status).toBe(404);
    expect(missing.json.error).toContain(join(dir, 'none'));
    const directory = await server.call(`/files/read${q({ path: dir })}`);
    expect(directory.status).toBe(400);
    expect(directory.json.error).toContain('not a regular file');
    const noPath = await server.call('/files/read');
    expect(noPath.status).toBe(400);
    expect(noPath.json.problems).toEqual(['missing required argument: path']);
  });

  test('a FIFO is refused as not a regular file, at once (nothing waits for a writer)', async () => {
    const fifo = join(dir, 'pipe');
    execFileSync('mkfifo', [fifo]);
    const answer = await server.call(`/files/read${q({ path: fifo })}`);
    expect(answer.status).toBe(400);
    expect(answer.json.error).toContain('not a regular file');
    // The server still answers reads: no thread of its pool is stuck on the FIFO.
    writeFileSync(join(dir, 'after.txt'), 'still here');
    expect((await server.call(`/files/read${q({ path: join(dir, 'after.txt') })}`)).text).toBe(
      'still here',
    );
  });

  test('small writes: parents made, atomic replace, a parent that is a file is a clear error', async () => {
    const path = join(dir, 'a', 'b', 'small.txt');
    for (const text of ['first', 'second, longer']) {
      const put = await server.call(`/files/write${q({ path })}`, { method: 'PUT', body: text });
      expect(put.json).toEqual({ path, size: text.length });
      expect(readFileSync(path, 'utf8')).toBe(text);
    }
    expect(readdirSync(join(dir, 'a', 'b'))).toEqual(['small.txt']);
    writeFileSync(join(dir, 'plain'), 'x');
    const under = join(dir, 'plain', 'child.txt');
    const refused = await server.call(`/files/write${q({ path: under })}`, {
      method: 'PUT',
      body: 'y',
    });
    expect(refused.status).toBeGreaterThanOrEqual(400);
    expect(refused.status).toBeLessThan(500);
    expect(refused.json.error).toContain(under);
    expect(readdirSync(dir).sort()).toEqual(['a', 'plain']);
  });

  test('GET /files/list and /files/stat describe entries', async () => {
    writeFileSync(join(dir, 'b.txt'), 'bb');
    mkdirSync(join(dir, 'a'));
    const list = await server.call(`/files/list${q({ path: dir })}`);
    expect(list.json.entries.map((e: { name: string; type: string }) => [e.name, e.type])).toEqual([
      ['a', 'directory'],
      ['b.txt', 'file'],
    ]);
    const stat = await server.call(`/files/stat${q({ path: join(dir, 'b.txt') })}`);
    expect(stat.json).toMatchObject({ path: join(dir, 'b.txt'), type: 'file', size: 2 });
  });

  test('mkdir, move, copy and delete', async () => {
    const made = await server.call('/files/mkdir', { body: { path: join(dir, 'x', 'y') } });
    expect(made.status).toBe(200);
    writeFileSync(join(dir, 'x', 'y', 'f.txt'), 'data');
    const copy = await server.call('/files/copy', {
      body: { from: join(dir, 'x'), to: join(dir, 'x2') },
    });
    expect(copy.status).toBe(200);
    expect(readFileSync(join(dir, 'x2', 'y', 'f.txt'), 'utf8')).toBe('data');
    const clash = await server.call('/files/move', {
      body: { from: join(dir, 'x'), to: join(dir, 'x2') },
    });
    expect(clash.status).toBe(400);
    expect(clash.json.error).toContain('overwrite');
    const move = await server.call('/files/move', {
      body: { from: join(dir, 'x2', 'y', 'f.txt'), to: join(dir, 'moved', 'g.txt') },
    });
    expect(move.status).toBe(200);
    expect(readFileSync(join(dir, 'moved', 'g.txt'), 'utf8')).toBe('data');
    const notRecursive = await server.call('/files/delete', { body: { path: join(dir, 'x') } });
    expect(notRecursive.status).toBe(400);
    expect(notRecursive.json.error).toContain('recursive');
    const del = await server.call('/files/delete', {
      body: { path: join(dir, 'x'), recursive: true },
    });
    expect(del.json).toEqual({ path: join(dir, 'x'), deleted: true });
    expect(existsSync(join(dir, 'x'))).toBe(false);
  });

  test('GET /files/glob matches **, * and {a,b}', async () => {
    mkdirSync(join(dir, 'src', 'lib'), { recursive: true });
    for (const f of ['src/a.ts', 'src/lib/b.ts', 'src/lib/c.js', 'README.md']) {
      writeFileSync(join(dir, f), '');
    }
    const ts = await server.call(`/files/glob${q({ pattern: '**/*.ts', cwd: dir })}`);
    expect(ts.json.matches.sort()).toEqual(['src/a.ts', 'src/lib/b.ts']);
    const both = await server.call(`/files/glob${q({ pattern: 'src/lib/*.{ts,js}', cwd: dir })}`);
    expect(both.json.matches.sort()).toEqual(['src/lib/b.ts', 'src/lib/c.js']);
    const limited = await server.call(`/files/glob${q({ pattern: '**', cwd: dir, limit: 2 })}`);
    expect(limited.json.matches).toHaveLength(2);
    expect(limited.json.truncated).toBe(true);
  });

  test('GET /files/grep finds lines; a bad regex is 400', async () => {
    writeFileSync(join(dir, 'one.txt'), 'alpha\nBeta\ngamma beta\n');
    writeFileSync(join(dir, 'two.md'), 'beta\n');
    writeFileSync(join(dir, 'bin.dat'), Buffer.from([0, 98, 101, 116, 97]));
    const found = await server.call(
      `/files/grep${q({ pattern: 'beta', path: dir, ignore_case: true, glob: '*.txt' })}`,
    );
    expect(found.json.matches).toEqual([
      { path: join(dir, 'one.txt'), line: 2, text: 'Beta' },
      { path: join(dir, 'one.txt'), line: 3, text: 'gamma beta' },
    ]);
    const bad = await server.call(`/files/grep${q({ pattern: '(', path: dir })}`);
    expect(bad.status).toBe(400);
    expect(bad.json.error).toContain('regular expression');
  });

  test('POST /files/edit replaces exact text once, or all with all: true', async () => {
    const path = join(dir, 'edit.txt');
    writeFileSync(path, 'a = 1\nb = 1\n');
    const twice = await server.call('/files/edit', { body: { path, old: '= 1', new: '= 2' } });
    expect(twice.status).toBe(400);
    expect(twice.json).toMatchObject({ type: 'EditMismatchError' });
    expect(twice.json.error).toContain('2 times');
    const all = await server.call('/files/edit', {
      body: { path, old: '= 1', new: '= 2', all: true },
    });
    expect(all.json).toEqual({ path, replacements: 2 });
    const once = await server.call('/files/edit', { body: { path, old: 'a = 2', new: 'a = $&' } });
    expect(once.json.replacements).toBe(1);
    expect(readFileSync(path, 'utf8')).toBe('a = $&\nb = 2\n');
    const none = await server.call('/files/edit', { body: { path, old: 'zzz', new: '' } });
    expect(none.status).toBe(400);
    expect(none.json.error).toContain('does not occur');
  });

  test('a path with a NUL byte is refused and nothing is written', async () => {
    const answer = await server.call(`/files/write?path=${encodeURIComponent(`${dir}/a\0b`)}`, {
      method: 'PUT',
      body: 'x',
    });
    expect(answer.status).toBe(400);
    expect(answer.json.type).toBe('InvalidPathError');
    expect(readdirSync(dir)).toEqual([]);
  });
});
