import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { SANDBOX_RUNTIME_DIR } from '../../runtime/protocol/constants.js';
import { abxHome } from '../installation/paths.js';
import { DockerProvider } from '../providers/docker/docker-provider.js';
import { dockerClient, dockerMessage, type EngineFacts } from '../providers/docker/engine.js';
import {
  type DockerEngine,
  type EngineContainer,
  followProgress,
} from '../providers/docker/engine-client.js';
import { portableRuntime, SANDBOX_NODE } from '../providers/portable-runtime.js';
import { packageInfo } from '../util/package-info.js';
import { dockerGroupFix, probe, probeFailure } from './doctor-probe.js';
import { type Check, type DoctorReport, reportOf } from './doctor-report.js';

const ENGINE_TIMEOUT_MS = 5_000;
/** Building the runtime hashes and copies Node (~100 MB) the first time: give it room. */
const RUNTIME_TIMEOUT_MS = 120_000;
const RUN_TIMEOUT_MS = 10_000;

function within<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([
    work,
    new Promise<never>((_, reject) =>
      setTimeout(
        () => reject(new Error(`${what} did not finish within ${ms / 1000} s`)),
        ms,
      ).unref(),
    ),
  ]);
}

/**
 * The portable runtime every docker sandbox runs envd on: built (or found in the daemon's cache)
 * as the daemon would, then its Node started through its own loader and libraries.
 */
async function runtimeCheck(docker: DockerEngine): Promise<Check> {
  const runtimeDir = join(packageInfo().root, 'dist', 'runtime');
  const root = process.getuid?.() === 0;
  try {
    const runtime = await within(
      portableRuntime({ runtimeDir, ...(root ? {} : { cacheDir: join(abxHome(), 'runtime') }) }),
      RUNTIME_TIMEOUT_MS,
      'building the portable runtime',
    );
    const loader = runtime.libs.find((name) => name.startsWith('ld-'));
    const lib = join(runtime.dir, 'lib');
    const node = join(runtime.dir, 'bin', 'node');
    const [file, args] = loader
      ? [join(lib, loader), ['--library-path', lib, node, '--version']]
      : [node, ['--version']];
    const result = await probe(file, args, { timeoutMs: RUN_TIMEOUT_MS });
    if (!result.ok) {
      return {
        name: 'portable runtime',
        status: 'failed',
        required: true,
        found: probeFailure(result, `the runtime's Node (${runtime.dir})`, RUN_TIMEOUT_MS),
        fix: `remove ${runtime.dir} so the daemon builds it again, and check that patchelf works (apt-get install patchelf)`,
      };
    }
    const described = `Node ${result.stdout.trim()} with ${runtime.libs.length} libraries, ${Math.round(runtime.bytes / 1024 ** 2)} MB at ${runtime.dir} (${runtime.built ? 'built now' : 'cached'})`;
    const injected = await within(
      runInEmptyImage(docker, runtime.dir),
      RUNTIME_TIMEOUT_MS,
      'a container of an empty image',
    ).catch((error: Error) => ({ ok: false as const, why: error.message }));
    if (!injected.ok) {
      return {
        name: 'portable runtime',
        status: 'failed',
        required: true,
        found: `${described}; bound at ${SANDBOX_RUNTIME_DIR} in a container it did not run: ${injected.why}`,
        fix: 'the engine must be able to bind this folder read-only into containers (a rootless engine or --userns-remap needs it readable by its uids; root’s cache is /run/abx-runtime, mode 755)',
      };
    }
    return {
      name: 'portable runtime',
      status: 'ok',
      required: true,
      found: `${described}; bound read-only at ${SANDBOX_RUNTIME_DIR} in a container of an image with no files (${injected.image}, removed), its Node ran (${injected.version})`,
    };
  } catch (error) {
    const message = (error as Error).message;
    return {
      name: 'portable runtime',
      status: 'failed',
      required: true,
      found: message,
      fix: /patchelf/.test(message)
        ? 'apt-get install patchelf'
        : existsSync(join(runtimeDir, 'envd.cjs'))
          ? 'see the message; the runtime is built from the daemon’s Node (process.execPath) with ldd and patchelf'
          : 'build the package (npm run build) or reinstall it',
    };
  }
}

function engineLine(facts: EngineFacts, address: string): Check {
  return {
    name: 'docker engine',
    status: 'ok',
    required: true,
    found: `Docker ${facts.version} at ${address}, ${facts.rootless ? 'a rootless engine' : 'run as root'}${facts.usernsRemap ? ' with --userns-remap' : ''}; cgroup v${facts.cgroupVersion} (${facts.cgroupDriver})`,
  };
}

/**
 * Runs the runtime's Node in a container of an image with no files at all (imported from an
 * empty tar), the runtime bound read-only at /opt/abx as the provider binds it: proof that any
 * image can run envd. The image and the container are removed, whatever happens.
 */
