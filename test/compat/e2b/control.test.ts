import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import {
  AuthenticationError,
  RateLimitError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
} from 'e2b';
import fc from 'fast-check';
import { afterAll, test as base, beforeAll, describe, expect, vi } from 'vitest';
import { startDaemon } from '../../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../../src/installation/daemon-info.js';
import { ApiKeys } from '../../../src/sandbox/api-keys.js';
import { Sandbox as AbxSandbox } from '../../../src/sandbox/sandbox.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { call, type Json } from '../../helpers/api-call.js';
import { ROOT } from '../../helpers/build.js';

// The real, unmodified `e2b` package against a real daemon and real (bubblewrap) sandboxes. The
// SDK is configured only as documented: E2B_API_URL (set for the whole file, so no call can go
// anywhere but the daemon) and the apiKey option or E2B_API_KEY.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
/** The daemon's own key (admin). */
let adminKey: string;

beforeAll(async () => {
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  adminKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  process.env.E2B_API_URL = info.apiUrl;
}, 120_000);

afterAll(async () => {
  delete process.env.E2B_API_URL;
  await abx?.close();
}, 120_000);

/** The SDK's connection options for a key. */
const as = (apiKey: string) => ({ apiKey, requestTimeoutMs: 60_000 });

/** `abx keys create --format e2b` through the CLI: the key it prints. */
async function cliKey(name: string, ...more: string[]): Promise<string> {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    [join(ROOT, 'dist', 'cli.js'), 'keys', 'create', '--name', name, '--format', 'e2b', ...more],
    { env: { ...process.env, ABX_HOME: abx.home }, timeout: 60_000 },
  );
  return stdout.trim();
}

/** Raw HTTP to the daemon with `X-API-KEY`. */
function raw(method: string, path: string, body?: unknown, key: string | null = adminKey) {
  return call(`${info.apiUrl}${path}`, {
    method,
    headers: key === null ? {} : { 'x-api-key': key },
    ...(body === undefined ? {} : { body }),
  });
}

/** Sandboxes made through the E2B SDK, each killed (through the native API) when the test ends. */
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

async function allPages(metadata: Record<string, string>, key: string, limit: number) {
  const paginator = Sandbox.list({ ...as(key), query: { metadata }, limit });
  const pages: string[][] = [];
  while (paginator.hasNext) {
    pages.push((await paginator.nextItems()).map((sandbox) => sandbox.sandboxId));
    if (pages.length > 20) throw new Error('paging never ends');
  }
  return pages;
}

