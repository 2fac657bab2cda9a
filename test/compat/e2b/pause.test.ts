import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { RateLimitError, Sandbox, SandboxError, SandboxNotFoundError } from 'e2b';
import { afterAll, test as base, beforeAll, describe, expect } from 'vitest';
import { startDaemon } from '../../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../../src/installation/daemon-info.js';
import { ApiKeys } from '../../../src/sandbox/api-keys.js';
import { createAbxHome, sandboxProcesses } from '../../helpers/abx-home.js';
import { call } from '../../helpers/api-call.js';

// Pause, resume (connect) and auto-pause through the real, unmodified `e2b` package against a
// real daemon with bubblewrap sandboxes. E2B_API_URL and E2B_SANDBOX_URL are the daemon's gateway
// (one URL), set for the whole file, so no call can go anywhere but the daemon.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let adminKey: string;

beforeAll(async () => {
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  adminKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  process.env.E2B_API_URL = info.gatewayUrl;
  process.env.E2B_SANDBOX_URL = info.gatewayUrl;
}, 120_000);

afterAll(async () => {
  delete process.env.E2B_API_URL;
  delete process.env.E2B_SANDBOX_URL;
  await abx?.close();
}, 120_000);

const as = (apiKey: string) => ({ apiKey, requestTimeoutMs: 60_000 });

/** Sandboxes made through the E2B SDK, each killed (running or paused) when the test ends. */
const test = base.extend<{ made: (sandbox: Sandbox) => Sandbox }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  made: async ({}, use) => {
    const ids: string[] = [];
    try {
      await use((sandbox) => {
        ids.push(sandbox.sandboxId);
        return sandbox;
      });
    } finally {
      for (const id of ids) await Sandbox.kill(id, as(adminKey)).catch(() => undefined);
    }
  },
});

/** E2B's control API, raw, with `X-API-KEY`. */
function raw(method: string, path: string, body?: unknown, key = adminKey) {
  return call(`${info.apiUrl}${path}`, {
    method,
    headers: { 'x-api-key': key },
    ...(body === undefined ? {} : { body }),
  });
}

/** The ids a `Sandbox.list` of these states and metadata gives, every page. */
async function listed(
  metadata: Record<string, string>,
  state?: ('running' | 'paused')[],
  key = adminKey,
) {
  const paginator = Sandbox.list({ ...as(key), query: { metadata, ...(state ? { state } : {}) } });
  const all: { id: string; state: string }[] = [];
  while (paginator.hasNext) {
    for (const item of await paginator.nextItems()) {
      all.push({ id: item.sandboxId, state: item.state });
    }
  }
  return all;
}

