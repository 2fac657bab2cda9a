import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, Template, Templates } from '../../src/index.js';
import { engineAddress, probeEngine } from '../../src/providers/docker/engine.js';
import {
  type DockerEngine,
  logText,
  type MountSettings,
} from '../../src/providers/docker/engine-client.js';
import {
  DockerVolumes,
  dockerVolumeName,
  volumeMount,
} from '../../src/providers/docker/volumes.js';
import { mountsUnder, unmountUnder } from '../../src/providers/local/volumes.js';
import { type DockerHome, dockerHome } from '../compat/e2b/docker-home.js';
import { removeTemplates } from '../helpers/abx-home.js';
import { call, type Json } from '../helpers/api-call.js';
import { DEBIAN_IMAGE, dockerEngine, ensureDebianImage } from '../helpers/docker-images.js';

// Volumes on the Docker provider. With a root daemon: a Docker named volume each, bound to an ext4
// disk of its size, shared by sandboxes as uid 1000, read-write or read-only, kept when they end.
// Without (here: the engine taken for a rootless one), a plain named volume of the user's whose
// size is reported, not enforced.

const engine = await dockerEngine();
const MiB = 1024 * 1024;

/** Runs `script` in a throwaway container of uid 1000 (no capabilities) with `mounts`; its output. */
async function runAsUser(
  docker: DockerEngine,
  mounts: MountSettings[],
  script: string,
): Promise<string> {
  const container = await docker.createContainer({
    Image: DEBIAN_IMAGE,
    User: '1000:1000',
    Cmd: ['sh', '-c', script],
    NetworkDisabled: true,
    HostConfig: { NetworkMode: 'none', CapDrop: ['ALL'], Mounts: mounts },
  });
  try {
    await container.start();
    const { StatusCode } = await container.wait();
    const output = logText(await container.logs({ stdout: true, stderr: true })).trim();
    if (StatusCode !== 0) throw new Error(`exit ${StatusCode}: ${output}`);
    return output;
  } finally {
    await container.remove({ force: true });
  }
}

if (engine.docker) {
  const docker = engine.docker;

  test('where the daemon cannot make a disk, a plain named volume of the user, its size reported', async () => {
    await ensureDebianImage(docker);
    const facts = await probeEngine(docker);
    const store = new DockerVolumes(
      docker,
      async () => ({ ...facts, rootless: true }),
      engineAddress(docker),
    );
    const dir = mkdtempSync(join(tmpdir(), 'abx-plain-volume-'));
    const volume = {
      id: `vol_${randomBytes(10).toString('hex')}`,
      name: 'plain',
      sizeBytes: 16 * MiB,
      dir: join(dir, 'volume'),
    };
    try {
      expect(store.unavailable()).toBeUndefined();
      await store.create(volume);
      const made = await docker.getVolume(dockerVolumeName(volume)).inspect();
      expect(made.Options ?? {}).toEqual({});
      expect(made.Labels).toMatchObject({ 'abx.volume': volume.id, 'abx.volume-name': 'plain' });
      const mount = (path: string, readOnly = false) => volumeMount({ volume, path, readOnly });
      // No copy-up: mounted over a folder of the image (root's, with files), it stays empty and
      // the user's.
      expect(
        await runAsUser(docker, [mount('/etc/apt')], 'stat -c "%u:%g" /etc/apt; ls -A /etc/apt'),
      ).toBe('1000:1000');
      expect(
        await runAsUser(
          docker,
          [mount('/mnt/v')],
          'head -c 3145728 /dev/zero > /mnt/v/three && mkdir /mnt/v/d && stat -c "%u:%g %a" /mnt/v',
        ),
      ).toBe('1000:1000 755');
      expect(
        await runAsUser(
          docker,
          [mount('/home/x/v', true)],
          'ls -ln /home/x/v | tail -n +2 | awk \'{print $3":"$4, $9}\'; touch /home/x/v/no 2>&1 || true',
        ),
      ).toBe(
        "1000:1000 d\n1000:1000 three\ntouch: cannot touch '/home/x/v/no': Read-only file system",
      );
      const usage = await store.usage(volume);
      expect(usage).toMatchObject({ total: 16 * MiB, enforced: false });
      expect(usage.used).toBeGreaterThanOrEqual(3 * MiB);
      expect(usage.used).toBeLessThan(4 * MiB);
      await store.remove(volume);
      await expect(docker.getVolume(dockerVolumeName(volume)).inspect()).rejects.toMatchObject({
        statusCode: 404,
      });
      await store.remove(volume);
    } finally {
      await docker
        .getVolume(dockerVolumeName(volume))
        .remove()
        .catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    }
  }, 300_000);
}

