import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, expect, test } from 'vitest';
import { SETTLE_MS } from '../../runtime/envd/idle.js';
import { ENVD_NODE_OPTIONS } from '../../src/providers/provider.js';
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

/** The body as JSON where it is one object, else `{ text }` (an NDJSON stream, plain text). */
function jsonOr(text: string): Answer['body'] {
  try {
    const parsed = JSON.parse(text);
    return typeof parsed === 'object' && parsed !== null ? parsed : { text };
  } catch {
    return { text };
  }
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

/**
 * envd with the bootstrap tokens, and a client on one keep-alive connection. `preload`: a script
 * Node runs first in envd's process (`--require`), written to envd's folder.
 */
async function startEnvd(preload?: string, nodeOptions: readonly string[] = []) {
  ensureBuilt();
  const dir = mkdtempSync(join(tmpdir(), 'abx-envd-tokens-'));
  const preloadFile = join(dir, 'preload.cjs');
  if (preload !== undefined) writeFileSync(preloadFile, preload);
  mkdirSync(join(dir, 'ports'));
  writeFileSync(join(dir, 'token'), `${BOOT_CLIENT}\n${BOOT_CONTROL}\n`, { mode: 0o600 });
  const socketPath = join(dir, 'envd.sock');
  const child = spawn(
    process.execPath,
    [
      ...nodeOptions,
      ...(preload === undefined ? [] : ['--require', preloadFile]),
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
              body: jsonOr(text),
              reused: req.reusedSocket,
            }),
          );
        },
      );
      req.on('error', reject);
      req.end(body === undefined ? undefined : JSON.stringify(body));
    });
  return { call, dir, child };
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

test('envd checks tokens and runs a command without loading node:crypto or node:zlib', async () => {
  // Loading node:crypto starts OpenSSL: 1.3 MiB more in every sandbox's envd (issue 50). The
  // token check compares bytes itself (runtime/server/file-tools/random.ts), and names come from
  // /dev/urandom. The preload lists the built-in modules loaded when envd gets SIGUSR2.
  const envd = await startEnvd(`process.on('SIGUSR2', () => require('fs').writeFileSync(
    require('path').join(__dirname, 'modules'), process.moduleLoadList.join('\\n')));`);
  // Wrong tokens of every length: a prefix, the token with one more byte, one byte changed, none.
  for (const token of [
    BOOT_CLIENT.slice(0, -1),
    `${BOOT_CLIENT}x`,
    `${BOOT_CLIENT.slice(0, -1)}X`,
    BOOT_CLIENT.slice(0, 1),
    '',
  ]) {
    expect((await envd.call('GET', '/info', token)).status, token).toBe(401);
  }
  const ran = await envd.call('POST', '/exec', BOOT_CLIENT, { cmd: 'echo ran' });
  expect(ran.status).toBe(200);
  expect(String(ran.body.text)).toContain('"data":"ran\\n"');
  // A file written through envd takes a random temporary name.
  const written = await envd.call('PUT', '/files/write?path=a.txt', BOOT_CLIENT, 'written');
  expect(written.status).toBe(200);
  expect(readFileSync(join(envd.dir, 'a.txt'), 'utf8')).toBe('"written"');
  const modules = join(envd.dir, 'modules');
  envd.child.kill('SIGUSR2');
  for (let waited = 0; !existsSync(modules) && waited < 10_000; waited += 20) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  const loaded = readFileSync(modules, 'utf8').split('\n');
  expect(loaded).toContain('NativeModule child_process');
  expect(loaded.filter((name) => /^NativeModule (crypto|zlib)$/.test(name))).toEqual([]);
});

test('a quiet envd gives back what its start and its requests left, with its Node options', async () => {
  // settleGarbage (runtime/envd/idle.ts), SETTLE_MS after the last request: ~2 MiB of a fresh
  // envd's 13 on Node 24. Measured as the process's anonymous memory, what a sandbox is charged.
  const envd = await startEnvd(undefined, ENVD_NODE_OPTIONS);
  const anonymousKiB = () =>
    Number(
      /^Anonymous:\s+(\d+)/m.exec(
        readFileSync(`/proc/${envd.child.pid}/smaps_rollup`, 'utf8'),
      )?.[1],
    );
  for (let i = 0; i < 20; i++) {
    const ran = await envd.call('POST', '/exec', BOOT_CLIENT, { cmd: 'seq 1 2000' });
    expect(ran.status).toBe(200);
  }
  const busy = anonymousKiB();
  await new Promise((resolve) => setTimeout(resolve, SETTLE_MS + 1500));
  const settled = anonymousKiB();
  expect(
    busy - settled,
    `${busy} KiB after the commands, ${settled} KiB once quiet`,
  ).toBeGreaterThan(1024);
  // And it still answers as before.
  expect(
    (await envd.call('POST', '/exec', BOOT_CLIENT, { cmd: 'echo again' })).body.text,
  ).toContain('"data":"again\\n"');
});
