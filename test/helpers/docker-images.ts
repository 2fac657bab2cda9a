import { execFile, execFileSync } from 'node:child_process';
import {
  chmodSync,
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmdirSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DockerEngine, logText } from '../../src/providers/docker/engine-client.js';
import { importFolder } from '../../src/providers/docker/import-folder.js';
import { pidAlive } from '../../src/util/pid-alive.js';

/** Debian's static busybox: no libc, no Node (package busybox-static). */
export const BUSYBOX = '/bin/busybox';
/** A root filesystem of busybox alone: what the portable runtime must run in. */
export const BUSYBOX_IMAGE = 'abx-test/busybox:1';
/** A minimal Debian 12 (debootstrap minbase, plus python3): apt works in it during builds. */
export const DEBIAN_IMAGE = 'abx-test/debian:12';

/**
 * `/bin/busybox` and one symlink per applet: a root filesystem with no libc at all. `/tmp` is
 * sticky and world-writable, as every Linux program expects.
 */
export function busyboxRoot(dir: string): void {
  for (const sub of ['bin', 'opt/abx', 'proc', 'dev', 'tmp']) {
    mkdirSync(join(dir, sub), { recursive: true, mode: 0o755 });
  }
  chmodSync(join(dir, 'tmp'), 0o1777);
  copyFileSync(BUSYBOX, join(dir, 'bin', 'busybox'));
  chmodSync(join(dir, 'bin', 'busybox'), 0o755);
  const applets = execFileSync(BUSYBOX, ['--list'], { encoding: 'utf8' }).split('\n');
  for (const applet of applets) {
    if (applet && applet !== 'busybox') symlinkSync('busybox', join(dir, 'bin', applet));
  }
}

/** Where the engine is, as the engine client and the docker CLI read it. */
export function dockerSocketName(): string {
  return process.env.DOCKER_HOST || 'unix:///var/run/docker.sock';
}

/**
 * A client of the Docker engine when one answers (within 3 s), else `undefined` and why: the
 * Docker tests skip with that reason on a machine without an engine (CI starts one, see .ci/run).
 */
export async function dockerEngine(): Promise<{ docker?: DockerEngine; reason?: string }> {
  const docker = new DockerEngine();
  try {
    await docker.ping({ timeoutMs: 3000 });
    return { docker };
  } catch (error) {
    docker.close();
    return {
      reason: `no Docker engine answers on ${dockerSocketName()} (${(error as Error).message}); start one with \`dockerd --iptables=false --bridge=none &\` (as .ci/run does)`,
    };
  }
}

async function hasImage(docker: DockerEngine, tag: string): Promise<boolean> {
  try {
    await docker.getImage(tag).inspect();
    return true;
  } catch {
    return false;
  }
}

/**
 * Runs `build` once per machine for `tag`: concurrent test files wait on a lock folder (taken
 * over when its holder died), and an image that is there already is not built again.
 */
async function onceFor(
  docker: DockerEngine,
  tag: string,
  build: () => Promise<void>,
): Promise<void> {
  if (await hasImage(docker, tag)) return;
  const lock = join(tmpdir(), `abx-test-image-${tag.replace(/[^\w.-]/g, '_')}.lock`);
  for (;;) {
    try {
      mkdirSync(lock);
      writeFileSync(join(lock, 'pid'), String(process.pid));
      break;
    } catch {
      let holder = 0;
      try {
        holder = Number(readFileSync(join(lock, 'pid'), 'utf8'));
      } catch {
        // being written, or released meanwhile
      }
      const stale =
        holder > 0
          ? !pidAlive(holder)
          : Date.now() - (statSafe(lock)?.mtimeMs ?? Date.now()) > 10_000;
      if (stale) rmSync(lock, { recursive: true, force: true });
      else await new Promise((resolve) => setTimeout(resolve, 500));
    }
  }
  try {
    if (!(await hasImage(docker, tag))) await build();
  } finally {
    rmSync(join(lock, 'pid'), { force: true });
    rmdirSync(lock);
  }
}

function statSafe(path: string): { mtimeMs: number } | undefined {
  try {
    return statSync(path);
  } catch {
    return undefined;
  }
}

