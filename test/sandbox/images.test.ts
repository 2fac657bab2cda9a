import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  commandRegistry,
  NotFoundError,
  Sandbox,
  Template,
  TemplateBuildError,
  Templates,
} from '../../src/index.js';
import { Terminal } from '../../src/sandbox/terminal.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome, removeTemplates } from '../helpers/abx-home.js';
import {
  BUSYBOX_IMAGE,
  DEBIAN_IMAGE,
  dockerEngine,
  ensureBusyboxImage,
  ensureDebianImage,
  ensureShelllessImage,
  SHELLESS_IMAGE,
} from '../helpers/docker-images.js';

// Image templates end to end: a daemon on the Docker provider (started by the SDK with
// ABX_PROVIDER=docker, as a user would), YAML and code templates built from local images with
// root setup steps, a busybox image (no libc, no Node) serving a decorated command, snapshots,
// and the bad inputs. Skipped, saying why, only when no Docker engine answers.
const engine = await dockerEngine();

if (!engine.docker) {
  describe.skip(`image templates: skipped, ${engine.reason}`, () => {
    test('image templates on the docker provider', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let home: string;
  const work = mkdtempSync(join(tmpdir(), 'abx-images-'));
  /** Image tags present before the tests; anything else a test leaves is a leak. */
  let imagesBefore: Set<string>;
  const templateImages = async () =>
    (await docker.listImages({ filters: { reference: ['abx-template/*'] } })).flatMap(
      (image) => image.RepoTags ?? [],
    );

  beforeAll(async () => {
    await ensureBusyboxImage(docker);
    await ensureDebianImage(docker);
    // The daemon the SDK starts inherits these.
    process.env.ABX_PROVIDER = 'docker';
    process.env.ABX_DOCKER_BASE_IMAGE = DEBIAN_IMAGE;
    process.env.ABX_WARM_POOL = '0';
    abx = await createAbxHome();
    home = abx.home;
    imagesBefore = new Set(await templateImages());
  }, 900_000);

  afterAll(async () => {
    // Templates own engine images: remove them with the installation, and anything a failed
    // test left among the images made during this file.
    await removeTemplates(home);
    for (const tag of await templateImages()) {
      if (!imagesBefore?.has(tag))
        await docker
          .getImage(tag)
          .remove()
          .catch(() => {});
    }
    await abx?.close();
    rmSync(work, { recursive: true, force: true });
    delete process.env.ABX_PROVIDER;
    delete process.env.ABX_DOCKER_BASE_IMAGE;
    delete process.env.ABX_WARM_POOL;
  });

  describe('image templates on the docker provider', () => {
    test('YAML: root setup steps, a copy owned by the user, then sandboxes run as the user', async () => {
      writeFileSync(join(work, 'greeting.txt'), 'hello from the host\n');
      const yaml = join(work, 'template.yaml');
      writeFileSync(
        yaml,
        `name: debian-tools
image: ${DEBIAN_IMAGE}
env: { STAGE: built }
setup:
  - printf '#!/bin/sh\\necho tool:$STAGE\\n' > /usr/local/bin/tool && chmod 755 /usr/local/bin/tool
  - id -u > /etc/built-by
  - { copy: ./greeting.txt, to: /home/user/greeting.txt, user: user }
  - { run: id -un > /home/user/step-user, user: user }
`,
      );
      const built = await Templates.build(yaml, { home });
      expect(built).toMatchObject({
        name: 'debian-tools',
        image: DEBIAN_IMAGE,
        builtImage: expect.stringMatching(/^abx-template\/debian-tools:/),
        user: 'user',
      });
      const box = await Sandbox.create({ home, template: 'debian-tools' });
      try {
        expect((await box.commands.run('tool')).stdout).toBe('tool:built\n');
        expect((await box.commands.run('cat /etc/built-by; id -u; id -un')).stdout).toBe(
          '0\n1000\nuser\n',
        );
        expect(await box.files.read('greeting.txt')).toBe('hello from the host\n');
        expect((await box.commands.run('stat -c %U greeting.txt step-user')).stdout).toBe(
          'user\nuser\n',
        );
        expect(await box.files.read('step-user')).toBe('user\n');
        // The sandbox itself is never root: it cannot change what the build made.
        const denied = await box.commands.run('echo x > /usr/local/bin/tool', {
          allowNonZeroExit: true,
        });
        expect(denied.exitCode).not.toBe(0);
      } finally {
        await box.kill();
      }
    });

    test('code: a busybox image (no libc, no Node) runs commands, files, a pty and a decorated command', async () => {
      const tpl = Template.fromImage(BUSYBOX_IMAGE)
        .setCapabilities(['shell', 'files', 'code', 'ports'])
        .runCmd('mkdir -p /srv/data && echo seeded > /srv/data/seed.txt');
      const built = await Templates.build(tpl, { home, name: 'tiny' });
      expect(built).toMatchObject({
        image: BUSYBOX_IMAGE,
        builtImage: expect.stringMatching(/^abx-template\/tiny:/),
      });
      const box = await Sandbox.create({ home, template: 'tiny' });
      try {
        expect(
          (await box.commands.run('cat /srv/data/seed.txt; ls /lib 2>&1 | head -1')).stdout,
        ).toMatch(/^seeded\n/);
        await box.files.write('in.txt', 'written by files');
        expect((await box.commands.run('cat in.txt')).stdout).toBe('written by files');
        // A pty too: busybox has no `script` applet; the runtime at /opt/abx carries one.
        const terminal = await Terminal.open(box, { command: 'sh' });
        await terminal.write('echo pty-$((40+2)); tty\nexit\n');
        let screen = '';
        for await (const piece of terminal.output()) screen += piece;
        expect(screen).toContain('pty-42');
        expect(screen).toMatch(/\/dev\/pts\/\d+/);
        commandRegistry().registerClass(SandboxCommands);
        await box.server.start({ commands: [SandboxCommands] });
        expect(await box.server.call('add', { x: 40, y: 2 })).toBe(42);
      } finally {
        await box.kill();
      }
    });

    test('a Dockerfile template: the engine builds it, then the setup steps run on top', async () => {
      const context = join(work, 'df');
      mkdirSync(context, { recursive: true });
      writeFileSync(join(context, 'note.txt'), 'from the build context\n');
      writeFileSync(
        join(context, 'Dockerfile'),
        `FROM ${BUSYBOX_IMAGE}\nCOPY note.txt /opt/note.txt\nRUN echo from-dockerfile > /opt/df.txt\n`,
      );
      const yaml = join(work, 'df-template.yaml');
      writeFileSync(
        yaml,
        'name: from-dockerfile\ndockerfile: df/Dockerfile\nsetup:\n  - cat /opt/df.txt > /opt/step.txt\n',
      );
      const built = await Templates.build(yaml, { home });
      expect(built.dockerfile).toBe(join(context, 'Dockerfile'));
      const box = await Sandbox.create({ home, template: 'from-dockerfile' });
      try {
        expect(
          (await box.commands.run('cat /opt/note.txt /opt/df.txt /opt/step.txt; id -un')).stdout,
        ).toBe('from the build context\nfrom-dockerfile\nfrom-dockerfile\nuser\n');
      } finally {
        await box.kill();
      }
    });

    test('an image with no shell and no libc at all (like distroless) runs commands, files and a decorated command', async () => {
      await ensureShelllessImage(docker);
      await Templates.build(
        Template.fromImage(SHELLESS_IMAGE).setCapabilities(['shell', 'files', 'code', 'ports']),
        { home, name: 'shellless' },
      );
      const box = await Sandbox.create({ home, template: 'shellless' });
      try {
        await box.files.write('data.json', '{"ok":true}');
        expect(await box.files.read('data.json')).toBe('{"ok":true}');
        expect((await box.files.list('/')).map((e) => e.name).sort()).toContain('etc');
        // Command lines run with the runtime's own shell: the image has none.
        expect((await box.commands.run('ls /bin 2>&1; echo "$((6 * 7))"')).stdout).toMatch(
          /No such file or directory\n42\n$/,
        );
        commandRegistry().registerClass(SandboxCommands);
        await box.server.start({ commands: [SandboxCommands] });
        expect(await box.server.call('add', { x: 1, y: 2 })).toBe(3);
      } finally {
        await box.kill();
      }
    });

    test('snapshot: the whole filesystem, not only the home, comes back', async () => {
      const box = await Sandbox.create({ home, template: 'debian-tools' });
      let copy: Sandbox | undefined;
      try {
        await box.commands.run('echo kept > /tmp/outside-home && echo mine > notes.txt');
        const snap = await box.snapshot({ name: 'debian-snap' });
        expect(snap.builtImage).toMatch(/^abx-template\/debian-snap:/);
        copy = await Sandbox.create({ home, template: 'debian-snap' });
        expect((await copy.commands.run('cat /tmp/outside-home notes.txt; tool')).stdout).toBe(
          'kept\nmine\ntool:built\n',
        );
      } finally {
        await copy?.kill();
        await box.kill();
      }
      await Templates.remove('debian-snap', { home });
      expect(await templateImages()).not.toContain(expect.stringMatching(/debian-snap/));
    });

    test('bad inputs: an unknown image, a failing step; neither leaves a template or image', async () => {
      const unknown = await Templates.build(Template.fromImage('no-such-image:0'), {
        home,
        name: 'ghost',
      }).catch((e) => e);
      expect(unknown).toBeInstanceOf(NotFoundError);
      expect(unknown.message).toContain('docker pull no-such-image:0');

      const failing = await Templates.build(
        Template.fromImage(DEBIAN_IMAGE).runCmd('echo step one').runCmd('echo broken >&2; exit 9'),
        { home, name: 'broken' },
      ).catch((e) => e);
      expect(failing).toBeInstanceOf(TemplateBuildError);
      expect([failing.step, failing.exitCode]).toEqual([1, 9]);
      expect(failing.output).toContain('broken');

      const names = (await Templates.list({ home })).map((t) => t.name);
      expect(names).not.toContain('ghost');
      expect(names).not.toContain('broken');
      const leaked = (await templateImages()).filter(
        (tag) => !imagesBefore.has(tag) && /(ghost|broken)/.test(tag),
      );
      expect(leaked).toEqual([]);
      const buildContainers = await docker.listContainers({
        all: true,
        filters: { label: ['abx.sandbox'] },
      });
      // This test's builds only: other test files build images on the same engine meanwhile.
      expect(
        buildContainers.filter((c) => c.Names.some((n) => /build-(ghost|broken)-/.test(n))),
      ).toEqual([]);
    });
  });
}