if (!engine.docker) {
  describe.skip(`volumes on Docker: skipped, ${engine.reason}`, () => {
    test('volumes', () => undefined);
  });
} else if (process.getuid?.() !== 0) {
  describe.skip('volumes on Docker: skipped, the quota needs a root daemon (run as root)', () => {
    test('volumes', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: DockerHome;
  /** Ids of the volumes this file made (their Docker volumes carry them as a label). */
  const volumeIds: string[] = [];
  const boxes: Sandbox[] = [];

  beforeAll(async () => {
    abx = await dockerHome(docker);
  }, 900_000);

  afterAll(async () => {
    await Promise.all(boxes.map((box) => box.kill().catch(() => undefined)));
    await removeTemplates(abx?.home);
    for (const name of ['shared', 'small', 'kept', 'fresh']) {
      await api('DELETE', `/v1/volumes/${name}`).catch(() => undefined);
    }
    if (abx) {
      // Never a recursive removal of the home across a volume's mount.
      await unmountUnder(join(abx.home, 'volumes')).catch(() => undefined);
      await abx.close();
    }
    for (const id of volumeIds) {
      await docker
        .getVolume(`abx-vol-${id.replace(/^vol_/, '')}`)
        .remove()
        .catch(() => undefined);
    }
  }, 120_000);

  const api = async (method: string, path: string, body?: unknown) =>
    call(`${abx.info.apiUrl}${path}`, {
      method,
      headers: { authorization: `Bearer ${abx.apiKey}` },
      ...(body === undefined ? {} : { body }),
    });

  async function makeVolume(name: string, size: string): Promise<Json> {
    const made = await api('POST', '/v1/volumes', { name, size });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    volumeIds.push(made.body.volumeId);
    return made.body;
  }

  /** A sandbox with `volumeMounts`, connected through the SDK. */
  async function sandboxWith(
    volumeMounts: { name: string; path: string; readOnly?: boolean }[],
  ): Promise<Sandbox> {
    const made = await api('POST', '/v1/sandboxes', { volumeMounts });
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    const box = await Sandbox.connect(made.body.sandboxId, { home: abx.home });
    boxes.push(box);
    return box;
  }

  async function run(box: Sandbox, command: string): Promise<string> {
    const result = await box.commands.run(command);
    return result.stdout.trim();
  }

  /** The exit code and error output of a command expected to fail. */
  async function failing(
    box: Sandbox,
    command: string,
  ): Promise<{ exitCode: number; stderr: string }> {
    try {
      await box.commands.run(command);
    } catch (error) {
      const { exitCode, stderr } = error as { exitCode: number; stderr: string };
      return { exitCode, stderr };
    }
    throw new Error(`${command} succeeded`);
  }

  test('two sandboxes share a volume both ways as uid 1000; a read-only mount refuses writes', async () => {
    await makeVolume('shared', '64M');
    const a = await sandboxWith([{ name: 'shared', path: '/home/user/work/data' }]);
    const b = await sandboxWith([{ name: 'shared', path: '/mnt/shared' }]);
    const reader = await sandboxWith([{ name: 'shared', path: '/mnt/ro', readOnly: true }]);

    await run(a, 'echo from-a > /home/user/work/data/a.txt && mkdir /home/user/work/data/dir');
    expect(await run(b, 'cat /mnt/shared/a.txt')).toBe('from-a');
    await run(b, 'echo from-b > /mnt/shared/b.txt && echo more >> /mnt/shared/a.txt');
    expect(await run(a, 'cat /home/user/work/data/b.txt /home/user/work/data/a.txt')).toBe(
      'from-b\nfrom-a\nmore',
    );
    // Everything is the sandbox user's in each of them: the root, files, folders.
    for (const [box, path] of [
      [a, '/home/user/work/data'],
      [b, '/mnt/shared'],
      [reader, '/mnt/ro'],
    ] as const) {
      expect(await run(box, `stat -c '%u:%g %a' ${path}`)).toBe('1000:1000 755');
      const owners = (await run(box, `ls -ln ${path} | tail -n +2 | awk '{print $3":"$4}'`)).split(
        '\n',
      );
      expect(owners).toEqual(['1000:1000', '1000:1000', '1000:1000']);
    }
    // The folder above a volume in the home is the user's too (the engine made it).
    expect(await run(a, 'stat -c %u /home/user/work && touch /home/user/work/beside')).toBe('1000');

    expect(await run(reader, 'cat /mnt/ro/b.txt')).toBe('from-b');
    const refused = await failing(reader, 'echo no > /mnt/ro/c.txt');
    expect(refused.exitCode).not.toBe(0);
    expect(refused.stderr).toMatch(/Read-only file system/);
    expect(await run(b, 'ls /mnt/shared')).toBe('a.txt\nb.txt\ndir');

    const info = await api('GET', '/v1/volumes/shared');
    expect(info.body.usedBy.sort()).toEqual([a, b, reader].map((box) => box.sandboxId).sort());
    expect(info.body.quotaEnforced).toBe(true);
    for (const box of [a, b, reader]) await box.kill();
  }, 300_000);

  test("a template's home files at a volume's mount point stay out of the volume", async () => {
    await Templates.build(
      Template.fromBase().runCmd(
        'mkdir -p data && echo template > data/t.txt && echo x > keep.txt',
      ),
      { home: abx.home, name: 'with-data' },
    );
    await makeVolume('fresh', '16M');
    const made = await api('POST', '/v1/sandboxes', {
      template: 'with-data',
      volumeMounts: [{ name: 'fresh', path: '/home/user/data' }],
    });
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    const box = await Sandbox.connect(made.body.sandboxId, { home: abx.home });
    boxes.push(box);
    expect(await run(box, 'cat ~/keep.txt; ls -A ~/data; stat -c %u ~/data')).toBe('x\n1000');
    await box.kill();
  }, 300_000);

  test('a write past the size fails with ENOSPC, and the volume reports itself full', async () => {
    await makeVolume('small', '16M');
    const box = await sandboxWith([{ name: 'small', path: '/mnt/small' }]);
    const full = await failing(box, 'dd if=/dev/zero of=/mnt/small/big bs=1M count=32');
    expect(full.stderr).toMatch(/No space left on device/);
    const info = await api('GET', '/v1/volumes/small');
    expect(info.status).toBe(200);
    expect(info.body.totalBytes).toBeLessThanOrEqual(16 * MiB);
    expect(info.body.usedBytes).toBeGreaterThan(info.body.totalBytes * 0.9);
    // The engine's own disk was not written: the file is on the volume, as big as the volume.
    const size = Number(await run(box, 'stat -c %s /mnt/small/big'));
    expect(size).toBeGreaterThan(10 * MiB);
    expect(size).toBeLessThan(16 * MiB);
    await run(box, 'rm /mnt/small/big');
    const after = await api('GET', '/v1/volumes/small');
    expect(after.body.usedBytes).toBeLessThan(after.body.totalBytes * 0.2);
    await box.kill();
  }, 300_000);

  test('a volume outlives its sandboxes, follows hibernation and forks, and is removed only once unmounted', async () => {
    const volume = await makeVolume('kept', '32M');
    const box = await sandboxWith([{ name: 'kept', path: '/home/user/kept' }]);
    await run(box, 'echo before > /home/user/kept/note.txt');

    await box.pause({ memory: false });
    const refused = await api('DELETE', '/v1/volumes/kept');
    expect(refused.status).toBe(409);
    expect(refused.body).toMatchObject({ code: 'volume_in_use', users: [box.sandboxId] });
    expect(refused.body.error).toContain(`mounted by sandbox ${box.sandboxId}`);
    // As after a reboot: the disk is no longer mounted on the host; the wake mounts it again.
    const mnt = join(abx.home, 'volumes', volume.volumeId, 'mnt');
    execFileSync('umount', [mnt]);
    expect(mountsUnder(mnt)).toEqual([]);
    await box.resume();
    expect(mountsUnder(mnt)).toEqual([mnt]);
    expect(
      await run(box, 'cat /home/user/kept/note.txt && df -k /home/user/kept | tail -1'),
    ).toMatch(/^before\n\S+\s+\d+/);
    const size = Number((await run(box, 'df -k /home/user/kept | tail -1')).split(/\s+/)[1]);
    expect(size * 1024).toBeLessThanOrEqual(32 * MiB);

    const [fork] = await box.fork();
    if (!fork) throw new Error('no fork');
    boxes.push(fork);
    await run(fork, 'echo from-fork >> /home/user/kept/note.txt');
    expect(await run(box, 'cat /home/user/kept/note.txt')).toBe('before\nfrom-fork');
    const busy = await api('DELETE', '/v1/volumes/kept');
    expect(busy.status).toBe(409);
    expect(busy.body.users.sort()).toEqual([box.sandboxId, fork.sandboxId].sort());
    await fork.kill();
    await box.kill();

    const later = await sandboxWith([{ name: 'kept', path: '/mnt/later' }]);
    expect(await run(later, 'cat /mnt/later/note.txt && stat -c %u /mnt/later/note.txt')).toBe(
      'before\nfrom-fork\n1000',
    );
    await later.kill();

    const dir = join(abx.home, 'volumes', volume.volumeId);
    expect(existsSync(join(dir, 'disk.img'))).toBe(true);
    const removed = await api('DELETE', '/v1/volumes/kept');
    expect(removed.status).toBe(200);
    expect(removed.body.removed).toBe(true);
    expect((await api('GET', '/v1/volumes/kept')).status).toBe(404);
    expect(existsSync(dir)).toBe(false);
    // Gone already is fine (and answers 404 as any unknown volume).
    expect((await api('DELETE', '/v1/volumes/kept')).status).toBe(404);
  }, 300_000);

  test('nothing is left on the engine or the host: containers, volumes, loop devices, mounts', async () => {
    for (const name of ['shared', 'small', 'fresh']) {
      expect((await api('DELETE', `/v1/volumes/${name}`)).status).toBe(200);
    }
    const ids = boxes.map((box) => `abx-${box.sandboxId}`);
    const containers = await docker.listContainers({ all: true });
    expect(containers.filter((c) => c.Names.some((n) => ids.includes(n.slice(1))))).toEqual([]);
    expect(await docker.listContainers({ all: true, filters: { label: ['abx.volume'] } })).toEqual(
      [],
    );
    const volumes = (await docker.listVolumes()).Volumes ?? [];
    expect(
      volumes.filter((v) => volumeIds.includes(v.Labels?.['abx.volume'] ?? '')).map((v) => v.Name),
    ).toEqual([]);
    expect(volumeIds).toHaveLength(4);
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .filter((line) => line.includes(abx.home));
    expect(mounts).toEqual([]);
    const loops = execFileSync('losetup', ['-a'], { encoding: 'utf8' })
      .split('\n')
      .filter((line) => line.includes(abx.home));
    expect(loops).toEqual([]);
  }, 120_000);
}
