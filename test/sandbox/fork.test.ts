import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { setSandboxEnv } from '../../src/control/envd-request.js';
import { openSqlite } from '../../src/control/sqlite.js';
import { Sandbox, Template, Templates } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';
import { call } from '../helpers/api-call.js';
import { DEBIAN_IMAGE, dockerEngine, ensureDebianImage } from '../helpers/docker-images.js';
import { type RootlessDaemon, startRootlessDaemon } from '../helpers/rootless.js';

// Forks on the local provider, a root daemon (a uid and a disk image per sandbox) and a rootless
// one (home and /tmp as tmpfs mounts): files come along, processes do not, and the copies are
// apart from then on.

/** Kills every sandbox given, even when some are gone already. */
async function killAll(boxes: (Sandbox | undefined)[]): Promise<void> {
  await Promise.all(boxes.map((box) => box?.kill().catch(() => undefined)));
}

/** The text of a file in a sandbox, or `missing`. */
async function read(box: Sandbox, path: string): Promise<string> {
  const result = await box.commands.run(`cat ${path} 2>/dev/null || echo missing`);
  return result.stdout.trim();
}

/** Whether a process whose command line is `sleep 4242` runs in the sandbox. */
async function sleeping(box: Sandbox): Promise<boolean> {
  const result = await box.commands.run(
    'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f" 2>/dev/null; echo; done | grep -c "^sleep 4242" || true',
  );
  return Number(result.stdout.trim()) > 0;
}

/** The host uids a sandbox's processes run as. */
function hostUids(id: string): Set<number> {
  return new Set(
    sandboxProcesses(id).flatMap((pid) => {
      try {
        const status = readFileSync(`/proc/${pid}/status`, 'utf8');
        return [Number(/^Uid:\s+(\d+)/m.exec(status)?.[1])];
      } catch {
        return [];
      }
    }),
  );
}

/** Adds variables to a running sandbox's environment through its envd (`PUT /env`). */
async function addEnv(at: string, box: Sandbox, env: Record<string, string>): Promise<void> {
  const db = openSqlite(join(at, 'abx.db'), { readOnly: true });
  try {
    const row = db.prepare('SELECT handle FROM sandboxes WHERE id = ?').get(box.sandboxId) as {
      handle: string;
    };
    await setSandboxEnv(JSON.parse(row.handle), box.accessToken, env);
  } finally {
    db.close();
  }
}

