import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test as base, describe, expect } from 'vitest';
import { Daemon, type DaemonOptions } from '../../src/control/daemon.js';
import { sandboxToken } from '../../src/control/ids.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { call, type Json } from '../helpers/api-call.js';
import { MEMORY_ISOLATION, MemoryProvider } from '../helpers/memory-provider.js';
import { until } from './plane.js';

interface Installation {
  home: string;
  provider: MemoryProvider;
  /** Starts a daemon on the installation (stopped after the test if the test did not). */
  start(options?: Partial<DaemonOptions>): Promise<{ daemon: Daemon; info: DaemonInfo }>;
}

/** One `$ABX_HOME` and one memory provider per test; every daemon, server and folder cleaned. */
const test = base.extend<{ abx: Installation }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  abx: async ({}, use) => {
    const home = mkdtempSync(join(tmpdir(), 'abx-daemon-'));
    const provider = new MemoryProvider();
    const daemons: Daemon[] = [];
    try {
      await use({
        home,
        provider,
        async start(options = {}) {
          const daemon = new Daemon({
            home,
            provider,
            apiPort: 0,
            gatewayPort: 0,
            reapIntervalMs: 50,
            ...options,
          });
          daemons.push(daemon);
          return { daemon, info: await daemon.start() };
        },
      });
    } finally {
      for (const daemon of daemons) await daemon.stop().catch(() => undefined);
      await provider.dispose();
      rmSync(home, { recursive: true, force: true });
    }
  },
});

const apiKey = (home: string) => readFileSync(join(home, 'api-key'), 'utf8').trim();

/** The API with the installation's key. */
function api(info: DaemonInfo, home: string) {
  const auth = { authorization: `Bearer ${apiKey(home)}` };
  return {
    get: (path: string) => call(`${info.apiUrl}${path}`, { headers: auth }),
    post: (path: string, body: unknown = {}) =>
      call(`${info.apiUrl}${path}`, { method: 'POST', headers: auth, body }),
    delete: (path: string) => call(`${info.apiUrl}${path}`, { method: 'DELETE', headers: auth }),
  };
}

/** One request through the gateway. */
const gateway = (info: DaemonInfo, path: string, headers: Record<string, string>) =>
  call(`${info.gatewayUrl}${path}`, { headers });

/** Every error answer is the contract's `{ error, type }`, both strings, nothing else. */
function expectErrorShape(body: Json, type?: string): void {
  expect(Object.keys(body).sort()).toEqual(['error', 'type']);
  expect(body.error).toEqual(expect.any(String));
  expect(body.type).toEqual(type ?? expect.any(String));
}

