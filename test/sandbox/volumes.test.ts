import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  type DaemonInfo,
  Sandbox,
  Template,
  Templates,
  Volume,
  VolumeConflictError,
  VolumeNotFoundError,
} from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';
import { DEBIAN_IMAGE, dockerEngine, ensureDebianImage } from '../helpers/docker-images.js';
import { type RootlessDaemon, startRootlessDaemon } from '../helpers/rootless.js';

// Volumes on the local provider: a root daemon's ext4 disk per volume, idmapped into each sandbox
// (its files the sandbox user's inside, one reserved host uid's on disk), and a rootless daemon's
// plain folder. Files go both ways between sandboxes, outlive them, and keep to the quota.

/** The host uid that owns a root daemon's volume files: below the default sandbox uid range. */
const VOLUME_UID = 1_500_000_000 - 1;

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;
let rootless: RootlessDaemon;

const daemonInfo = (at = home) =>
  JSON.parse(readFileSync(join(at, 'daemon.json'), 'utf8')) as DaemonInfo;
const adminKey = (at = home) => readFileSync(join(at, 'api-key'), 'utf8').trim();

/** A raw call of a daemon's API with a key (default: the daemon's own). */
async function api(method: string, path: string, body?: unknown, key = adminKey()) {
  const response = await request(`${daemonInfo().apiUrl}${path}`, {
    method: method as 'POST',
    headers: {
      authorization: `Bearer ${key}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await response.body.text();
  return {
    status: response.statusCode,
    body: (text ? JSON.parse(text) : undefined) as Record<string, unknown> & {
      type?: string;
      code?: string;
      error?: string;
    },
  };
}

async function killAll(boxes: (Sandbox | undefined)[]): Promise<void> {
  await Promise.all(boxes.map((box) => box?.kill().catch(() => undefined)));
}

/** `stdout` of a shell command in a sandbox, trimmed; fails the test when it fails. */
async function sh(box: Sandbox, command: string): Promise<string> {
  return (await box.commands.run(command)).stdout.trim();
}

/** stderr and exit code of a command expected to fail. */
async function fails(box: Sandbox, command: string): Promise<{ code: number; stderr: string }> {
  const result = await box.commands.run(command).catch((error: { result?: unknown }) => {
    if (!error.result) throw error;
    return error.result as { exitCode: number; stderr: string };
  });
  return { code: result.exitCode, stderr: result.stderr };
}

/** The host uids a sandbox's processes run as. */
function hostUids(id: string): Set<number> {
  return new Set(
    sandboxProcesses(id).flatMap((pid) => {
      try {
        return [Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1])];
      } catch {
        return [];
      }
    }),
  );
}

/** Whether anything is mounted at or under `dir` on the host. */
function mountedUnder(dir: string): boolean {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .some((line) => {
      const point = line.split(' ')[4];
      return point !== undefined && (point === dir || point.startsWith(`${dir}/`));
    });
}

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
  await startDaemon(home);
  rootless = await startRootlessDaemon();
}, 300_000);

afterAll(async () => {
  await rootless?.close();
  await abx?.close();
}, 120_000);

/** What both daemons do the same way. */
function sharedCases(name: string, at: () => string, root: boolean): void {
  describe(name, () => {
    test('two sandboxes share a volume both ways, as their own user; it outlives them', async () => {
      const volume = await Volume.create(`shared-${root ? 'root' : 'rootless'}`, {
        home: at(),
        size: '64M',
      });
      let a: Sandbox | undefined;
      let b: Sandbox | undefined;
      let c: Sandbox | undefined;
      try {
        a = await Sandbox.create({
          home: at(),
          volumeMounts: [{ name: volume.name, path: '/mnt/data' }],
        });
        // E2B's form: a map of path to volume.
        b = await Sandbox.create({ home: at(), volumeMounts: { '/home/user/data': volume } });
        await sh(a, 'echo from-a > /mnt/data/a.txt && mkdir -p /mnt/data/dir/deep');
        expect(await sh(b, 'cat ~/data/a.txt')).toBe('from-a');
        await sh(b, 'echo from-b > ~/data/dir/deep/b.txt && chmod 600 ~/data/dir/deep/b.txt');
        expect(await sh(a, 'cat /mnt/data/dir/deep/b.txt')).toBe('from-b');
        // Each sandbox sees every file as its own user's (uid 1000), whoever wrote it.
        expect(
          await sh(a, 'stat -c %u:%g /mnt/data/a.txt /mnt/data/dir/deep/b.txt /mnt/data'),
        ).toBe('1000:1000\n1000:1000\n1000:1000');
        expect(await sh(b, 'stat -c %U ~/data/a.txt')).toBe('user');
        expect((await a.getInfo()).volumeMounts).toEqual([
          { name: volume.name, path: '/mnt/data', readOnly: false },
        ]);
        if (root) {
          // On disk the files are the reserved volume uid's, not either sandbox's host uid.
          const file = join(at(), 'volumes', volume.volumeId, 'mnt', 'a.txt');
          expect(statSync(file).uid).toBe(VOLUME_UID);
          expect(hostUids(a.sandboxId)).not.toContain(VOLUME_UID);
          expect([...hostUids(a.sandboxId)][0]).not.toBe([...hostUids(b.sandboxId)][0]);
        }
        const info = await Volume.get(volume.name, { home: at() });
        expect(info.info.usedBy?.sort()).toEqual([a.sandboxId, b.sandboxId].sort());
        await killAll([a, b]);
        // Both gone: a new sandbox finds every file.
        c = await Sandbox.create({
          home: at(),
          volumeMounts: [{ name: volume.name, path: '/tmp/v' }],
        });
        expect(await sh(c, 'cat /tmp/v/a.txt /tmp/v/dir/deep/b.txt')).toBe('from-a\nfrom-b');
        expect((await Volume.get(volume.name, { home: at() })).info.usedBy).toEqual([c.sandboxId]);
      } finally {
        await killAll([a, b, c]);
        await Volume.remove(volume.name, { home: at() });
      }
    }, 180_000);

    test('from inside, a sandbox cannot unmount, cover, re-own or escalate through its volume', async () => {
      const volume = await Volume.create(`probe-${root ? 'root' : 'rootless'}`, {
        home: at(),
        size: '16M',
      });
      const box = await Sandbox.create({
        home: at(),
        volumeMounts: [{ name: volume.name, path: '/mnt/p' }],
      });
      try {
        await sh(box, 'echo kept > /mnt/p/f && cp /bin/true /mnt/p/suid && chmod 4755 /mnt/p/suid');
        for (const attack of [
          'umount /mnt/p',
          'umount -l /mnt/p',
          'mount --bind /tmp /mnt/p',
          'mount -o remount,suid /mnt/p',
          'chown 0:0 /mnt/p/f',
          'mknod /mnt/p/dev b 7 0',
        ]) {
          expect((await fails(box, attack)).code, attack).not.toBe(0);
        }
        // Still the volume, mounted nosuid and nodev: a set-uid file there gives nothing.
        const line = await sh(box, 'grep " /mnt/p " /proc/self/mountinfo');
        expect(line).toMatch(/nosuid/);
        expect(line).toMatch(/nodev/);
        expect(await sh(box, 'cat /mnt/p/f && stat -c %u /mnt/p/f')).toBe('kept\n1000');
        // The sandbox sees only its own volume's files, not the host's folder of volumes.
        expect(await sh(box, 'ls -A /mnt/p | sort | tr "\\n" " "')).toBe('f suid');
      } finally {
        await box.kill();
        await Volume.remove(volume.name, { home: at() });
      }
    }, 120_000);

    test('a read-only mount refuses writes while another sandbox writes the same volume', async () => {
      const volume = await Volume.create(`ro-${root ? 'root' : 'rootless'}`, {
        home: at(),
        size: '32M',
      });
      let writer: Sandbox | undefined;
      let reader: Sandbox | undefined;
      try {
        writer = await Sandbox.create({
          home: at(),
          volumeMounts: [{ name: volume.name, path: '/mnt/w' }],
        });
        reader = await Sandbox.create({
          home: at(),
          volumeMounts: [{ name: volume.name, path: '/mnt/r', readOnly: true }],
        });
        await sh(writer, 'echo one > /mnt/w/f');
        expect(await sh(reader, 'cat /mnt/r/f')).toBe('one');
        const refused = await fails(reader, 'echo two > /mnt/r/f');
        expect(refused.code).not.toBe(0);
        expect(refused.stderr).toMatch(/Read-only file system/);
        expect((await fails(reader, 'rm /mnt/r/f')).stderr).toMatch(/Read-only file system/);
        expect(await sh(writer, 'cat /mnt/w/f')).toBe('one');
        expect((await reader.getInfo()).volumeMounts).toEqual([
          { name: volume.name, path: '/mnt/r', readOnly: true },
        ]);
      } finally {
        await killAll([writer, reader]);
        await Volume.remove(volume.name, { home: at() });
      }
    }, 120_000);

    test('removal is refused while a sandbox mounts the volume, and leaves nothing after', async () => {
      const volume = await Volume.create(`busy-${root ? 'root' : 'rootless'}`, {
        home: at(),
        size: '16M',
      });
      const dir = join(at(), 'volumes', volume.volumeId);
      const box = await Sandbox.create({
        home: at(),
        volumeMounts: [{ name: volume.name, path: '/mnt/busy' }],
      });
      try {
        await sh(box, 'echo kept > /mnt/busy/f');
        const refused = await Volume.remove(volume.name, { home: at() }).catch((e) => e);
        expect(refused).toBeInstanceOf(VolumeConflictError);
        expect(refused.code).toBe('volume_in_use');
        expect(refused.message).toContain(box.sandboxId);
        expect(refused.details.users).toEqual([box.sandboxId]);
        // Refused means untouched: the sandbox still reads its file.
        expect(await sh(box, 'cat /mnt/busy/f')).toBe('kept');
        // A paused sandbox still mounts it.
        await box.pause();
        expect(await Volume.remove(volume.name, { home: at() }).catch((e) => e.code)).toBe(
          'volume_in_use',
        );
      } finally {
        await box.kill();
      }
      expect(await Volume.remove(volume.name, { home: at() })).toBe(true);
      expect(existsSync(dir)).toBe(false);
      if (root) expect(mountedUnder(dir)).toBe(false);
      expect(await Volume.remove(volume.name, { home: at() })).toBe(false);
      const gone = await Sandbox.create({
        home: at(),
        volumeMounts: [{ name: volume.name, path: '/mnt/busy' }],
      }).catch((e) => e);
      expect(gone).toBeInstanceOf(VolumeNotFoundError);
    }, 120_000);
  });
}

sharedCases('root daemon', () => home, true);
sharedCases('rootless daemon', () => rootless.home, false);

describe('root daemon: quota, restarts, hibernate and fork', () => {
  test('the size is a quota: a write past it fails with ENOSPC, and the volume reports it', async () => {
    const volume = await Volume.create('quota', { home, size: '16M' });
    const box = await Sandbox.create({
      home,
      volumeMounts: [{ name: 'quota', path: '/mnt/q' }],
    });
    try {
      const full = await fails(box, 'head -c 64M /dev/zero > /mnt/q/big');
      expect(full.stderr).toMatch(/No space left on device/);
      const info = (await Volume.get('quota', { home })).info;
      expect(info.quotaEnforced).toBe(true);
      expect(info.totalBytes).toBeLessThanOrEqual(16 * 1024 ** 2);
      expect(info.usedBytes).toBeGreaterThan((info.totalBytes as number) * 0.9);
      // The sandbox's own disk is untouched by the volume's: its home still takes writes.
      await sh(box, 'head -c 1M /dev/zero > ~/fine');
      // Freed space is usable again: the volume is full, not broken.
      await sh(box, 'rm /mnt/q/big && echo again > /mnt/q/small && cat /mnt/q/small');
    } finally {
      await box.kill();
      await Volume.remove(volume.name, { home });
    }
  }, 120_000);

  test('a volume survives a daemon SIGKILL and a host that lost its mount (a reboot)', async () => {
    const volume = await Volume.create('lasting', { home, size: '16M' });
    let box = await Sandbox.create({ home, volumeMounts: [{ name: 'lasting', path: '/mnt/l' }] });
    try {
      await sh(box, 'echo before > /mnt/l/f && sync');
      await box.kill();
      process.kill(daemonInfo().pid, 'SIGKILL');
      // What a reboot does: the host's mount of the volume's disk is gone.
      execFileSync('umount', [join(home, 'volumes', volume.volumeId, 'mnt')]);
      box = await Sandbox.create({ home, volumeMounts: [{ name: 'lasting', path: '/mnt/l' }] });
      expect(await sh(box, 'cat /mnt/l/f')).toBe('before');
    } finally {
      await box.kill();
      await Volume.remove(volume.name, { home });
    }
  }, 120_000);

  test('hibernate and wake mount the volume again; a fork mounts it too', async () => {
    await Volume.create('kept', { home, size: '16M' });
    const box = await Sandbox.create({ home, volumeMounts: [{ name: 'kept', path: '/mnt/k' }] });
    let forks: Sandbox[] = [];
    try {
      // Written just before the pause (E2B #884, #1104): kept.
      await sh(box, 'echo just-before > /mnt/k/f');
      await box.pause({ memory: false });
      await sh(box, 'echo after-wake >> /mnt/k/f');
      expect(await sh(box, 'cat /mnt/k/f')).toBe('just-before\nafter-wake');
      forks = await box.fork();
      const fork = forks[0] as Sandbox;
      await sh(fork, 'echo from-fork >> /mnt/k/f');
      expect(await sh(box, 'cat /mnt/k/f')).toBe('just-before\nafter-wake\nfrom-fork');
      expect((await fork.getInfo()).volumeMounts).toEqual([
        { name: 'kept', path: '/mnt/k', readOnly: false },
      ]);
    } finally {
      await killAll([box, ...forks]);
      await Volume.remove('kept', { home });
    }
  }, 180_000);

  test('a volume goes where no folder was: deep under /mnt, on the host system and in an image', async (context) => {
    await Volume.create('deep', { home, size: '16M' });
    const mounts = [{ name: 'deep', path: '/mnt/deep/er/path' }];
    const host = await Sandbox.create({ home, volumeMounts: mounts });
    let image: Sandbox | undefined;
    try {
      await sh(host, 'echo from-host > /mnt/deep/er/path/f');
      const engine = await dockerEngine();
      if (!engine.docker) {
        context.skip(`no Docker engine to export the image from: ${engine.reason}`);
        return;
      }
      await ensureDebianImage(engine.docker);
      await Templates.build(Template.fromImage(DEBIAN_IMAGE), { home, name: 'vol-debian' });
      // The launcher makes /mnt/deep/er/path in the image's overlay, as root, after checking it.
      image = await Sandbox.create({ home, template: 'vol-debian', volumeMounts: mounts });
      expect(await sh(image, 'cat /mnt/deep/er/path/f && stat -c %U /mnt/deep/er/path/f')).toBe(
        'from-host\nuser',
      );
      await sh(image, 'echo from-image >> /mnt/deep/er/path/f');
      expect(await sh(host, 'cat /mnt/deep/er/path/f')).toBe('from-host\nfrom-image');
    } finally {
      await killAll([host, image]);
      await Volume.remove('deep', { home });
      await Templates.remove('vol-debian', { home }).catch(() => undefined);
    }
  }, 600_000);

  test('volumes belong to the key that made them: another key sees none and cannot mount them', async () => {
    const alice = await ApiKeys.create('vol-alice', { home });
    const bob = await ApiKeys.create('vol-bob', { home });
    const asAlice = { apiUrl: daemonInfo().apiUrl, apiKey: alice.key };
    const asBob = { apiUrl: daemonInfo().apiUrl, apiKey: bob.key };
    const made = await api('POST', '/v1/volumes', { name: 'mine', size: '16M' }, alice.key);
    expect(made.status).toBe(201);
    let hers: Sandbox | undefined;
    let his: Sandbox | undefined;
    try {
      hers = await Sandbox.create({ ...asAlice, volumeMounts: [{ name: 'mine', path: '/mnt/m' }] });
      await sh(hers, 'echo alice > /mnt/m/secret');
      // Bob sees none of Alice's volumes, and cannot mount hers.
      expect((await api('GET', '/v1/volumes', undefined, bob.key)).body.volumes).toEqual([]);
      expect((await api('GET', '/v1/volumes/mine', undefined, bob.key)).status).toBe(404);
      const refused = await Sandbox.create({
        ...asBob,
        volumeMounts: [{ name: 'mine', path: '/mnt/m' }],
      }).catch((e) => e);
      expect(refused).toBeInstanceOf(VolumeNotFoundError);
      // The same name is free for another key: Bob's own "mine", without Alice's file.
      expect(
        (await api('POST', '/v1/volumes', { name: 'mine', size: '16M' }, bob.key)).status,
      ).toBe(201);
      his = await Sandbox.create({ ...asBob, volumeMounts: [{ name: 'mine', path: '/mnt/m' }] });
      expect(await sh(his, 'ls -A /mnt/m')).toBe('');
      expect(await sh(hers, 'cat /mnt/m/secret')).toBe('alice');
      // Nor may Bob remove hers: his removal takes his own.
      await his.kill();
      expect((await api('DELETE', '/v1/volumes/mine', undefined, bob.key)).status).toBe(200);
      expect((await api('GET', '/v1/volumes/mine', undefined, alice.key)).status).toBe(200);
      expect((await api('GET', '/v1/volumes', undefined)).body.volumes).toEqual([]);
    } finally {
      await killAll([hers, his]);
      await api('DELETE', '/v1/volumes/mine', undefined, alice.key);
      await api('DELETE', '/v1/volumes/mine', undefined, bob.key);
    }
  }, 120_000);
});

describe('bad input changes nothing', () => {
  test('bad names, sizes and duplicates are refused with what to do', async () => {
    for (const name of ['', 'a b', '../x', 'x/y', 'é', 'a'.repeat(64), 42, null]) {
      const answer = await api('POST', '/v1/volumes', { name });
      expect(answer.status, String(name)).toBe(400);
      expect(answer.body.code).toBe('invalid_volume_name');
    }
    for (const size of ['1K', '2T', 'lots', -5, 0, {}]) {
      const answer = await api('POST', '/v1/volumes', { name: 'sized', size });
      expect(answer.status, String(size)).toBe(400);
      expect(answer.body.error).toMatch(/size must be/);
    }
    expect((await api('POST', '/v1/volumes', ['not', 'an', 'object'])).status).toBe(400);
    expect((await api('GET', '/v1/volumes')).body.volumes).toEqual([]);
    expect((await api('POST', '/v1/volumes', { name: 'twice', size: '16M' })).status).toBe(201);
    const again = await api('POST', '/v1/volumes', { name: 'twice', size: '32M' });
    expect(again.status).toBe(409);
    expect(again.body.code).toBe('volume_exists');
    const kept = await api('GET', '/v1/volumes/twice');
    expect(kept.body.sizeBytes).toBe(16 * 1024 ** 2);
    expect((await api('DELETE', '/v1/volumes/twice')).body.removed).toBe(true);
    expect((await api('GET', '/v1/volumes/twice')).status).toBe(404);
    expect((await api('DELETE', '/v1/volumes/twice')).status).toBe(404);
  });

  test('bad mounts are refused before any sandbox starts', async () => {
    await Volume.create('target', { home, size: '16M' });
    const before = (await Sandbox.list({ home, all: true })).length;
    try {
      const cases: [unknown, RegExp][] = [
        [[{ name: 'nope', path: '/mnt/x' }], /no volume named nope/],
        [[{ name: 'target', path: 'mnt/x' }], /must be absolute/],
        [[{ name: 'target', path: '/mnt/../etc' }], /must not contain/],
        [[{ name: 'target', path: '/mnt/x/' }], /must not contain/],
        [[{ name: 'target', path: '/mnt//x' }], /must not contain/],
        [[{ name: 'target', path: '/etc/x' }], /not a place a volume can go/],
        [[{ name: 'target', path: '/usr/lib' }], /not a place a volume can go/],
        [[{ name: 'target', path: '/home/user' }], /not a place a volume can go/],
        [[{ name: 'target', path: '/tmp' }], /not a place a volume can go/],
        [[{ name: 'target', path: '/mnt' }], /not a place a volume can go/],
        [[{ name: 'target', path: '/home/other/x' }], /not a place a volume can go/],
        [[{ name: 'target', path: '/mnt/a\nb' }], /control character/],
        [
          [
            { name: 'target', path: '/mnt/a' },
            { name: 'target', path: '/mnt/a' },
          ],
          /is the path of another mount/,
        ],
        [
          [
            { name: 'target', path: '/mnt/a' },
            { name: 'target', path: '/mnt/a/b' },
          ],
          /overlaps the path of another mount/,
        ],
        [[{ name: 'target', path: '/mnt/x', readOnly: 'yes' }], /readOnly must be true or false/],
        [[{ name: 'target', path: '/mnt/x', size: 5 }], /size is not a mount key/],
        [[{ name: '../target', path: '/mnt/x' }], /volume name/],
        [{ name: 'target', path: '/mnt/x' }, /must be a list/],
        [['target'], /must be an object/],
      ];
      for (const [volumeMounts, message] of cases) {
        const answer = await api('POST', '/v1/sandboxes', { volumeMounts });
        expect(answer.status, JSON.stringify(volumeMounts)).toBeGreaterThanOrEqual(400);
        expect(answer.status).toBeLessThan(500);
        expect(answer.body.error, JSON.stringify(volumeMounts)).toMatch(message);
      }
      expect((await Sandbox.list({ home, all: true })).length).toBe(before);
      expect((await Volume.get('target', { home })).info.usedBy).toEqual([]);
    } finally {
      await Volume.remove('target', { home });
    }
  });
});
