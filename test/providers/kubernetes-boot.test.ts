import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { V1Container, V1Pod } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { envdRequest } from '../../src/control/envd-request.js';
import { type ContainerCreateOptions, logText } from '../../src/providers/docker/engine-client.js';
import { sandboxPod, TOKEN_KEY } from '../../src/providers/kubernetes/pod-spec.js';
import { buildRuntimeImage } from '../../src/providers/kubernetes/runtime-image.js';
import { envdHealthy } from '../../src/providers/local/local-provider.js';
import { portableRuntime } from '../../src/providers/portable-runtime.js';
import { envdTokenFile, type SandboxSpec } from '../../src/providers/provider.js';
import { tcpTarget } from '../../src/providers/sandbox-socket.js';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { BUSYBOX_IMAGE, dockerEngine, ensureBusyboxImage } from '../helpers/docker-images.js';

// The pod's boot path for real on the Docker engine (no cluster runs here): the provider's pod
// spec, its init container run from the runtime image (made here with buildRuntimeImage, as a
// user makes it), then its main container on an image with no libc and no Node (busybox), each
// as a container made from the spec's fields — user and group, fsGroup, no capabilities, no new
// privileges, read-only root where the spec says, its volumes as folders shared like emptyDirs
// and the Secret as a folder of its keys, command and args with $(ABX_POD_IP) expanded as the
// kubelet does — with host networking, the pod's address being a loopback address of its own.
const engine = await dockerEngine();
const RUNTIME_IMAGE = 'abx-test/runtime:k8s';

/** The Docker create options of one container of a pod, from the spec's fields. */
function containerOf(
  pod: V1Pod,
  container: V1Container,
  volumes: Record<string, string>,
  podIP: string,
  label: string,
): ContainerCreateOptions {
  const security = { ...pod.spec?.securityContext, ...container.securityContext };
  const env: Record<string, string> = {};
  for (const variable of container.env ?? []) {
    env[variable.name] =
      variable.valueFrom?.fieldRef?.fieldPath === 'status.podIP' ? podIP : (variable.value ?? '');
  }
  const expand = (text: string) =>
    text.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (all, name: string) => env[name] ?? all);
  const capabilities = container.securityContext?.capabilities;
  return {
    Image: container.image as string,
    Entrypoint: (container.command ?? []).map(expand),
    Cmd: (container.args ?? []).map(expand),
    Env: Object.entries(env).map(([key, value]) => `${key}=${value}`),
    ...(container.workingDir ? { WorkingDir: container.workingDir } : {}),
    User: `${security.runAsUser}:${security.runAsGroup}`,
    Labels: { 'abx-test.k8s-boot': label },
    HostConfig: {
      NetworkMode: 'host',
      ...(pod.spec?.securityContext?.fsGroup !== undefined
        ? { GroupAdd: [String(pod.spec.securityContext.fsGroup)] }
        : {}),
      ...(capabilities?.drop ? { CapDrop: capabilities.drop } : {}),
      SecurityOpt: security.allowPrivilegeEscalation === false ? ['no-new-privileges'] : [],
      ReadonlyRootfs: container.securityContext?.readOnlyRootFilesystem === true,
      Binds: (container.volumeMounts ?? []).map(
        (mount) => `${volumes[mount.name]}:${mount.mountPath}${mount.readOnly ? ':ro' : ''}`,
      ),
    },
  };
}