/** Polls until `check` holds (a bounded wait for what the daemon does on its own). */
async function until(what: string, check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`never happened: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

/** A counter in a shell variable, written to /tmp/count every 50 ms: state in memory. */
const COUNTER = 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done';

async function count(sandbox: Sandbox): Promise<number> {
  return Number((await sandbox.files.read('/tmp/count')).trim());
}

describe('pause and resume through the E2B SDK', () => {
  test('pause freezes: true, then false; paused in info and list; connect resumes (201) with the file and the counting process where they were', async ({
    made,
  }) => {
    const run = `freeze-${Date.now()}`;
    const sandbox = made(await Sandbox.create({ ...as(adminKey), metadata: { run } }));
    await sandbox.files.write('/home/user/kept.txt', 'from before the pause');
    const counter = await sandbox.commands.run(COUNTER, { background: true, timeoutMs: 0 });
    await until('the counter counts', async () => (await count(sandbox).catch(() => 0)) > 3);

    const before = await count(sandbox);
    expect(await sandbox.pause()).toBe(true);
    expect(await sandbox.pause()).toBe(false);
    expect(await Sandbox.pause(sandbox.sandboxId, as(adminKey))).toBe(false);

    const paused = await sandbox.getInfo();
    expect(paused).toMatchObject({
      sandboxId: sandbox.sandboxId,
      state: 'paused',
      lifecycle: { onTimeout: 'kill', autoResume: false },
    });
    expect(await listed({ run }, ['paused'])).toEqual([{ id: sandbox.sandboxId, state: 'paused' }]);
    expect(await listed({ run }, ['running'])).toEqual([]);
    expect(await listed({ run })).toEqual([{ id: sandbox.sandboxId, state: 'paused' }]);
    // Its envd is not reached while it is paused, on the SDK's kept-alive connection too: the
    // gateway answers as E2B's proxy does for a sandbox that is not running (502; unavailable on
    // Connect), so isRunning() is false and a call fails rather than hangs.
    expect(await sandbox.isRunning()).toBe(false);
    await expect(sandbox.files.read('/home/user/kept.txt')).rejects.toThrow();
    await expect(sandbox.commands.run('true')).rejects.toBeInstanceOf(SandboxNotFoundError);
    // A call that needs it running says so too.
    await expect(sandbox.setTimeout(60_000)).rejects.toThrow(
      /409: sandbox .* is paused \(frozen since .*\): resume it first/,
    );

    const resumed = await raw('POST', `/v2/sandboxes/${sandbox.sandboxId}/connect`, {
      timeout: 120,
    });
    expect(resumed).toMatchObject({ status: 201, body: { sandboxID: sandbox.sandboxId } });
    // Connecting again finds it running: 200.
    const again = await Sandbox.connect(sandbox.sandboxId, as(adminKey));
    expect((await raw('POST', `/v2/sandboxes/${sandbox.sandboxId}/connect`, {})).status).toBe(200);
    expect((await again.getInfo()).state).toBe('running');
    expect(await again.files.read('/home/user/kept.txt')).toBe('from before the pause');
    const after = await count(again);
    expect(after).toBeGreaterThanOrEqual(before);
    // The same process, counting on from where it was (a restarted one would begin at 1).
    expect((await again.commands.list()).map((p) => p.pid)).toContain(counter.pid);
    await until('the counter counts on', async () => (await count(again)) > after + 3);
  }, 180_000);

  test('pause({ keepMemory: false }) hibernates: connect starts it on its kept files, its processes gone', async ({
    made,
  }) => {
    const run = `hibernate-${Date.now()}`;
    const sandbox = made(await Sandbox.create({ ...as(adminKey), metadata: { run } }));
    await sandbox.files.write('/home/user/kept.txt', 'on the disk');
    await sandbox.files.write('/tmp/also.txt', 'in /tmp');
    const sleeper = await sandbox.commands.run('sleep 600', { background: true, timeoutMs: 0 });

    expect(await sandbox.pause({ keepMemory: false })).toBe(true);
    expect(sandboxProcesses(sandbox.sandboxId)).toEqual([]);
    expect((await sandbox.getInfo()).state).toBe('paused');
    expect(await listed({ run }, ['paused'])).toEqual([{ id: sandbox.sandboxId, state: 'paused' }]);
    expect(await sandbox.pause({ keepMemory: false })).toBe(false);

    // onResume: 'reboot' (memory: false) is what a hibernated sandbox's resume is anyway.
    const woken = await Sandbox.connect(sandbox.sandboxId, { ...as(adminKey), onResume: 'reboot' });
    expect((await woken.getInfo()).state).toBe('running');
    expect(await woken.files.read('/home/user/kept.txt')).toBe('on the disk');
    expect(await woken.files.read('/tmp/also.txt')).toBe('in /tmp');
    expect((await woken.commands.list()).map((p) => p.pid)).not.toContain(sleeper.pid);
    expect((await woken.commands.run('echo ok')).stdout).toBe('ok\n');
  }, 180_000);

  test("a frozen sandbox refuses onResume: 'reboot' by name and stays paused; kill of a paused sandbox ends it", async ({
    made,
  }) => {
    const sandbox = made(await Sandbox.create(as(adminKey)));
    expect(await sandbox.pause()).toBe(true);
    const reboot = Sandbox.connect(sandbox.sandboxId, { ...as(adminKey), onResume: 'reboot' });
    await expect(reboot).rejects.toBeInstanceOf(SandboxError);
    await expect(reboot).rejects.toThrow(/400: .*paused with its memory .*onResume: 'reboot'/);
    expect((await sandbox.getInfo()).state).toBe('paused');

    expect(await Sandbox.kill(sandbox.sandboxId, as(adminKey))).toBe(true);
    await expect(sandbox.getInfo()).rejects.toBeInstanceOf(SandboxNotFoundError);
    await expect(Sandbox.connect(sandbox.sandboxId, as(adminKey))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    expect(sandboxProcesses(sandbox.sandboxId)).toEqual([]);
    expect(await Sandbox.kill(sandbox.sandboxId, as(adminKey))).toBe(false);
  }, 120_000);

  test("lifecycle onTimeout 'pause': the timeout pauses it instead of killing it, and connect resumes it", async ({
    made,
  }) => {
    const sandbox = made(
      await Sandbox.create({
        ...as(adminKey),
        timeoutMs: 3_000,
        lifecycle: { onTimeout: 'pause' },
      }),
    );
    expect((await sandbox.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: false });
    await sandbox.files.write('/home/user/kept.txt', 'before the timeout');
    const sleeper = await sandbox.commands.run('sleep 600', { background: true, timeoutMs: 0 });
    await until('the timeout pauses it', async () => (await sandbox.getInfo()).state === 'paused');
    const resumed = await Sandbox.connect(sandbox.sandboxId, {
      ...as(adminKey),
      timeoutMs: 120_000,
    });
    expect(await resumed.getInfo()).toMatchObject({
      state: 'running',
      lifecycle: { onTimeout: 'pause', autoResume: false },
    });
    expect(await resumed.files.read('/home/user/kept.txt')).toBe('before the timeout');
    // Frozen (keepMemory defaults to true): its process is still there.
    expect((await resumed.commands.list()).map((p) => p.pid)).toContain(sleeper.pid);
  }, 180_000);

  test("onTimeout { action: 'pause', keepMemory: false } hibernates at the timeout", async ({
    made,
  }) => {
    const sandbox = made(
      await Sandbox.create({
        ...as(adminKey),
        timeoutMs: 3_000,
        lifecycle: { onTimeout: { action: 'pause', keepMemory: false } },
      }),
    );
    await sandbox.files.write('/home/user/kept.txt', 'before the timeout');
    // The row says paused as the hibernate begins (row first, then the provider): its processes
    // end just after.
    await until(
      'the timeout pauses it and its processes end',
      async () =>
        (await sandbox.getInfo()).state === 'paused' &&
        sandboxProcesses(sandbox.sandboxId).length === 0,
    );
    const resumed = await Sandbox.connect(sandbox.sandboxId, as(adminKey));
    expect(await resumed.files.read('/home/user/kept.txt')).toBe('before the timeout');
  }, 180_000);

  test('autoResume: a paused sandbox is resumed by its own traffic, as at E2B', async ({
    made,
  }) => {
    const sandbox = made(
      await Sandbox.create({
        ...as(adminKey),
        lifecycle: { onTimeout: 'pause', autoResume: true },
      }),
    );
    expect((await sandbox.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: true });
    await sandbox.files.write('/home/user/kept.txt', 'before the pause');
    expect(await sandbox.pause()).toBe(true);
    expect((await sandbox.getInfo()).state).toBe('paused');
    // No connect: the SDK's envd calls on the object it had reach the paused sandbox and wake it.
    expect(await sandbox.files.read('/home/user/kept.txt')).toBe('before the pause');
    expect((await sandbox.commands.run('echo awake')).stdout.trim()).toBe('awake');
    expect((await sandbox.getInfo()).state).toBe('running');
  }, 120_000);

  test("another key's paused sandbox is not found; a key at its limit cannot resume its own", async ({
    made,
  }) => {
    const now = Date.now();
    const alice = (await ApiKeys.create(`alice-${now}`, { home: abx.home, maxRunning: 1 })).key;
    const bob = (await ApiKeys.create(`bob-${now}`, { home: abx.home })).key;
    const first = made(await Sandbox.create(as(alice)));
    expect(await first.pause()).toBe(true);

    await expect(Sandbox.pause(first.sandboxId, as(bob))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    await expect(Sandbox.connect(first.sandboxId, as(bob))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    await expect(Sandbox.getInfo(first.sandboxId, as(bob))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    expect(await Sandbox.kill(first.sandboxId, as(bob))).toBe(false);
    expect(await listed({}, ['paused'], bob)).toEqual([]);

    // A paused sandbox holds no place of the key's limit: a second one starts.
    made(await Sandbox.create({ ...as(alice), timeoutMs: 300_000 }));
    // Its resume would make two: 429 (Retry-After past the request deadline: raised at once).
    await expect(Sandbox.connect(first.sandboxId, as(alice))).rejects.toBeInstanceOf(
      RateLimitError,
    );
    expect((await Sandbox.getInfo(first.sandboxId, as(alice))).state).toBe('paused');
  }, 120_000);

  test('the older resume route: 201 for a paused sandbox, 409 for a running one; bad bodies are 400', async ({
    made,
  }) => {
    const sandbox = made(await Sandbox.create(as(adminKey)));
    const id = sandbox.sandboxId;
    expect(await raw('POST', `/sandboxes/${id}/pause`, { memory: 'no' })).toMatchObject({
      status: 400,
      body: { code: 400, message: expect.stringMatching(/memory must be true or false/) },
    });
    expect(await raw('POST', `/sandboxes/${id}/resume`, {})).toMatchObject({
      status: 409,
      body: { code: 409, message: expect.stringMatching(/already running/) },
    });
    expect((await raw('POST', `/sandboxes/${id}/pause`)).status).toBe(204);
    expect(await raw('POST', `/sandboxes/${id}/pause`, {})).toMatchObject({
      status: 409,
      body: { code: 409, message: expect.stringMatching(/is paused already/) },
    });
    expect(await raw('POST', `/sandboxes/${id}/resume`, { autoPause: true })).toMatchObject({
      status: 400,
      body: { message: expect.stringMatching(/autoPause true on resume is not supported/) },
    });
    expect(await raw('POST', `/sandboxes/${id}/resume`, { timeout: 60 })).toMatchObject({
      status: 201,
      body: { sandboxID: id, envdAccessToken: expect.any(String) },
    });
    expect((await sandbox.commands.run('echo back')).stdout).toBe('back\n');
    expect(await raw('POST', '/sandboxes/inosuchsandbox00/pause', {})).toMatchObject({
      status: 404,
    });
  }, 120_000);
});

describe('fork through the E2B SDK', () => {
  test('Sandbox.fork: count sandboxes with the source’s files and not its processes; bad counts refused', async ({
    made,
  }) => {
    const source = made(await Sandbox.create(as(adminKey)));
    await source.files.write('/home/user/kept.txt', 'kept');
    await source.commands.run('sleep 600', { background: true });
    const forks = await Sandbox.fork(source.sandboxId, {
      ...as(adminKey),
      count: 2,
      timeoutMs: 120_000,
    });
    expect(forks).toHaveLength(2);
    for (const fork of forks) {
      if (!(fork instanceof Sandbox)) throw fork;
      made(fork);
      expect(fork.sandboxId).not.toBe(source.sandboxId);
      expect(await fork.files.read('/home/user/kept.txt')).toBe('kept');
      const processes = await fork.commands.list();
      expect(processes.some((p) => p.cmd.includes('sleep') || p.args.includes('600'))).toBe(false);
      await fork.files.write('/home/user/own.txt', fork.sandboxId);
    }
    // The source did not see the forks' writes.
    await expect(source.files.read('/home/user/own.txt')).rejects.toThrow();
    for (const bad of [0, 11, '2']) {
      expect(
        await raw('POST', `/sandboxes/${source.sandboxId}/fork`, { count: bad }),
      ).toMatchObject({
        status: 400,
        body: { code: 400, message: expect.stringMatching(/count must be a whole number/) },
      });
    }
    expect((await raw('POST', '/sandboxes/inosuchsandbox00/fork', { count: 1 })).status).toBe(404);
  }, 180_000);
});
