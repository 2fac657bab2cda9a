import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { commandRegistry, Sandbox, Template, Templates } from '../../src/index.js';
import { ROOTFS_ROOT } from '../../src/providers/local/image-rootfs.js';
import { Terminal } from '../../src/sandbox/terminal.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome, removeTemplates } from '../helpers/abx-home.js';
import {
  BUSYBOX_IMAGE,
  DEBIAN_IMAGE,
  dockerEngine,
  ensureBusyboxImage,
  ensureDebianImage,
} from '../helpers/docker-images.js';

// Image templates on the LOCAL provider (bubblewrap, a root daemon): the build runs on the
// Docker engine (root steps), the sandboxes run here on an overlay of the image's file system,
// exported once. Needs a root daemon and an engine; skipped, saying why, otherwise.
const engine = process.getuid?.() === 0 ? await dockerEngine() : { reason: 'not root' };

/** A digest of every file name, size and mode under `dir` (what an overlay must never change). */
function treeDigest(dir: string): string {
  const hash = createHash('sha256');
  const walk = (path: string) => {
    for (const entry of readdirSync(path, { withFileTypes: true }).sort((a, b) =>
      a.name.localeCompare(b.name),
    )) {
      const full = join(path, entry.name);
      const s = statSync(full, { throwIfNoEntry: false });
      hash.update(`${full}:${s?.size}:${s?.mode}\n`);
      if (entry.isDirectory()) walk(full);
    }
  };
  walk(dir);
  return hash.digest('hex');
}