if (!engine.docker) {
  describe.skip(`kubernetes pod boot path on Docker: skipped, ${engine.reason}`, () => {
    test('the init container and envd from the pod spec', () => undefined);
  });
} else {
  const docker = engine.docker;
  const scratch = mkdtempSync(join(tmpdir(), 'abx-kube-boot-'));
  const label = randomBytes(4).toString('hex');

  beforeAll(async () => {
    ensureBuilt();
    await ensureBusyboxImage(docker);
    const runtime = await portableRuntime({
      runtimeDir: join(ROOT, 'dist', 'runtime'),
      cacheDir: join(scratch, 'runtime'),
    });
    await buildRuntimeImage(docker, runtime, RUNTIME_IMAGE);
  }, 300_000);

  afterAll(async () => {
    const left = await docker.listContainers({
      all: true,
      filters: { label: [`abx-test.k8s-boot=${label}`] },
    });
    for (const found of left) {
      await docker
        .getContainer(found.Id)
        .remove({ force: true })
        .catch(() => undefined);
    }
    await docker
      .getImage(RUNTIME_IMAGE)
      .remove({ force: true })
      .catch(() => undefined);
    rmSync(scratch, { recursive: true, force: true });
  });

  describe('kubernetes pod boot path on Docker', () => {
    test('the init container copies the runtime and token; envd answers on the pod address with the token only, as uid 1000 with no capabilities', async () => {
      const spec: SandboxSpec = {
        id: `boot-${label}`,
        accessToken: randomBytes(24).toString('hex'),
        controlToken: randomBytes(24).toString('hex'),
        capabilities: ['shell', 'files'],
        template: 'boot',
        dir: join(scratch, 'sandboxes', 'boot'),
        env: { GREETING: 'hello from the spec' },
        workdir: '/home/user',
        resources: {},
        network: 'none',
      };
      const pod = sandboxPod(spec, {
        namespace: 'sandboxes',
        runtimeImage: RUNTIME_IMAGE,
        baseImage: BUSYBOX_IMAGE,
        sandboxesDir: join(scratch, 'sandboxes'),
        imagePullPolicy: 'Never',
      });
      // The volumes, as the kubelet makes them: emptyDirs world-writable, the Secret's keys as
      // files of the fsGroup.
      const volumes: Record<string, string> = {};
      for (const volume of pod.spec?.volumes ?? []) {
        const dir = join(scratch, 'volumes', volume.name);
        mkdirSync(dir, { recursive: true });
        volumes[volume.name] = dir;
        if (volume.emptyDir) chmodSync(dir, 0o777);
        if (volume.secret) {
          writeFileSync(join(dir, TOKEN_KEY), envdTokenFile(spec));
          chmodSync(join(dir, TOKEN_KEY), volume.secret.defaultMode ?? 0o644);
          chownSync(join(dir, TOKEN_KEY), 0, pod.spec?.securityContext?.fsGroup ?? 0);
        }
      }
      const podIP = `127.${20 + Math.floor(Math.random() * 200)}.${Math.floor(Math.random() * 250)}.${2 + Math.floor(Math.random() * 250)}`;

      const init = pod.spec?.initContainers?.[0] as V1Container;
      const initContainer = await docker.createContainer(
        containerOf(pod, init, volumes, podIP, label),
      );
      await initContainer.start();
      const initEnd = await initContainer.wait();
      const initLog = logText(await initContainer.logs({ stdout: true, stderr: true }));
      expect(initEnd.StatusCode, initLog).toBe(0);

      const main = pod.spec?.containers[0] as V1Container;
      const mainContainer = await docker.createContainer(
        containerOf(pod, main, volumes, podIP, label),
      );
      await mainContainer.start();
      const envd = tcpTarget(podIP, 49983);
      let healthy = false;
      for (const deadline = Date.now() + 20_000; !healthy && Date.now() < deadline; ) {
        healthy = await envdHealthy(envd);
        if (!healthy) await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect(healthy, logText(await mainContainer.logs({ stdout: true, stderr: true }))).toBe(true);

      const refused = await envdRequest<{ type?: string }>(
        envd,
        'wrong-token',
        'POST',
        '/process/exec',
        { cmd: 'touch /home/user/ran' },
      );
      expect(refused).toMatchObject({ status: 401, body: { type: 'AuthenticationError' } });
      const ran = await envdRequest<{ stdout: string; stderr: string }>(
        envd,
        spec.accessToken,
        'POST',
        '/process/exec',
        {
          cmd: [
            'id -u; id -g; pwd; echo "$GREETING"',
            'grep CapEff /proc/self/status',
            'test -e /home/user/ran && echo ran || echo not-ran',
            'test -e /run/abx/token && echo token-left || echo token-gone',
            '(touch /opt/abx/x 2>/dev/null && echo runtime-writable) || echo runtime-read-only',
            'touch ~/mine && stat -c %u ~/mine',
          ].join('; '),
        },
      );
      expect(ran.status, ran.body.stderr).toBe(200);
      expect(ran.body.stdout).toBe(
        [
          '1000',
          '1000',
          '/home/user',
          'hello from the spec',
          'CapEff:\t0000000000000000',
          'not-ran',
          'token-gone',
          'runtime-read-only',
          '1000',
          '',
        ].join('\n'),
      );
      // The control plane's token reaches every route; the access token only the template's.
      const control = await envdRequest(envd, spec.controlToken as string, 'GET', '/health');
      expect(control.status).toBe(200);
    });
  });
}