function forkCases(name: string, home: () => string, uidOfItsOwn: boolean): void {
  describe(name, () => {
    test('a fork has the source’s files in home and /tmp, not its processes, and each goes its own way', async () => {
      const source = await Sandbox.create({ home: home(), metadata: { team: 'a', run: '1' } });
      let forks: Sandbox[] = [];
      try {
        await source.commands.run(
          'echo home-before > ~/kept.txt && echo tmp-before > /tmp/kept.txt && mkdir -p ~/deep/er && ln -s ../kept.txt ~/deep/link',
        );
        await source.commands.start('sleep 4242');
        expect(await sleeping(source)).toBe(true);

        forks = await source.fork({ metadata: { run: '2' } });
        expect(forks).toHaveLength(1);
        const fork = forks[0] as Sandbox;
        expect(fork.sandboxId).not.toBe(source.sandboxId);
        if (uidOfItsOwn) {
          const [sourceUid] = [...hostUids(source.sandboxId)];
          expect(sourceUid).toBeGreaterThan(0);
          expect(hostUids(fork.sandboxId)).not.toContain(sourceUid);
          expect(hostUids(fork.sandboxId).size).toBeGreaterThan(0);
        }

        expect(await read(fork, '~/kept.txt')).toBe('home-before');
        expect(await read(fork, '/tmp/kept.txt')).toBe('tmp-before');
        expect(await read(fork, '~/deep/link')).toBe('home-before');
        // The fork's user owns what it inherited, and can change it.
        await fork.commands.run('echo changed >> /tmp/kept.txt && echo changed >> ~/kept.txt');
        expect(await read(fork, '/tmp/kept.txt')).toBe('tmp-before\nchanged');
        expect(await fork.commands.run('id -un').then((r) => r.stdout.trim())).toBe('user');
        // No process of the source runs in the fork; the source's still runs (it was thawed).
        expect(await sleeping(fork)).toBe(false);
        expect(await sleeping(source)).toBe(true);

        // Apart from then on: neither sees the other's writes.
        await source.commands.run('echo source-after > ~/after.txt');
        await fork.commands.run('echo fork-after > /tmp/fork.txt');
        expect(await read(fork, '~/after.txt')).toBe('missing');
        expect(await read(source, '/tmp/fork.txt')).toBe('missing');
        expect(await read(source, '~/kept.txt')).toBe('home-before');

        const info = await fork.getInfo();
        expect(info.state).toBe('running');
        expect(info.metadata).toEqual({ team: 'a', run: '2' });
        // Tokens of its own: the source's token does not reach the fork.
        expect(fork.accessToken).not.toBe(source.accessToken);
      } finally {
        await killAll([source, ...forks]);
      }
    }, 180_000);

    test('count 3 forks a paused (frozen) source, which stays paused', async () => {
      const source = await Sandbox.create({ home: home() });
      let forks: Sandbox[] = [];
      try {
        await source.commands.run('echo frozen > ~/state.txt');
        // Set after it started (as a pooled sandbox gets its create's envs): its forks get it.
        await addEnv(home(), source, { FROM_CREATE: 'kept' });
        // A clock in the source: a fork taken later than another sees the same tick only if the
        // source stayed frozen in between.
        await source.commands.start(
          'while :; do date +%s%N > ~/tick.new && mv ~/tick.new ~/tick; sleep 0.02; done',
        );
        await source.commands.run('sleep 0.3');
        expect(await source.pause()).toBe(true);
        forks = await source.fork({ count: 3 });
        expect(new Set(forks.map((f) => f.sandboxId)).size).toBe(3);
        for (const fork of forks) {
          expect(await read(fork, '~/state.txt')).toBe('frozen');
          expect((await fork.commands.run('echo $FROM_CREATE')).stdout.trim()).toBe('kept');
        }
        const ticks = await Promise.all(forks.map((fork) => read(fork, '~/tick')));
        expect(ticks[0]).toMatch(/^\d+$/);
        expect(new Set(ticks).size).toBe(1);
        await new Promise((resolve) => setTimeout(resolve, 300));
        const later = await source.fork();
        forks.push(...later);
        expect(await read(later[0] as Sandbox, '~/tick')).toBe(ticks[0]);
        await forks[0]?.commands.run('echo only-first > ~/state.txt');
        expect(await read(forks[1] as Sandbox, '~/state.txt')).toBe('frozen');
        const info = await Sandbox.list({ home: home(), state: 'paused' });
        expect(info.map((s) => s.sandboxId)).toContain(source.sandboxId);
      } finally {
        await killAll([source, ...forks]);
      }
    }, 180_000);

    test('a hibernated source forks from its kept disk', async () => {
      const source = await Sandbox.create({ home: home() });
      let forks: Sandbox[] = [];
      try {
        await source.commands.run('echo slept > ~/state.txt && echo tmp-slept > /tmp/state.txt');
        expect(await source.pause({ memory: false })).toBe(true);
        forks = await source.fork();
        const fork = forks[0] as Sandbox;
        expect(await read(fork, '~/state.txt')).toBe('slept');
        expect(await read(fork, '/tmp/state.txt')).toBe('tmp-slept');
        // The source wakes on its own disk, untouched by the fork.
        await fork.commands.run('echo forked > ~/state.txt');
        expect(await source.resume()).toBe(true);
        expect(await read(source, '~/state.txt')).toBe('slept');
      } finally {
        await killAll([source, ...forks]);
      }
    }, 180_000);
  });
}

