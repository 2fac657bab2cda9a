import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, expect, test } from 'vitest';
import { ensureBuilt, ROOT } from '../helpers/build.js';

// PUT /tokens on envd itself (the built program, on a Unix socket): a pre-started envd (a warm
// pool's pod) takes its sandbox's own tokens once, and refuses the bootstrap ones from then on,
// on the very keep-alive connection that replaced them too.

const BOOT_CLIENT = 'bootstrap-client-token-0123456789abcdef';
const BOOT_CONTROL = 'bootstrap-control-token-0123456789abcdef';
const CLIENT = 'own-client-token-AAAAAAAAAAAAAAAAAAAAAAAAAAAA';
const CONTROL = 'own-control-token-BBBBBBBBBBBBBBBBBBBBBBBBBBBB';

interface Answer {
  status: number;
  body: { type?: string; error?: string; [k: string]: unknown };
  reused: boolean;
}

const started: { child: ChildProcess; dir: string; agent: Agent }[] = [];

afterEach(async () => {
  for (const { child, dir, agent } of started.splice(0)) {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await once(child, 'exit');
    }
    agent.destroy();
    rmSync(dir, { recursive: true, force: true });
  }
});

/** envd with the bootstrap tokens, and a client on one keep-alive connection. */
async function startEnvd() {
  ensureBuilt();
  const dir = mkdtempSync(join(tmpdir(), 'abx-envd-tokens-'));
  mkdirSync(join(dir, 'ports'));
  writeFileSync(join(dir, 'token'), `${BOOT_CLIENT}\n${BOOT_CONTROL}\n`, { mode: 0o600 });
  const socketPath = join(dir, 'envd.sock');
  const child = spawn(
    process.execPath,
    [
      join(ROOT, 'dist', 'runtime', 'envd.cjs'),
      '--socket',
      socketPath,
      '--ports-dir',
      join(dir, 'ports'),
      '--token-file',
      join(dir, 'token'),
    ],
    { cwd: dir, stdio: 'pipe' },
  );
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  started.push({ child, dir, agent });
  let stderr = '';
  child.stderr?.on('data', (chunk) => {
    stderr += chunk;
  });
  await Promise.race([
    once(child.stdout as NodeJS.ReadableStream, 'data'),
    once(child, 'exit').then(() => {
      throw new Error(`envd exited: ${stderr}`);
    }),
  ]);
  const call = (method: string, path: string, token: string, body?: unknown) =>
    new Promise<Answer>((resolve, reject) => {
      const req = request(
        {
          socketPath,
          agent,
          method,
          path,
          headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        },
        (res) => {
          let text = '';
          res.on('data', (chunk) => {
            text += chunk;
          });
          res.on('end', () =>
            resolve({
              status: res.statusCode ?? 0,
              body: text.startsWith('{') ? JSON.parse(text) : { text },
              reused: req.reusedSocket,
            }),
          );
        },
      );
      req.on('error', reject);
      req.end(body === undefined ? undefined : JSON.stringify(body));
    });
  return { call };
}

test('the control token replaces both tokens once; the bootstrap ones are refused from the next request on, on the same connection', async () => {
  const envd = await startEnvd();
  expect((await envd.call('GET', '/info', BOOT_CLIENT)).status).toBe(200);
  const replaced = await envd.call('PUT', '/tokens', BOOT_CONTROL, {
    client: CLIENT,
    control: CONTROL,
  });
  expect(replaced).toMatchObject({ status: 200, body: { replaced: true } });
  for (const token of [BOOT_CLIENT, BOOT_CONTROL]) {
    const refused = await envd.call('GET', '/info', token);
    expect(refused).toMatchObject({ status: 401, body: { type: 'AuthenticationError' } });
    // The connection that carried the replacement is the one refused: keep-alive changes nothing.
    expect(refused.reused).toBe(true);
  }
  expect((await envd.call('GET', '/info', CLIENT)).status).toBe(200);
  expect((await envd.call('PUT', '/env', CONTROL, { env: { A: '1' } })).status).toBe(200);
  // The new client token is still the limited one: it may not replace tokens.
  expect(
    (await envd.call('PUT', '/tokens', CLIENT, { client: `${CLIENT}x`, control: `${CONTROL}x` }))
      .status,
  ).toBe(401);
  // Once: even the new control token cannot replace them again.
  const again = await envd.call('PUT', '/tokens', CONTROL, {
    client: `${CLIENT}x`,
    control: `${CONTROL}x`,
  });
  expect(again).toMatchObject({ status: 400, body: { type: 'BadRequestError' } });
  expect(again.body.error).toContain('replaced already');
  expect((await envd.call('GET', '/info', CONTROL)).status).toBe(200);
});

test('only the current control token may call it; bad tokens are refused and change nothing', async () => {
  const envd = await startEnvd();
  const good = { client: CLIENT, control: CONTROL };
  // The client (access) token, a wrong token, none.
  expect(await envd.call('PUT', '/tokens', BOOT_CLIENT, good)).toMatchObject({
    status: 401,
    body: { type: 'AuthenticationError' },
  });
  expect((await envd.call('PUT', '/tokens', 'not-a-token-of-this-envd-at-all', good)).status).toBe(
    401,
  );
  for (const body of [
    {},
    { client: CLIENT },
    { client: 'short', control: CONTROL },
    { client: CLIENT, control: `${'a'.repeat(40)} b` },
    { client: CLIENT, control: `${'a'.repeat(40)}\nb` },
    { client: CLIENT, control: 'x'.repeat(513) },
    { client: CLIENT, control: 42 },
    { client: CONTROL, control: CONTROL },
  ]) {
    const answer = await envd.call('PUT', '/tokens', BOOT_CONTROL, body);
    expect(answer, JSON.stringify(body)).toMatchObject({
      status: 400,
      body: { type: 'BadRequestError' },
    });
  }
  // Nothing changed: the bootstrap tokens still work, the proposed ones do not.
  expect((await envd.call('GET', '/info', BOOT_CLIENT)).status).toBe(200);
  expect((await envd.call('GET', '/info', CLIENT)).status).toBe(401);
  // And a good replacement still goes through after the refusals.
  expect((await envd.call('PUT', '/tokens', BOOT_CONTROL, good)).status).toBe(200);
  expect((await envd.call('GET', '/info', CLIENT)).status).toBe(200);
});
