import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { killLeftovers, type RunningServer, startServer } from './harness.js';

const TOKEN = 'system-token-5678';
let server: RunningServer;

beforeAll(async () => {
  // The token comes from the environment here, as a sandbox would pass it.
  server = await startServer([], { env: { ABX_SERVER_TOKEN: TOKEN } });
});
afterAll(killLeftovers);

const call = (path: string, body?: unknown) => server.call(path, { token: TOKEN, body });

describe('SYSTEM', () => {
  test('os, cpu, memory and disk describe the machine', async () => {
    expect((await call('/system/os')).json).toMatchObject({
      platform: 'linux',
      node: process.version,
    });
    const cpu = (await call('/system/cpu')).json;
    expect(cpu.count).toBeGreaterThan(0);
    expect(cpu.loadavg).toHaveLength(3);
    const memory = (await call('/system/memory')).json;
    expect(memory.total).toBeGreaterThan(memory.free);
    const disk = (await call('/system/disk?path=/tmp')).json;
    expect(disk).toMatchObject({ path: '/tmp' });
    expect(disk.total).toBeGreaterThanOrEqual(disk.available);
  });

  test('env hides the token it was started with', async () => {
    const { json } = await call('/system/env');
    expect(json.env.ABX_SERVER_TOKEN).toBe('(hidden)');
    expect(JSON.stringify(json)).not.toContain(TOKEN);
    expect(json.env.PATH).toBe(process.env.PATH);
  });

  test('metrics count requests by status', async () => {
    await server.call('/system/metrics', { token: null });
    const { json } = await call('/system/metrics');
    expect(json.requests).toBeGreaterThan(1);
    expect(json.in_flight).toBe(1);
    expect(json.by_status['401']).toBeGreaterThanOrEqual(1);
  });

  test('the env token is required', async () => {
    expect((await server.call('/system/os')).status).toBe(401);
  });
});

describe('DEV_TOOLS', () => {
  test('git status, diff and log of a repository', async () => {
    const repo = mkdtempSync(join(tmpdir(), 'abx-git-'));
    const git = (...args: string[]) =>
      execFileSync('git', ['-c', 'user.name=T', '-c', 'user.email=t@e.x', ...args], { cwd: repo });
    git('init', '-q', '-b', 'main');
    writeFileSync(join(repo, 'a.txt'), 'one\n');
    git('add', 'a.txt');
    git('commit', '-q', '-m', 'first commit');
    writeFileSync(join(repo, 'a.txt'), 'two\n');
    writeFileSync(join(repo, 'new.txt'), '');
    const status = (await call(`/dev-tools/git/status?path=${repo}`)).json;
    expect(status).toEqual({
      branch: 'main',
      files: [
        { status: ' M', path: 'a.txt' },
        { status: '??', path: 'new.txt' },
      ],
    });
    const diff = (await call(`/dev-tools/git/diff?path=${repo}`)).json.diff;
    expect(diff).toContain('-one');
    expect(diff).toContain('+two');
    const log = (await call(`/dev-tools/git/log?path=${repo}&limit=5`)).json.commits;
    expect(log).toHaveLength(1);
    expect(log[0]).toMatchObject({ author: 'T', subject: 'first commit' });
    const notRepo = await call(`/dev-tools/git/status?path=${tmpdir()}`);
    expect(notRepo.status).toBe(400);
    expect(notRepo.json.error).toContain('git status failed');
  });

  test('runs python and node snippets; a timeout is 504 with partial output', async () => {
    const py = await call('/dev-tools/run', { language: 'python', code: 'print(6 * 7)' });
    expect(py.json).toEqual({ stdout: '42\n', stderr: '', exit_code: 0 });
    const node = await call('/dev-tools/run', {
      language: 'node',
      code: 'console.log(typeof process)',
    });
    expect(node.json.stdout).toBe('object\n');
    const slow = await call('/dev-tools/run', {
      language: 'node',
      code: 'console.log("begun"); setTimeout(() => {}, 60000)',
      timeout: 0.5,
    });
    expect(slow.status).toBe(504);
    expect(slow.json.stdout).toBe('begun\n');
    const ruby = await call('/dev-tools/run', { language: 'ruby', code: '' });
    expect(ruby.status).toBe(400);
    expect(ruby.json.error).toContain('python, node');
  });
});

describe('BROWSER', () => {
  const hasChromium = existsSync('/usr/bin/chromium');

  test.skipIf(hasChromium)(
    'without Chromium the routes answer 503 BrowserUnavailableError',
    async () => {
      for (const path of ['/browser/screenshot', '/browser/text']) {
        const answer = await call(path, { url: 'https://example.com' });
        expect(answer.status).toBe(503);
        expect(answer.json.type).toBe('BrowserUnavailableError');
        expect(answer.json.error).toContain('/usr/bin/chromium');
      }
    },
  );

  test.runIf(hasChromium)('with Chromium, text and a PNG screenshot of a page', async () => {
    const url = `data:text/html,${encodeURIComponent('<h1>Hello</h1><script>x=1</script>')}`;
    const text = await call('/browser/text', { url });
    expect(text.json.text).toBe('Hello');
    const shot = await call('/browser/screenshot', { url, width: 200, height: 100 });
    expect(Buffer.from(shot.json.content, 'base64').subarray(1, 4).toString()).toBe('PNG');
  });

  test('a URL that is not http(s), file or data is 400', async () => {
    const answer = await call('/browser/text', { url: 'javascript:alert(1)' });
    expect(answer.status).toBe(400);
    expect(answer.json.error).toContain('javascript:');
  });
});
