import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { openSqlite } from '../../src/control/sqlite.js';
import { type DaemonInfo, LimitExceededError, Sandbox } from '../../src/index.js';
import { isProcessAlive, startDaemon } from '../../src/installation/daemon-connection.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';
import {
  COUNTER,
  counterValue,
  freezeKeepsProcesses,
  hibernateKeepsFiles,
  sdkCallsResume,
} from './pause-scenarios.js';

// Pause and resume on the local provider with a root daemon: the cgroup freezer, hibernation on
// the sandbox's disk image, and what the control plane does around them.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;

const daemonInfo = () => JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as DaemonInfo;
const adminKey = () => readFileSync(join(home, 'api-key'), 'utf8').trim();
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A raw call of the daemon's API with the admin key. */
async function api(method: string, path: string, body?: unknown) {
  const response = await request(`${daemonInfo().apiUrl}${path}`, {
    method: method as 'POST',
    headers: {
      authorization: `Bearer ${adminKey()}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  return {
    status: response.statusCode,
    body: (await response.body.json()) as Record<string, unknown>,
  };
}

/** Kills the daemon with SIGKILL and waits until it is gone (the next SDK call starts another). */
async function killDaemon(): Promise<void> {
  const pid = daemonInfo().pid;
  process.kill(pid, 'SIGKILL');
  for (let i = 0; i < 500 && isProcessAlive(pid); i++) await sleep(10);
}

/** The state letters of a sandbox's processes (`T` stopped by SIGSTOP, `D`/`S` frozen...). */
function freezerState(id: string): string {
  return readFileSync(`/sys/fs/cgroup/freezer/abx/${id}/freezer.state`, 'utf8').trim();
}

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
  await startDaemon(home);
}, 300_000);

afterAll(async () => {
  await abx?.close();
}, 120_000);

describe('pause and resume (local, root daemon)', () => {
  test('a frozen sandbox stops where it is and goes on after a resume', async () => {
    await freezeKeepsProcesses({ home });
  }, 120_000);

  test('a frozen sandbox keeps an open TCP connection and a code context’s variables', async () => {
    const box = await Sandbox.create({ home });
    try {
      // A server and a client in the sandbox, the client echoing through one connection forever.
      await box.files.write(
        'echo.py',
        [
          'import socket, threading, time',
          "srv = socket.socket(); srv.bind(('127.0.0.1', 7001)); srv.listen()",
          'def serve():',
          '    c, _ = srv.accept()',
          '    while True:',
          '        d = c.recv(100)',
          '        if not d: break',
          '        c.sendall(d)',
          'threading.Thread(target=serve, daemon=True).start()',
          "cl = socket.create_connection(('127.0.0.1', 7001))",
          'n = 0',
          'while True:',
          "    cl.sendall(b'ping'); assert cl.recv(100) == b'ping'; n += 1",
          "    open('/tmp/echoes.tmp', 'w').write(str(n)); __import__('os').replace('/tmp/echoes.tmp', '/tmp/echoes')",
          '    time.sleep(0.05)',
        ].join('\n'),
      );
      const echo = await box.commands.start('python3 echo.py');
      await box.runCode('x = 41');
      await box.commands.run('sleep 0.5');
      const echoes = async () => Number((await box.commands.run('cat /tmp/echoes')).stdout);
      const before = await echoes();
      expect(before).toBeGreaterThan(0);
      await box.pause();
      expect(freezerState(box.sandboxId)).toBe('FROZEN');
      await sleep(1500);
      await box.resume();
      expect(freezerState(box.sandboxId)).toBe('THAWED');
      await box.commands.run('sleep 0.5');
      // The same connection goes on echoing: the client would have died on a broken one.
      expect(await echoes()).toBeGreaterThan(before);
      expect((await box.commands.list()).find((p) => p.pid === echo.pid)?.running).toBe(true);
      expect((await box.runCode('x + 1')).text).toBe('42');
    } finally {
      await box.kill();
    }
  }, 120_000);

  test('a hibernated sandbox keeps its files and environment across a daemon SIGKILL', async () => {
    await hibernateKeepsFiles({ home }, killDaemon);
  }, 180_000);

  test('SDK calls resume a paused sandbox; a second pause answers false', async () => {
    await sdkCallsResume({ home });
  }, 120_000);

  test('a hibernated sandbox holds no process and no memory; its disk stays', async () => {
    const box = await Sandbox.create({ home });
    try {
      await box.commands.start('sleep 600');
      expect(sandboxProcesses(box.sandboxId).length).toBeGreaterThan(0);
      await box.pause({ memory: false });
      expect(sandboxProcesses(box.sandboxId)).toEqual([]);
      const dir = join(home, 'sandboxes', box.sandboxId);
      expect(readFileSync(join(dir, 'spec.json'), 'utf8')).not.toContain(box.accessToken);
      await box.resume();
      expect(sandboxProcesses(box.sandboxId).length).toBeGreaterThan(0);
    } finally {
      await box.kill();
    }
    expect(sandboxProcesses(box.sandboxId)).toEqual([]);
  }, 120_000);

  test('list, info and the CLI-facing API show paused sandboxes', async () => {
    const box = await Sandbox.create({ home });
    try {
      await box.pause({ memory: false });
      const listed = await Sandbox.list({ home });
      expect(listed.find((s) => s.sandboxId === box.sandboxId)?.state).toBe('paused');
      expect(
        (await Sandbox.list({ home, state: 'running' })).some((s) => s.sandboxId === box.sandboxId),
      ).toBe(false);
      const info = await box.getInfo();
      expect(info.paused?.memory).toBe(false);
      expect(Date.parse(info.paused?.pausedAt ?? '')).toBeLessThanOrEqual(Date.now());
      // Its paused timeout (30 days by default) is its expiry while paused.
      expect(Date.parse(info.expiresAt) - Date.now()).toBeGreaterThan(29 * 24 * 3600 * 1000);
    } finally {
      await box.kill();
    }
  }, 120_000);

  test('a raw gateway request to a paused sandbox answers 409 naming the way out', async () => {
    const box = await Sandbox.create({ home });
    try {
      await box.pause();
      const response = await request(`${daemonInfo().gatewayUrl}/health`, {
        headers: {
          'x-sandbox-id': box.sandboxId,
          'x-sandbox-port': '49983',
          'x-access-token': box.accessToken,
        },
      });
      expect(response.statusCode).toBe(409);
      const body = (await response.body.json()) as { type: string; code: string; error: string };
      expect(body).toMatchObject({ type: 'SandboxPausedError', code: 'paused' });
      expect(body.error).toContain(`abx resume ${box.sandboxId}`);
      // Still paused: a raw request does not resume it.
      expect((await box.getInfo()).state).toBe('paused');
    } finally {
      await box.kill();
    }
  }, 120_000);

  test('autoResume: a request with its token resumes it, frozen or hibernated; a wrong token does not', async () => {
    const key = await ApiKeys.create(`auto-resume-${Date.now()}`, { home, maxRunning: 1 });
    const connection = { apiUrl: daemonInfo().apiUrl, apiKey: key.key };
    const box = await Sandbox.create({ ...connection, autoPause: true, autoResume: true });
    let other: Sandbox | undefined;
    const health = (token: string) =>
      request(`${daemonInfo().gatewayUrl}/health`, {
        headers: {
          'x-sandbox-id': box.sandboxId,
          'x-sandbox-port': '49983',
          'x-access-token': token,
        },
      });
    try {
      expect((await box.getInfo()).lifecycle).toEqual({
        onTimeout: 'pause',
        keepMemory: true,
        autoResume: true,
      });
      await box.commands.run('echo kept > ~/f');
      for (const memory of [true, false]) {
        await box.pause({ memory });
        const refused = await health('not-its-token');
        expect(refused.statusCode).toBe(401);
        await refused.body.text();
        expect((await box.getInfo()).state).toBe('paused');
        const answered = await health(box.accessToken);
        expect(answered.statusCode).toBe(200);
        await answered.body.text();
        expect((await box.getInfo()).state).toBe('running');
        expect((await box.commands.run('cat ~/f')).stdout.trim()).toBe('kept');
      }
      // Its key's limit holds for a resume its traffic asks for too.
      await box.pause();
      other = await Sandbox.create(connection);
      const over = await health(box.accessToken);
      expect(over.statusCode).toBe(429);
      await over.body.text();
      expect((await box.getInfo()).state).toBe('paused');
    } finally {
      await box.kill();
      await other?.kill();
    }
  }, 180_000);

  test('bad input is refused and changes nothing', async () => {
    const box = await Sandbox.create({ home });
    try {
      const id = box.sandboxId;
      const bad = await api('POST', `/v1/sandboxes/${id}/pause`, { memory: 'yes' });
      expect(bad.status).toBe(400);
      const before = (await Sandbox.list({ home, all: true })).length;
      for (const body of [{ autoResume: true }, { autoPause: true, autoResume: 'yes' }]) {
        const refused = await api('POST', '/v1/sandboxes', body);
        expect(refused.status, JSON.stringify(body)).toBe(400);
        expect(String(refused.body.error)).toMatch(/autoResume/);
      }
      expect((await Sandbox.list({ home, all: true })).length).toBe(before);
      expect((await box.getInfo()).state).toBe('running');
      expect((await api('POST', `/v1/sandboxes/${id}/resume`, { timeoutMs: -5 })).status).toBe(400);
      expect((await api('POST', '/v1/sandboxes/inosuchsandbox00/pause', {})).status).toBe(404);
      expect((await api('POST', '/v1/sandboxes/inosuchsandbox00/resume', {})).status).toBe(404);
      const first = await api('POST', `/v1/sandboxes/${id}/pause`, {});
      expect(first.status).toBe(200);
      const again = await api('POST', `/v1/sandboxes/${id}/pause`, { memory: false });
      expect(again.status).toBe(409);
      expect(again.body).toMatchObject({ type: 'SandboxPausedError', code: 'already_paused' });
      // Paused, a sandbox takes no timeout or network change: it must be resumed first.
      const timeout = await api('POST', `/v1/sandboxes/${id}/timeout`, { timeoutMs: 60_000 });
      expect(timeout.status).toBe(409);
      expect(
        (await api('POST', `/v1/sandboxes/${id}/resume`, { timeoutMs: 120_000 })).body,
      ).toMatchObject({ state: 'running', resumed: true });
      await box.kill();
      expect((await api('POST', `/v1/sandboxes/${id}/pause`, {})).status).toBe(404);
      expect((await api('POST', `/v1/sandboxes/${id}/resume`, {})).status).toBe(404);
    } finally {
      await box.kill();
    }
  }, 120_000);

  test('a paused sandbox counts against no key’s limit; resuming over it is refused', async () => {
    const key = await ApiKeys.create(`pause-limit-${Date.now()}`, { home, maxRunning: 1 });
    const connection = { apiUrl: daemonInfo().apiUrl, apiKey: key.key };
    const first = await Sandbox.create(connection);
    let second: Sandbox | undefined;
    try {
      await first.pause();
      second = await Sandbox.create(connection);
      await expect(first.resume()).rejects.toBeInstanceOf(LimitExceededError);
      expect((await first.getInfo()).state).toBe('paused');
      await second.kill();
      expect(await first.resume()).toBe(true);
    } finally {
      await first.kill();
      await second?.kill();
    }
  }, 120_000);
});

describe('faults around a pause', () => {
  test('a command running through a pause finishes after the resume', async () => {
    const box = await Sandbox.create({ home });
    try {
      const running = box.commands.run('sleep 1; echo done');
      await sleep(300);
      await box.pause();
      await sleep(1500);
      await box.resume();
      expect((await running).stdout).toBe('done\n');
    } finally {
      await box.kill();
    }
  }, 120_000);

  test('killing a paused sandbox ends its command and every process', async () => {
    for (const memory of [true, false]) {
      const box = await Sandbox.create({ home });
      const handle = await box.commands.start('sleep 600');
      const settled = handle.wait().then(
        () => 'exited',
        () => 'failed',
      );
      await box.pause({ memory });
      expect(await box.kill()).toBe(true);
      expect(['exited', 'failed']).toContain(await settled);
      expect(sandboxProcesses(box.sandboxId)).toEqual([]);
      expect((await box.getInfo()).state).toBe('killed');
    }
  }, 120_000);

  test('a resume racing a kill leaves the sandbox killed and nothing running', async () => {
    for (const memory of [true, false]) {
      const box = await Sandbox.create({ home });
      await box.pause({ memory });
      const [resumed, killed] = await Promise.allSettled([box.resume(), box.kill()]);
      expect(killed).toEqual({ status: 'fulfilled', value: true });
      expect(['fulfilled', 'rejected']).toContain(resumed.status);
      expect((await box.getInfo()).state).toBe('killed');
      expect(sandboxProcesses(box.sandboxId)).toEqual([]);
    }
  }, 120_000);

  test('a daemon that died between recording a pause and doing it: the next one does it', async () => {
    const frozen = await Sandbox.create({ home });
    const hibernated = await Sandbox.create({ home });
    try {
      await frozen.commands.start(COUNTER);
      await hibernated.files.write('kept.txt', 'kept');
      await hibernated.commands.start('sleep 600');
      await killDaemon();
      // The rows say paused; the processes still run, as after a SIGKILL at that instant.
      const db = openSqlite(join(home, 'abx.db'));
      const pause = db.prepare(
        "UPDATE sandboxes SET state = 'paused', paused = ?, expires_at = ? WHERE id = ?",
      );
      const at = Date.now();
      pause.run(JSON.stringify({ memory: true, at }), at + 3_600_000, frozen.sandboxId);
      pause.run(JSON.stringify({ memory: false, at }), at + 3_600_000, hibernated.sandboxId);
      db.close();
      await startDaemon(home);
      expect(freezerState(frozen.sandboxId)).toBe('FROZEN');
      expect(sandboxProcesses(hibernated.sandboxId)).toEqual([]);
      const states = Object.fromEntries(
        (await Sandbox.list({ home })).map((s) => [s.sandboxId, s.state]),
      );
      expect(states[frozen.sandboxId]).toBe('paused');
      expect(states[hibernated.sandboxId]).toBe('paused');
      const woken = await Sandbox.connect(hibernated.sandboxId, { home });
      expect(await woken.files.read('kept.txt')).toBe('kept');
      const thawed = await Sandbox.connect(frozen.sandboxId, { home });
      const value = await counterValue(thawed);
      await thawed.commands.run('sleep 0.3');
      expect(await counterValue(thawed)).toBeGreaterThan(value);
    } finally {
      await frozen.kill();
      await hibernated.kill();
    }
  }, 180_000);
});

describe('timeouts of paused sandboxes, autoPause', () => {
  let quick: Awaited<ReturnType<typeof createAbxHome>>;

  beforeAll(async () => {
    // This file's second daemon keeps paused sandboxes 4 s.
    process.env.ABX_PAUSED_TIMEOUT_MS = '4000';
    try {
      quick = await createAbxHome();
      await startDaemon(quick.home);
    } finally {
      delete process.env.ABX_PAUSED_TIMEOUT_MS;
    }
  }, 300_000);

  afterAll(async () => {
    await quick?.close();
  }, 120_000);

  /** Polls a sandbox's info until `ok`, for 30 s at most. */
  async function until(box: Sandbox, what: string, ok: (state: string) => boolean) {
    const deadline = Date.now() + 30_000;
    for (;;) {
      const info = await box.getInfo();
      if (ok(info.state)) return info;
      if (Date.now() > deadline) throw new Error(`sandbox not ${what} in 30 s: ${info.state}`);
      await sleep(200);
    }
  }

  test('a paused sandbox does not time out, and is removed at its paused timeout', async () => {
    const box = await Sandbox.create({ home: quick.home, timeoutMs: 2000 });
    try {
      await box.pause({ memory: false });
      const ended = await until(box, 'removed', (state) => state !== 'paused');
      expect(ended.state).toBe('expired');
      expect(ended.endReason).toMatch(/paused since .* removed at its paused timeout/);
      expect(sandboxProcesses(box.sandboxId)).toEqual([]);
    } finally {
      await box.kill();
    }
  }, 120_000);

  test('autoPause: at its timeout the sandbox pauses instead of dying, and resumes', async () => {
    const frozen = await Sandbox.create({ home: quick.home, timeoutMs: 1500, autoPause: true });
    const hibernated = await Sandbox.create({
      home: quick.home,
      timeoutMs: 1500,
      autoPause: true,
      autoPauseMemory: false,
    });
    try {
      expect((await frozen.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', keepMemory: true });
      await hibernated.files.write('kept.txt', 'kept');
      const paused = await until(frozen, 'paused', (state) => state !== 'running');
      expect(paused.state).toBe('paused');
      expect(paused.paused?.memory).toBe(true);
      const sleeping = await until(hibernated, 'paused', (state) => state !== 'running');
      expect(sleeping.paused?.memory).toBe(false);
      expect(await hibernated.resume({ timeoutMs: 60_000 })).toBe(true);
      expect(await hibernated.files.read('kept.txt')).toBe('kept');
    } finally {
      await frozen.kill();
      await hibernated.kill();
    }
  }, 120_000);
});