describe('fork on the local provider', () => {
  let root: Awaited<ReturnType<typeof createAbxHome>>;
  let rootless: RootlessDaemon | undefined;

  beforeAll(async () => {
    root = await createAbxHome();
    rootless = await startRootlessDaemon();
  }, 300_000);

  afterAll(async () => {
    await rootless?.close();
    await root?.close();
  });

  forkCases('a root daemon', () => root.home, true);
  forkCases('a rootless daemon', () => (rootless as RootlessDaemon).home, false);

  test('an image sandbox’s fork has its changes to the image, owned by the fork’s user; the image’s own folders stay root’s', async (context) => {
    const engine = await dockerEngine();
    if (!engine.docker) {
      context.skip(`no Docker engine to export the image from: ${engine.reason}`);
      return;
    }
    await ensureDebianImage(engine.docker);
    await Templates.build(Template.fromImage(DEBIAN_IMAGE), {
      home: root.home,
      name: 'fork-debian',
    });
    const source = await Sandbox.create({ home: root.home, template: 'fork-debian' });
    let forks: Sandbox[] = [];
    try {
      // /var/tmp is the image's (world-writable): what is written there lands in the overlay's
      // upper layer on the disk, under a copy of the image's root-owned /var.
      await source.commands.run('echo upper > /var/tmp/x && echo tmp > /tmp/y');
      forks = await source.fork();
      const fork = forks[0] as Sandbox;
      expect(await read(fork, '/var/tmp/x')).toBe('upper');
      expect(await read(fork, '/tmp/y')).toBe('tmp');
      const owners = await fork.commands.run('stat -c %u /var/tmp/x /tmp/y /var /var/tmp');
      // The image's root-owned folders show as the overflow uid (host root is not mapped in the
      // sandbox's user namespace), as in the source: they were not given to the fork's uid.
      expect(owners.stdout.split('\n').filter(Boolean)).toEqual(['1000', '1000', '65534', '65534']);
      await fork.commands.run('echo more >> /var/tmp/x && echo more >> /tmp/y');
      expect(await read(source, '/var/tmp/x')).toBe('upper');
    } finally {
      await killAll([source, ...forks]);
      await Templates.remove('fork-debian', { home: root.home }).catch(() => undefined);
    }
  }, 600_000);

  test('bad requests are refused with what was wrong, and start nothing', async () => {
    const info = await startDaemon(root.home);
    const key = readFileSync(join(root.home, 'api-key'), 'utf8').trim();
    const fork = (id: string, body: unknown) =>
      call(`${info.apiUrl}/v1/sandboxes/${id}/fork`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}` },
        body,
      });
    const source = await Sandbox.create({ home: root.home });
    try {
      for (const count of [0, 11, '2', 1.5, null]) {
        const answer = await fork(source.sandboxId, { count });
        expect(answer.status).toBe(400);
        expect(answer.body.error).toMatch(/count must be a whole number of forks from 1 to 10/);
      }
      const badMeta = await fork(source.sandboxId, { metadata: { a: 1 } });
      expect(badMeta.status).toBe(400);
      expect(badMeta.body.error).toMatch(/metadata\.a must be a string, not number/);
      const unknown = await fork('i0000000000000000', {});
      expect(unknown.status).toBe(404);
      expect(unknown.body.error).toMatch(/sandbox i0000000000000000 does not exist/);
      const ghost = await Sandbox.create({ home: root.home });
      await ghost.kill();
      const killed = await fork(ghost.sandboxId, { count: 2 });
      expect(killed.status).toBe(404);
      expect(killed.body.error).toMatch(/is not running \(killed/);
      // Nothing was started by the refusals.
      const running = await Sandbox.list({ home: root.home, state: 'running' });
      expect(running.map((s) => s.sandboxId)).toEqual([source.sandboxId]);
    } finally {
      await source.kill();
    }
  }, 120_000);
});