if (!('docker' in engine) || !engine.docker) {
  describe.skip(`image templates on the local provider: skipped, ${engine.reason}`, () => {
    test('image templates on the local provider', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let home: string;

  beforeAll(async () => {
    await ensureBusyboxImage(docker);
    await ensureDebianImage(docker);
    process.env.ABX_WARM_POOL = '0';
    abx = await createAbxHome();
    home = abx.home;
  }, 900_000);

  afterAll(async () => {
    await removeTemplates(home);
    await abx?.close();
    delete process.env.ABX_WARM_POOL;
  });

  describe('image templates on the local provider', () => {
    test('built on the engine, run here on an overlay: root-built files, the user, no host system', async () => {
      const built = await Templates.build(
        Template.fromImage(DEBIAN_IMAGE)
          .runCmd('echo "from the image build" > /etc/motd-abx && id -u > /etc/built-by')
          .setEnvs({ WHERE: 'local' }),
        { home, name: 'local-debian' },
      );
      expect(built.builtImage).toMatch(/^abx-template\/local-debian:/);
      const [one, two] = await Promise.all([
        Sandbox.create({ home, template: 'local-debian' }),
        Sandbox.create({ home, template: 'local-debian' }),
      ]);
      try {
        expect(
          (await one.commands.run('cat /etc/motd-abx /etc/built-by; id -u; echo $WHERE')).stdout,
        ).toBe('from the image build\n0\n1000\nlocal\n');
        // It is the image's system, not the host's: Debian's own os-release, no host node.
        expect(
          (await one.commands.run('. /etc/os-release; echo $ID; command -v node || echo none'))
            .stdout,
        ).toBe('debian\n/opt/abx/bin/node\n');
        // Writes go to the sandbox's own layer: the other sandbox and the cached image never see them.
        const rootfsDirs = readdirSync(ROOTFS_ROOT).filter((d) => !d.includes('.partial'));
        const before = rootfsDirs.map((d) => treeDigest(join(ROOTFS_ROOT, d, 'rootfs', 'tmp')));
        await one.commands.run('echo mine > /tmp/one.txt && echo home > ~/h.txt');
        expect(await two.files.exists('/tmp/one.txt')).toBe(false);
        expect(await two.files.exists('h.txt')).toBe(false);
        expect(rootfsDirs.map((d) => treeDigest(join(ROOTFS_ROOT, d, 'rootfs', 'tmp')))).toEqual(
          before,
        );
        // The image's root-owned system stays read-only to the sandbox user.
        const denied = await one.commands.run('touch /etc/evil', { allowNonZeroExit: true });
        expect(denied.exitCode).not.toBe(0);
      } finally {
        await Promise.all([one.kill(), two.kill()]);
      }
      // A build and the first create (the image's export, its home's seed) on a loaded machine.
    }, 600_000);

    test('busybox (no libc, no Node) runs commands, files, a pty and a decorated command', async () => {
      await Templates.build(
        Template.fromImage(BUSYBOX_IMAGE)
          .runCmd('echo hi > /srv-note')
          .setCapabilities(['shell', 'files', 'code', 'ports']),
        {
          home,
          name: 'local-busybox',
        },
      );
      const box = await Sandbox.create({ home, template: 'local-busybox' });
      try {
        expect((await box.commands.run('cat /srv-note; readlink /bin/sh')).stdout).toMatch(
          /^hi\n.*busybox/,
        );
        await box.files.write('f.txt', 'ok');
        expect(await box.files.read('f.txt')).toBe('ok');
        const terminal = await Terminal.open(box, { command: 'sh' });
        await terminal.write('echo pty-$((6*7))\nexit\n');
        let screen = '';
        for await (const piece of terminal.output()) screen += piece;
        expect(screen).toContain('pty-42');
        // The command server too: node comes from the runtime, the image has none.
        commandRegistry().registerClass(SandboxCommands);
        await box.server.start({ commands: [SandboxCommands] });
        expect(await box.server.call('add', { x: 40, y: 2 })).toBe(42);
        // envd's front (a static program: the image has no libc) holds envd's socket, so there
        // is no wake FIFO; pid 2 is the front.
        const pid2 = await box.commands.run('readlink /proc/2/exe; ls /run/abx/wake || echo none');
        expect(pid2.stdout).toBe('/opt/abx/envd-front\nnone\n');
      } finally {
        await box.kill();
      }
    });

    test('an image without mkfifo runs under envd’s front, which needs no wake FIFO', async () => {
      // Debian's dash, not busybox's sh (which runs its applets itself, with or without the file).
      // Under the shell loop (ABX_ENVD_FRONT=0) the daemon made the FIFO there (makeWakeFifo).
      await Templates.build(Template.fromImage(DEBIAN_IMAGE).runCmd('rm /usr/bin/mkfifo'), {
        home,
        name: 'local-busybox-no-mkfifo',
      });
      const box = await Sandbox.create({ home, template: 'local-busybox-no-mkfifo' });
      try {
        const listed = await box.commands.run(
          'command -v mkfifo || echo none; ls /run/abx/wake 2>/dev/null || echo no-fifo',
        );
        expect(listed.stdout).toBe('none\nno-fifo\n');
        await box.files.write('kept.txt', 'yes');
        expect((await box.commands.run('cat kept.txt')).stdout).toBe('yes');
      } finally {
        await box.kill();
        await Templates.remove('local-busybox-no-mkfifo', { home });
      }
    });

    test('a link the sandbox leaves in its kept overlay is not followed out of it at a wake', async () => {
      // The launcher makes the workdir's folders in the overlay as root. A hibernated sandbox
      // keeps its overlay's upper layer: a link it put where the workdir's parent was (a folder any
      // user may write, as images have) must not
      // take that root mkdir to a host folder.
      await Templates.build(
        Template.fromImage(BUSYBOX_IMAGE)
          .runCmd('mkdir -p /work/sub/deeper && chmod -R 777 /work')
          .setWorkdir('/work/sub/deeper'),
        { home, name: 'local-linked-workdir' },
      );
      const probe = mkdtempSync(join(tmpdir(), 'abx-link-probe-'));
      const box = await Sandbox.create({ home, template: 'local-linked-workdir' });
      try {
        await box.commands.run(`cd / && mv /work/sub /work/old && ln -s ${probe} /work/sub`);
        expect((await box.commands.run('readlink /work/sub', { cwd: '/' })).stdout).toBe(
          `${probe}\n`,
        );
        await box.pause({ memory: false });
        await box.resume();
        expect(existsSync(join(probe, 'deeper'))).toBe(false);
        expect(readdirSync(probe)).toEqual([]);
        // The workdir is the image's again, and the sandbox works in it.
        expect((await box.commands.run('pwd')).stdout).toBe('/work/sub/deeper\n');
      } finally {
        await box.kill();
        rmSync(probe, { recursive: true, force: true });
      }
    }, 300_000);

    test('a snapshot of a local image sandbox keeps its image and its home', async () => {
      const box = await Sandbox.create({ home, template: 'local-debian' });
      let copy: Sandbox | undefined;
      try {
        await box.files.write('kept.txt', 'kept');
        const snap = await box.snapshot({ name: 'local-snap' });
        copy = await Sandbox.create({ home, template: 'local-snap' });
        expect(await copy.files.read('kept.txt')).toBe('kept');
        expect((await copy.commands.run('cat /etc/motd-abx')).stdout).toBe(
          'from the image build\n',
        );
        expect(snap.builtImage).toBe((await Templates.get('local-debian', { home })).builtImage);
      } finally {
        await copy?.kill();
        await box.kill();
      }
      // Removing the snapshot leaves the image its source template still needs.
      await Templates.remove('local-snap', { home });
      const again = await Sandbox.create({ home, template: 'local-debian' });
      await again.kill();
    });

    test('removing a template removes its image and, once unused, its unpacked file system', async () => {
      const { builtImage } = await Templates.get('local-busybox', { home });
      const id = (await docker.getImage(builtImage as string).inspect()).Id.replace('sha256:', '');
      const cached = join(ROOTFS_ROOT, id.slice(0, 24));
      expect(existsSync(cached)).toBe(true);
      await Templates.remove('local-busybox', { home });
      await expect(docker.getImage(builtImage as string).inspect()).rejects.toThrow();
      expect(existsSync(cached)).toBe(false);
    });
  });
}
