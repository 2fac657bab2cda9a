import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { type DockerHome, dockerHome } from '../compat/e2b/docker-home.js';
import { dockerEngine } from '../helpers/docker-images.js';

// Forks on the Docker provider: a commit of the source's container to a throwaway image, which
// goes when the fork is killed.

const engine = await dockerEngine();

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

if (!engine.docker) {
  describe.skip(`fork on Docker: skipped, ${engine.reason}`, () => {
    test('fork', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: DockerHome;

  beforeAll(async () => {
    abx = await dockerHome(docker);
  }, 900_000);

  afterAll(async () => {
    await abx?.close();
  });

  /** The fork images left on the engine for these fork ids. */
  const forkImages = async (ids: string[]) =>
    (await docker.listImages({ filters: { label: ['abx.fork'] } })).filter((image) =>
      ids.includes(image.Labels?.['abx.fork'] ?? ''),
    );

  test('a fork has the files (not the processes) of a running, frozen or hibernated source; its image goes with it', async () => {
    const source = await Sandbox.create({ home: abx.home, metadata: { team: 'a' } });
    const forks: Sandbox[] = [];
    try {
      await source.commands.run('echo home-before > ~/kept.txt && echo tmp-before > /tmp/kept.txt');
      await source.commands.start('sleep 4242');
      expect(await sleeping(source)).toBe(true);
      forks.push(...(await source.fork({ count: 2 })));
      expect(forks).toHaveLength(2);
      for (const fork of forks) {
        expect(await read(fork, '~/kept.txt')).toBe('home-before');
        expect(await read(fork, '/tmp/kept.txt')).toBe('tmp-before');
        expect(await sleeping(fork)).toBe(false);
        expect((await fork.getInfo()).metadata).toEqual({ team: 'a' });
      }
      await forks[0]?.commands.run('echo fork > ~/kept.txt');
      expect(await read(source, '~/kept.txt')).toBe('home-before');
      expect(await read(forks[1] as Sandbox, '~/kept.txt')).toBe('home-before');

      await source.commands.run('echo frozen > ~/state.txt');
      expect(await source.pause()).toBe(true);
      forks.push(...(await source.fork()));
      expect(await read(forks[2] as Sandbox, '~/state.txt')).toBe('frozen');

      expect(await source.resume()).toBe(true);
      await source.commands.run('echo slept > ~/state.txt');
      expect(await source.pause({ memory: false })).toBe(true);
      forks.push(...(await source.fork()));
      expect(await read(forks[3] as Sandbox, '~/state.txt')).toBe('slept');

      const ids = forks.map((fork) => fork.sandboxId);
      expect(await forkImages(ids)).toHaveLength(4);
      for (const fork of forks) await fork.kill();
      expect(await forkImages(ids)).toHaveLength(0);
    } finally {
      await Promise.all([source, ...forks].map((box) => box.kill().catch(() => undefined)));
    }
  }, 300_000);
}
