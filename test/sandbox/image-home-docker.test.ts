import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, Template, Templates } from '../../src/index.js';
import { createAbxHome, removeTemplates } from '../helpers/abx-home.js';
import {
  DEBIAN_IMAGE,
  dockerEngine,
  ensurePipImage,
  ensureShelllessImage,
  PIP_IMAGE,
  SHELLESS_IMAGE,
} from '../helpers/docker-images.js';
import { expectSeededHome, homeTemplate } from '../helpers/home-template.js';

// The home an image template's build made, on the DOCKER provider (the container's own file
// system keeps it), and copy steps through the engine's archive upload: an image without `tar`
// (or anything else) takes them, owned as the step says.
const engine = await dockerEngine();

if (!engine.docker) {
  describe.skip(`image homes on the docker provider: skipped, ${engine.reason}`, () => {
    test('image homes on the docker provider', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let home: string;
  const work = mkdtempSync(join(tmpdir(), 'abx-image-home-docker-'));

  beforeAll(async () => {
    await ensurePipImage(docker);
    await ensureShelllessImage(docker);
    process.env.ABX_PROVIDER = 'docker';
    process.env.ABX_DOCKER_BASE_IMAGE = DEBIAN_IMAGE;
    process.env.ABX_WARM_POOL = '0';
    abx = await createAbxHome();
    home = abx.home;
  }, 900_000);

  afterAll(async () => {
    await removeTemplates(home);
    await abx?.close();
    rmSync(work, { recursive: true, force: true });
    delete process.env.ABX_PROVIDER;
    delete process.env.ABX_DOCKER_BASE_IMAGE;
    delete process.env.ABX_WARM_POOL;
  });

  describe('an image template’s home on the docker provider', () => {
    test('a copied folder and a `pip install --user` package are in every sandbox', async () => {
      await Templates.build(homeTemplate(PIP_IMAGE, work), { home, name: 'home-docker' });
      const [one, two] = await Promise.all([
        Sandbox.create({ home, template: 'home-docker' }),
        Sandbox.create({ home, template: 'home-docker' }),
      ]);
      try {
        await expectSeededHome(one);
        await expectSeededHome(two);
        await one.commands.run('echo mine > ~/data/notes.txt');
        expect(await two.files.read('/home/user/data/notes.txt')).toBe('seeded data\n');
      } finally {
        await Promise.all([one.kill(), two.kill()]);
      }
    }, 600_000);

    test('copy steps into an image with no tar at all go through the engine, owned as asked', async () => {
      const folder = join(work, 'tree');
      mkdirSync(join(folder, 'inner'), { recursive: true });
      writeFileSync(join(folder, 'inner', 'a.txt'), 'in a folder\n');
      writeFileSync(join(folder, 'run.sh'), '#!/bin/sh\necho ran\n', { mode: 0o4755 });
      writeFileSync(join(work, 'single.txt'), 'one file\n');
      await Templates.build(
        Template.fromImage(SHELLESS_IMAGE)
          .copy(folder, '/home/user/tree', { user: 'user' })
          .copy(join(work, 'single.txt'), '/srv/single.txt')
          .setCapabilities(['shell', 'files']),
        { home, name: 'tarless' },
      );
      const box = await Sandbox.create({ home, template: 'tarless' });
      try {
        expect(await box.files.read('/home/user/tree/inner/a.txt')).toBe('in a folder\n');
        expect(await box.files.read('/srv/single.txt')).toBe('one file\n');
        // The runtime's busybox shell: the image has no programs. Set-id bits never come along.
        const owners = await box.commands.run(
          'stat -c "%u %a %n" /home/user/tree /home/user/tree/inner/a.txt /home/user/tree/run.sh /srv/single.txt',
        );
        expect(owners.stdout).toBe(
          [
            '1000 755 /home/user/tree',
            '1000 644 /home/user/tree/inner/a.txt',
            '1000 755 /home/user/tree/run.sh',
            '0 644 /srv/single.txt',
            '',
          ].join('\n'),
        );
      } finally {
        await box.kill();
      }
    }, 600_000);

    test('a copy as a user the image lacks fails the build, naming the user, and leaves no template', async () => {
      writeFileSync(join(work, 'x.txt'), 'x\n');
      await expect(
        Templates.build(
          Template.fromImage(SHELLESS_IMAGE).copy(join(work, 'x.txt'), '/srv/x.txt', {
            user: 'nobody-here',
          }),
          { home, name: 'copy-ghost' },
        ),
      ).rejects.toThrow(/setup\[0\] copy .* failed: user "nobody-here" is not in the image/);
      expect((await Templates.list({ home })).map((t) => t.name)).not.toContain('copy-ghost');
    }, 600_000);
  });
}