describe('the E2B SDK drives the control API', () => {
  test('create, info, list with a metadata filter and pages of one, setTimeout, connect, kill', async ({
    made,
  }) => {
    const run = `run-${Date.now()}`;
    const key = adminKey;
    const created: Sandbox[] = [];
    for (const n of ['1', '2', '3']) {
      created.push(
        made(
          await Sandbox.create({
            ...as(key),
            metadata: { suite: run, n, odd: 'a b&c=d/é' },
            timeoutMs: 120_000,
          }),
        ),
      );
    }
    const other = made(await Sandbox.create('base', { ...as(key), metadata: { suite: 'other' } }));
    const first = created[0] as Sandbox;

    const before = Date.now();
    const details = await first.getInfo();
    expect(details).toMatchObject({
      sandboxId: first.sandboxId,
      templateId: 'base',
      metadata: { suite: run, n: '1', odd: 'a b&c=d/é' },
      state: 'running',
      envdVersion: '0.6.4',
    });
    expect(details.cpuCount).toBeGreaterThan(0);
    expect(details.memoryMB).toBeGreaterThan(0);
    const left = details.endAt.getTime() - before;
    expect(left).toBeGreaterThan(60_000);
    expect(left).toBeLessThanOrEqual(120_000);

    // Three pages of one, newest first, then no next page; the fourth sandbox is filtered out.
    const pages = await allPages({ suite: run }, key, 1);
    expect(pages).toEqual(created.map((sandbox) => [sandbox.sandboxId]).reverse());
    expect(pages.flat()).not.toContain(other.sandboxId);
    // Every key of the filter must match, special characters included.
    expect(await allPages({ suite: run, n: '2', odd: 'a b&c=d/é' }, key, 100)).toEqual([
      [created[1]?.sandboxId],
    ]);

    // startedAfter (at or after) and template filter too.
    const ids = async (query: { startedAfter?: Date; template?: string }) =>
      (
        await Sandbox.list({
          ...as(key),
          query: { metadata: { suite: run }, ...query },
        }).nextItems()
      )
        .map((s) => s.sandboxId)
        .sort();
    const third = await (created[2] as Sandbox).getInfo();
    expect(await ids({ startedAfter: third.startedAt })).toEqual([third.sandboxId]);
    expect(await ids({ startedAfter: new Date(third.startedAt.getTime() + 1000) })).toEqual([]);
    expect(await ids({ template: 'base' })).toHaveLength(3);
    expect(await ids({ template: 'no-such-template' })).toEqual([]);
    await expect(raw('GET', '/v2/sandboxes?startedAfter=yesterday')).resolves.toMatchObject({
      status: 400,
      body: { code: 400, message: expect.stringMatching(/^startedAfter must be a time/) },
    });

    await first.setTimeout(600_000);
    expect((await first.getInfo()).endAt.getTime() - Date.now()).toBeGreaterThan(500_000);

    const again = await Sandbox.connect(first.sandboxId, as(key));
    expect(again.sandboxId).toBe(first.sandboxId);

    expect(await first.kill()).toBe(true);
    expect((await allPages({ suite: run }, key, 100)).flat()).toEqual([
      created[2]?.sandboxId,
      created[1]?.sandboxId,
    ]);
    // Killed: unknown to every call, as at E2B.
    expect(await Sandbox.kill(first.sandboxId, as(key))).toBe(false);
    await expect(Sandbox.getInfo(first.sandboxId, as(key))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    await expect(Sandbox.connect(first.sandboxId, as(key))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    expect(await Sandbox.kill(other.sandboxId, as(key))).toBe(true);
  }, 180_000);

  test('the create answer: 201 with the fields the SDK reads; envdAccessToken is the native access token', async ({
    made,
  }) => {
    const answer = await raw('POST', '/v2/sandboxes', { templateID: 'base', timeout: 60 });
    expect(answer.status).toBe(201);
    made({ sandboxId: answer.body.sandboxID } as Sandbox);
    expect(answer.body).toEqual({
      sandboxID: expect.stringMatching(/^i[a-z0-9]{15}$/),
      templateID: 'base',
      clientID: 'abx',
      envdVersion: '0.6.4',
      envdAccessToken: expect.any(String),
      trafficAccessToken: expect.any(String),
      // The domain, with the gateway's port: the SDK builds https://{port}-{id}.{domain} from it.
      domain: `${info.domain}:${new URL(info.gatewayUrl).port}`,
    });
    // The traffic token (what `@e2b/code-interpreter` sends on its context routes) is the same.
    expect(answer.body.trafficAccessToken).toBe(answer.body.envdAccessToken);
    const native = await call(`${info.apiUrl}/v1/sandboxes/${answer.body.sandboxID}/connect`, {
      method: 'POST',
      headers: { authorization: `Bearer ${adminKey}` },
    });
    expect(native.body.accessToken).toBe(answer.body.envdAccessToken);
    // The older path creates too, and connect answers 200 with the same token.
    const older = await raw('POST', '/sandboxes', { templateID: 'base' });
    expect(older.status).toBe(201);
    made({ sandboxId: older.body.sandboxID } as Sandbox);
    const connected = await raw('POST', `/sandboxes/${answer.body.sandboxID}/connect`, {});
    expect(connected.status).toBe(200);
    expect(connected.body.envdAccessToken).toBe(answer.body.envdAccessToken);
    const metrics = await raw('GET', `/sandboxes/${older.body.sandboxID}/metrics`);
    expect(metrics.status).toBe(200);
    expect(Array.isArray(metrics.body)).toBe(true);
  }, 120_000);
});

describe('more of the control API', () => {
  test('configured only by E2B_API_URL and E2B_API_KEY, the SDK lists and connects', async ({
    made,
  }) => {
    const sandbox = made(await Sandbox.create(as(adminKey)));
    vi.stubEnv('E2B_API_KEY', adminKey);
    try {
      const listed = (await Sandbox.list().nextItems()).map((item) => item.sandboxId);
      expect(listed).toContain(sandbox.sandboxId);
      expect((await Sandbox.connect(sandbox.sandboxId)).sandboxId).toBe(sandbox.sandboxId);
    } finally {
      vi.unstubAllEnvs();
    }
  }, 60_000);

  test('allowInternetAccess that matches the template is accepted, and getInfo shows it', async ({
    made,
  }) => {
    const sandbox = made(await Sandbox.create({ ...as(adminKey), allowInternetAccess: false }));
    expect((await sandbox.getInfo()).allowInternetAccess).toBe(false);
  }, 60_000);

  test('connect with a timeout lengthens a sandbox’s life and never shortens it', async ({
    made,
  }) => {
    const sandbox = made(await Sandbox.create({ ...as(adminKey), timeoutMs: 60_000 }));
    await Sandbox.connect(sandbox.sandboxId, { ...as(adminKey), timeoutMs: 900_000 });
    const lengthened = (await sandbox.getInfo()).endAt.getTime();
    expect(lengthened - Date.now()).toBeGreaterThan(800_000);
    await Sandbox.connect(sandbox.sandboxId, { ...as(adminKey), timeoutMs: 10_000 });
    expect((await sandbox.getInfo()).endAt.getTime()).toBe(lengthened);
  }, 60_000);

  test('createSnapshot saves the sandbox as a template that Sandbox.create starts from; listed, paged, deleted', async ({
    made,
  }) => {
    const source = made(await Sandbox.create(as(adminKey)));
    // Written through the native SDK: the envd face is another part of the work.
    const native = await AbxSandbox.connect(source.sandboxId, { home: abx.home });
    await native.files.write('notes/kept.txt', 'from before the snapshot');
    const name = `e2b-snap-${Date.now()}`;
    const snapshot = await Sandbox.createSnapshot(source.sandboxId, { ...as(adminKey), name });
    expect(snapshot).toEqual({ snapshotId: name, names: [name] });
    const copy = made(await Sandbox.create(snapshot.snapshotId, as(adminKey)));
    expect((await copy.getInfo()).templateId).toBe(name);
    const copied = await AbxSandbox.connect(copy.sandboxId, { home: abx.home });
    expect(await copied.files.read('notes/kept.txt')).toBe('from before the snapshot');
    // Listed: all, by the sandbox it came from (the instance method), by name.
    const second = await source.createSnapshot({ ...as(adminKey), name: `${name}-b` });
    const listed = async (paginator: { nextItems(): Promise<{ snapshotId: string }[]> }) =>
      (await paginator.nextItems()).map((s) => s.snapshotId).sort();
    expect(await listed(Sandbox.listSnapshots(as(adminKey)))).toEqual([name, `${name}-b`]);
    expect(await listed(source.listSnapshots())).toEqual([name, `${name}-b`]);
    expect(await listed(copy.listSnapshots())).toEqual([]);
    expect(await listed(Sandbox.listSnapshots({ ...as(adminKey), name }))).toEqual([name]);
    // Pages of one, newest first.
    const pager = Sandbox.listSnapshots({ ...as(adminKey), limit: 1 });
    expect(await listed(pager)).toEqual([`${name}-b`]);
    expect(pager.hasNext).toBe(true);
    expect(await listed(pager)).toEqual([name]);
    expect(pager.hasNext).toBe(false);
    expect(await Sandbox.deleteSnapshot(second.snapshotId, as(adminKey))).toBe(true);

    expect(await Sandbox.deleteSnapshot(name, as(adminKey))).toBe(true);
    expect(await Sandbox.deleteSnapshot(name, as(adminKey))).toBe(false);
    await expect(Sandbox.create(name, as(adminKey))).rejects.toThrow(/404: /);
    expect(await listed(Sandbox.listSnapshots(as(adminKey)))).toEqual([]);
  }, 180_000);

  test('a snapshot belongs to the key that took it: any key snapshots its own sandbox; other keys get 404 as for an unknown name', async ({
    made,
  }) => {
    const listed = async (paginator: { nextItems(): Promise<{ snapshotId: string }[]> }) =>
      (await paginator.nextItems()).map((s) => s.snapshotId).sort();
    const alice = await cliKey(`snap-alice-${Date.now()}`);
    const bob = await cliKey(`snap-bob-${Date.now()}`);
    const hers = made(await Sandbox.create(as(alice)));
    // Files through the native SDK (E2B's files need a resolvable domain; envd is tested apart).
    const files = async (id: string) => (await AbxSandbox.connect(id, { home: abx.home })).files;
    await (await files(hers.sandboxId)).write('secret.txt', 'alice only');
    // An ordinary key snapshots its own sandbox, with E2B's generated name.
    const snapshot = await hers.createSnapshot();
    expect(snapshot.snapshotId).toMatch(new RegExp(`^snapshot-${hers.sandboxId}-`));
    expect(await listed(Sandbox.listSnapshots(as(alice)))).toEqual([snapshot.snapshotId]);
    const copy = made(await Sandbox.create(snapshot.snapshotId, as(alice)));
    expect(await (await files(copy.sandboxId)).read('secret.txt')).toBe('alice only');

    // Bob: not listed, not started, not removed, not snapshotted over; as a name that is not there.
    expect(await listed(Sandbox.listSnapshots(as(bob)))).toEqual([]);
    expect(await listed(Sandbox.listSnapshots({ ...as(bob), sandboxId: hers.sandboxId }))).toEqual(
      [],
    );
    const unknown = await Sandbox.create('snapshot-nosuch', as(bob)).catch((e: Error) => e);
    const refused = await Sandbox.create(snapshot.snapshotId, as(bob)).catch((e: Error) => e);
    expect(refused).toBeInstanceOf(Error);
    expect((refused as Error).message).toBe(
      (unknown as Error).message.replaceAll('snapshot-nosuch', snapshot.snapshotId),
    );
    expect((refused as Error).message).toMatch(/404: /);
    expect(await Sandbox.deleteSnapshot(snapshot.snapshotId, as(bob))).toBe(false);
    // Her sandbox is not his to snapshot: as a sandbox that does not exist.
    await expect(Sandbox.createSnapshot(hers.sandboxId, as(bob))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    const his = made(await Sandbox.create(as(bob)));
    await expect(his.createSnapshot({ name: snapshot.snapshotId })).rejects.toThrow(
      /409: the template name '.+' is taken by a template this key cannot see/,
    );
    expect(await listed(Sandbox.listSnapshots(as(alice)))).toEqual([snapshot.snapshotId]);

    // An admin's snapshot of her sandbox is the admin's: alice does not see it.
    const audit = await Sandbox.createSnapshot(hers.sandboxId, as(adminKey));
    expect(await listed(Sandbox.listSnapshots(as(adminKey)))).toEqual(
      [snapshot.snapshotId, audit.snapshotId].sort(),
    );
    expect(await listed(Sandbox.listSnapshots(as(alice)))).toEqual([snapshot.snapshotId]);
    await expect(Sandbox.create(audit.snapshotId, as(alice))).rejects.toThrow(/404: /);
    expect(await Sandbox.deleteSnapshot(audit.snapshotId, as(alice))).toBe(false);

    // Published by an admin (abx template publish), every key starts it; alice removes her own.
    const shared = await call(`${info.apiUrl}/v1/templates/${snapshot.snapshotId}/publish`, {
      method: 'POST',
      headers: { authorization: `Bearer ${adminKey}` },
      body: {},
    });
    expect(shared.body.shared).toBe(true);
    expect(await listed(Sandbox.listSnapshots(as(bob)))).toEqual([snapshot.snapshotId]);
    const bobs = made(await Sandbox.create(snapshot.snapshotId, as(bob)));
    expect(await (await files(bobs.sandboxId)).read('secret.txt')).toBe('alice only');
    // Shared, it is the catalogue's: only an admin removes it.
    await expect(Sandbox.deleteSnapshot(snapshot.snapshotId, as(alice))).rejects.toThrow(/403: /);
    expect(await Sandbox.deleteSnapshot(snapshot.snapshotId, as(adminKey))).toBe(true);
    expect(await Sandbox.deleteSnapshot(audit.snapshotId, as(adminKey))).toBe(true);
  }, 180_000);
});

describe('API keys', () => {
  test('abx keys create --format e2b prints e2b_ and hex, which works as X-API-KEY; a key sees and kills only its own sandboxes', async ({
    made,
  }) => {
    const alice = await cliKey(`alice-${Date.now()}`);
    const bob = await cliKey(`bob-${Date.now()}`);
    // The key check of E2B's Python SDK.
    expect(alice).toMatch(/^e2b_[0-9a-f]+$/);
    const mine = made(await Sandbox.create({ ...as(alice), metadata: { owner: 'alice' } }));

    await expect(Sandbox.getInfo(mine.sandboxId, as(bob))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    await expect(Sandbox.connect(mine.sandboxId, as(bob))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    await expect(Sandbox.setTimeout(mine.sandboxId, 5_000, as(bob))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    expect(await Sandbox.kill(mine.sandboxId, as(bob))).toBe(false);
    expect((await allPages({ owner: 'alice' }, bob, 100)).flat()).toEqual([]);
    // Untouched: alice still has it, and the admin key sees it too.
    expect((await Sandbox.getInfo(mine.sandboxId, as(alice))).state).toBe('running');
    expect((await allPages({ owner: 'alice' }, alice, 100)).flat()).toEqual([mine.sandboxId]);
    expect((await allPages({ owner: 'alice' }, adminKey, 100)).flat()).toEqual([mine.sandboxId]);
    expect(await Sandbox.kill(mine.sandboxId, as(alice))).toBe(true);
  }, 120_000);

  test('a wrong key and a revoked key are AuthenticationError; nothing is created', async () => {
    await expect(Sandbox.create(as(`e2b_${'0'.repeat(64)}`))).rejects.toBeInstanceOf(
      AuthenticationError,
    );
    const made = await ApiKeys.create(`revoked-${Date.now()}`, { home: abx.home, format: 'e2b' });
    await ApiKeys.revoke(made.id, { home: abx.home });
    const refused = Sandbox.list(as(made.key)).nextItems();
    await expect(refused).rejects.toBeInstanceOf(AuthenticationError);
    await expect(refused).rejects.toThrow(/revoked/);
    const badFormat = await call(`${info.apiUrl}/v1/keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${adminKey}` },
      body: { name: 'bad-format', format: 'hex' },
    });
    expect(badFormat.status).toBe(400);
    expect(badFormat.body.error).toMatch(/format must be abx .* or e2b/);
    const none = await raw('GET', '/v2/sandboxes', undefined, null);
    expect(none).toEqual({
      status: 401,
      body: { code: 401, message: expect.stringMatching(/X-API-KEY/) },
    });
  }, 60_000);

  test('a key at its --max-running limit gets RateLimitError, with Retry-After at its first expiry', async ({
    made,
  }) => {
    const key = await cliKey(`limited-${Date.now()}`, '--max-running', '1');
    made(await Sandbox.create({ ...as(key), timeoutMs: 300_000 }));
    // Retry-After (about 300 s) is past the SDK's request deadline: it raises at once.
    await expect(Sandbox.create(as(key))).rejects.toBeInstanceOf(RateLimitError);
    const refused = await call(`${info.apiUrl}/v2/sandboxes`, {
      method: 'POST',
      headers: { 'x-api-key': key },
      body: {},
    });
    expect(refused.status).toBe(429);
    expect(refused.body).toEqual({ code: 429, message: expect.stringMatching(/--max-running/) });
    const { headers } = await fetch(`${info.apiUrl}/v2/sandboxes`, {
      method: 'POST',
      headers: { 'x-api-key': key, 'content-type': 'application/json' },
      body: '{}',
    });
    const retryAfter = Number(headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThan(200);
    expect(retryAfter).toBeLessThanOrEqual(300);
  }, 120_000);
});

describe('bad input', () => {
  test('an unknown template and an unknown sandbox are the SDK’s errors', async () => {
    const unknown = Sandbox.create('no-such-template', as(adminKey));
    await expect(unknown).rejects.toBeInstanceOf(SandboxError);
    await expect(unknown).rejects.toThrow(/404: .*no-such-template/);
    await expect(Sandbox.getInfo('inosuchsandbox00', as(adminKey))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
    expect(await Sandbox.kill('inosuchsandbox00', as(adminKey))).toBe(false);
    await expect(Sandbox.connect('inosuchsandbox00', as(adminKey))).rejects.toBeInstanceOf(
      SandboxNotFoundError,
    );
  }, 60_000);

  test('arbitrary bytes as a body, with any path under /sandboxes: a 4xx { code, message }, and the daemon goes on', async () => {
    const before = ((await raw('GET', '/v2/sandboxes')).body as Json[]).length;
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(
          '/v2/sandboxes',
          '/sandboxes',
          '/sandboxes/x/timeout',
          '/sandboxes/x/connect',
        ),
        // Not a JSON object (one of those is a valid create).
        fc.uint8Array({ minLength: 1, maxLength: 300 }).filter((bytes) => {
          try {
            const value = JSON.parse(Buffer.from(bytes).toString('utf8'));
            return typeof value !== 'object' || value === null || Array.isArray(value);
          } catch {
            return true;
          }
        }),
        async (path, bytes) => {
          const answer = await fetch(`${info.apiUrl}${path}`, {
            method: 'POST',
            headers: { 'x-api-key': adminKey, 'content-type': 'application/json' },
            body: bytes,
          });
          const body = await answer.json();
          expect(answer.status).toBeGreaterThanOrEqual(400);
          expect(answer.status).toBeLessThan(500);
          expect(body).toEqual({ code: answer.status, message: expect.any(String) });
        },
      ),
      { numRuns: 150 },
    );
    expect((await call(`${info.apiUrl}/v1/health`)).status).toBe(200);
    expect(((await raw('GET', '/v2/sandboxes')).body as Json[]).length).toBe(before);
  }, 120_000);

  test('malformed JSON and wrong field types: 400 { code, message } naming the field; nothing created', async () => {
    const count = async () => ((await raw('GET', '/v2/sandboxes')).body as Json[]).length;
    const before = await count();
    const malformed = await fetch(`${info.apiUrl}/v2/sandboxes`, {
      method: 'POST',
      headers: { 'x-api-key': adminKey, 'content-type': 'application/json' },
      body: '{"templateID": "base",',
    });
    expect(malformed.status).toBe(400);
    expect(await malformed.json()).toEqual({
      code: 400,
      message: expect.stringMatching(/not valid JSON/),
    });
    const cases: [unknown, RegExp][] = [
      [[1, 2], /must be a JSON object/],
      [{ templateID: 5 }, /templateID must be a non-empty string/],
      [{ timeout: '60' }, /timeout must be a whole number of seconds/],
      [{ timeout: 86_401 }, /timeout must be a whole number of seconds/],
      [{ metadata: { a: 1 } }, /metadata\.a must be a string/],
      [{ envVars: ['A=1'] }, /envVars must be an object/],
      [{ autoPause: 'yes' }, /autoPause must be true or false/],
      [{ autoPauseMemory: false }, /autoPauseMemory needs autoPause: true/],
      [{ autoResume: { enabled: true } }, /autoResume needs autoPause: true/],
      [{ autoResume: 'on' }, /autoResume must be \{ enabled: true \| false \}/],
      [{ allow_internet_access: 'yes' }, /allow_internet_access must be/],
      [{ network: { allowOut: ['not a name'] } }, /network\.allowOut\[0\]: 'not a name'/],
      [{ network: ['1.2.3.4'] }, /network must be an object/],
      [{ network: { rules: { '10.0.0.1': [] } } }, /network\.rules: '10\.0\.0\.1' is not a domain/],
      [
        {
          network: {
            rules: { 'a.test': [{ transform: { headers: { A: '${e2b.identity.x}' } } }] },
          },
        },
        /is not a placeholder abx resolves/,
      ],
      // egressProxy is taken (test/egress/egress-proxy.test.ts); a malformed one names its field.
      [
        { network: { egressProxy: { address: 'p' } } },
        /network\.egressProxy\.address: 'p' is not host:port/,
      ],
      [
        { network: { egressProxy: { address: 'p:1080', password: 'x' } } },
        /network\.egressProxy\.password needs a username/,
      ],
      [{ network: { maskRequestHost: 'x' } }, /maskRequestHost is not supported/],
      [{ network: { httpsPorts: [8443] } }, /httpsPorts is not supported/],
      [{ network: { allowPublicTraffic: true } }, /allowPublicTraffic true is not supported/],
    ];
    for (const [body, message] of cases) {
      const answer = await raw('POST', '/v2/sandboxes', body);
      expect(answer, JSON.stringify(body)).toEqual({
        status: 400,
        body: { code: 400, message: expect.stringMatching(message) },
      });
    }
    for (const query of ['limit=0', 'limit=abc', 'state=dead', 'nextToken=zzz', 'order=up']) {
      const answer = await raw('GET', `/v2/sandboxes?${query}`);
      expect(answer.status, query).toBe(400);
      expect(answer.body.code).toBe(400);
    }
    const noTimeout = await raw('POST', '/sandboxes/inosuchsandbox00/timeout', { timeout: 'x' });
    expect(noTimeout).toEqual({
      status: 404,
      body: { code: 404, message: expect.stringMatching(/inosuchsandbox00 not found/) },
    });
    const unknownRoute = await raw('POST', '/sandboxes/x/refreshes', {});
    expect(unknownRoute).toEqual({
      status: 404,
      body: {
        code: 404,
        message: expect.stringMatching(
          /abx does not serve POST \/sandboxes\/x\/refreshes of E2B's API/,
        ),
      },
    });
    expect(await count()).toBe(before);
  }, 60_000);
});