async function runInEmptyImage(
  docker: DockerEngine,
  runtimeDir: string,
): Promise<{ ok: true; version: string; image: string } | { ok: false; why: string }> {
  // Each run's probe has a name of its own (two doctors on one engine never mistake each other's).
  const image = `abx-doctor-probe:${randomBytes(6).toString('hex')}`;
  const [repo, tag] = image.split(':') as [string, string];
  let container: EngineContainer | undefined;
  try {
    const progress = await docker.importImage(Readable.from([Buffer.alloc(10_240)]), {
      repo,
      tag,
    });
    await followProgress(progress);
    container = await docker.createContainer({
      Image: image,
      Entrypoint: [SANDBOX_NODE, '-e', 'process.stdout.write(process.version)'],
      Cmd: [],
      Tty: true,
      NetworkDisabled: true,
      Labels: { 'abx.doctor': 'probe', 'abx.doctor.image': image },
      HostConfig: {
        Binds: [`${runtimeDir}:${SANDBOX_RUNTIME_DIR}:ro`],
        NetworkMode: 'none',
      },
    });
    await container.start();
    const exit = await container.wait({ timeoutMs: RUNTIME_TIMEOUT_MS });
    // A TTY container's log is plain text (no frames).
    const output = (await container.logs({ stdout: true, stderr: true })).toString('utf8').trim();
    if (exit.StatusCode === 0 && /^v\d+\.\d+\.\d+$/.test(output))
      return { ok: true, version: output, image };
    return { ok: false, why: `exit ${exit.StatusCode}: ${output.slice(-300)}` };
  } catch (error) {
    return { ok: false, why: dockerMessage(error) };
  } finally {
    await container?.remove({ force: true }).catch(() => undefined);
    await docker
      .getImage(image)
      .remove({ force: true })
      .catch(() => undefined);
  }
}

/**
 * `abx doctor --provider docker`: the engine answers (DOCKER_HOST or its socket), its version and
 * whether it runs rootless, the limits it enforces (the provider's own isolation report), and the
 * portable runtime every sandbox runs envd on.
 */
export async function dockerDoctor(): Promise<DoctorReport> {
  const root = process.getuid?.() === 0;
  const { docker, close } = dockerClient();
  const provider = new DockerProvider({
    docker,
    runtimeDir: join(packageInfo().root, 'dist', 'runtime'),
    ...(root ? {} : { runtimeCacheDir: join(abxHome(), 'runtime') }),
    ...(process.env.ABX_DOCKER_BASE_IMAGE ? { baseImage: process.env.ABX_DOCKER_BASE_IMAGE } : {}),
  });
  const address = process.env.DOCKER_HOST || 'unix:///var/run/docker.sock';
  const checks: Check[] = [];
  try {
    let facts: EngineFacts;
    try {
      facts = await within(provider.engine(), ENGINE_TIMEOUT_MS, `the Docker engine at ${address}`);
    } catch (error) {
      const message = (error as Error).message;
      const [found, fix] = message.split(/; (?=start it with)/);
      checks.push({
        name: 'docker engine',
        status: 'failed',
        required: true,
        found: found ?? message,
        fix: /refused this user/.test(message)
          ? dockerGroupFix()
          : fix
            ? `${fix}; apt-get install docker.io to install it`
            : 'start it (sudo systemctl start docker, or dockerd &), or point DOCKER_HOST at a running engine',
      });
      return reportOf('docker', undefined, checks);
    }
    const mode = facts.rootless ? 'rootless' : 'root';
    checks.push(engineLine(facts, address));
    const isolation = provider.isolation();
    for (const [name, limit] of Object.entries(isolation.limits)) {
      if (limit.enforced) continue;
      checks.push({
        name: `${name} limit`,
        status: 'warning',
        required: false,
        found: limit.how,
        fix:
          name === 'disk'
            ? 'give the engine a storage driver with quotas (overlay2 on xfs mounted with pquota, btrfs or zfs)'
            : `enable the ${name} cgroup controller for the engine (cgroup v2 with it delegated, or the v1 hierarchy mounted)`,
      });
    }
    for (const warning of isolation.warnings) {
      const base = /image (\S+) is not on this Docker engine/.exec(warning);
      if (base) {
        checks.push({
          name: 'base image',
          status: 'warning',
          required: false,
          found: `${base[1]} is not on the engine: sandboxes of templates without an image cannot start until it is`,
          fix: `docker pull ${base[1]}, docker load -i file.tar, or set ABX_DOCKER_BASE_IMAGE to an image the engine has`,
        });
      }
    }
    if (!facts.seccomp) {
      checks.push({
        name: 'seccomp',
        status: 'warning',
        required: false,
        found: 'the engine reports no seccomp support: sandboxes run without a system call filter',
        fix: 'use a kernel and dockerd built with seccomp (the distributions’ packages are)',
      });
    }
    checks.push(await runtimeCheck(docker));
    return reportOf('docker', mode, checks);
  } finally {
    await provider.close();
    close();
  }
}
