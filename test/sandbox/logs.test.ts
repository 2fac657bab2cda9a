import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ApiClient, ConnectionConfig, Sandbox as E2bSandbox } from 'e2b';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { startDaemon, stopDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import type { SandboxLogLine } from '../../src/sandbox/sandbox-logs.js';
import { abxIn } from '../cli/abx.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { call } from '../helpers/api-call.js';

// Sandbox logs against a real daemon and real sandboxes: abx's SDK and /v1, and the unmodified
// `e2b` package's API client on the E2B face. One daemon for the file, its log cap lowered to
// 40 lines so a flood is quick.

const CAP = 40;
let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let adminKey: string;

beforeAll(async () => {
  process.env.ABX_SANDBOX_LOG_LINES = String(CAP);
  process.env.ABX_SANDBOX_LOG_PASS_MS = '200';
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  adminKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  // A template whose start command prints to stdout and stderr, then keeps running.
  const built = await call(`${info.apiUrl}/v1/templates`, {
    method: 'POST',
    headers: { authorization: `Bearer ${adminKey}` },
    body: {
      yaml: 'name: logs-start\nstart:\n  cmd: echo hello-start; echo oops-start >&2; exec sleep 600\n',
    },
  });
  expect(built.status).toBe(200);
}, 120_000);

afterAll(async () => {
  delete process.env.ABX_SANDBOX_LOG_LINES;
  delete process.env.ABX_SANDBOX_LOG_PASS_MS;
  await abx?.close();
}, 120_000);

/** Waits until `read` returns lines `check` accepts (the daemon reads envd's log as it comes). */
async function until(
  read: () => Promise<SandboxLogLine[]>,
  check: (lines: SandboxLogLine[]) => boolean,
): Promise<SandboxLogLine[]> {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const lines = await read();
    if (check(lines)) return lines;
    if (Date.now() > deadline) throw new Error(`not in the log: ${JSON.stringify(lines)}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

const exitedWith = (code: string) => (line: SandboxLogLine) => line.fields.exitCode === code;

test("the start command's output, envd and its processes in the log with timestamps and levels; a flood is trimmed to the newest; follow ends with the sandbox; an ended sandbox keeps its log", async () => {
  const sandbox = await Sandbox.create({ home: abx.home, template: 'logs-start' });
  const follow = new AbortController();
  try {
    const before = Date.now();
    await sandbox.commands.run('exit 3').catch(() => undefined);
    const lines = await until(
      () => sandbox.logs(),
      (all) => all.some(exitedWith('3')),
    );
    expect(lines.some((line) => line.message === 'envd started' && line.level === 'info')).toBe(
      true,
    );
    // The start command's stdout is info, its stderr error.
    const started = lines.filter((line) => line.fields.source === 'start');
    expect(started.map((line) => [line.level, line.message])).toEqual([
      ['info', 'start command started'],
      ['info', 'hello-start'],
      ['error', 'oops-start'],
    ]);
    const exit = lines.find(exitedWith('3')) as SandboxLogLine;
    expect(exit.level).toBe('warn');
    expect(exit.message).toMatch(/^process \S+ exited with code 3$/);
    expect(Date.parse(exit.timestamp)).toBeGreaterThanOrEqual(before - 1000);
    expect(Date.parse(exit.timestamp)).toBeLessThanOrEqual(Date.now());
    // Filters: level and above, a substring, newest first.
    const warnings = await sandbox.logs({ level: 'warn' });
    expect(warnings.length).toBeGreaterThan(0);
    expect(warnings.every((line) => line.level === 'warn' || line.level === 'error')).toBe(true);
    expect((await sandbox.logs({ search: 'code 3' })).map((l) => l.fields.exitCode)).toEqual(['3']);
    const newest = await sandbox.logs({ direction: 'backward', limit: 1 });
    expect(newest).toHaveLength(1);
    // No token in the log: neither the sandbox's access token nor its envd's.
    const wire = JSON.stringify(lines);
    expect(wire).not.toContain(sandbox.accessToken);

    // Follow: a line made after it started arrives, and the stream ends when the sandbox is killed.
    const followed: SandboxLogLine[] = [];
    const reading = (async () => {
      for await (const line of sandbox.followLogs({ signal: follow.signal })) followed.push(line);
    })();
    await sandbox.commands.run('exit 7').catch(() => undefined);
    await until(
      async () => followed,
      (all) => all.some(exitedWith('7')),
    );

    // A flood: more than the cap of process lines, trimmed to the newest with a line saying so.
    for (let i = 0; i < CAP; i++) await sandbox.commands.run('true');
    await sandbox.commands.run('exit 9').catch(() => undefined);
    const trimmed = await until(
      () => sandbox.logs(),
      (all) => all.some(exitedWith('9')),
    );
    expect(trimmed.length).toBeLessThanOrEqual(CAP);
    expect(trimmed[0]?.fields.abxDropped).toMatch(/^[1-9]\d*$/);
    expect(trimmed[0]?.message).toMatch(/earlier log lines were dropped/);
    expect(trimmed.some(exitedWith('3'))).toBe(false);

    expect(await sandbox.kill()).toBe(true);
    await Promise.race([
      reading,
      new Promise((_, reject) => setTimeout(() => reject(new Error('follow did not end')), 10_000)),
    ]);
    expect(followed.some(exitedWith('9'))).toBe(true);

    // Ended: still served, by id, to the same key.
    const after = await Sandbox.logs(sandbox.sandboxId, { home: abx.home });
    expect(after.some(exitedWith('9'))).toBe(true);

    // abx logs: the newest N, as text or JSON; --follow of an ended sandbox prints and ends.
    const { abx: cli } = abxIn(abx.home);
    const text = await cli(['logs', sandbox.sandboxId, '-n', '2']);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(
      /^\S+Z WARN {2}process \S+ exited with code 9 pid=\d+ cmd=\S+ exitCode=9$/m,
    );
    expect(text.stdout.trim().split('\n')).toHaveLength(2);
    const json = await cli(['logs', sandbox.sandboxId, '-n', '3', '--json']);
    expect(JSON.parse(json.stdout)).toEqual(after.slice(-3));
    const followed2 = await cli(['logs', sandbox.sandboxId, '--follow', '-n', '1']);
    expect(followed2.code).toBe(0);
    expect(followed2.stdout.trim().split('\n')).toHaveLength(1);
    const unknown = await cli(['logs', 'sbx-nosuchsandbox']);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/sandbox sbx-nosuchsandbox does not exist/);
    const wrong = await cli(['logs', sandbox.sandboxId, '-n', '0']);
    expect(wrong.code).toBe(2);
    expect(wrong.stderr).toMatch(/from 1 to 10000, not '0'/);
  } finally {
    follow.abort();
    await sandbox.kill().catch(() => undefined);
  }
}, 120_000);

test("E2B's face: v1 and v2 in E2B's shapes through the unmodified e2b API client; another key gets 404 as for an unknown id; bad input is 400", async () => {
  const made = await ApiKeys.create('logs-bob', { home: abx.home, format: 'e2b' });
  const e2b = (apiKey: string) =>
    new ApiClient(new ConnectionConfig({ apiKey, apiUrl: info.apiUrl })).api;
  const sandbox = await E2bSandbox.create({ apiKey: adminKey, apiUrl: info.apiUrl });
  try {
    // The command through abx's own SDK: this test is about the control API's logs.
    const native = await Sandbox.connect(sandbox.sandboxId, { home: abx.home });
    await native.commands.run('exit 5').catch(() => undefined);
    const params = { path: { sandboxID: sandbox.sandboxId } };
    const v2 = await until(
      async () =>
        ((await e2b(adminKey).GET('/v2/sandboxes/{sandboxID}/logs', { params })).data?.logs ??
          []) as SandboxLogLine[],
      (all) => all.some(exitedWith('5')),
    );
    const line = v2.find(exitedWith('5')) as SandboxLogLine;
    expect(Object.keys(line).sort()).toEqual(['fields', 'level', 'message', 'timestamp']);
    expect(line.level).toBe('warn');

    const warned = await e2b(adminKey).GET('/v2/sandboxes/{sandboxID}/logs', {
      params: { ...params, query: { level: 'warn', direction: 'backward', limit: 1 } },
    });
    expect(warned.data?.logs).toHaveLength(1);
    expect(warned.data?.logs[0]?.level).toMatch(/^(warn|error)$/);

    // Backward pages: the oldest time of one is the next one's cursor, an upper bound.
    const page = await e2b(adminKey).GET('/v2/sandboxes/{sandboxID}/logs', {
      params: { ...params, query: { direction: 'backward', limit: 2 } },
    });
    const cursor = Date.parse(page.data?.logs[1]?.timestamp ?? '');
    const older = await e2b(adminKey).GET('/v2/sandboxes/{sandboxID}/logs', {
      params: { ...params, query: { direction: 'backward', cursor } },
    });
    expect(older.data?.logs.length).toBeGreaterThan(1);
    expect(older.data?.logs.every((l) => Date.parse(l.timestamp) <= cursor)).toBe(true);
    expect(older.data?.logs.at(-1)?.message).toBe('envd started');

    const v1 = await e2b(adminKey).GET('/sandboxes/{sandboxID}/logs', {
      params: { ...params, query: { limit: 2 } },
    });
    expect(v1.response.status).toBe(200);
    expect(v1.data?.logs).toHaveLength(2);
    expect(Object.keys(v1.data?.logs[0] ?? {}).sort()).toEqual(['line', 'timestamp']);
    expect(v1.data?.logEntries[0]?.message).toBe(v1.data?.logs[0]?.line);

    // Another key: 404 exactly as an id that never existed.
    const bob = await e2b(made.key).GET('/v2/sandboxes/{sandboxID}/logs', { params });
    const unknown = await e2b(made.key).GET('/v2/sandboxes/{sandboxID}/logs', {
      params: { path: { sandboxID: 'sbx-nosuchsandbox' } },
    });
    expect(bob.response.status).toBe(404);
    expect(unknown.response.status).toBe(404);
    expect((bob.error as { message: string }).message).toBe(
      (unknown.error as { message: string }).message.replace(
        'sbx-nosuchsandbox',
        sandbox.sandboxId,
      ),
    );
    const other = await call(`${info.apiUrl}/v1/sandboxes/${sandbox.sandboxId}/logs`, {
      headers: { authorization: `Bearer ${made.key}` },
    });
    expect(other.status).toBe(404);

    // Bad input: E2B's { code, message } naming the parameter.
    const bad = await call(`${info.apiUrl}/v2/sandboxes/${sandbox.sandboxId}/logs?level=loud`, {
      headers: { 'x-api-key': adminKey },
    });
    expect(bad.status).toBe(400);
    expect(bad.body).toEqual({
      code: 400,
      message: expect.stringMatching(/^level must be one of/),
    });

    // Killed: still served on the E2B face.
    await sandbox.kill();
    const ended = await e2b(adminKey).GET('/v2/sandboxes/{sandboxID}/logs', { params });
    expect(ended.data?.logs.some(exitedWith('5'))).toBe(true);
  } finally {
    await sandbox.kill().catch(() => undefined);
  }
}, 120_000);

test('a daemon started again goes on where the log was: no line twice, new lines kept', async () => {
  const sandbox = await Sandbox.create({ home: abx.home });
  try {
    await sandbox.commands.run('exit 11').catch(() => undefined);
    await until(
      () => sandbox.logs(),
      (all) => all.some(exitedWith('11')),
    );
    expect(await stopDaemon(abx.home)).toBe(true);
    info = await startDaemon(abx.home);
    const again = await Sandbox.connect(sandbox.sandboxId, { home: abx.home });
    await again.commands.run('exit 12').catch(() => undefined);
    const lines = await until(
      () => again.logs(),
      (all) => all.some(exitedWith('12')),
    );
    expect(lines.filter((line) => line.message === 'envd started')).toHaveLength(1);
    expect(lines.filter(exitedWith('11'))).toHaveLength(1);
  } finally {
    await sandbox.kill().catch(() => undefined);
  }
}, 120_000);