/** {@link BUSYBOX_IMAGE}: built from {@link busyboxRoot} in about a second, once. */
export async function ensureBusyboxImage(docker: DockerEngine): Promise<string> {
  await onceFor(docker, BUSYBOX_IMAGE, async () => {
    const work = mkdtempSync(join(tmpdir(), 'abx-busybox-image-'));
    try {
      busyboxRoot(join(work, 'rootfs'));
      await importFolder(docker, join(work, 'rootfs'), BUSYBOX_IMAGE);
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  });
  return BUSYBOX_IMAGE;
}

/** An image like a distroless one: no shell, no libc, no programs at all; only /etc. */
export const SHELLESS_IMAGE = 'abx-test/shellless:1';

/** {@link SHELLESS_IMAGE}: a root file system of one folder and a hosts file, once. */
export async function ensureShelllessImage(docker: DockerEngine): Promise<string> {
  await onceFor(docker, SHELLESS_IMAGE, async () => {
    const work = mkdtempSync(join(tmpdir(), 'abx-shellless-image-'));
    try {
      mkdirSync(join(work, 'rootfs', 'etc'), { recursive: true });
      writeFileSync(join(work, 'rootfs', 'etc', 'hosts'), '127.0.0.1 localhost\n');
      await importFolder(docker, join(work, 'rootfs'), SHELLESS_IMAGE);
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  });
  return SHELLESS_IMAGE;
}

/** The Debian mirror apt uses on this machine (deb822 or one-line sources), else Debian's CDN. */
export function debianMirror(): string {
  for (const file of ['/etc/apt/sources.list.d/debian.sources', '/etc/apt/sources.list']) {
    let text: string;
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    const uri =
      /^URIs:\s*(\S+\/debian)\/?\s*$/m.exec(text)?.[1] ??
      /^deb\s+(?:\[[^\]]*\]\s+)?(\S+\/debian)\/?\s+bookworm\s/m.exec(text)?.[1];
    if (uri) return uri;
  }
  return 'http://deb.debian.org/debian';
}

/**
 * {@link DEBIAN_IMAGE}: `debootstrap --variant=minbase bookworm` from the machine's mirror, with
 * python3 (what the provider contract runs inside), imported as an image. Takes a few minutes,
 * once per machine; the engine keeps it.
 */
export async function ensureDebianImage(docker: DockerEngine): Promise<string> {
  await onceFor(docker, DEBIAN_IMAGE, async () => {
    const work = mkdtempSync(join(tmpdir(), 'abx-debian-image-'));
    const rootfs = join(work, 'rootfs');
    try {
      await new Promise<void>((resolve, reject) => {
        execFile(
          'debootstrap',
          ['--variant=minbase', '--include=python3', 'bookworm', rootfs, debianMirror()],
          { timeout: 15 * 60_000, maxBuffer: 64 << 20 },
          (error, _stdout, stderr) => {
            if (!error) return resolve();
            const hint =
              (error as NodeJS.ErrnoException).code === 'ENOENT'
                ? 'debootstrap is not installed: apt-get install -y debootstrap (scripts/setup-system.sh)'
                : `${stderr}`.slice(-2000);
            reject(new Error(`debootstrap failed: ${hint}`));
          },
        );
      });
      await importFolder(docker, rootfs, DEBIAN_IMAGE);
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  });
  return DEBIAN_IMAGE;
}

/** {@link DEBIAN_IMAGE} with Debian's python3-pip: what `pip install --user` tests need. */
export const PIP_IMAGE = 'abx-test/debian-pip:12';

/**
 * {@link PIP_IMAGE}: python3-pip installed with apt (from the machine's Debian mirror, the only
 * package source reachable) in a container of {@link DEBIAN_IMAGE}, committed. About a minute,
 * once per machine; the engine keeps it.
 */
export async function ensurePipImage(docker: DockerEngine): Promise<string> {
  const base = await ensureDebianImage(docker);
  await onceFor(docker, PIP_IMAGE, async () => {
    const container = await docker.createContainer({
      Image: base,
      Cmd: [
        '/bin/sh',
        '-c',
        'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-pip && apt-get clean && rm -rf /var/lib/apt/lists/*',
      ],
      HostConfig: { NetworkMode: 'host' },
    });
    try {
      await container.start();
      const { StatusCode } = await container.wait({ timeoutMs: 15 * 60_000 });
      if (StatusCode !== 0) {
        const log = logText(await container.logs({ stdout: true, stderr: true }));
        throw new Error(`installing python3-pip failed (exit ${StatusCode}): ${log.slice(-2000)}`);
      }
      const [repo, tag] = PIP_IMAGE.split(':') as [string, string];
      await container.commit({ repo, tag });
    } finally {
      await container.remove({ force: true }).catch(() => undefined);
    }
  });
  return PIP_IMAGE;
}
