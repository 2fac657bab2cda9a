import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test as base, describe, expect } from 'vitest';
import { Daemon, type DaemonOptions } from '../../src/control/daemon.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { type Api, apiAs, call, type Json } from '../helpers/api-call.js';
import { MemoryProvider } from '../helpers/memory-provider.js';
import { createTestDatabase, NEEDS_POSTGRES } from '../helpers/postgres.js';
import { until } from './plane.js';

interface Plane {
  provider: MemoryProvider;
  /**
   * Starts a daemon: on one SQLite home by default, or (`databaseUrl`) with a home of its own on
   * that database, sharing the first home's token secret as replicas do.
   */
  start(
    options?: Partial<DaemonOptions>,
  ): Promise<{ daemon: Daemon; info: DaemonInfo; admin: Api }>;
  /** Stops every daemon started (before the test drops a database they use). */
  stopAll(): Promise<void>;
}

/** Daemons on a memory provider; every daemon, home and provider cleaned after the test. */
const test = base.extend<{ plane: Plane }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  plane: async ({}, use) => {
    const provider = new MemoryProvider();
    const homes: string[] = [];
    const daemons: Daemon[] = [];
    try {
      await use({
        provider,
        async start(options = {}) {
          const home =
            homes.length > 0 && !options.databaseUrl
              ? (homes[0] as string)
              : mkdtempSync(join(tmpdir(), 'abx-keys-'));
          if (!homes.includes(home)) {
            if (homes.length > 0) {
              copyFileSync(join(homes[0] as string, 'token-secret'), join(home, 'token-secret'));
            }
            homes.push(home);
          }
          const daemon = new Daemon({
            home,
            provider,
            apiPort: 0,
            gatewayPort: 0,
            reapIntervalMs: 50,
            warmPool: 0,
            ...options,
          });
          daemons.push(daemon);
          const info = await daemon.start();
          const admin = apiAs(info, readFileSync(join(home, 'api-key'), 'utf8').trim());
          return { daemon, info, admin };
        },
        async stopAll() {
          provider.releaseCreates();
          for (const daemon of daemons) await daemon.stop().catch(() => undefined);
        },
      });
    } finally {
      provider.releaseCreates();
      for (const daemon of daemons) await daemon.stop().catch(() => undefined);
      await provider.dispose();
      for (const home of homes) rmSync(home, { recursive: true, force: true });
    }
  },
});

/** Makes a key through `admin` and answers its API and its record. */
async function makeKey(
  admin: Api,
  info: DaemonInfo,
  body: { name: string; admin?: boolean; maxRunning?: number },
): Promise<{ api: Api; key: string; id: string }> {
  const made = await admin.post('/v1/keys', body);
  expect(made.status).toBe(200);
  return { api: apiAs(info, made.body.key), key: made.body.key, id: made.body.id };
}

const ids = (body: Json): string[] => body.sandboxes.map((s: Json) => s.sandboxId).sort();

const names = (body: Json): string[] => body.templates.map((t: Json) => t.name);

/**
 * Templates and snapshots have owners, as keys see them through `one` and `two` (one daemon
 * twice, or two replicas on one database): what another key's own template answers is exactly
 * what a name that does not exist answers.
 */
