import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { text } from 'node:stream/consumers';
import {
  AuthenticationError,
  Sandbox,
  SandboxError,
  Volume,
  VolumeError,
  VolumeNotFoundError,
  VolumePathNotFoundError,
} from 'e2b';
import { request } from 'undici';
import { afterAll, test as base, beforeAll, describe, expect } from 'vitest';
import { startDaemon } from '../../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../../src/installation/daemon-info.js';
import { unmountUnder } from '../../../src/providers/local/volumes.js';
import { ApiKeys } from '../../../src/sandbox/api-keys.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { call } from '../../helpers/api-call.js';
import { type RootlessDaemon, startRootlessDaemon } from '../../helpers/rootless.js';

// Volumes through the real, unmodified `e2b` package (its `Volume` class and
// `Sandbox.create({ volumeMounts })`) against a real daemon with bubblewrap sandboxes, run as
// root: each volume an ext4 disk mounted on the host and idmapped into the sandboxes. The SDK is
// configured as `abx e2b env` prints it: E2B_API_URL, E2B_SANDBOX_URL and E2B_VOLUME_API_URL all
// the daemon's gateway (one URL), so every call, the volume content API's included, passes the
// gateway to the daemon.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let adminKey: string;
/** A key that is not the admin's: it sees only its own volumes. */
let otherKey: string;

const ENV = ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_VOLUME_API_URL'] as const;

beforeAll(async () => {
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  adminKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  otherKey = (await ApiKeys.create(`other-${Date.now()}`, { home: abx.home, format: 'e2b' })).key;
  for (const name of ENV) process.env[name] = info.gatewayUrl;
}, 120_000);

afterAll(async () => {
  if (abx) {
    try {
      // Volumes outlive sandboxes: each is removed (its disk unmounted) before the home goes,
      // with the SDK still pointed at the daemon.
      for (const key of [adminKey, otherKey]) {
        for (const volume of await Volume.list(as(key)).catch(() => [])) {
          await Volume.destroy(volume.volumeId, as(key)).catch(() => undefined);
        }
      }
      // What a failed removal left mounted.
      await unmountUnder(join(abx.home, 'volumes')).catch(() => undefined);
    } finally {
      await abx.close();
    }
  }
  for (const name of ENV) delete process.env[name];
}, 120_000);

const as = (apiKey: string) => ({ apiKey, requestTimeoutMs: 60_000 });

/** Sandboxes made through the SDK, killed when the test ends, whatever happened. */
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

/** A volume name no other test uses. */
const unique = (what: string) => `${what}-${randomBytes(4).toString('hex')}`;

/** E2B's control API, raw, with `X-API-KEY`. */
function raw(method: string, path: string, body?: unknown, key: string | null = adminKey) {
  return call(`${info.gatewayUrl}${path}`, {
    method,
    headers: key === null ? {} : { 'x-api-key': key },
    ...(body === undefined ? {} : { body }),
  });
}

/** The content API, raw, with a volume's token. */
async function content(
  method: string,
  path: string,
  token: string | null,
  body?: string,
): Promise<{ status: number; body: unknown; allow?: string }> {
  const response = await request(`${info.gatewayUrl}${path}`, {
    method: method as 'GET',
    headers: token === null ? {} : { authorization: `Bearer ${token}` },
    ...(body === undefined ? {} : { body }),
  });
  const got = await response.body.text();
  const allow = response.headers.allow;
  return {
    status: response.statusCode,
    body: got ? JSON.parse(got) : undefined,
    ...(typeof allow === 'string' ? { allow } : {}),
  };
}

async function run(sandbox: Sandbox, command: string): Promise<string> {
  return (await sandbox.commands.run(command)).stdout.trim();
}

