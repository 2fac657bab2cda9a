import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, Template, Templates } from '../../src/index.js';
import { ROOTFS_ROOT } from '../../src/providers/local/image-rootfs.js';
import { createAbxHome, removeTemplates } from '../helpers/abx-home.js';
import { dockerEngine, ensurePipImage, PIP_IMAGE } from '../helpers/docker-images.js';
import { expectSeededHome, homeTemplate } from '../helpers/home-template.js';

// The home an image template's build made, in every sandbox of it on the LOCAL provider (a root
// daemon: an ext4 disk per sandbox is mounted over the home, and starts from a seeded copy of the
// image's /home/user), warm pool included; and what a hostile image's home cannot do there.
const engine = process.getuid?.() === 0 ? await dockerEngine() : { reason: 'not root' };

/**
 * Every seeded disk the local provider keeps for image homes, with its owner, mode and times: a
 * write to one would change its mtime (a digest would read 2 GiB of holes each time).
 */
function seedDisks(): Map<string, string> {
  const found = new Map<string, string>();
  for (const id of readdirSync(ROOTFS_ROOT)) {
    const dir = join(ROOTFS_ROOT, id);
    for (const name of readdirSync(dir).filter((n) => /^home-.*\.img$/.test(n))) {
      const s = statSync(join(dir, name));
      found.set(
        join(dir, name),
        `${s.uid} ${(s.mode & 0o7777).toString(8)} ${s.mtimeMs} ${s.ctimeMs}`,
      );
    }
  }
  return found;
}

if (!('docker' in engine) || !engine.docker) {
  describe.skip(`image homes on the local provider: skipped, ${engine.reason}`, () => {
    test('image homes on the local provider', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let home: string;
  const work = mkdtempSync(join(tmpdir(), 'abx-image-home-'));
  /** A host folder a hostile image points at: nothing may land in it or be read from it. */
  const hostDir = mkdtempSync('/run/abx-image-home-probe-');

  beforeAll(async () => {
    await ensurePipImage(docker);
    // One spare per template at most: the pool test below takes it.
    process.env.ABX_WARM_POOL = '1';
    abx = await createAbxHome();
    home = abx.home;
  }, 900_000);

  afterAll(async () => {
    await removeTemplates(home);
    await abx?.close();
    delete process.env.ABX_WARM_POOL;
    rmSync(work, { recursive: true, force: true });
    rmSync(hostDir, { recursive: true, force: true });
  });

  describe('an image template’s home on the local provider (root daemon)', () => {
    test('a copied folder and a `pip install --user` package are in every sandbox, the pooled one too', async () => {
      await Templates.build(homeTemplate(PIP_IMAGE, work), { home, name: 'home-local' });
      const [one, two] = await Promise.all([
        Sandbox.create({ home, template: 'home-local' }),
        Sandbox.create({ home, template: 'home-local' }),
      ]);
      try {
        await expectSeededHome(one);
        await expectSeededHome(two);
        // Each home is the sandbox's own: a write in one is not in the other, nor in the seed.
        const seeds = seedDisks();
        expect(seeds.size).toBeGreaterThan(0);
        // Root's, and no one else may write it.
        for (const facts of seeds.values()) expect(facts).toMatch(/^0 (644|600) /);
        await one.commands.run('echo mine > ~/data/notes.txt && rm -r ~/.local');
        expect(await two.files.read('/home/user/data/notes.txt')).toBe('seeded data\n');
        expect(seedDisks()).toEqual(seeds);
        // Another sandbox's home is out of reach (its own uid on the host, its own disk).
        const other = await one.commands.run(`ls /proc/*/root/home/user 2>&1 | head -3`, {
          allowNonZeroExit: true,
        });
        expect(other.stdout).not.toContain('notes.txt');
      } finally {
        await Promise.all([one.kill(), two.kill()]);
      }
      // The creates above leave a spare in the warm pool; it has the home before anyone asks.
      const deadline = Date.now() + 120_000;
      let pooled: string | undefined;
      while (!pooled && Date.now() < deadline) {
        pooled = (await Sandbox.list({ home, state: 'pooled' })).find(
          (s) => s.template === 'home-local',
        )?.sandboxId;
        if (!pooled) await new Promise((resolve) => setTimeout(resolve, 200));
      }
      expect(pooled).toBeDefined();
      const three = await Sandbox.create({ home, template: 'home-local' });
      try {
        expect(three.sandboxId).toBe(pooled);
        await expectSeededHome(three);
      } finally {
        await three.kill();
      }
    }, 600_000);

    test('a hostile image home: no device nodes, no setuid, links stay links inside the sandbox', async () => {
      writeFileSync(join(hostDir, 'secret'), 'host secret\n');
      await Templates.build(
        Template.fromImage(PIP_IMAGE).runCmd(
          [
            'mknod /home/user/mem c 1 1',
            'cp /bin/ls /home/user/suid && chmod 4755 /home/user/suid',
            `ln -s ${hostDir}/secret /home/user/out`,
            'mkfifo /home/user/fifo',
            'echo ok > /home/user/plain',
          ].join(' && '),
        ),
        { home, name: 'home-hostile' },
      );
      const box = await Sandbox.create({ home, template: 'home-hostile' });
      try {
        const seen = await box.commands.run(
          'cd ~ && ls -A | sort | tr "\\n" " "; echo; stat -c "%a %U" suid; readlink out; cat out 2>&1; cat plain',
          { allowNonZeroExit: true },
        );
        const [names, suid, link, read, plain] = seen.stdout.split('\n');
        expect(names).toBe('out plain suid ');
        expect(suid).toBe('755 user');
        expect(link).toBe(`${hostDir}/secret`);
        expect(read).toMatch(/No such file/);
        expect(plain).toBe('ok');
      } finally {
        await box.kill();
      }
    }, 600_000);

    test('an image whose /home is a link out is refused, and nothing is made where it points', async () => {
      mkdirSync(join(hostDir, 'target'), { recursive: true });
      await Templates.build(
        Template.fromImage(PIP_IMAGE).runCmd(`rm -rf /home && ln -s ${hostDir}/target /home`),
        { home, name: 'home-escape' },
      );
      const refused = await Sandbox.create({ home, template: 'home-escape' }).then(
        async (box) => {
          await box.kill();
          return undefined;
        },
        (error: Error) => error,
      );
      // Before anything else: the launcher (root) must not have made the home where the link points.
      expect(readdirSync(join(hostDir, 'target'))).toEqual([]);
      expect(refused?.message).toMatch(
        /\/home is a symbolic link.*make it a real folder in the image/,
      );
    }, 600_000);
  });
}
