import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { envdRequest } from '../../src/control/envd-request.js';
import { LocalProvider } from '../../src/providers/local/local-provider.js';
import { rootUidOf } from '../../src/providers/local/root-userns.js';
import type { SandboxHandle, SandboxSpec } from '../../src/providers/provider.js';
import { DEBIAN_IMAGE, dockerEngine, ensureDebianImage } from '../helpers/docker-images.js';

// A root-allowing image sandbox on the local provider (root daemon), through the provider
// itself: two envds (the default user's as always, root's on envd-root.sock), `sudo` for the
// default user, and what root inside still cannot do.

const IS_ROOT = process.getuid?.() === 0;
const engine = IS_ROOT ? await dockerEngine() : { reason: 'not root' };
const ROOT = join(import.meta.dirname, '..', '..');

interface Exec {
  stdout: string;
  stderr: string;
  exit_code: number;
}

if (!('docker' in engine) || !engine.docker) {
  describe.skip(`root inside image sandboxes: skipped, ${engine.reason}`, () => {
    test('root sandbox', () => undefined);
  });
} else {
  const docker = engine.docker;
  describe('a root-allowing image sandbox on the local provider', () => {
    let folder: string;
    let provider: LocalProvider;
    let spec: SandboxSpec;
    let handle: SandboxHandle | undefined;
    const run = async (socket: string, cmd: string): Promise<Exec> => {
      const answer = await envdRequest<Exec>(socket, spec.accessToken, 'POST', '/process/exec', {
        cmd,
        timeout: 30,
      });
      if (answer.status !== 200) throw new Error(`exec ${cmd}: ${JSON.stringify(answer.body)}`);
      return answer.body;
    };
    const asUser = (cmd: string) => run((handle as SandboxHandle).envdSocket, cmd);
    const asRoot = (cmd: string) => run((handle as SandboxHandle).envdRootSocket as string, cmd);

    beforeAll(async () => {
      await ensureDebianImage(docker);
      folder = mkdtempSync('/var/tmp/abx-root-sandbox-');
      provider = new LocalProvider({ runtimeDir: join(ROOT, 'dist', 'runtime') });
      const id = `root-${randomBytes(4).toString('hex')}`;
      spec = {
        id,
        accessToken: randomBytes(24).toString('hex'),
        dir: join(folder, id),
        env: {},
        workdir: '/home/user',
        resources: { processes: 256 },
        network: 'none',
        image: DEBIAN_IMAGE,
        allowRoot: true,
      };
      handle = await provider.create(spec);
    }, 300_000);

    afterAll(async () => {
      if (handle) await provider.kill(handle).catch(() => undefined);
      await provider?.close();
      if (folder) rmSync(folder, { recursive: true, force: true });
    });

    test("the default user's envd is as always; root's answers on its own socket as uid 0", async () => {
      expect(handle?.envdRootSocket).toMatch(/\/run\/abx\/envd-root\.sock$/);
      const user = await asUser('id -u; grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status');
      expect(user.stdout).toMatch(/^1000\nCapEff:\s+0{16}\nNoNewPrivs:\s+1\nSeccomp:\s+2\n$/);
      const root = await asRoot('id -u; grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status');
      expect(root.stdout).toMatch(/^0\nCapEff:\s+0{13}5fb\nNoNewPrivs:\s+1\nSeccomp:\s+2\n$/);
    });

    test('sudo runs the command as root, passing stdin, output and the exit code', async () => {
      const sudo = await asUser(
        'echo piped | sudo sh -c "id -u; cat; echo err >&2; exit 7"; echo "exit=$?"; sudo -u nobody true; echo "other=$?"',
      );
      expect(sudo.stdout).toBe('0\npiped\nexit=7\nother=1\n');
      expect(sudo.stderr).toMatch(/^err\n/);
      expect(sudo.stderr).toMatch(/runs commands as root only/);
      const missing = await asUser('sudo no-such-program; echo "exit=$?"');
      expect(missing.stdout).toBe('exit=1\n');
      expect(missing.stderr).toMatch(/no-such-program: command not found/);
    });

    test("root writes the image's files into the upper layer as the root uid, never the image", async () => {
      const wrote = await asRoot(
        'echo hi > /etc/abx-root-probe && chmod 4755 /etc/abx-root-probe && ls -ln /etc/abx-root-probe',
      );
      expect(wrote.exit_code).toBe(0);
      expect(wrote.stdout).toMatch(/^-rwsr-xr-x 1 0 0 /);
      // The default user cannot write there, and a set-uid file root leaves gives it nothing.
      const user = await asUser(
        'echo x > /etc/abx-user-probe; echo "write=$?"; cp /bin/sh /tmp/x 2>/dev/null; true',
      );
      expect(user.stdout).toMatch(/^write=[1-9]\n$/);
      const rootUid = rootUidOf(handle?.uid as number);
      const upper = `/proc/${handle?.pid}/root/etc/abx-root-probe`;
      expect(statSync(upper).uid).toBe(rootUid);
      expect(readFileSync(upper, 'utf8')).toBe('hi\n');
    });

    test('root cannot make namespaces or mounts, write sysctls, make devices or raw sockets', async () => {
      const probe = await asRoot(
        [
          'unshare -r true 2>/dev/null; echo "unshare=$?"',
          'mount -t tmpfs x /mnt 2>/dev/null; echo "mount=$?"',
          '(echo 5 > /proc/sys/user/max_user_namespaces) 2>/dev/null; echo "userns-limit=$?"',
          'mknod /tmp/null c 1 3 2>/dev/null; echo "mknod=$?"',
          'python3 -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)" 2>/dev/null; echo "raw=$?"',
        ].join('\n'),
      );
      expect(probe.stdout).toMatch(/unshare=[1-9]/);
      expect(probe.stdout).toMatch(/mount=[1-9]/);
      expect(probe.stdout).toMatch(/userns-limit=[1-9]/);
      expect(probe.stdout).toMatch(/mknod=[1-9]/);
      expect(probe.stdout).toMatch(/raw=[1-9]/);
      expect(existsSync('/etc/abx-root-probe')).toBe(false);
    });
  });
}