describe('volumes through the E2B SDK', () => {
  test('create, list, getInfo, connect and destroy; a key sees its own volumes only', async () => {
    const name = unique('data');
    const volume = await Volume.create(name, as(adminKey));
    expect(volume.volumeId).toMatch(/^vol_[0-9a-f]+$/);
    expect(volume.name).toBe(name);
    expect(volume.token).toEqual(expect.any(String));
    // The gateway's host, as a sandbox's domain is: without E2B_VOLUME_API_URL the SDK's
    // content calls go to https://api.{domain}, this daemon's too (never E2B's cloud).
    expect(volume.domain).toBe(`localhost:${new URL(info.gatewayUrl).port}`);

    expect(await Volume.list(as(adminKey))).toContainEqual({ volumeId: volume.volumeId, name });
    expect(await Volume.getInfo(volume.volumeId, as(adminKey))).toEqual({
      volumeId: volume.volumeId,
      name,
      token: volume.token,
      domain: volume.domain,
    });
    const connected = await Volume.connect(volume.volumeId, as(adminKey));
    expect([connected.name, connected.token]).toEqual([name, volume.token]);

    // Another key: the volume does not exist for it, and its name is free for it.
    expect(await Volume.list(as(otherKey))).not.toContainEqual(
      expect.objectContaining({ volumeId: volume.volumeId }),
    );
    await expect(Volume.getInfo(volume.volumeId, as(otherKey))).rejects.toBeInstanceOf(
      VolumeNotFoundError,
    );
    expect(await Volume.destroy(volume.volumeId, as(otherKey))).toBe(false);
    const theirs = await Volume.create(name, as(otherKey));
    expect(theirs.volumeId).not.toBe(volume.volumeId);
    expect(await Volume.destroy(theirs.volumeId, as(otherKey))).toBe(true);

    // A name taken by the key: 400, as E2B's server answers it.
    const taken = await Volume.create(name, as(adminKey)).catch((error: unknown) => error);
    expect(taken).toBeInstanceOf(VolumeError);
    expect((taken as Error).message).toMatch(/^400: a volume named .* exists already/);

    expect(await Volume.destroy(volume.volumeId, as(adminKey))).toBe(true);
    expect(await Volume.destroy(volume.volumeId, as(adminKey))).toBe(false);
    await expect(Volume.getInfo(volume.volumeId, as(adminKey))).rejects.toBeInstanceOf(
      VolumeNotFoundError,
    );
    expect(await Volume.list(as(adminKey))).not.toContainEqual(
      expect.objectContaining({ volumeId: volume.volumeId }),
    );
  });

  test('bad names, unknown ids and missing keys are refused with E2B error bodies', async () => {
    for (const bad of ['has space', 'dots.not.allowed', '', 'x'.repeat(64)]) {
      const refused = await raw('POST', '/volumes', { name: bad });
      expect(refused.status).toBe(400);
      expect(refused.body).toEqual({ code: 400, message: expect.stringContaining('volume name') });
    }
    expect((await raw('POST', '/volumes', {})).status).toBe(400);
    expect(await raw('GET', '/volumes/vol_0000')).toEqual({
      status: 404,
      body: { code: 404, message: expect.stringContaining('vol_0000') },
    });
    expect((await raw('DELETE', '/volumes/vol_0000')).status).toBe(404);
    expect((await raw('GET', '/volumes', undefined, null)).status).toBe(401);
    expect((await raw('POST', '/volumes', { name: unique('nokey') }, null)).status).toBe(401);
    expect((await Volume.list(as(adminKey))).filter((v) => v.name.startsWith('nokey'))).toEqual([]);
  });

  test("a volume's files through the content API: write, read, list, folders, metadata, remove", async () => {
    const volume = await Volume.create(unique('files'), as(adminKey));
    const written = await volume.writeFile('/notes/hello.txt', 'hello volume', { force: true });
    expect(written).toMatchObject({
      name: 'hello.txt',
      path: '/notes/hello.txt',
      type: 'file',
      size: 12,
      mode: 0o644,
      uid: 1000,
      gid: 1000,
    });
    expect(written.mtime).toBeInstanceOf(Date);
    expect(await volume.readFile('/notes/hello.txt')).toBe('hello volume');
    expect(
      new TextDecoder().decode(await volume.readFile('/notes/hello.txt', { format: 'bytes' })),
    ).toBe('hello volume');
    expect(await text(await volume.readFile('/notes/hello.txt', { format: 'stream' }))).toBe(
      'hello volume',
    );

    // Without force an existing file is kept (409) and a missing folder is not made (404).
    await expect(volume.writeFile('/notes/hello.txt', 'other')).rejects.toThrow(/^409: /);
    await expect(volume.writeFile('/none/file', 'x')).rejects.toBeInstanceOf(
      VolumePathNotFoundError,
    );
    expect(await volume.readFile('/notes/hello.txt')).toBe('hello volume');

    // Several MiB, streamed through the gateway both ways.
    const big = randomBytes(6 * 1024 * 1024);
    await volume.writeFile('/big.bin', new Blob([big]));
    const back = await volume.readFile('/big.bin', { format: 'bytes' });
    expect(createHash('sha256').update(back).digest('hex')).toBe(
      createHash('sha256').update(big).digest('hex'),
    );

    const dir = await volume.makeDir('/a/b/c', { force: true, mode: 0o700 });
    expect(dir).toMatchObject({ path: '/a/b/c', type: 'directory', mode: 0o700, uid: 1000 });
    await expect(volume.makeDir('/a')).rejects.toThrow(/^409: /);
    expect((await volume.makeDir('/a', { force: true })).type).toBe('directory');
    expect((await volume.list('/')).map((e) => e.path)).toEqual(['/a', '/big.bin', '/notes']);
    expect((await volume.list('/', { depth: 3 })).map((e) => `${e.type} ${e.path}`)).toEqual([
      'directory /a',
      'directory /a/b',
      'directory /a/b/c',
      'file /big.bin',
      'directory /notes',
      'file /notes/hello.txt',
    ]);

    expect(await volume.exists('/notes/hello.txt')).toBe(true);
    expect(await volume.exists('/notes/nothing')).toBe(false);
    expect(await volume.getInfo('/')).toMatchObject({ type: 'directory', uid: 1000 });
    const changed = await volume.updateMetadata('/notes/hello.txt', { mode: 0o600, uid: 1000 });
    expect(changed.mode).toBe(0o600);
    // Only the sandbox user's ids: any other owner would be nobody in every sandbox.
    await expect(volume.updateMetadata('/notes/hello.txt', { uid: 0 })).rejects.toThrow(
      /^400: uid 0: .*uid 1000/,
    );

    // `..` stays inside the volume, as E2B's server cleans a path.
    expect(await volume.readFile('/../../notes/../notes/hello.txt')).toBe('hello volume');
    await expect(volume.readFile('/../../etc/passwd')).rejects.toBeInstanceOf(
      VolumePathNotFoundError,
    );

    await volume.remove('/a');
    await volume.remove('/notes/hello.txt');
    expect((await volume.list('/', { depth: 2 })).map((e) => e.path)).toEqual([
      '/big.bin',
      '/notes',
    ]);
    await expect(volume.remove('/a')).rejects.toBeInstanceOf(VolumePathNotFoundError);
    await expect(volume.readFile('/a/nothing')).rejects.toBeInstanceOf(VolumePathNotFoundError);
    await expect(volume.list('/', { depth: 11 })).rejects.toThrow(/^400: depth must be/);
    await expect(volume.remove('/')).rejects.toThrow(/^400: the root of volume/);
    expect(await Volume.destroy(volume.volumeId, as(adminKey))).toBe(true);
  });

  test('the content API takes only the volume’s own token', async () => {
    const volume = await Volume.create(unique('token'), as(adminKey));
    const other = await Volume.create(unique('token'), as(otherKey));
    await volume.writeFile('/secret.txt', 'mine');

    // The SDK with a wrong token, and another volume's token for this one.
    const wrong = new Volume(volume.volumeId, volume.name, 'not-the-token');
    await expect(wrong.readFile('/secret.txt')).rejects.toBeInstanceOf(AuthenticationError);
    const borrowed = new Volume(volume.volumeId, volume.name, other.token);
    await expect(borrowed.readFile('/secret.txt')).rejects.toBeInstanceOf(AuthenticationError);
    await expect(borrowed.writeFile('/x', 'x')).rejects.toBeInstanceOf(AuthenticationError);

    const path = `/volumecontent/${volume.volumeId}/file?path=/secret.txt`;
    expect(await content('GET', path, null)).toEqual({
      status: 401,
      body: { code: '401', message: expect.stringContaining('missing token') },
    });
    expect((await content('GET', path, adminKey)).status).toBe(401);
    expect(
      (await content('GET', '/volumecontent/vol_0000/file?path=/x', volume.token)).status,
    ).toBe(401);
    // With the token: a route that is not one is 404, a method a route does not take 405.
    expect(
      (await content('GET', `/volumecontent/${volume.volumeId}/nope`, volume.token)).status,
    ).toBe(404);
    expect(
      await content('POST', `/volumecontent/${volume.volumeId}/path?path=/x`, volume.token),
    ).toMatchObject({ status: 405, allow: 'GET, DELETE, PATCH' });
    expect(
      (await content('GET', `/volumecontent/${volume.volumeId}/file`, volume.token)).status,
    ).toBe(400);
    expect(await volume.readFile('/secret.txt')).toBe('mine');
    expect(await Volume.destroy(other.volumeId, as(otherKey))).toBe(true);
    expect(await Volume.destroy(volume.volumeId, as(adminKey))).toBe(true);
    // The token ends with its volume.
    expect((await content('GET', path, volume.token)).status).toBe(401);
  });

  test("a revoked key's volumes are not reached by their tokens any more", async () => {
    const key = await ApiKeys.create(`revoked-${Date.now()}`, { home: abx.home, format: 'e2b' });
    const volume = await Volume.create(unique('revoked'), as(key.key));
    await volume.writeFile('/f.txt', 'before');
    expect(await volume.readFile('/f.txt')).toBe('before');
    await ApiKeys.revoke(key.id, { home: abx.home });
    await expect(volume.readFile('/f.txt')).rejects.toBeInstanceOf(AuthenticationError);
    await expect(volume.writeFile('/g.txt', 'after')).rejects.toBeInstanceOf(AuthenticationError);
    // Its disk is unmounted by the file's teardown.
  });

  test('Sandbox.create({ volumeMounts }): sandboxes see and write the files the API sees; info and list show the mounts; an in-use volume is not destroyed', async ({
    made,
  }) => {
    const volume = await Volume.create(unique('shared'), as(adminKey));
    await volume.writeFile('/from-api.txt', 'written by the API');

    const sandbox = made(
      await Sandbox.create({ ...as(adminKey), volumeMounts: { '/mnt/data': volume } }),
    );
    expect(await run(sandbox, 'cat /mnt/data/from-api.txt')).toBe('written by the API');
    // The files are the sandbox user's, whoever wrote them.
    expect(await run(sandbox, 'stat -c "%u %g %a" /mnt/data/from-api.txt')).toBe('1000 1000 644');
    await sandbox.commands.run('echo written in a sandbox > /mnt/data/from-sandbox.txt');
    expect(await volume.readFile('/from-sandbox.txt')).toBe('written in a sandbox\n');
    expect(await volume.getInfo('/from-sandbox.txt')).toMatchObject({ uid: 1000, gid: 1000 });

    const shown = await sandbox.getInfo();
    expect(shown.volumeMounts).toEqual([{ name: volume.name, path: '/mnt/data' }]);
    const listed = await Sandbox.list(as(adminKey)).nextItems();
    expect(listed.find((s) => s.sandboxId === sandbox.sandboxId)?.volumeMounts).toEqual([
      { name: volume.name, path: '/mnt/data' },
    ]);

    // A second sandbox mounts it by name, in its home: it sees what the first wrote.
    const second = made(
      await Sandbox.create({
        ...as(adminKey),
        volumeMounts: { '/home/user/shared': volume.name },
      }),
    );
    expect(await run(second, 'cat /home/user/shared/from-sandbox.txt')).toBe(
      'written in a sandbox',
    );

    const inUse = await Volume.destroy(volume.volumeId, as(adminKey)).catch((e: unknown) => e);
    expect(inUse).toBeInstanceOf(VolumeError);
    expect((inUse as Error).message).toMatch(/^409: volume .* is mounted by sandboxes/);
    expect(await volume.readFile('/from-api.txt')).toBe('written by the API');

    await sandbox.kill();
    await second.kill();
    expect(await Volume.destroy(volume.volumeId, as(adminKey))).toBe(true);
  });

  test('links a sandbox leaves in a volume never lead the content API out of it', async ({
    made,
  }) => {
    const volume = await Volume.create(unique('links'), as(adminKey));
    const sandbox = made(
      await Sandbox.create({ ...as(adminKey), volumeMounts: { '/mnt/v': volume } }),
    );
    await sandbox.commands.run(
      'ln -s /etc /mnt/v/etc && ln -s /etc/hostname /mnt/v/hostname && mkdir /mnt/v/d && ln -s / /mnt/v/d/root',
    );
    const before = readFileSync('/etc/hostname', 'utf8');

    await expect(volume.readFile('/etc/passwd')).rejects.toThrow(/^400: .*symbolic link/);
    await expect(volume.readFile('/hostname')).rejects.toThrow(/^400: .*symbolic link/);
    await expect(volume.list('/etc')).rejects.toThrow(/^400: /);
    await expect(volume.writeFile('/etc/abx-was-here', 'x', { force: true })).rejects.toThrow(
      /^400: /,
    );
    await expect(volume.updateMetadata('/hostname', { mode: 0o777 })).rejects.toThrow(/^400: /);
    await expect(volume.makeDir('/d/root/tmp/abx-was-here', { force: true })).rejects.toThrow(
      /^400: /,
    );
    expect(existsSync('/etc/abx-was-here')).toBe(false);
    expect(existsSync('/tmp/abx-was-here')).toBe(false);

    expect(await volume.getInfo('/etc')).toMatchObject({ type: 'symlink', target: '/etc' });
    // A listing shows the links as links and does not descend into them.
    expect((await volume.list('/', { depth: 3 })).map((e) => `${e.type} ${e.path}`)).toEqual([
      'directory /d',
      'symlink /d/root',
      'symlink /etc',
      'symlink /hostname',
    ]);
    // Removing removes the links, never what they point to.
    await volume.remove('/d');
    await volume.remove('/etc');
    await volume.writeFile('/hostname', 'mine now', { force: true });
    expect(await run(sandbox, 'cat /mnt/v/hostname; echo; ls /mnt/v')).toBe('mine now\nhostname');
    expect(readFileSync('/etc/hostname', 'utf8')).toBe(before);
    expect(existsSync('/etc/passwd')).toBe(true);
  });

  test('bad volumeMounts: E2B’s invalid mounts message, every bad mount listed, nothing started', async () => {
    const volume = await Volume.create(unique('mounts'), as(adminKey));
    const theirs = await Volume.create(unique('theirs'), as(otherKey));
    const before = (await Sandbox.list(as(adminKey)).nextItems()).length;

    // Through the SDK: an unknown name.
    const unknown = await Sandbox.create({
      ...as(adminKey),
      volumeMounts: { '/mnt/x': 'no-such-volume' },
    }).catch((error: unknown) => error);
    expect(unknown).toBeInstanceOf(SandboxError);
    expect((unknown as Error).message).toBe(
      "400: invalid mounts:\n\t- volume mount #0: volume 'no-such-volume' not found",
    );

    const v = volume.name;
    const refused = await raw('POST', '/v2/sandboxes', {
      templateID: 'base',
      volumeMounts: [
        { name: theirs.name, path: '/mnt/a' },
        { name: v, path: 'relative' },
        { name: v, path: '/mnt/../etc' },
        { name: v, path: '/etc/x' },
        { name: v, path: '/mnt/ok' },
        { name: v, path: '/mnt/ok' },
        { name: v, path: '/mnt/ok/inner' },
        { name: v, path: '' },
      ],
    });
    expect(refused.status).toBe(400);
    expect(refused.body.code).toBe(400);
    expect(refused.body.message.split('\n')).toEqual([
      'invalid mounts:',
      `\t- volume mount #0: volume '${theirs.name}' not found`,
      '\t- volume mount #1: path must be absolute',
      "\t- volume mount #2: path must not contain any '.' or '..' components",
      expect.stringMatching(
        /^\t- volume mount #3: path '\/etc\/x' is not a place abx mounts a volume: use a folder inside \/home\/user, \/tmp, \/mnt/,
      ),
      "\t- volume mount #5: path '/mnt/ok' is already used",
      "\t- volume mount #6: path '/mnt/ok/inner' overlaps '/mnt/ok', the path of another mount: give each volume a folder of its own",
      '\t- volume mount #7: path cannot be empty',
    ]);
    for (const body of [{ volumeMounts: { '/mnt/x': v } }, { volumeMounts: 'data' }]) {
      const wrong = await raw('POST', '/v2/sandboxes', body);
      expect(wrong.status).toBe(400);
      expect(wrong.body.message).toMatch(/^volumeMounts must be a list of \{ name, path \}/);
    }
    expect((await Sandbox.list(as(adminKey)).nextItems()).length).toBe(before);
    expect(await Volume.destroy(theirs.volumeId, as(otherKey))).toBe(true);
    expect(await Volume.destroy(volume.volumeId, as(adminKey))).toBe(true);
  });
});