async function templateOwnership(
  provider: MemoryProvider,
  one: { info: DaemonInfo; admin: Api },
  two: { info: DaemonInfo; admin: Api },
): Promise<void> {
  const alice = await makeKey(one.admin, one.info, { name: 'alice' });
  const bob = await makeKey(one.admin, one.info, { name: 'bob' });
  const bobTwo = apiAs(two.info, bob.key);
  // An admin's build is the shared catalogue; a key's build is its own.
  const tools = await one.admin.post('/v1/templates', { yaml: 'name: tools\nenv: { A: "1" }\n' });
  expect(tools.body).toMatchObject({ name: 'tools', shared: true, owner: null });
  const own = await alice.api.post('/v1/templates', { yaml: 'name: alice-tools\n' });
  expect(own.status, JSON.stringify(own.body)).toBe(200);
  expect(own.body).toMatchObject({ name: 'alice-tools', shared: false, owner: alice.id });
  // Any key snapshots its own sandbox; the snapshot is its own, with its files.
  const a = (await alice.api.post('/v1/sandboxes', { template: 'alice-tools' })).body.sandboxId;
  writeFileSync(join(provider.sandbox(a).home, 'secret.txt'), 'alice only');
  const snap = await alice.api.post(`/v1/sandboxes/${a}/snapshot`, { name: 'alice-snap' });
  expect(snap.status, JSON.stringify(snap.body)).toBe(200);
  expect(snap.body).toMatchObject({ name: 'alice-snap', shared: false, owner: alice.id });
  const copy = await alice.api.post('/v1/sandboxes', { template: 'alice-snap' });
  expect(copy.status).toBe(200);
  expect(readFileSync(join(provider.sandbox(copy.body.sandboxId).home, 'secret.txt'), 'utf8')).toBe(
    'alice only',
  );
  expect(names((await alice.api.get('/v1/templates')).body)).toEqual([
    'base',
    'alice-snap',
    'alice-tools',
    'tools',
  ]);

  // Bob, on the other daemon, sees the catalogue only; alice's answer as unknown names.
  expect(names((await bobTwo.get('/v1/templates')).body)).toEqual(['base', 'tools']);
  const as = (answer: { status: number; body: Json }, name: string) => ({
    status: answer.status,
    body: JSON.parse(JSON.stringify(answer.body).replaceAll('no-such', name)),
  });
  const unknown = {
    get: await bobTwo.get('/v1/templates/no-such'),
    create: await bobTwo.post('/v1/sandboxes', { template: 'no-such' }),
    remove: await bobTwo.delete('/v1/templates/no-such'),
  };
  expect(unknown.get.status).toBe(404);
  expect(unknown.get.body.type).toBe('TemplateNotFoundError');
  expect(unknown.get.body.error).toContain('known templates: base, tools.');
  for (const name of ['alice-tools', 'alice-snap']) {
    expect(await bobTwo.get(`/v1/templates/${name}`)).toEqual(as(unknown.get, name));
    expect(await bobTwo.post('/v1/sandboxes', { template: name })).toEqual(
      as(unknown.create, name),
    );
    expect(await bobTwo.delete(`/v1/templates/${name}`)).toEqual(as(unknown.remove, name));
  }
  // Nor may he take the name, snapshot her sandbox, or write into the catalogue.
  const b = (await bob.api.post('/v1/sandboxes')).body.sandboxId;
  const taken = await bob.api.post('/v1/templates', { yaml: 'name: alice-snap\n' });
  expect(taken).toEqual({
    status: 409,
    body: {
      error:
        "the template name 'alice-snap' is taken by a template this key cannot see: choose another name",
      type: 'TemplateConflictError',
      code: 'template_name_taken',
    },
  });
  expect((await bob.api.post(`/v1/sandboxes/${b}/snapshot`, { name: 'alice-snap' })).status).toBe(
    409,
  );
  const hers = await bob.api.post(`/v1/sandboxes/${a}/snapshot`, { name: 'bobs' });
  expect(hers.status).toBe(404);
  expect(hers.body.type).toBe('SandboxNotFoundError');
  for (const answer of [
    await bob.api.post('/v1/templates', { yaml: 'name: tools\n' }),
    await bob.api.post(`/v1/sandboxes/${b}/snapshot`, { name: 'tools' }),
    await bob.api.delete('/v1/templates/tools'),
    await alice.api.post('/v1/templates/alice-tools/publish'),
  ]) {
    expect(answer.status).toBe(403);
    expect(answer.body).toMatchObject({ type: 'PermissionDeniedError', code: 'admin_required' });
  }
  expect((await bob.api.post('/v1/templates', { yaml: 'name: tools\n' })).body.error).toMatch(
    /^replacing template 'tools', which is in the shared catalogue, needs an admin API key, and the key 'bob' \(key_\w+\) is not one/,
  );
  expect((await one.admin.get('/v1/templates/tools')).body.env).toEqual({ A: '1' });

  // Admin keys see every template, with its owner, and create from any.
  const all = (await two.admin.get('/v1/templates')).body.templates;
  expect(all.map((t: Json) => [t.name, t.shared, t.owner])).toEqual([
    ['base', true, null],
    ['alice-snap', false, alice.id],
    ['alice-tools', false, alice.id],
    ['tools', true, null],
  ]);
  expect((await two.admin.post('/v1/sandboxes', { template: 'alice-snap' })).status).toBe(200);
  // An admin's snapshot of alice's sandbox is the admin's: neither alice nor bob sees it.
  const audit = await one.admin.post(`/v1/sandboxes/${a}/snapshot`, { name: 'audit' });
  expect(audit.body).toMatchObject({ shared: false, owner: null });
  expect((await alice.api.get('/v1/templates/audit')).status).toBe(404);
  expect((await bobTwo.post('/v1/sandboxes', { template: 'audit' })).status).toBe(404);

  // Published, alice's template is the catalogue's: bob uses it, alice no longer changes it.
  const published = await one.admin.post('/v1/templates/alice-tools/publish');
  expect(published.body).toMatchObject({ shared: true, owner: alice.id });
  expect(names((await bobTwo.get('/v1/templates')).body)).toEqual(['base', 'alice-tools', 'tools']);
  expect((await bobTwo.get('/v1/templates/alice-tools')).body.owner).toBeNull();
  expect((await bobTwo.post('/v1/sandboxes', { template: 'alice-tools' })).status).toBe(200);
  expect((await alice.api.post('/v1/templates', { yaml: 'name: alice-tools\n' })).status).toBe(403);
  const back = await two.admin.post('/v1/templates/alice-tools/publish', { shared: false });
  expect(back.body.shared).toBe(false);
  expect((await bobTwo.get('/v1/templates/alice-tools')).status).toBe(404);
  expect((await one.admin.post('/v1/templates/nope/publish')).status).toBe(404);
  expect((await one.admin.post('/v1/templates/tools/publish', { shared: 'yes' })).status).toBe(400);
  // Alice rebuilds and removes her own.
  expect((await alice.api.post('/v1/templates', { yaml: 'name: alice-tools\n' })).status).toBe(200);
  expect((await alice.api.delete('/v1/templates/alice-snap')).body).toEqual({
    removed: 'alice-snap',
  });
  expect((await alice.api.get('/v1/templates/alice-snap')).status).toBe(404);
}

