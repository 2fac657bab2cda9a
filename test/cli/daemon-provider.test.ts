import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createAbxHome } from '../helpers/abx-home.js';
import { DEBIAN_IMAGE, dockerEngine, ensureDebianImage } from '../helpers/docker-images.js';
import { abxIn } from './abx.js';

// `abx daemon start --provider docker`, as a user types it: the daemon runs its sandboxes as
// containers, says so, and refuses to be mistaken for a daemon of the other provider.
const engine = process.getuid?.() === 0 ? await dockerEngine() : { reason: 'not root' };

if (!('docker' in engine) || !engine.docker) {
  describe.skip(`abx daemon start --provider docker: skipped, ${engine.reason}`, () => {
    test('the docker provider from the CLI', () => undefined);
  });
} else {
  const docker = engine.docker;
  let home: Awaited<ReturnType<typeof createAbxHome>>;
  let cli: ReturnType<typeof abxIn>;

  beforeAll(async () => {
    await ensureDebianImage(docker);
    home = await createAbxHome();
    cli = abxIn(home.home);
  }, 900_000);
  afterAll(() => home?.close());

  describe('abx daemon start --provider docker', () => {
    test('sandboxes are containers of the base image; status says which provider', async () => {
      const started = await cli.abx([
        'daemon',
        'start',
        '--provider',
        'docker',
        '--docker-base-image',
        DEBIAN_IMAGE,
      ]);
      expect(started.code).toBe(0);
      const status = await cli.abx(['daemon', 'status']);
      expect(status.stdout).toMatch(/^running: pid \d+, provider docker,/);
      const id = (await cli.abx(['create', '-q'])).stdout.trim();
      const inside = await cli.abx([
        'exec',
        id,
        '--',
        'sh',
        '-c',
        '. /etc/os-release; echo $ID; id -u; cat /proc/1/comm',
      ]);
      expect(inside.stdout).toBe('debian\n1000\ndocker-init\n');
      const containers = await docker.listContainers({ filters: { label: [`abx.sandbox=${id}`] } });
      expect(containers).toHaveLength(1);
      expect((await cli.abx(['kill', id])).code).toBe(0);
      expect(
        await docker.listContainers({ all: true, filters: { label: [`abx.sandbox=${id}`] } }),
      ).toEqual([]);

      // A daemon of the other provider is not silently reused.
      const local = await cli.abx(['daemon', 'start', '--provider', 'local']);
      expect(local.code).toBe(2);
      expect(local.stderr).toContain('a daemon with the docker provider runs already');
      expect((await cli.abx(['daemon', 'stop'])).stdout).toBe('daemon stopped\n');
    });
  });
}
