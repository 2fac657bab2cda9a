import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { eventually, isAlive, killLeftovers, type RunningServer, startServer } from './harness.js';

let server: RunningServer;
let dir: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'abx-process-'));
  server = await startServer([]);
});
afterAll(killLeftovers);

async function processState(id: string) {
  return (await server.call(`/process/${id}`)).json;
}

describe('PROCESS', () => {
  test('POST /process/exec runs to completion; a timeout is 504 with partial output', async () => {
    const done = await server.call('/process/exec', {
      body: { cmd: 'echo out; echo err >&2; exit 4' },
    });
    expect(done.json).toEqual({ stdout: 'out\n', stderr: 'err\n', exit_code: 4 });
    const late = await server.call('/process/exec', {
      body: { cmd: 'echo part; sleep 30', timeout: 0.3 },
    });
    expect(late.status).toBe(504);
    expect(late.json).toMatchObject({ type: 'CommandTimeoutError', stdout: 'part\n' });
  });

  test('a background process takes stdin, reports output and exit, and is listed', async () => {
    const started = await server.call('/process/start', {
      body: { cmd: 'read line; echo "got $line"; exit 7', cwd: dir },
    });
    expect(started.status).toBe(200);
    const { id, pid } = started.json;
    expect(started.json).toMatchObject({ running: true, cwd: dir, exit_code: null });
    expect(typeof pid).toBe('number');
    const listed = await server.call('/process');
    expect(listed.json.processes.map((p: { id: string }) => p.id)).toContain(id);
    const wrote = await server.call(`/process/${id}/stdin`, { body: { data: 'hello\n' } });
    expect(wrote.json).toEqual({ written: 6 });
    await eventually(async () => !(await processState(id)).running);
    expect(await processState(id)).toMatchObject({ exit_code: 7, signal: null, output_bytes: 10 });
    const output = await server.call(`/process/${id}/output`);
    expect(output.json).toEqual({ data: 'got hello\n', offset: 0, next_offset: 10, done: true });
    const replay = await server.call(`/process/${id}/output?offset=4`);
    expect(replay.json.data).toBe('hello\n');
    const closed = await server.call(`/process/${id}/stdin`, { body: { data: 'more' } });
    expect(closed.status).toBe(400);
    expect(closed.json.error).toContain('no longer takes input');
  });

  test('stdin with encoding base64 writes bytes that are not UTF-8; bad base64 is 400', async () => {
    const file = join(dir, 'stdin.bin');
    const { json } = await server.call('/process/start', { body: { cmd: `cat > ${file}` } });
    const bytes = Buffer.from([0xff, 0xfe, 0x00, 0x41, 0xe2, 0x82]);
    const wrote = await server.call(`/process/${json.id}/stdin`, {
      body: { data: bytes.toString('base64'), encoding: 'base64', eof: false },
    });
    expect(wrote.json).toEqual({ written: 6 });
    const bad = await server.call(`/process/${json.id}/stdin`, {
      body: { data: 'not base64!', encoding: 'base64' },
    });
    expect(bad.status).toBe(400);
    expect(bad.json.error).toContain('data is not base64');
    const unknown = await server.call(`/process/${json.id}/stdin`, {
      body: { data: '', encoding: 'hex', eof: true },
    });
    expect(unknown.json.error).toContain('encoding must be "text" or "base64", not "hex"');
    await server.call(`/process/${json.id}/stdin`, { body: { data: '', eof: true } });
    await eventually(async () => !(await processState(json.id)).running);
    expect(readFileSync(file)).toEqual(bytes);
  });

  test('output follow streams until the process exits', async () => {
    const { json } = await server.call('/process/start', {
      body: { cmd: 'for i in 1 2 3; do echo line$i; sleep 0.1; done' },
    });
    const followed = await server.call(`/process/${json.id}/output?follow=true`);
    expect(followed.status).toBe(200);
    expect(followed.text).toBe('line1\nline2\nline3\n');
  });

  test('kill signals the whole process group', async () => {
    const pidFile = join(dir, 'child.pid');
    const { json } = await server.call('/process/start', {
      body: { cmd: `sleep 300 & echo $! > ${pidFile}; wait` },
    });
    await eventually(() => {
      try {
        return readFileSync(pidFile, 'utf8').trim() !== '';
      } catch {
        return false;
      }
    });
    const grandchild = Number(readFileSync(pidFile, 'utf8'));
    const killed = await server.call(`/process/${json.id}/kill`, { body: { signal: 'TERM' } });
    expect(killed.status).toBe(200);
    await eventually(async () => !(await processState(json.id)).running);
    expect((await processState(json.id)).signal).toBe('SIGTERM');
    await eventually(() => !isAlive(grandchild));
  });

  test('unknown ids are 404 and unknown signals 400', async () => {
    const missing = await server.call('/process/p999');
    expect(missing.status).toBe(404);
    expect(missing.json).toMatchObject({ type: 'NotFoundError' });
    const { json } = await server.call('/process/start', { body: { cmd: 'sleep 30' } });
    const bad = await server.call(`/process/${json.id}/kill`, { body: { signal: 'SIGNOPE' } });
    expect(bad.status).toBe(400);
    expect(bad.json.error).toContain('SIGNOPE');
    await server.call(`/process/${json.id}/kill`, { body: {} });
  });

  test('GET /process/exec is 405: the literal path wins over /process/{id}', async () => {
    const answer = await server.call('/process/exec');
    expect(answer.status).toBe(405);
    expect(answer.headers.allow).toBe('POST');
  });
});

describe('TERMINAL', () => {
  async function readUntil(id: string, wanted: string): Promise<string> {
    let text = '';
    let offset = 0;
    while (!text.includes(wanted)) {
      const { json } = await server.call(`/terminal/${id}/read?offset=${offset}&wait_ms=2000`);
      text += json.data;
      offset = json.next_offset;
    }
    return text;
  }

  test('a pty session runs commands, resizes, and closes', async () => {
    const opened = await server.call('/terminal', {
      body: { command: 'bash --norc --noprofile -i', cols: 90, rows: 20, cwd: dir },
    });
    expect(opened.status).toBe(200);
    const { id } = opened.json;
    await server.call(`/terminal/${id}/write`, { body: { data: 'tty; stty size; pwd\n' } });
    const first = await readUntil(id, dir);
    expect(first).toContain('/dev/pts/');
    expect(first).toContain('20 90');
    const resized = await server.call(`/terminal/${id}/resize`, { body: { cols: 120, rows: 40 } });
    expect(resized.json).toEqual({ cols: 120, rows: 40 });
    await server.call(`/terminal/${id}/write`, { body: { data: 'stty size\n' } });
    await readUntil(id, '40 120');
    const closed = await server.call(`/terminal/${id}`, { method: 'DELETE' });
    expect(closed.json).toEqual({ id, closed: true });
    expect((await server.call(`/terminal/${id}/read`)).status).toBe(404);
  });

  test('bad sizes are refused', async () => {
    const answer = await server.call('/terminal', { body: { cols: 0 } });
    expect(answer.status).toBe(400);
    expect(answer.json.error).toContain('cols');
  });
});