describe('API keys on one daemon', () => {
  test('create shows the key once; list shows id, name, prefix, admin, limit, running, never the key', async ({
    plane,
  }) => {
    const { info, admin } = await plane.start();
    const made = await admin.post('/v1/keys', { name: 'ci', maxRunning: 5 });
    expect(made.status).toBe(200);
    expect(made.body.key).toMatch(/^abx_[A-Za-z0-9_-]{43}$/);
    expect(made.body).toMatchObject({
      id: expect.stringMatching(/^key_[a-z0-9]{12}$/),
      name: 'ci',
      prefix: made.body.key.slice(0, 10),
      admin: false,
      maxRunning: 5,
      lastUsedAt: null,
      revokedAt: null,
    });
    const ci = apiAs(info, made.body.key);
    expect((await ci.post('/v1/sandboxes')).status).toBe(200);
    const listed = await admin.get('/v1/keys');
    expect(listed.status).toBe(200);
    expect(listed.body.keys).toEqual([
      {
        id: made.body.id,
        name: 'ci',
        prefix: made.body.prefix,
        admin: false,
        maxRunning: 5,
        running: 1,
        createdAt: made.body.createdAt,
        lastUsedAt: expect.any(String),
        revokedAt: null,
      },
    ]);
    expect(JSON.stringify(listed.body)).not.toContain(made.body.key.slice(10));
  });

  test('bad input is refused in the contract shape and changes nothing', async ({ plane }) => {
    const { admin } = await plane.start();
    await admin.post('/v1/keys', { name: 'alice' });
    const refusals: [unknown, number, string, RegExp][] = [
      [{ name: 'alice' }, 400, 'InvalidArgumentError', /named 'alice' exists already/],
      [{}, 400, 'ArgumentError', /name/],
      [{ name: 'bob', maxRunning: 0 }, 400, 'InvalidArgumentError', /maxRunning must be/],
      [{ name: 'bob', maxRunning: 'ten' }, 400, 'ArgumentError', /maxRunning/],
      [{ name: 'bob', colour: 'red' }, 400, 'ArgumentError', /colour/],
      [{ name: 'has space' }, 400, 'InvalidArgumentError', /name must be/],
      [['alice'], 400, 'ArgumentError', /object/],
    ];
    for (const [body, status, type, message] of refusals) {
      const answer = await admin.post('/v1/keys', body);
      expect({ body, status: answer.status, type: answer.body.type }).toEqual({
        body,
        status,
        type,
      });
      expect(answer.body.error).toMatch(message);
    }
    expect((await admin.get('/v1/keys')).body.keys.map((k: Json) => k.name)).toEqual(['alice']);
    const unknown = await admin.delete('/v1/keys/key_nosuchkey000');
    expect(unknown.status).toBe(404);
    expect(unknown.body).toEqual({
      error: expect.stringContaining('no API key has the id "key_nosuchkey000"'),
      type: 'NotFoundError',
    });
  });

  test("two keys cannot see or touch each other's sandboxes; admins see all", async ({ plane }) => {
    const { info, admin } = await plane.start();
    const alice = await makeKey(admin, info, { name: 'alice' });
    const bob = await makeKey(admin, info, { name: 'bob' });
    const ops = await makeKey(admin, info, { name: 'ops', admin: true });
    const a = (await alice.api.post('/v1/sandboxes', { metadata: { team: 'x' } })).body.sandboxId;
    const b = (await bob.api.post('/v1/sandboxes', { metadata: { team: 'x' } })).body.sandboxId;
    const own = (await admin.post('/v1/sandboxes')).body.sandboxId;

    expect(ids((await alice.api.get('/v1/sandboxes')).body)).toEqual([a]);
    expect(ids((await alice.api.get('/v1/sandboxes?metadata.team=x')).body)).toEqual([a]);
    expect(ids((await bob.api.get('/v1/sandboxes?state=running')).body)).toEqual([b]);
    expect(ids((await ops.api.get('/v1/sandboxes')).body)).toEqual([a, b, own].sort());
    expect(ids((await admin.get('/v1/sandboxes')).body)).toEqual([a, b, own].sort());

    // Bob's sandbox answers Alice exactly as an id that does not exist.
    const attempts = (id: string) => [
      alice.api.get(`/v1/sandboxes/${id}`),
      alice.api.post(`/v1/sandboxes/${id}/connect`),
      alice.api.post(`/v1/sandboxes/${id}/timeout`, { timeoutMs: 1000 }),
      alice.api.delete(`/v1/sandboxes/${id}`),
    ];
    const unknown = 'inosuchsandbox00';
    const asUnknown = await Promise.all(attempts(unknown));
    for (const [i, answer] of (await Promise.all(attempts(b))).entries()) {
      expect(answer.status).toBe(404);
      expect(answer.body).toEqual({
        ...asUnknown[i]?.body,
        error: asUnknown[i]?.body.error.replace(unknown, b),
      });
      expect(answer.body).toEqual({
        error: `sandbox ${b} does not exist`,
        type: 'SandboxNotFoundError',
      });
    }
    // Nothing of it reached Bob's sandbox: it runs, with its lifetime.
    const seen = await bob.api.get(`/v1/sandboxes/${b}`);
    expect(seen.body.state).toBe('running');
    expect(Date.parse(seen.body.expiresAt) - Date.now()).toBeGreaterThan(60_000);
    // The daemon's own sandbox is nobody's but the admins'.
    expect((await bob.api.get(`/v1/sandboxes/${own}`)).status).toBe(404);
    // Alice reaches her own; an admin key reaches Bob's.
    expect((await alice.api.post(`/v1/sandboxes/${a}/connect`)).body.accessToken).toEqual(
      expect.any(String),
    );
    expect((await ops.api.delete(`/v1/sandboxes/${b}`)).body.killed).toBe(true);
    expect((await alice.api.delete(`/v1/sandboxes/${a}`)).body.killed).toBe(true);
  });

  test('admin routes refuse a key that is not an admin with 403, and change nothing', async ({
    plane,
  }) => {
    const { info, admin } = await plane.start();
    const alice = await makeKey(admin, info, { name: 'alice' });
    const a = (await alice.api.post('/v1/sandboxes')).body.sandboxId;
    const refused = [
      await alice.api.get('/v1/keys'),
      await alice.api.post('/v1/keys', { name: 'mine', admin: true }),
      // Refused before its body is looked at.
      await alice.api.post('/v1/keys', { colour: 'red' }),
      await alice.api.delete(`/v1/keys/${alice.id}`),
      await alice.api.delete(`/v1/keys/${alice.id}?kill=true`),
      // A path names a file on the daemon's host: a key builds from the YAML's text instead.
      await alice.api.post('/v1/templates', { path: '/etc/abx/template.yaml' }),
      await alice.api.post('/v1/shutdown'),
    ];
    for (const answer of refused) {
      expect(answer.status).toBe(403);
      expect(answer.body).toEqual({
        error: expect.stringContaining(
          `needs an admin API key, and the key 'alice' (${alice.id}) is not one`,
        ),
        type: 'PermissionDeniedError',
        code: 'admin_required',
      });
    }
    expect((await admin.get('/v1/health')).status).toBe(200);
    expect((await admin.get('/v1/keys')).body.keys.map((k: Json) => [k.name, k.revokedAt])).toEqual(
      [['alice', null]],
    );
    expect((await admin.get('/v1/templates')).body.templates.map((t: Json) => t.name)).toEqual([
      'base',
    ]);
    // Templates are shared: any key reads them and creates from them.
    expect((await alice.api.get('/v1/templates/base')).status).toBe(200);
    // Her sandbox still runs: a refused revoke with ?kill=true killed nothing.
    expect((await alice.api.get(`/v1/sandboxes/${a}`)).body.state).toBe('running');
  });

  test('a revoked key is refused from its next request on; its sandboxes run on', async ({
    plane,
  }) => {
    const { info, admin } = await plane.start();
    const alice = await makeKey(admin, info, { name: 'alice' });
    const a = (await alice.api.post('/v1/sandboxes')).body.sandboxId;
    const revoked = await admin.delete(`/v1/keys/${alice.id}`);
    expect(revoked.status).toBe(200);
    expect(revoked.body).toMatchObject({ revoked: true, key: { id: alice.id, name: 'alice' } });
    const refused = await alice.api.get('/v1/sandboxes');
    expect(refused.status).toBe(401);
    expect(refused.body).toEqual({
      error: expect.stringMatching(
        new RegExp(
          `^the API key 'alice' \\(${alice.id}, abx_.{6}…\\) was revoked at .+: ask an admin`,
        ),
      ),
      type: 'AuthenticationError',
      code: 'key_revoked',
    });
    expect((await alice.api.post('/v1/sandboxes')).status).toBe(401);
    expect((await admin.get(`/v1/sandboxes/${a}`)).body.state).toBe('running');
    // Revoked once: the second answer says so and keeps the first time.
    const again = await admin.delete(`/v1/keys/${alice.id}`);
    expect(again.body).toEqual({ revoked: false, key: revoked.body.key });
    // The name is free again.
    expect((await admin.post('/v1/keys', { name: 'alice' })).status).toBe(200);
    // A key that never existed, or no key, is refused as before.
    expect((await apiAs(info, 'abx_nothing').get('/v1/sandboxes')).status).toBe(401);
    expect((await call(`${info.apiUrl}/v1/sandboxes`)).status).toBe(401);
  });

  test('a caller without a valid key learns nothing about the host: no path, no home', async ({
    plane,
  }) => {
    const { info } = await plane.start();
    const answers = [
      await call(`${info.apiUrl}/v1/sandboxes`),
      await apiAs(info, 'abx_nothing').get('/v1/sandboxes'),
      await call(`${info.apiUrl}/sandboxes`, { headers: { 'x-api-key': 'e2b_nothing' } }),
      await call(`${info.apiUrl}/sandboxes`),
    ];
    for (const answer of answers) {
      expect(answer.status).toBe(401);
      const text = JSON.stringify(answer.body);
      expect(text).toMatch(/key/);
      expect(text).not.toMatch(/api-key\b|\/tmp\/|ABX_HOME|daemon's host/);
    }
  });

  test('a limit holds against creates that start together, and frees up when a sandbox ends', async ({
    plane,
  }) => {
    const { info, admin } = await plane.start({ startConcurrency: 8 });
    const ci = await makeKey(admin, info, { name: 'ci', maxRunning: 2 });
    // Every create passes the early count (none runs yet) and starts its sandbox: the registry's
    // locked write decides which two stay.
    plane.provider.holdCreates();
    const pending = Array.from({ length: 8 }, () => ci.api.post('/v1/sandboxes'));
    await until(() => plane.provider.created.length === 8, 'eight sandboxes starting');
    plane.provider.releaseCreates();
    const answers = await Promise.all(pending);
    expect(answers.map((a) => a.status).sort()).toEqual([200, 200, 429, 429, 429, 429, 429, 429]);
    expect(answers.find((a) => a.status === 429)?.body).toEqual({
      error: `the API key 'ci' (${ci.id}) has 2 sandboxes running, its limit (--max-running): kill one of them (abx list, abx kill ID) or ask an admin for a key with a higher limit`,
      type: 'LimitExceededError',
      code: 'limit_exceeded',
    });
    const mine = ids((await ci.api.get('/v1/sandboxes?state=running')).body);
    expect(mine).toEqual(
      answers
        .filter((a) => a.status === 200)
        .map((a) => a.body.sandboxId)
        .sort(),
    );
    // The sandboxes of the refused creates were killed: none runs without a row.
    expect(plane.provider.aliveIds().sort()).toEqual(mine);
    // Refused before anything starts, once the limit is plainly reached.
    expect((await ci.api.post('/v1/sandboxes')).status).toBe(429);
    expect(plane.provider.created).toHaveLength(8);
    expect((await ci.api.delete(`/v1/sandboxes/${mine[0]}`)).body.killed).toBe(true);
    expect((await ci.api.post('/v1/sandboxes')).status).toBe(200);
    expect((await ci.api.post('/v1/sandboxes')).status).toBe(429);
    expect((await admin.get('/v1/keys')).body.keys[0].running).toBe(2);
  });

  test("a warm pool's spares are nobody's until handed out; then the creating key's", async ({
    plane,
  }) => {
    const { info, admin } = await plane.start({ warmPool: 1 });
    const alice = await makeKey(admin, info, { name: 'alice' });
    // The first create of a template starts its pool.
    const first = (await alice.api.post('/v1/sandboxes')).body.sandboxId;
    await until(
      async () => (await admin.get('/v1/sandboxes?state=pooled')).body.sandboxes.length === 1,
      'a spare in the pool',
    );
    const [spare] = ids((await admin.get('/v1/sandboxes?state=pooled')).body);
    expect((await alice.api.get(`/v1/sandboxes/${spare}`)).status).toBe(404);
    expect(ids((await alice.api.get('/v1/sandboxes?state=pooled')).body)).toEqual([]);
    const second = (await alice.api.post('/v1/sandboxes')).body.sandboxId;
    expect(second).toBe(spare);
    expect(ids((await alice.api.get('/v1/sandboxes')).body)).toEqual([first, second].sort());
    expect((await alice.api.post(`/v1/sandboxes/${second}/connect`)).status).toBe(200);
  });
  test('templates and snapshots have owners: a key uses its own and the catalogue, others get 404 as for no such name', async ({
    plane,
  }) => {
    const daemon = await plane.start();
    await templateOwnership(plane.provider, daemon, daemon);
  });

  test("a key's build may not reach into the daemon's host: host network, copy steps, a dockerfile, kubernetes placement; its setup steps run off the host's network", async ({
    plane,
  }) => {
    const { info, admin } = await plane.start();
    const alice = await makeKey(admin, info, { name: 'alice' });
    const refused = async (yaml: string, what: string) => {
      const answer = await alice.api.post('/v1/templates', { yaml });
      expect(answer.status, JSON.stringify(answer.body)).toBe(403);
      expect(answer.body).toEqual({
        error: `template 'reach' has ${what}: building that needs an admin API key, and the key 'alice' (${alice.id}) is not one; leave it out, or ask an admin of the control plane`,
        type: 'PermissionDeniedError',
        code: 'admin_required',
      });
    };
    await refused('name: reach\nnetwork: host\n', "network: host (the daemon host's own network)");
    await refused(
      'name: reach\nsetup:\n  - copy: /etc/passwd\n    to: /home/user/passwd\n',
      "setup copy steps (they copy files of the daemon's host; use run steps)",
    );
    await refused(
      'name: reach\ndockerfile: /etc/hostname\n',
      "dockerfile: (a file on the daemon's host; use image:)",
    );
    await refused(
      'name: reach\nkubernetes:\n  runtime_class: gvisor\n',
      'kubernetes: (where its pods run)',
    );
    // Another template's built image (a private snapshot's, say) is not a base for a key's build.
    await refused(
      'name: reach\nimage: abx-template/alice-snap:1765000000000\n',
      "image: abx-template/alice-snap:1765000000000 (a template's own build; start from that template instead)",
    );
    await refused(
      'name: reach\nimage: registry.local:5000/abx-template-alice-snap:0123abcd\n',
      "image: registry.local:5000/abx-template-alice-snap:0123abcd (a template's own build; start from that template instead)",
    );
    // Nothing was built or started.
    expect(plane.provider.creates).toBe(0);
    expect((await admin.get('/v1/templates/reach')).status).toBe(404);

    // Her setup steps run on the template's own network; an admin's on the host's.
    const mine = await alice.api.post('/v1/templates', {
      yaml: 'name: alice-setup\nsetup:\n  - echo hi\n',
    });
    expect(mine.status, JSON.stringify(mine.body)).toBe(200);
    expect(plane.provider.sandbox('build-alice-setup').spec.network).not.toBe('host');
    const offline = await alice.api.post('/v1/templates', {
      yaml: 'name: alice-offline\nnetwork: none\nsetup:\n  - echo hi\n',
    });
    expect(offline.status).toBe(200);
    expect(plane.provider.sandbox('build-alice-offline').spec.network).toBe('none');
    expect(
      (await admin.post('/v1/templates', { yaml: 'name: admin-setup\nsetup:\n  - echo hi\n' }))
        .status,
    ).toBe(200);
    expect(plane.provider.sandbox('build-admin-setup').spec.network).toBe('host');
    // An admin builds what a key may not.
    expect(
      (await admin.post('/v1/templates', { yaml: 'name: reach\nnetwork: host\n' })).status,
    ).toBe(200);
  });

  test("DELETE /v1/keys/{id}?kill=true kills the key's sandboxes through the kill path; their tokens stop at the gateway at once", async ({
    plane,
  }) => {
    const { info, admin } = await plane.start();
    const alice = await makeKey(admin, info, { name: 'alice' });
    const bob = await makeKey(admin, info, { name: 'bob' });
    const made = [
      (await alice.api.post('/v1/sandboxes')).body,
      (await alice.api.post('/v1/sandboxes')).body,
    ];
    const theirs = (await bob.api.post('/v1/sandboxes')).body;
    const exec = (sandbox: Json) =>
      call(`${info.gatewayUrl}/process/exec`, {
        method: 'POST',
        headers: {
          'x-sandbox-id': sandbox.sandboxId,
          'x-sandbox-port': '49983',
          'x-access-token': sandbox.accessToken,
        },
        body: { cmd: 'echo hi' },
      });
    // Warm connections and the gateway's lookups first: what it knows must be forgotten.
    for (const sandbox of [...made, theirs]) expect((await exec(sandbox)).status).toBe(200);

    expect((await admin.delete(`/v1/keys/${alice.id}?kill=maybe`)).body).toEqual({
      error:
        'kill must be true (also kill the key\'s running and paused sandboxes) or false, not "maybe"',
      type: 'InvalidArgumentError',
    });
    // A bad flag changed nothing: the key still works.
    expect((await alice.api.get('/v1/sandboxes')).status).toBe(200);

    const revoked = await admin.delete(`/v1/keys/${alice.id}?kill=true`);
    expect(revoked.status).toBe(200);
    expect(revoked.body).toMatchObject({ revoked: true, key: { id: alice.id } });
    expect([...revoked.body.killed].sort()).toEqual(made.map((m) => m.sandboxId).sort());
    for (const sandbox of made) {
      const answer = await exec(sandbox);
      expect(answer.status).toBe(404);
      const row = (await admin.get(`/v1/sandboxes/${sandbox.sandboxId}`)).body;
      expect(row).toMatchObject({
        state: 'killed',
        endReason: `killed: its API key ${alice.id} was revoked`,
      });
    }
    expect(plane.provider.aliveIds()).toEqual([theirs.sandboxId]);
    // Bob's sandbox is untouched; a second revoke with kill finds nothing left.
    expect((await exec(theirs)).status).toBe(200);
    expect((await admin.delete(`/v1/keys/${alice.id}?kill=true`)).body).toMatchObject({
      revoked: false,
      killed: [],
    });
  });

  test('a create under way when its key is revoked with ?kill=true is killed when it ends, and refused', async ({
    plane,
  }) => {
    const { info, admin } = await plane.start();
    const alice = await makeKey(admin, info, { name: 'alice' });
    // Her request is authenticated and its sandbox starting, but no row is written yet.
    plane.provider.holdCreates();
    const pending = alice.api.post('/v1/sandboxes');
    await until(() => plane.provider.created.length === 1, 'her sandbox starting');
    const revoked = await admin.delete(`/v1/keys/${alice.id}?kill=true`);
    expect(revoked.body).toMatchObject({ revoked: true, killed: [] });
    plane.provider.releaseCreates();
    const answer = await pending;
    expect(answer.status).toBe(401);
    expect(answer.body).toMatchObject({ type: 'AuthenticationError', code: 'key_revoked' });
    expect(answer.body.error).toMatch(
      new RegExp(
        `^the API key 'alice' \\(${alice.id}, abx_.{6}…\\) was revoked at .+, while this request ran; what it started was killed`,
      ),
    );
    expect(plane.provider.aliveIds()).toEqual([]);
    const rows = (await admin.get('/v1/sandboxes?state=killed')).body.sandboxes;
    expect(rows.map((r: Json) => r.endReason)).toEqual([
      `killed: its API key ${alice.id} was revoked`,
    ]);
  });
});

describe(`API keys on two daemons sharing PostgreSQL${NEEDS_POSTGRES}`, () => {
  test.skipIf(NEEDS_POSTGRES !== '')(
    'a key made on one works on the other; its limit holds across both; a revocation holds on both at once',
    async ({ plane }) => {
      const database = await createTestDatabase();
      try {
        const one = await plane.start({ databaseUrl: database.url, startConcurrency: 10 });
        const two = await plane.start({ databaseUrl: database.url, startConcurrency: 10 });
        const made = await one.admin.post('/v1/keys', { name: 'ci', maxRunning: 3 });
        const [viaOne, viaTwo] = [apiAs(one.info, made.body.key), apiAs(two.info, made.body.key)];
        // All ten start their sandboxes before any row is written: the key's row lock decides.
        plane.provider.holdCreates();
        const pending = Array.from({ length: 10 }, (_, i) =>
          (i % 2 ? viaOne : viaTwo).post('/v1/sandboxes'),
        );
        await until(() => plane.provider.created.length === 10, 'ten sandboxes starting');
        plane.provider.releaseCreates();
        const answers = await Promise.all(pending);
        expect(answers.filter((a) => a.status === 200)).toHaveLength(3);
        expect(answers.filter((a) => a.status === 429)).toHaveLength(7);
        expect(ids((await viaTwo.get('/v1/sandboxes')).body)).toEqual(
          answers
            .filter((a) => a.status === 200)
            .map((a) => a.body.sandboxId)
            .sort(),
        );
        expect((await two.admin.get('/v1/keys')).body.keys[0].running).toBe(3);
        expect(plane.provider.aliveIds()).toHaveLength(3);

        expect((await one.admin.delete(`/v1/keys/${made.body.id}`)).body.revoked).toBe(true);
        expect((await viaTwo.get('/v1/sandboxes')).body.code).toBe('key_revoked');
        expect((await viaOne.get('/v1/sandboxes')).body.code).toBe('key_revoked');
      } finally {
        await plane.stopAll();
        await database.drop();
      }
    },
  );
  test.skipIf(NEEDS_POSTGRES !== '')(
    'templates and snapshots have owners across two replicas',
    async ({ plane }) => {
      const database = await createTestDatabase();
      try {
        const one = await plane.start({ databaseUrl: database.url });
        const two = await plane.start({ databaseUrl: database.url });
        await templateOwnership(plane.provider, one, two);
      } finally {
        await plane.stopAll();
        await database.drop();
      }
    },
  );
});
