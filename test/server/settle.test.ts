import { afterEach, describe, expect, test } from 'vitest';
import { EXEC } from '../../runtime/envd/exec.js';
import { CORE } from '../../runtime/server/groups/core.js';
import { PROCESS } from '../../runtime/server/groups/process.js';
import { SandboxServer } from '../../runtime/server/server.js';
import { call } from './harness.js';

// SandboxServer.settleWhenQuiet: what envd runs once a spell of requests is over (it collects its
// garbage then, runtime/envd/idle.ts). Once per quiet spell, never while a request is in flight,
// and the daemon's long read of envd's log (idle-neutral) does not count as one.

const TOKEN = 'settle-test-token';
const QUIET_MS = 1000;
const servers: SandboxServer[] = [];

afterEach(async () => {
  for (const server of servers.splice(0)) await server.stop();
});

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function started() {
  const server = new SandboxServer({
    token: TOKEN,
    catalog: [CORE, PROCESS, EXEC],
    // As envd's log read: a slow route the test names idle-neutral.
    idleNeutral: (req) => req.url === '/exec' && req.headers['x-neutral'] === '1',
  });
  servers.push(server);
  const { host, port } = await server.start();
  const runs: number[] = [];
  const began = Date.now();
  server.settleWhenQuiet(QUIET_MS, () => runs.push(Date.now() - began));
  const url = `http://${host}:${port}`;
  const run = (cmd: string, headers: Record<string, string> = {}) =>
    call(url, '/exec', { token: TOKEN, body: { cmd }, headers });
  return { runs, run };
}

describe('settleWhenQuiet', () => {
  test('runs once after the start and once after each spell of requests, not in between', async () => {
    const { runs, run } = await started();
    await pause(QUIET_MS * 2);
    expect(runs).toHaveLength(1);
    // A spell of requests, each shorter than the quiet time: one run after the last one.
    for (let i = 0; i < 5; i++) expect((await run('true')).status).toBe(200);
    expect(runs).toHaveLength(1);
    await pause(QUIET_MS * 2);
    expect(runs).toHaveLength(2);
    // A quiet server is left alone: no run on a timer of its own.
    await pause(QUIET_MS * 3);
    expect(runs).toHaveLength(2);
  });

  test('never while a request is in flight, however long it takes', async () => {
    const { runs, run } = await started();
    await pause(QUIET_MS * 2);
    expect(runs).toHaveLength(1);
    const slow = run('sleep 2.5');
    await pause(QUIET_MS * 2);
    expect(runs).toHaveLength(1);
    expect((await slow).status).toBe(200);
    await pause(QUIET_MS * 2);
    expect(runs).toHaveLength(2);
  });

  test('an idle-neutral request in flight does not hold it back', async () => {
    const { runs, run } = await started();
    const neutral = run('sleep 3', { 'x-neutral': '1' });
    await pause(QUIET_MS * 2);
    // The start's spell ended while the neutral request runs.
    expect(runs).toHaveLength(1);
    expect((await run('true')).status).toBe(200);
    await pause(QUIET_MS * 2);
    expect(runs).toHaveLength(2);
    await neutral;
  });
});