describe('the daemon on a memory provider', () => {
  test('daemon.json says where it listens and carries the provider’s isolation report', async ({
    abx,
  }) => {
    const { info } = await abx.start();
    const file = join(abx.home, 'daemon.json');
    expect(JSON.parse(readFileSync(file, 'utf8'))).toEqual(info);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(info).toMatchObject({ pid: process.pid, domain: 'localhost' });
    expect(info.isolation).toEqual(MEMORY_ISOLATION);
    expect(info.apiUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(info.gatewayUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(info.gatewayUrl).not.toBe(info.apiUrl);
    expect(statSync(join(abx.home, 'api-key')).mode & 0o777).toBe(0o600);
    // Nothing is started by starting the daemon.
    expect(abx.provider.creates).toBe(0);
  });

  test('the REST API wants the API key (health excepted)', async ({ abx }) => {
    const { info } = await abx.start();
    const none = await call(`${info.apiUrl}/v1/sandboxes`);
    expect(none.status).toBe(401);
    expectErrorShape(none.body, 'AuthenticationError');
    // It says what to send, and nothing about the host (where the daemon keeps its key).
    expect(none.body.error).toContain('abx keys create');
    expect(none.body.error).not.toContain(abx.home);

    const wrong = await call(`${info.apiUrl}/v1/sandboxes`, {
      headers: { authorization: 'Bearer not-the-key' },
    });
    expect(wrong.status).toBe(401);
    const refused = await call(`${info.apiUrl}/v1/sandboxes`, {
      method: 'POST',
      headers: { authorization: 'Bearer not-the-key' },
      body: {},
    });
    expect(refused.status).toBe(401);
    expect(abx.provider.creates).toBe(0);

    expect(await api(info, abx.home).get('/v1/sandboxes')).toEqual({
      status: 200,
      body: { sandboxes: [] },
    });
    expect(await call(`${info.apiUrl}/v1/health`)).toMatchObject({
      status: 200,
      body: { status: 'ok', pid: process.pid },
    });
  });

  test('POST /v1/sandboxes creates through the provider; DELETE kills', async ({ abx }) => {
    const { info } = await abx.start({ warmPool: 0 });
    const v1 = api(info, abx.home);
    const created = await v1.post('/v1/sandboxes', {
      timeoutMs: 60_000,
      envs: { A: '1' },
      metadata: { owner: 'alice' },
    });
    expect(created.status).toBe(200);
    const id: string = created.body.sandboxId;
    expect(created.body).toMatchObject({
      template: 'base',
      state: 'running',
      metadata: { owner: 'alice' },
      envdPort: 49983,
      accessToken: expect.any(String),
    });
    expect(Date.parse(created.body.expiresAt) - Date.parse(created.body.createdAt)).toBe(60_000);
    expect(abx.provider.created).toEqual([id]);
    const box = abx.provider.sandbox(id);
    expect(box.spec.env).toEqual({ A: '1' });
    expect(box.spec.accessToken).toBe(created.body.accessToken);
    expect(box.spec.dir).toBe(join(abx.home, 'sandboxes', id));
    // The token is derived from the installation's secret, never stored.
    const secret = readFileSync(join(abx.home, 'token-secret'), 'utf8').trim();
    expect(created.body.accessToken).toBe(sandboxToken(secret, id));

    const listed = await v1.get('/v1/sandboxes');
    expect(listed.body.sandboxes.map((s: Json) => s.sandboxId)).toEqual([id]);
    expect(listed.body.sandboxes[0].accessToken).toBeUndefined();
    expect((await v1.get(`/v1/sandboxes/${id}`)).body.state).toBe('running');
    const connected = await v1.post(`/v1/sandboxes/${id}/connect`, undefined);
    expect(connected.body.accessToken).toBe(created.body.accessToken);

    const killed = await v1.delete(`/v1/sandboxes/${id}`);
    expect(killed).toMatchObject({
      status: 200,
      body: { killed: true, sandbox: { sandboxId: id, state: 'killed' } },
    });
    expect(abx.provider.isAlive(box.handle)).toBe(false);
    expect(existsSync(box.spec.dir)).toBe(false);
    expect((await v1.delete(`/v1/sandboxes/${id}`)).body.killed).toBe(false);
    const unknown = await v1.delete('/v1/sandboxes/inosuchsandbox00');
    expect(unknown.status).toBe(404);
    expectErrorShape(unknown.body, 'SandboxNotFoundError');
  });

  test('bad create requests are 400s of the contract’s shape and start nothing', async ({
    abx,
  }) => {
    const { info } = await abx.start();
    const v1 = api(info, abx.home);
    const timeout = await v1.post('/v1/sandboxes', { timeoutMs: 'soon' });
    expect(timeout.status).toBe(400);
    expectErrorShape(timeout.body, 'InvalidArgumentError');
    expect(timeout.body.error).toContain('timeoutMs must be a whole number');
    const envs = await v1.post('/v1/sandboxes', { envs: { A: 1 } });
    expect(envs.status).toBe(400);
    expect(envs.body).toEqual({
      error: 'envs.A must be a string, not number',
      type: 'InvalidArgumentError',
    });
    const array = await v1.post('/v1/sandboxes', [1, 2]);
    expect(array.status).toBe(400);
    expectErrorShape(array.body, 'InvalidArgumentError');
    const template = await v1.post('/v1/sandboxes', { template: 'nope' });
    expect(template.status).toBe(404);
    expectErrorShape(template.body, 'TemplateNotFoundError');
    expect(abx.provider.creates).toBe(0);
  });

  // Regression, fixed (src/control/api-routes.ts, POST /v1/sandboxes): a `template` that is not a string is
  // dropped silently (`typeof request.template === 'string' ? ... : {}`), so `{ "template": 42 }`
  // creates a `base` sandbox instead of answering 400; DESIGN.md: bad input gets a clear error
  // and changes nothing.
  test('a template that is not a string is refused', async ({ abx }) => {
    const { info } = await abx.start({ warmPool: 0 });
    const answer = await api(info, abx.home).post('/v1/sandboxes', { template: 42 });
    expect(answer.status).toBe(400);
    expect(abx.provider.creates).toBe(0);
  });

  test('the gateway routes to that sandbox’s envd with that sandbox’s token only', async ({
    abx,
  }) => {
    const { info } = await abx.start({ warmPool: 0 });
    const v1 = api(info, abx.home);
    const a = (await v1.post('/v1/sandboxes')).body;
    const b = (await v1.post('/v1/sandboxes')).body;
    const host = `49983-${a.sandboxId}.localhost`;

    expect(await gateway(info, '/health', { host, 'x-access-token': a.accessToken })).toEqual({
      status: 200,
      body: { status: 'ok' },
    });
    // The request reaches a's envd with a's token as envd wants it; the gateway's own headers and
    // the ?token= are not passed on.
    const reached = await gateway(info, `/debug/request?x=1&token=${a.accessToken}`, {
      host: `${host}:1234`,
    });
    expect(reached.status).toBe(200);
    expect(reached.body).toMatchObject({ sandbox: a.sandboxId, url: '/debug/request?x=1' });
    expect(reached.body.headers.authorization).toBe(`Bearer ${a.accessToken}`);
    const byHeaders = await gateway(info, '/debug/request', {
      'x-sandbox-id': b.sandboxId,
      'x-sandbox-port': '49983',
      'x-access-token': b.accessToken,
    });
    expect(byHeaders.body.sandbox).toBe(b.sandboxId);
    expect(byHeaders.body.headers['x-access-token']).toBeUndefined();
    expect(byHeaders.body.headers['x-sandbox-id']).toBeUndefined();

    const reachedA = abx.provider.sandbox(a.sandboxId).requests.length;
    const othersToken = await gateway(info, '/debug/request', {
      host,
      'x-access-token': b.accessToken,
    });
    expect(othersToken.status).toBe(401);
    expectErrorShape(othersToken.body, 'AuthenticationError');
    // The other sandbox's token by headers too, and the API key is no sandbox token.
    const crossed = await gateway(info, '/health', {
      'x-sandbox-id': a.sandboxId,
      'x-sandbox-port': '49983',
      'x-access-token': b.accessToken,
    });
    expect(crossed.status).toBe(401);
    const withKey = await gateway(info, '/health', { host, 'x-access-token': apiKey(abx.home) });
    expect(withKey.status).toBe(401);
    const none = await gateway(info, '/health', { host });
    expect(none.status).toBe(401);
    expectErrorShape(none.body, 'AuthenticationError');
    // None of those refused requests reached a's envd.
    expect(abx.provider.sandbox(a.sandboxId).requests).toHaveLength(reachedA);

    const unknown = await gateway(info, '/health', {
      host: '49983-inosuchsandbox00.localhost',
      'x-access-token': a.accessToken,
    });
    expect(unknown.status).toBe(404);
    expectErrorShape(unknown.body, 'SandboxNotFoundError');
    const port = await gateway(info, '/', {
      host: `8080-${a.sandboxId}.localhost`,
      'x-access-token': a.accessToken,
    });
    expect(port.status).toBe(403);
    expectErrorShape(port.body, 'CapabilityError');
    const nothing = await gateway(info, '/health', {});
    expect(nothing.status).toBe(400);
    expectErrorShape(nothing.body, 'BadRequestError');
  });

  test('capabilities hold at the gateway: no code, shell or files routes a template lacks', async ({
    abx,
  }) => {
    const { info } = await abx.start({ warmPool: 0 });
    const v1 = api(info, abx.home);
    const yaml = join(abx.home, 'bare.yaml');
    writeFileSync(yaml, 'name: bare\ncapabilities: [files]\n');
    expect((await v1.post('/v1/templates', { path: yaml })).status).toBe(200);
    const box = (await v1.post('/v1/sandboxes', { template: 'bare' })).body;
    const host = `49983-${box.sandboxId}.localhost`;
    const reachedBefore = abx.provider.sandbox(box.sandboxId).requests.length;
    for (const [path, capability] of [
      ['/execute', 'code'],
      ['/contexts', 'code'],
      ['/exec', 'shell'],
      ['/process/exec', 'shell'],
      ['/terminal', 'shell'],
      ['/dev-tools/run', 'shell'],
      // What envd's router reads as those routes is refused the same way.
      ['//exec', 'shell'],
      ['/%65xecute', 'code'],
    ] as const) {
      const refused = await gateway(info, path, { host, 'x-access-token': box.accessToken });
      expect(refused.status, path).toBe(403);
      expectErrorShape(refused.body, 'CapabilityError');
      expect(refused.body.error).toContain(
        `template 'bare' does not have the ${capability} capability`,
      );
    }
    // Nothing refused reached envd; what the template has still does.
    expect(abx.provider.sandbox(box.sandboxId).requests).toHaveLength(reachedBefore);
    const health = await gateway(info, '/health', { host, 'x-access-token': box.accessToken });
    expect(health.status).toBe(200);
  });

  test("envd enforces the template's capabilities too; the control plane has a token of its own", async ({
    abx,
  }) => {
    const { info } = await abx.start({ warmPool: 0 });
    const v1 = api(info, abx.home);
    const yaml = join(abx.home, 'code-only.yaml');
    writeFileSync(yaml, 'name: code-only\ncapabilities: [code]\n');
    expect((await v1.post('/v1/templates', { path: yaml })).status).toBe(200);
    const box = (await v1.post('/v1/sandboxes', { template: 'code-only' })).body;
    const sandbox = abx.provider.sandbox(box.sandboxId);
    // envd is told what to enforce for the users' token, and gets a second token for the daemon.
    expect(sandbox.spec).toMatchObject({
      accessToken: box.accessToken,
      capabilities: ['code'],
      template: 'code-only',
    });
    expect(sandbox.spec.controlToken).toMatch(/^[\w-]{40,}$/);
    expect(sandbox.spec.controlToken).not.toBe(box.accessToken);
    // A snapshot exports the home through envd's file routes, which the template lacks: the
    // daemon presents its own token, so the snapshot has the sandbox's files.
    writeFileSync(join(sandbox.home, 'notes.txt'), 'kept\n');
    const snapshot = await v1.post(`/v1/sandboxes/${box.sandboxId}/snapshot`, { name: 'snap' });
    expect(snapshot.status).toBe(200);
    expect(readFileSync(join(abx.home, 'templates', 'snap', 'home', 'notes.txt'), 'utf8')).toBe(
      'kept\n',
    );
    // The users' token still cannot reach the file routes, at the gateway or past it.
    const files = await gateway(info, '/files/read?path=notes.txt', {
      host: `49983-${box.sandboxId}.localhost`,
      'x-access-token': box.accessToken,
    });
    expect(files.status).toBe(403);
  });

  test('with the ports capability the gateway reaches {port}.sock, asking envd when needed', async ({
    abx,
  }) => {
    const { info } = await abx.start({ warmPool: 0 });
    const v1 = api(info, abx.home);
    const yaml = join(abx.home, 'web.yaml');
    writeFileSync(yaml, 'name: web\ncapabilities: [shell, files, code, ports]\n');
    expect((await v1.post('/v1/templates', { path: yaml })).status).toBe(200);
    const box = (await v1.post('/v1/sandboxes', { template: 'web' })).body;
    expect(box.capabilities).toContain('ports');

    // A program that serves its own socket: reached without a round trip to envd.
    await abx.provider.servePort(box.sandboxId, 8080);
    const own = await gateway(info, '/api?q=1', {
      host: `8080-${box.sandboxId}.localhost`,
      'x-access-token': box.accessToken,
    });
    expect(own).toMatchObject({
      status: 200,
      body: { sandbox: box.sandboxId, port: 8080, via: 'own socket', url: '/api?q=1' },
    });
    expect(own.body.headers['x-access-token']).toBeUndefined();
    // A port nobody serves yet: envd is asked to forward it.
    const forwarded = await gateway(info, '/', {
      host: `3000-${box.sandboxId}.localhost`,
      'x-access-token': box.accessToken,
    });
    expect(forwarded).toMatchObject({
      status: 200,
      body: { sandbox: box.sandboxId, port: 3000, via: 'envd forwarder' },
    });
    expect(abx.provider.sandbox(box.sandboxId).portOpens).toEqual([3000]);
    // Another sandbox's token does not open ports either.
    const other = (await v1.post('/v1/sandboxes', { template: 'web' })).body;
    const refused = await gateway(info, '/', {
      host: `3000-${box.sandboxId}.localhost`,
      'x-access-token': other.accessToken,
    });
    expect(refused.status).toBe(401);
  });

  test('a dead sandbox is marked by the reaper and its route answers an error', async ({ abx }) => {
    const { info } = await abx.start({ warmPool: 0 });
    const v1 = api(info, abx.home);
    const box = (await v1.post('/v1/sandboxes')).body;
    const host = `49983-${box.sandboxId}.localhost`;
    expect(
      (await gateway(info, '/health', { host, 'x-access-token': box.accessToken })).status,
    ).toBe(200);

    await abx.provider.die(box.sandboxId, 'oom');
    // At once (the gateway may still believe it alive for a moment): an error, of the contract's
    // shape, never a hang or a bare socket error.
    const early = await gateway(info, '/health', { host, 'x-access-token': box.accessToken });
    expect([404, 502]).toContain(early.status);
    expectErrorShape(early.body);

    await until(
      () => abx.provider.killed.includes(box.sandboxId),
      'the reaper to clean up the dead sandbox',
    );
    const record = (await v1.get(`/v1/sandboxes/${box.sandboxId}`)).body;
    expect(record).toMatchObject({ state: 'dead', endReason: 'oom' });
    await until(
      () => !existsSync(join(abx.home, 'sandboxes', box.sandboxId)),
      'the dead sandbox’s folder to go',
    );
    const late = await gateway(info, '/health', { host, 'x-access-token': box.accessToken });
    expect(late).toEqual({
      status: 404,
      body: {
        error: `sandbox ${box.sandboxId} is not running (dead: oom)`,
        type: 'SandboxNotFoundError',
      },
    });
    const connect = await v1.post(`/v1/sandboxes/${box.sandboxId}/connect`, undefined);
    expect(connect.status).toBe(404);
    expectErrorShape(connect.body, 'SandboxNotFoundError');
  });

  test('the reaper expires sandboxes past their timeout', async ({ abx }) => {
    const { info } = await abx.start({ warmPool: 0 });
    const v1 = api(info, abx.home);
    const short = (await v1.post('/v1/sandboxes', { timeoutMs: 100 })).body;
    const long = (await v1.post('/v1/sandboxes', { timeoutMs: 600_000 })).body;
    await until(
      () => !abx.provider.isAlive(abx.provider.sandbox(short.sandboxId).handle),
      'the reaper to kill the expired sandbox',
    );
    expect((await v1.get(`/v1/sandboxes/${short.sandboxId}`)).body).toMatchObject({
      state: 'expired',
      endReason: expect.stringMatching(/^expired at /),
    });
    expect((await v1.get(`/v1/sandboxes/${long.sandboxId}`)).body.state).toBe('running');
    const route = await gateway(info, '/health', {
      host: `49983-${short.sandboxId}.localhost`,
      'x-access-token': short.accessToken,
    });
    expect(route.status).toBe(404);
    expect(route.body.error).toMatch(/is not running \(expired: expired at /);
  });

  test('a template with setup is built in a sandbox; its sandboxes start from its home', async ({
    abx,
  }) => {
    const { info } = await abx.start({ warmPool: 1 });
    const v1 = api(info, abx.home);
    const yaml = join(abx.home, 'built.yaml');
    writeFileSync(
      yaml,
      'name: built\nenv: { STAGE: one }\nsetup:\n  - echo first build > marker.txt\n',
    );
    const built = await v1.post('/v1/templates', { path: yaml });
    expect(built).toMatchObject({ status: 200, body: { name: 'built', setup: expect.any(Array) } });
    // The build ran its step in a sandbox of its own, which is gone.
    const builder = abx.provider.sandbox('build-built');
    expect(builder.execs).toEqual(['echo first build > marker.txt']);
    expect(builder.alive).toBe(false);
    expect(builder.spec.network).toBe('host');

    const box = (await v1.post('/v1/sandboxes', { template: 'built' })).body;
    const started = abx.provider.sandbox(box.sandboxId);
    expect(started.spec.baseHome).toBe(join(abx.home, 'templates', 'built', 'home'));
    expect(started.spec.env).toEqual({ STAGE: 'one' });
    expect(readFileSync(join(started.home, 'marker.txt'), 'utf8')).toBe('first build\n');

    // A rebuild drains the pool: the spare started from the old home is not handed out.
    let spare: { sandboxId: string }[] = [];
    await until(async () => {
      spare = (await v1.get('/v1/sandboxes?state=pooled')).body.sandboxes;
      return spare.length === 1;
    }, 'the refill');
    writeFileSync(yaml, 'name: built\nsetup:\n  - echo second build > marker.txt\n');
    expect((await v1.post('/v1/templates', { path: yaml })).status).toBe(200);
    expect(abx.provider.killed).toContain(spare[0].sandboxId);
    const next = (await v1.post('/v1/sandboxes', { template: 'built' })).body;
    expect(next.sandboxId).not.toBe(spare[0].sandboxId);
    expect(
      readFileSync(join(abx.provider.sandbox(next.sandboxId).home, 'marker.txt'), 'utf8'),
    ).toBe('second build\n');
  });

  test('a failing setup step fails the build and leaves nothing behind', async ({ abx }) => {
    const { info } = await abx.start({ warmPool: 0 });
    const v1 = api(info, abx.home);
    const yaml = join(abx.home, 'broken.yaml');
    writeFileSync(yaml, 'name: broken\nsetup:\n  - echo ok\n  - "false"\n  - echo never\n');
    const answer = await v1.post('/v1/templates', { path: yaml });
    expect(answer.status).toBe(422);
    expect(answer.body).toEqual({
      error:
        "template 'broken': setup[1] `false` exited with code 1; its output ends:\nfalse: failed\n",
      type: 'TemplateBuildError',
      step: 1,
      command: 'false',
      exitCode: 1,
      output: 'false: failed\n',
    });
    expect(abx.provider.sandbox('build-broken').execs).toEqual(['echo ok', 'false']);
    expect(abx.provider.aliveIds()).toEqual([]);
    expect((await v1.get('/v1/templates/broken')).status).toBe(404);
    expect(existsSync(join(abx.home, 'templates', 'broken'))).toBe(false);
  });

  test('stop() leaves running sandboxes to the next daemon and closes its servers', async ({
    abx,
  }) => {
    const first = await abx.start({ warmPool: 1 });
    const v1 = api(first.info, abx.home);
    const box = (await v1.post('/v1/sandboxes', { metadata: { keep: 'yes' } })).body;
    await until(
      () => abx.provider.pendingCreates === 0 && abx.provider.aliveIds().length === 2,
      'the warm pool',
    );
    const spare = abx.provider.aliveIds().find((id) => id !== box.sandboxId) as string;

    await first.daemon.stop();
    // The spare is killed (a stopping daemon leaves none behind); the running one is not.
    expect(abx.provider.killed).toEqual([spare]);
    expect(abx.provider.aliveIds()).toEqual([box.sandboxId]);
    expect(abx.provider.closes).toBe(1);
    expect(existsSync(join(abx.home, 'daemon.json'))).toBe(false);
    await expect(call(`${first.info.apiUrl}/v1/health`)).rejects.toThrow();
    await expect(
      gateway(first.info, '/health', {
        host: `49983-${box.sandboxId}.localhost`,
        'x-access-token': box.accessToken,
      }),
    ).rejects.toThrow();
    await first.daemon.stopped;

    // The next daemon adopts it: listed, reachable with the same token.
    const second = await abx.start({ warmPool: 0 });
    const listed = (await api(second.info, abx.home).get('/v1/sandboxes')).body.sandboxes;
    expect(listed.map((s: Json) => [s.sandboxId, s.state])).toEqual([[box.sandboxId, 'running']]);
    const reached = await gateway(second.info, '/debug/request', {
      host: `49983-${box.sandboxId}.localhost`,
      'x-access-token': box.accessToken,
    });
    expect(reached.body.sandbox).toBe(box.sandboxId);
    expect(abx.provider.killed).toEqual([spare]);
  });

  test('POST /v1/shutdown stops the daemon', async ({ abx }) => {
    const { daemon, info } = await abx.start({ warmPool: 0 });
    expect(await api(info, abx.home).post('/v1/shutdown', undefined)).toEqual({
      status: 200,
      body: { stopping: true },
    });
    await daemon.stopped;
    await expect(call(`${info.apiUrl}/v1/health`)).rejects.toThrow();
  });
});
