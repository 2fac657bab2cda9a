import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import { DockerProvider } from '../../src/providers/docker/docker-provider.js';
import type { DockerEngine } from '../../src/providers/docker/engine-client.js';
import { KubernetesProvider } from '../../src/providers/kubernetes/kubernetes-provider.js';
import { portableRuntime } from '../../src/providers/portable-runtime.js';
import { call } from '../helpers/api-call.js';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { dockerEngine, ensureBusyboxImage } from '../helpers/docker-images.js';
import { KubeApiDouble, kubeletUnavailable } from '../helpers/kube-api-double.js';
import {
  freePort,
  registryUnavailable,
  startRegistry,
  type TestRegistry,
} from '../helpers/registry.js';

// A daemon on the kubernetes provider with --kube-image-registry: an image template is built on
// the host's Docker engine, pushed to a real registry (docker-registry on loopback), and the pod
// of its sandbox (the API double's) names the pushed reference; an unreachable registry fails
// the build with an error naming it, leaving no image and no template behind.
const NAMESPACE = 'sandboxes';
const engine = await dockerEngine();
const skipped =
  kubeletUnavailable() ?? (engine.docker ? undefined : engine.reason) ?? registryUnavailable();
const scratch = mkdtempSync(join(tmpdir(), 'abx-daemon-kube-images-'));
const label = `t${process.pid}`;
let double: KubeApiDouble;
let registry: TestRegistry | undefined;
let builder: DockerProvider | undefined;
const daemons: Daemon[] = [];
const providers: KubernetesProvider[] = [];

/** The template images the engine holds for `name`, by any tag. */
async function templateImages(docker: DockerEngine, name: string): Promise<string[]> {
  const images = await docker.listImages();
  return images
    .flatMap((image) => image.RepoTags ?? [])
    .filter(
      (tag) => tag.includes(`abx-template/${name}:`) || tag.includes(`abx-template-${name}:`),
    );
}

beforeAll(async () => {
  if (skipped) return;
  ensureBuilt();
  const runtime = await portableRuntime({
    runtimeDir: join(ROOT, 'dist', 'runtime'),
    cacheDir: join(scratch, 'runtime'),
  });
  double = new KubeApiDouble({ dir: join(scratch, 'node'), runtimeImageDir: runtime.dir });
  await double.start();
  registry = await startRegistry();
  await ensureBusyboxImage(engine.docker as DockerEngine);
  builder = new DockerProvider({
    runtimeDir: join(ROOT, 'dist', 'runtime'),
    runtimeCacheDir: join(scratch, 'runtime'),
  });
}, 300_000);

afterAll(async () => {
  for (const daemon of daemons) await daemon.stop().catch(() => undefined);
  for (const provider of providers) await provider.close();
  const docker = engine.docker;
  if (docker) {
    for (const tag of [
      ...(await templateImages(docker, `${label}-img-1`)),
      ...(await templateImages(docker, `${label}-down`)),
    ]) {
      await docker
        .getImage(tag)
        .remove({ force: true })
        .catch(() => undefined);
    }
  }
  await builder?.close?.();
  await registry?.stop();
  await double?.close();
  rmSync(scratch, { recursive: true, force: true });
  expect(double?.invalid ?? []).toEqual([]);
});

async function startDaemon(name: string, imageRegistry: string) {
  const home = join(scratch, name);
  const provider = new KubernetesProvider({
    kubeConfig: double.kubeConfig(NAMESPACE),
    runtimeImage: 'abx-runtime:test',
  });
  providers.push(provider);
  const daemon = new Daemon({
    home,
    provider,
    imageBuilder: async () => builder as DockerProvider,
    imageRegistry,
    apiPort: 0,
    gatewayPort: 0,
    warmPool: 0,
  });
  daemons.push(daemon);
  const info = await daemon.start();
  const auth = {
    authorization: `Bearer ${readFileSync(join(home, 'api-key'), 'utf8').trim()}`,
  };
  return { daemon, info, auth };
}

