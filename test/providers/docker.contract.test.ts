import { randomBytes } from 'node:crypto';
import {
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { request } from 'node:http';
import type { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { envdRequest } from '../../src/control/envd-request.js';
import { InvalidArgumentError, NotFoundError, UnavailableError } from '../../src/errors.js';
import { DockerProvider } from '../../src/providers/docker/docker-provider.js';
import { type ContainerInfo, DockerEngine } from '../../src/providers/docker/engine-client.js';
import { addSandboxUser } from '../../src/providers/docker/passwd.js';
import { sandboxCgroupDirs } from '../../src/providers/docker/sandbox-cgroups.js';
import type { SandboxHandle, SandboxSpec } from '../../src/providers/provider.js';
import { connectSandboxSocket } from '../../src/providers/sandbox-socket.js';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import {
  BUSYBOX_IMAGE,
  DEBIAN_IMAGE,
  dockerEngine,
  ensureBusyboxImage,
  ensureDebianImage,
} from '../helpers/docker-images.js';
import { providerContract } from './contract.js';

// The Docker provider against a real engine, on images made here (no registry is reachable):
// abx-test/debian:12 (debootstrap, a few minutes once per machine) for the contract, whose
// checks need python3 and util-linux, and abx-test/busybox:1 (no libc, no Node) for images that
// have nothing the runtime needs. Skipped, saying why, only when no engine answers.
const RUNTIME_DIR = join(ROOT, 'dist', 'runtime');
const MiB = 1024 * 1024;
const engine = await dockerEngine();

describe('addSandboxUser (prepare’s account files)', () => {
  const root = 'root:x:0:0:root:/root:/bin/bash\n';
  test('adds user 1000 at the end, and files an image lacks start with root', () => {
    expect(addSandboxUser('img', 'user', root, 'root:x:0:\n')).toEqual({
      passwd: `${root}user:x:1000:1000::/home/user:/bin/sh\n`,
      group: 'root:x:0:\nuser:x:1000:\n',
    });
    expect(addSandboxUser('img', 'user', undefined, undefined)).toEqual({
      passwd: 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n',
      group: 'root:x:0:\nuser:x:1000:\n',
    });
  });

  test('uid 1000 under another name: the user goes first, the other name stays an alias', () => {
    const passwd = `${root}node:x:1000:1000::/home/node:/bin/bash\n`;
    expect(addSandboxUser('img', 'user', passwd, 'root:x:0:\nnode:x:1000:\n')).toEqual({
      passwd: `${root}user:x:1000:1000::/home/user:/bin/sh\nnode:x:1000:1000::/home/node:/bin/bash\n`,
      group: 'root:x:0:\nuser:x:1000:\nnode:x:1000:\n',
    });
  });

  test('the user there already as uid 1000 is kept; with another uid it is refused', () => {
    const passwd = `${root}user:x:1000:1000:me:/home/user:/bin/bash\n`;
    expect(addSandboxUser('img', 'user', passwd, 'user:x:1000:\n')).toEqual({});
    expect(() =>
      addSandboxUser('img', 'user', `${root}user:x:1001:1001::/home/user:/bin/sh\n`, ''),
    ).toThrow(InvalidArgumentError);
    expect(() => addSandboxUser('img', 'bad name', root, '')).toThrow(InvalidArgumentError);
  });
});

if (!engine.docker) {
  describe.skip(`docker provider: skipped, ${engine.reason}`, () => {
    test('the provider contract', () => undefined);
  });
} else {
  const docker = engine.docker;

  beforeAll(async () => {
    ensureBuilt();
    await ensureBusyboxImage(docker);
    await ensureDebianImage(docker);
  }, 20 * 60_000);

  /** Host processes in the sandbox's cgroups (Docker puts its container below them). */
  function processesOf(id: string): number[] {
    const pids: number[] = [];
    for (const entry of readdirSync('/proc')) {
      if (!/^\d+$/.test(entry)) continue;
      try {
        if (readFileSync(`/proc/${entry}/cgroup`, 'utf8').includes(`/abx-docker/${id}/`)) {
          pids.push(Number(entry));
        }
      } catch {
        // ended meanwhile
      }
    }
    return pids;
  }

  async function containersOf(id: string): Promise<ContainerInfo[]> {
    return docker.listContainers({ all: true, filters: { label: [`abx.sandbox=${id}`] } });
  }

  /** Its containers (any state), its cgroup folders, processes in them. */
  async function leftovers(id: string): Promise<string[]> {
    return [
      ...(await containersOf(id)).map((c) => `container ${c.Names.join(',')} (${c.State})`),
      ...sandboxCgroupDirs(id).map((dir) => `cgroup ${dir}`),
      ...processesOf(id).map((pid) => `process ${pid}`),
    ];
  }

  async function removeLeftovers(id: string): Promise<void> {
    for (const found of await containersOf(id)) {
      await docker
        .getContainer(found.Id)
        .remove({ force: true })
        .catch(() => undefined);
    }
    for (const dir of sandboxCgroupDirs(id)) {
      try {
        rmdirSync(dir);
      } catch {
        // still busy, or gone
      }
    }
  }

  const makeProvider = (options: { startTimeoutMs?: number } = {}) =>
    new DockerProvider({ runtimeDir: RUNTIME_DIR, baseImage: DEBIAN_IMAGE, ...options });

  providerContract('docker', makeProvider, {
    mode: 'rootless',
    leftovers,
    removeLeftovers,
  });

  describe('docker provider: what the contract does not cover', () => {
    let provider: DockerProvider;
    let folder: string;
    const started: SandboxHandle[] = [];
    const images: string[] = [];

    const specFor = (label: string, overrides: Partial<SandboxSpec> = {}): SandboxSpec => {
      const id = `${label}-${randomBytes(4).toString('hex')}`;
      return {
        id,
        accessToken: randomBytes(24).toString('hex'),
        dir: join(folder, id),
        env: {},
        workdir: '/home/user',
        resources: {},
        network: 'none',
        ...overrides,
      };
    };
    const start = async (spec: SandboxSpec) => {
      const handle = await provider.create(spec);
      started.push(handle);
      return handle;
    };
    const sh = async (handle: SandboxHandle, spec: SandboxSpec, cmd: string, timeout = 20) => {
      const { status, body } = await envdRequest<{
        stdout: string;
        stderr: string;
        exit_code: number;
      }>(handle.envdSocket, spec.accessToken, 'POST', '/process/exec', { cmd, timeout }, 300_000);
      expect(status).toBe(200);
      return body;
    };

    beforeAll(() => {
      folder = mkdtempSync(join(tmpdir(), 'abx-docker-'));
      provider = makeProvider();
    });

    afterAll(async () => {
      for (const handle of started) await provider.kill(handle).catch(() => undefined);
      for (const image of images) await provider.images.remove(image).catch(() => undefined);
      await provider.close();
      if (folder) rmSync(folder, { recursive: true, force: true });
    });

    test('the container is made with the isolation settings, and they hold inside', async () => {
      const spec = specFor('settings', {
        resources: { memory: 256 * MiB, cpu: 0.5, processes: 64, openFiles: 300, fileSize: MiB },
      });
      const handle = await start(spec);
      const info = await docker.getContainer(handle.container as string).inspect();
      const host = info.HostConfig;
      expect({
        user: info.Config.User,
        hostname: info.Config.Hostname,
        capDrop: host.CapDrop,
        capAdd: host.CapAdd ?? null,
        privileged: host.Privileged,
        securityOpt: host.SecurityOpt,
        network: host.NetworkMode,
        init: host.Init,
        memory: host.Memory,
        swap: host.MemorySwap,
        cpus: host.NanoCpus,
        pids: host.PidsLimit,
        ulimits: host.Ulimits,
        readOnlyRuntime: host.Binds?.some((bind) => bind.endsWith(':/opt/abx:ro')),
      }).toEqual({
        user: '1000:1000',
        hostname: spec.id,
        capDrop: ['ALL'],
        capAdd: null,
        privileged: false,
        securityOpt: ['no-new-privileges'],
        network: 'none',
        init: true,
        memory: 256 * MiB,
        swap: 256 * MiB,
        cpus: 500_000_000,
        pids: 64,
        ulimits: [
          { Name: 'nofile', Soft: 300, Hard: 300 },
          { Name: 'fsize', Soft: MiB, Hard: MiB },
        ],
        readOnlyRuntime: true,
      });
      const inside = await sh(
        handle,
        spec,
        'id -u; grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " "; touch /opt/abx/x 2>/dev/null || echo runtime read-only',
      );
      expect(inside.stdout).toBe(
        '1000\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nlo\nruntime read-only\n',
      );
    });

    test('a symlink the sandbox plants in /run/abx never leads the host to its own sockets', async () => {
      const spec = specFor('symlink');
      const handle = await start(spec);
      // Where the host's engine listens: a naive connect through /proc/PID/root would follow an
      // absolute link from the host's root and reach it.
      await sh(handle, spec, 'ln -s /var/run/docker.sock /run/abx/ports/9999.sock');
      const socket = join(handle.portsDir, '9999.sock');
      const ping = (connect?: () => Socket) =>
        new Promise<string>((resolve) => {
          const req = request(
            {
              socketPath: socket,
              ...(connect ? { createConnection: connect } : {}),
              path: '/_ping',
            },
            (res) => {
              res.resume();
              resolve(`answered ${res.statusCode}`);
            },
          );
          req.on('error', (error: NodeJS.ErrnoException) => resolve(error.code ?? error.message));
          req.end();
        });
      // The danger is real: a plain connect follows the link to the engine...
      expect(await ping()).toBe('answered 200');
      // ...the daemon's connect refuses anything but a socket reached without a link.
      expect(['ELOOP', 'ENOTSOCK']).toContain(await ping(() => connectSandboxSocket(socket)));
    });

    test('an image with no libc and no Node (busybox) runs envd, with the user prepare added', async () => {
      const image = await provider.images.prepare(
        { image: BUSYBOX_IMAGE },
        { user: 'user', tag: 'abx-test/prepared-busybox:1' },
      );
      images.push(image);
      const spec = specFor('busybox', { image, workdir: '/home/user/work' });
      const handle = await start(spec);
      const result = await sh(
        handle,
        spec,
        'id -un; id -u; pwd; readlink /bin/sh; ls /lib 2>&1 | head -n 1; node -p "6 * 7"; touch here && echo writable',
      );
      expect(result.stdout).toBe(
        'user\n1000\n/home/user/work\nbusybox\nls: /lib: No such file or directory\n42\nwritable\n',
      );
      // A second prepare of the same image for the same user finds it made.
      const started = Date.now();
      await provider.images.prepare(
        { image: BUSYBOX_IMAGE },
        { user: 'user', tag: 'abx-test/prepared-busybox:1' },
      );
      expect(Date.now() - started).toBeLessThan(2000);
    });

    test('prepare: a missing image is a NotFoundError saying how to get it', async () => {
      const error = await provider.images
        .prepare({ image: 'abx-test/no-such-image:1' }, { user: 'user', tag: 'abx-test/x:1' })
        .catch((thrown: unknown) => thrown);
      expect(error).toBeInstanceOf(NotFoundError);
      expect((error as Error).message).toBe(
        'image abx-test/no-such-image:1 is not on this Docker engine; get it with `docker pull abx-test/no-such-image:1` or `docker load -i file.tar`',
      );
    });

    test('prepare builds a Dockerfile; uid 1000 taken by another name stays that name’s alias', async () => {
      const context = join(folder, 'dockerfile');
      mkdirSync(context);
      writeFileSync(join(context, 'greeting.txt'), 'from the context\n');
      writeFileSync(
        join(context, 'Dockerfile'),
        [
          `FROM ${BUSYBOX_IMAGE}`,
          'COPY greeting.txt /greeting.txt',
          "RUN mkdir -p /etc /home/node && printf 'root:x:0:0:root:/root:/bin/sh\\nnode:x:1000:1000::/home/node:/bin/sh\\n' > /etc/passwd && chown 1000:1000 /home/node",
          '',
        ].join('\n'),
      );
      const image = await provider.images.prepare(
        { dockerfile: join(context, 'Dockerfile') },
        { user: 'user', tag: 'abx-test/prepared-dockerfile:1' },
      );
      images.push(image);
      await expect(
        docker.getImage('abx-test/prepared-dockerfile:1-build').inspect(),
      ).rejects.toThrow();
      const spec = specFor('dockerfile', { image });
      const handle = await start(spec);
      const result = await sh(
        handle,
        spec,
        'cat /greeting.txt; id -un; cut -d: -f1,3 /etc/passwd; stat -c %U /home/node',
      );
      expect(result.stdout).toBe('from the context\nuser\nroot:0\nuser:1000\nnode:1000\nuser\n');
    });

    test('a template build: a root build sandbox with the host network runs apt-get, commit keeps it', async () => {
      const prepared = await provider.images.prepare(
        { image: DEBIAN_IMAGE },
        { user: 'user', tag: 'abx-test/prepared-debian:12' },
      );
      images.push(prepared);
      const build = specFor('build', { image: prepared, user: 'root', network: 'host' });
      const builder = await start(build);
      const setup = await sh(
        builder,
        build,
        'id -u && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends jq > /dev/null && echo installed',
        240,
      );
      expect(setup.stdout, setup.stderr).toBe('0\ninstalled\n');
      const tag = await provider.images.commit(builder, 'abx-test/template-jq:1');
      images.push(tag);
      await provider.kill(builder);
      const config = (await docker.getImage(tag).inspect()).Config ?? {};
      expect(config.Labels).toMatchObject({ 'abx.template': tag });
      // A container of this image run by hand is no sandbox of any folder (sweepOrphans).
      expect(config.Labels?.['abx.sandbox'] ?? '').toBe('');
      expect(config.Labels?.['abx.sandboxes-dir'] ?? '').toBe('');
      expect(config.Env ?? []).not.toContainEqual(expect.stringMatching(/^ABX_SANDBOX_ID=./));

      const spec = specFor('from-template', { image: tag });
      const handle = await start(spec);
      const result = await sh(handle, spec, 'id -u; echo \'{"a": 1}\' | jq .a');
      expect(result.stdout).toBe('1000\n1\n');
    }, 300_000);

    test('without an engine: an UnavailableError naming the socket and how to start Docker', async () => {
      const missing = join(folder, 'no-engine.sock');
      const offline = new DockerProvider({
        runtimeDir: RUNTIME_DIR,
        docker: new DockerEngine({ socketPath: missing }),
      });
      const error = await offline.create(specFor('offline')).catch((thrown: unknown) => thrown);
      expect(error).toBeInstanceOf(UnavailableError);
      expect((error as Error).message).toContain(missing);
      expect((error as Error).message).toMatch(/systemctl start docker|dockerd/);
      await offline.close();
    });
  });
}
