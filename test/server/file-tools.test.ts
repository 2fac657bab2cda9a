import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { grepTool } from '../../runtime/server/file-tools/grep.js';
import { killLeftovers, type RunningServer, startServer } from './harness.js';

// FILE_OPS' /files/tools/*: BaseSandbox's file tools as routes (test/agent/contract.ts holds
// their full behaviour, through Sandbox and both of its paths); here, the HTTP side.
let server: RunningServer;
let dir: string;
const b64 = (s: string) => Buffer.from(s, 'utf8').toString('base64');

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'abx-file-tools-'));
  // Relative paths resolve against the server's directory.
  server = await startServer([], { token: 'tools-token', cwd: dir });
});
afterAll(async () => {
  await killLeftovers();
  rmSync(dir, { recursive: true, force: true });
});

describe('/files/tools', () => {
  test('read gives a page with its position; relative paths are the server directory', async () => {
    writeFileSync(join(dir, 'ten.txt'), Array.from({ length: 10 }, (_, i) => `l${i}`).join('\n'));
    const page = await server.call('/files/tools/read', {
      body: { path: 'ten.txt', offset: 2, limit: 2 },
    });
    expect(page.status).toBe(200);
    expect(page.json).toEqual({
      content: 'l2\nl3',
      encoding: 'utf-8',
      totalLines: 10,
      startLine: 3,
      endLine: 4,
      nextOffset: 4,
    });
    const whole = await server.call('/files/tools/read', { body: { path: join(dir, 'ten.txt') } });
    expect(whole.json.endLine).toBe(10);
  });

  test("a tool's failure is an answer; a malformed request is a 400", async () => {
    const missing = await server.call('/files/tools/read', { body: { path: 'nope.txt' } });
    expect(missing.status).toBe(200);
    expect(missing.json).toEqual({ error: 'file_not_found' });
    const negative = await server.call('/files/tools/read', {
      body: { path: 'ten.txt', offset: -1 },
    });
    expect(negative.status).toBe(400);
    expect(negative.json.error).toBe('offset must not be negative');
    const unknown = await server.call('/files/tools/grep', { body: { pattern: 'x', regex: true } });
    expect(unknown.status).toBe(400);
    expect(unknown.json.type).toBe('ArgumentError');
    const style = await server.call('/files/tools/glob', {
      body: { pattern: '*', style: 'regex' },
    });
    expect(style.status).toBe(400);
    expect(style.json.error).toBe(`style must be one of 'reference', 'path', not "regex"`);
    const flag = await server.call('/files/tools/glob', {
      body: { pattern: '*', relative: 'yes' },
    });
    expect(flag.status).toBe(400);
    const noToken = await server.call('/files/tools/ls', { body: { path: '.' }, token: null });
    expect(noToken.status).toBe(401);
  });

  test('edit takes base64 strings and counts occurrences', async () => {
    const path = join(dir, 'edit.txt');
    writeFileSync(path, 'a-a-a\r\n');
    const many = await server.call('/files/tools/edit', {
      body: { path, old: b64('a'), new: b64('b') },
    });
    expect(many.json).toEqual({ error: 'multiple', count: 3 });
    const all = await server.call('/files/tools/edit', {
      body: { path, old: b64('a-a-a\n'), new: b64('é\n'), replaceAll: true },
    });
    expect(all.json).toEqual({ count: 1 });
    expect(readFileSync(path, 'utf8')).toBe('é\r\n');
  });

  test('ls, grep, glob and delete answer as the tools do', async () => {
    const root = join(dir, 'tree');
    mkdirSync(join(root, '.hidden'), { recursive: true });
    writeFileSync(join(root, 'a.py'), 'needle\n');
    writeFileSync(join(root, '.hidden', 'b.py'), 'x\nneedle\n');
    const ls = await server.call('/files/tools/ls', { body: { path: 'tree' } });
    expect(ls.json.entries.map((e: { path: string }) => e.path)).toEqual([
      join(root, '.hidden'),
      join(root, 'a.py'),
    ]);
    const grep = await server.call('/files/tools/grep', {
      body: { pattern: 'needle', path: 'tree', glob: '*.py', maxCount: 5 },
    });
    expect(grep.json).toEqual({
      matches: [
        { path: join(root, '.hidden', 'b.py'), line: 2, text: 'needle' },
        { path: join(root, 'a.py'), line: 1, text: 'needle' },
      ],
      truncated: false,
    });
    const glob = await server.call('/files/tools/glob', {
      body: { pattern: '**/*.py', path: 'tree', maxResults: 1 },
    });
    expect(glob.json.matches.map((m: { path: string }) => m.path)).toEqual([join(root, 'a.py')]);
    expect(glob.json.truncated).toBe(false);
    const dirs = await server.call('/files/tools/glob', {
      body: { pattern: '*', path: 'tree', style: 'path', includeDirs: true, relative: true },
    });
    expect(
      dirs.json.matches.map((m: { path: string; isDir: boolean }) => [m.path, m.isDir]),
    ).toEqual([
      ['.hidden', true],
      ['a.py', false],
    ]);
    const del = await server.call('/files/tools/delete', { body: { path: 'tree' } });
    expect(del.json).toEqual({ deleted: true });
    const again = await server.call('/files/tools/delete', { body: { path: 'tree' } });
    expect(again.json).toEqual({ error: 'not_found' });
  });
});

test('a long walk hands the event loop back now and then (envd keeps answering)', async () => {
  const root = mkdtempSync(join(tmpdir(), 'abx-file-tools-walk-'));
  try {
    for (let d = 0; d < 40; d++) {
      mkdirSync(join(root, `d${d}`));
      for (let f = 0; f < 100; f++) writeFileSync(join(root, `d${d}`, `f${f}.txt`), 'hay\n');
    }
    let turns = 0;
    const timer = setInterval(() => turns++, 1);
    const started = performance.now();
    const answer = await grepTool({ pattern: 'needle', path: root, glob: null, maxCount: null });
    const elapsed = performance.now() - started;
    clearInterval(timer);
    expect(answer).toEqual({ matches: [], truncated: false });
    // Work is cut into slices of about 10 ms; a walk this long had to let timers run.
    if (elapsed > 40) expect(turns).toBeGreaterThan(0);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