describe.skipIf(skipped)(
  `image templates pushed for the cluster (--kube-image-registry)${skipped ? `: skipped, ${skipped}` : ''}`,
  () => {
    test('a built image template is pushed by content hash, and its pod pulls that reference', async () => {
      const { address } = registry as TestRegistry;
      const { daemon, info, auth } = await startDaemon('home', address);
      // Upper case and "_" are fine in a template's name, not in a repository's (nor in a
      // local build tag, which the engine refused before).
      const name = `${label}-Img_1`;
      const built = await call(`${info.apiUrl}/v1/templates`, {
        method: 'POST',
        headers: auth,
        body: { yaml: `name: ${name}\nimage: abx-test/busybox:1\n` },
      });
      expect(built.status, JSON.stringify(built.body)).toBe(200);
      const { image } = await daemon.templates.get(name);
      const repository = `abx-template-${label}-img-1`;
      expect(image).toMatch(new RegExp(`^${address}/${repository}:[0-9a-f]{16}$`));
      const tag = (image as string).split(':').pop() as string;
      expect(await registry?.tags(repository)).toEqual([tag]);
      expect(await registry?.hasManifest(repository, tag)).toBe(true);
      // The engine keeps the pushed reference only: no build tag is left.
      expect(await templateImages(engine.docker as DockerEngine, `${label}-img-1`)).toEqual([
        image,
      ]);

      const created = await call(`${info.apiUrl}/v1/sandboxes`, {
        method: 'POST',
        headers: auth,
        body: { template: name },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(200);
      const pod = double.get('pods', NAMESPACE, `abx-${created.body.sandboxId}`);
      expect(pod?.spec.containers[0].image).toBe(image);
      expect(pod?.spec.initContainers[0].image).toBe('abx-runtime:test');
      const removed = await call(`${info.apiUrl}/v1/sandboxes/${created.body.sandboxId}`, {
        method: 'DELETE',
        headers: auth,
      });
      expect(removed.status).toBeLessThan(300);
    });

    test('a registry that does not answer: the build fails naming it; no image, no template', async () => {
      const down = `127.0.0.1:${await freePort()}`;
      const { daemon, info, auth } = await startDaemon('home-down', down);
      const name = `${label}-down`;
      const built = await call(`${info.apiUrl}/v1/templates`, {
        method: 'POST',
        headers: auth,
        body: { yaml: `name: ${name}\nimage: abx-test/busybox:1\n` },
      });
      expect(built.status).toBe(503);
      expect(JSON.stringify(built.body)).toContain(`registry ${down} cannot be reached`);
      await expect(daemon.templates.get(name)).rejects.toThrow(/is not built/);
      expect(await templateImages(engine.docker as DockerEngine, name)).toEqual([]);
    });

    test('--kube-image-registry on another provider stops the daemon, saying it needs kubernetes', async () => {
      const result = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
        const child = spawn(process.execPath, [join(ROOT, 'dist', 'daemon.js')], {
          env: {
            ...process.env,
            ABX_HOME: join(scratch, 'home-docker'),
            ABX_PROVIDER: 'docker',
            ABX_KUBE_IMAGE_REGISTRY: 'registry.example',
          },
          stdio: ['ignore', 'ignore', 'pipe'],
        });
        let stderr = '';
        child.stderr.on('data', (chunk: Buffer) => {
          stderr += chunk;
        });
        child.on('close', (code) => resolve({ code, stderr }));
      });
      expect(result.code).toBe(1);
      expect(result.stderr).toContain("it needs --provider kubernetes, not 'docker'");
    });

    test('a registry that is not a valid prefix stops the daemon from starting', () => {
      expect(
        () => new Daemon({ home: join(scratch, 'home-bad'), imageRegistry: 'https://Registry' }),
      ).toThrow(/--kube-image-registry.*REGISTRY\[:PORT\]\[\/PATH\]/);
    });
  },
);
