import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { afterEach, describe, expect, test } from 'vitest';
import { ensureBuilt, ROOT } from '../helpers/build.js';

// envd itself, the built program every provider starts, run here as a plain process on a Unix
// socket: the template's capabilities hold for the users' token even for a request that never
// went through the gateway, while the control plane's token reaches every route.

const ACCESS = 'users-token-0123456789';
const CONTROL = 'control-token-9876543210';

interface Envd {
  dir: string;
  /** A request to envd with a token; the status and the parsed body. */
  call(
    method: string,
    path: string,
    token: string,
    body?: unknown,
  ): Promise<{ status: number; body: { type?: string; error?: string; [k: string]: unknown } }>;
}

const started: { child: ChildProcess; dir: string; agent: Agent }[] = [];

afterEach(async () => {
  for (const { child, dir, agent } of started.splice(0)) {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await once(child, 'exit');
    }
    await agent.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

async function startEnvd(tokenFile: string, args: string[]): Promise<Envd> {
  ensureBuilt();
  const dir = mkdtempSync(join(tmpdir(), 'abx-envd-caps-'));
  mkdirSync(join(dir, 'ports'));
  mkdirSync(join(dir, 'home'));
  writeFileSync(join(dir, 'token'), tokenFile, { mode: 0o600 });
  writeFileSync(join(dir, 'home', 'notes.txt'), 'hello\n');
  const socket = join(dir, 'envd.sock');
  const child = spawn(
    process.execPath,
    [
      join(ROOT, 'dist', 'runtime', 'envd.cjs'),
      '--socket',
      socket,
      '--ports-dir',
      join(dir, 'ports'),
      '--token-file',
      join(dir, 'token'),
      ...args,
    ],
    { cwd: join(dir, 'home'), env: { ...process.env, HOME: join(dir, 'home') }, stdio: 'pipe' },
  );
  const agent = new Agent({ connect: { socketPath: socket } });
  started.push({ child, dir, agent });
  let stderr = '';
  child.stderr?.on('data', (chunk) => {
    stderr += chunk;
  });
  const [line] = await Promise.race([
    once(child.stdout as NodeJS.ReadableStream, 'data'),
    once(child, 'exit').then(() => {
      throw new Error(`envd exited: ${stderr}`);
    }),
  ]);
  expect(String(line)).toContain('"listening"');
  return {
    dir,
    async call(method, path, token, body) {
      const response = await request(`http://envd${path}`, {
        dispatcher: agent,
        method: method as 'GET',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      });
      const text = await response.body.text();
      return {
        status: response.statusCode,
        body: text.startsWith('{') ? JSON.parse(text) : { text },
      };
    },
  };
}

describe('envd enforces capabilities for the access token', () => {
  test('a route of a capability the template lacks is a 403 naming the template; the rest work', async () => {
    const envd = await startEnvd(`${ACCESS}\n${CONTROL}\n`, [
      '--capabilities',
      'files',
      '--template',
      'files-only',
    ]);
    // The token file is gone once envd has read it: nothing else in the sandbox can read it.
    expect(existsSync(join(envd.dir, 'token'))).toBe(false);
    for (const [method, path, capability, body] of [
      ['POST', '/process/exec', 'shell', { cmd: 'echo hi' }],
      ['POST', '/exec', 'shell', { cmd: 'echo hi' }],
      ['GET', '/terminal', 'shell', undefined],
      ['POST', '/dev-tools/run', 'shell', { language: 'node', code: '1' }],
      ['POST', '/execute', 'code', { code: '1+1' }],
      ['GET', '/contexts', 'code', undefined],
      ['POST', '/ports/8080', 'ports', undefined],
      // envd's router reads these as /process/exec: refused the same way.
      ['POST', '//process/exec', 'shell', { cmd: 'echo hi' }],
      ['POST', '/%70rocess/exec', 'shell', { cmd: 'echo hi' }],
    ] as const) {
      const answer = await envd.call(method, path, ACCESS, body);
      expect(answer.status, path).toBe(403);
      expect(answer.body.type).toBe('CapabilityError');
      expect(answer.body.error).toBe(
        `template 'files-only' does not have the ${capability} capability, so ${method} ${path} is refused; add ${capability} to its capabilities`,
      );
    }
    const read = await envd.call('GET', '/files/read?path=notes.txt', ACCESS);
    expect(read.status).toBe(200);
    expect(read.body.text).toBe('hello\n');
    expect((await envd.call('GET', '/info', ACCESS)).status).toBe(200);
  });

  test('the control token reaches every route, a wrong token none', async () => {
    const envd = await startEnvd(`${ACCESS}\n${CONTROL}\n`, [
      '--capabilities',
      'code',
      '--template',
      'code-only',
    ]);
    const exec = await envd.call('POST', '/process/exec', CONTROL, { cmd: 'echo from-control' });
    expect(exec.status).toBe(200);
    expect(exec.body.stdout).toBe('from-control\n');
    expect((await envd.call('GET', '/files/read?path=notes.txt', CONTROL)).status).toBe(200);
    expect((await envd.call('GET', '/files/read?path=notes.txt', ACCESS)).status).toBe(403);
    for (const token of ['', 'wrong', `${ACCESS}\n${CONTROL}`.slice(0, 10)]) {
      const refused = await envd.call('GET', '/files/read?path=notes.txt', token);
      expect(refused.status).toBe(401);
      expect(refused.body.type).toBe('AuthenticationError');
    }
  });

  test('a token file of one line has no control token: the access token stays limited', async () => {
    const envd = await startEnvd(ACCESS, [
      '--capabilities',
      'files,code',
      '--template',
      'no-shell',
    ]);
    expect((await envd.call('POST', '/process/exec', ACCESS, { cmd: 'true' })).status).toBe(403);
    expect((await envd.call('GET', '/files/read?path=notes.txt', ACCESS)).status).toBe(200);
  });

  test('without --capabilities the access token reaches every route (build sandboxes)', async () => {
    const envd = await startEnvd(ACCESS, []);
    const exec = await envd.call('POST', '/process/exec', ACCESS, { cmd: 'echo ok' });
    expect(exec.status).toBe(200);
    expect(exec.body.stdout).toBe('ok\n');
  });

  test('an unknown capability stops envd at start with a message naming it', async () => {
    await expect(startEnvd(ACCESS, ['--capabilities', 'shell,gpu'])).rejects.toThrow(
      /unknown capability "gpu": use shell, files, code, ports/,
    );
  });
});
