import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, Template, Templates } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { FORK_BOMB } from '../helpers/attacks.js';
import { DEBIAN_IMAGE, dockerEngine, ensureDebianImage } from '../helpers/docker-images.js';

// An attacker inside a sandbox of an IMAGE template, on both providers that run images: the
// docker provider (a container) and the local provider (bubblewrap on an overlay of the image).
// The image's build ran as root and planted a set-uid-root shell; the sandbox must still never
// be root, hold no capability, and stay inside its limits. (test/security/escape.test.ts attacks
// the local provider's host-system sandboxes, as a root and as a rootless daemon.)

const IS_ROOT = process.getuid?.() === 0;
const engine = IS_ROOT ? await dockerEngine() : { reason: 'not root' };

const installations: [string, Record<string, string>][] = [
  ['docker provider', { ABX_PROVIDER: 'docker', ABX_DOCKER_BASE_IMAGE: DEBIAN_IMAGE }],
  ['local provider (image on an overlay)', {}],
];

function sh(box: Sandbox, command: string, timeoutMs = 30_000) {
  return box.commands.run(command, { timeoutMs, allowNonZeroExit: true });
}

if (!('docker' in engine) || !engine.docker) {
  describe.skip(`escapes from image sandboxes: skipped, ${engine.reason}`, () => {
    test('escape attempts', () => undefined);
  });
} else {
  const docker = engine.docker;
  describe.each(installations)('escape attempts from an image sandbox on the %s', (_, env) => {
    let abx: Awaited<ReturnType<typeof createAbxHome>>;
    let box: Sandbox;

    beforeAll(async () => {
      await ensureDebianImage(docker);
      Object.assign(process.env, env, { ABX_WARM_POOL: '0' });
      abx = await createAbxHome();
      await Templates.build(
        Template.fromImage(DEBIAN_IMAGE)
          // What a careless (or hostile) image author leaves: a set-uid-root shell.
          .runCmd('cp /bin/sh /usr/local/bin/rootsh && chmod 4755 /usr/local/bin/rootsh')
          .setResources({ processes: 64, memory: '256M' })
          // Offline by name (internet is the default; the escape suite attacks egress itself).
          .setNetwork('none'),
        { home: abx.home, name: 'hostile-image' },
      );
      box = await Sandbox.create({ home: abx.home, template: 'hostile-image' });
    }, 900_000);

    afterAll(async () => {
      await box?.kill().catch(() => false);
      await Templates.remove('hostile-image', { home: abx.home }).catch(() => undefined);
      await abx?.close();
      for (const key of [...Object.keys(env), 'ABX_WARM_POOL']) delete process.env[key];
    });

    test('never root: uid 1000, no capabilities, no new privileges, a seccomp filter', async () => {
      const { stdout } = await sh(
        box,
        'id -u; grep -E "^(CapEff|CapPrm|NoNewPrivs|Seccomp):" /proc/self/status',
      );
      expect(stdout).toMatch(/^1000\n/);
      expect(stdout).toMatch(/CapEff:\s+0{16}/);
      expect(stdout).toMatch(/CapPrm:\s+0{16}/);
      expect(stdout).toMatch(/NoNewPrivs:\s+1/);
      expect(stdout).toMatch(/Seccomp:\s+2/);
    });

    test('the set-uid-root shell the image carries gives no root', async () => {
      const probe = await sh(
        box,
        'ls -l /usr/local/bin/rootsh; /usr/local/bin/rootsh -p -c "id -u; id -u -r"',
      );
      expect(probe.stdout).toMatch(/^-rws/);
      expect(probe.stdout).not.toMatch(/^0$/m);
      expect(probe.stdout).toMatch(/^1000\n1000\n?$/m);
    });

    test('no mounts, no user namespaces, no raw kernel knobs', async () => {
      const before = readFileSync('/proc/sys/kernel/core_pattern', 'utf8');
      const probe = await sh(
        box,
        [
          'unshare -U true; echo "unshare=$?"',
          'mkdir -p /tmp/m; mount -t tmpfs x /tmp/m; echo "mount=$?"',
          'echo "|/tmp/x" > /proc/sys/kernel/core_pattern; echo "sysctl=$?"',
        ].join('\n'),
      );
      expect(probe.stdout).toMatch(/unshare=[1-9]/);
      expect(probe.stdout).toMatch(/mount=[1-9]/);
      expect(probe.stdout).toMatch(/sysctl=[1-9]/);
      expect(readFileSync('/proc/sys/kernel/core_pattern', 'utf8')).toBe(before);
    });

    test('the engine and the host stay out of reach: no docker socket, no network but loopback', async () => {
      const probe = await sh(
        box,
        [
          'ls -l /var/run/docker.sock /run/docker.sock 2>&1',
          'cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d " "',
        ].join('\n'),
      );
      expect(probe.stdout).toMatch(/No such file or directory/);
      expect(probe.stdout).not.toMatch(/^srw/m);
      expect(probe.stdout.trim().split('\n').slice(-1)).toEqual(['lo']);
    });

    test('a fork bomb stops at resources.processes; the sandbox lives on', async () => {
      // The children are killed and reaped before the answer: nothing holds the output open.
      const bomb = await box.commands.run('python3 -c "$CODE"', {
        envs: { CODE: FORK_BOMB },
        timeoutMs: 60_000,
        allowNonZeroExit: true,
      });
      const [forked, refused, alive] = bomb.stdout.trim().split(' ').map(Number);
      expect(forked).toBeGreaterThan(5);
      expect(refused).toBeGreaterThan(0);
      expect(alive).toBeLessThanOrEqual(64);
      expect((await sh(box, 'echo alive')).stdout).toBe('alive\n');
    });
  });
}