describe("a rootless daemon's volumes through the E2B SDK", () => {
  let daemon: RootlessDaemon;
  let opts: { apiKey: string; apiUrl: string; sandboxUrl: string; requestTimeoutMs: number };

  beforeAll(async () => {
    daemon = await startRootlessDaemon();
    const started = JSON.parse(readFileSync(join(daemon.home, 'daemon.json'), 'utf8'));
    opts = {
      apiKey: readFileSync(join(daemon.home, 'api-key'), 'utf8').trim(),
      apiUrl: started.gatewayUrl,
      sandboxUrl: started.gatewayUrl,
      requestTimeoutMs: 60_000,
    };
  }, 120_000);

  afterAll(async () => {
    await daemon?.close();
  }, 120_000);

  test("a folder of the daemon's uid: the API's files are the sandbox user's, and the sandbox's the API's", async ({
    made,
  }) => {
    const volume = await Volume.create(unique('rootless'), opts);
    const at = { apiUrl: opts.apiUrl };
    await volume.writeFile('/from-api.txt', 'written by the API', { ...at, force: true });
    const sandbox = made(await Sandbox.create({ ...opts, volumeMounts: { '/mnt/r': volume } }));
    expect(await run(sandbox, 'stat -c "%u %g" /mnt/r/from-api.txt; cat /mnt/r/from-api.txt')).toBe(
      '1000 1000\nwritten by the API',
    );
    await sandbox.commands.run('mkdir /mnt/r/d && echo from the sandbox > /mnt/r/d/f.txt');
    expect(await volume.readFile('/d/f.txt', at)).toBe('from the sandbox\n');
    expect(await volume.getInfo('/d/f.txt', at)).toMatchObject({ uid: 1000, gid: 1000 });
    await sandbox.commands.run('ln -s / /mnt/r/root');
    await expect(volume.readFile('/root/etc/passwd', at)).rejects.toThrow(/^400: .*symbolic link/);
    await sandbox.kill();
    expect(await Volume.destroy(volume.volumeId, opts)).toBe(true);
  });
});
