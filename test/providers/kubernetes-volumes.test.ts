import { randomBytes } from 'node:crypto';
import { chownSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { PersistentVolumeClaim } from 'kubernetes-models/v1/PersistentVolumeClaim';
import { Pod } from 'kubernetes-models/v1/Pod';
import { describe, expect, test } from 'vitest';
import { envdRequest } from '../../src/control/envd-request.js';
import { InvalidArgumentError, SandboxStartError, UnavailableError } from '../../src/errors.js';
import { agentSandbox } from '../../src/providers/kubernetes/agent-sandbox.js';
import { checkCluster } from '../../src/providers/kubernetes/cluster-check.js';
import type { KubernetesProvider } from '../../src/providers/kubernetes/kubernetes-provider.js';
import {
  homeClaimName,
  podName,
  sandboxPod,
  secretName,
  volumeClaimName,
} from '../../src/providers/kubernetes/pod-spec.js';
import { claimSpec } from '../../src/providers/kubernetes/volume-claims.js';
import type {
  SandboxHandle,
  SandboxSpec,
  VolumeMountSpec,
  VolumeSpec,
} from '../../src/providers/provider.js';
import { sandboxProblems } from '../helpers/agent-sandbox-schemas.js';
import { kubeletUnavailable } from '../helpers/kube-api-double.js';
import { kubeDoubles, NAMESPACE } from '../helpers/kube-fixture.js';

// The kubernetes provider's hibernate (a home on a PersistentVolumeClaim of its own, a Sandbox
// suspended), its volumes (a claim each) and its metrics (metrics.k8s.io), against the API
// double: no cluster runs here. The double's provisioner gives claims a tmpfs of their size (or a
// folder, for a share class), its kubelet runs the pods for real on this host with the claims
// mounted (subPath, readOnly, fsGroup), and it serves PodMetrics measured from their processes.
const unavailable = kubeletUnavailable();
const MiB = 1024 * 1024;

function specOf(label: string, dir: string, overrides: Partial<SandboxSpec> = {}): SandboxSpec {
  const id = `${label}-${randomBytes(4).toString('hex')}`;
  return {
    id,
    accessToken: randomBytes(24).toString('hex'),
    controlToken: randomBytes(24).toString('hex'),
    dir: join(dir, id),
    env: {},
    workdir: '/home/user',
    resources: {},
    network: 'none',
    ...overrides,
  };
}

function volumeOf(name: string, sizeBytes = 16 * MiB): VolumeSpec {
  return {
    id: `vol_${randomBytes(10).toString('hex')}`,
    name,
    sizeBytes,
    dir: `/var/lib/abx/volumes/${name}`,
  };
}

/** Runs a shell command in the sandbox as its user; its output and exit code. */
async function run(
  handle: SandboxHandle,
  spec: SandboxSpec,
  cmd: string,
): Promise<{ stdout: string; stderr: string; exit_code: number | null }> {
  const answer = await envdRequest<{ stdout: string; stderr: string; exit_code: number | null }>(
    handle.envdSocket,
    spec.accessToken,
    'POST',
    '/process/exec',
    { cmd },
  );
  expect(answer.status, JSON.stringify(answer.body)).toBe(200);
  return answer.body;
}

const context = {
  namespace: NAMESPACE,
  runtimeImage: 'registry.example/abx-runtime:1',
  baseImage: 'debian:bookworm-slim',
  sandboxesDir: '/var/lib/abx/sandboxes',
};

describe('a sandbox with a home claim and volumes becomes a pod', () => {
  test('the home on its claim (home and /tmp subPaths), volumes as claims (readOnly on the claim and the mount), fsGroup 1000: a pod Kubernetes accepts', () => {
    const data = volumeOf('data');
    const shared = volumeOf('_shared');
    const mounts: VolumeMountSpec[] = [
      { volume: data, path: '/home/user/data', readOnly: false },
      { volume: shared, path: '/mnt/shared', readOnly: true },
    ];
    // A woken sandbox's environment (as envd had it) holds its old pod's address.
    const spec = specOf('shape', context.sandboxesDir, {
      volumeMounts: mounts,
      env: { ABX_POD_IP: '10.0.0.9', KEPT: 'yes' },
    });
    const pod = sandboxPod(spec, { ...context, homeClaim: homeClaimName(spec.id) });
    expect(() => new Pod(pod as ConstructorParameters<typeof Pod>[0]).validate()).not.toThrow();
    expect(pod.spec?.securityContext).toMatchObject({
      fsGroup: 1000,
      fsGroupChangePolicy: 'OnRootMismatch',
    });
    expect(pod.spec?.volumes?.filter((v) => v.persistentVolumeClaim)).toEqual([
      { name: 'abx-home', persistentVolumeClaim: { claimName: `abx-home-abx-${spec.id}` } },
      { name: 'abx-vol-0', persistentVolumeClaim: { claimName: volumeClaimName(data.id) } },
      {
        name: 'abx-vol-1',
        persistentVolumeClaim: { claimName: volumeClaimName(shared.id), readOnly: true },
      },
    ]);
    expect(volumeClaimName(data.id)).toMatch(/^abx-vol-[0-9a-f]{20}$/);
    const main = pod.spec?.containers[0];
    // The pod's own address only: the kubelet's, never a stale one (the last of two would win).
    expect(main?.env?.filter((e) => e.name === 'ABX_POD_IP')).toEqual([
      { name: 'ABX_POD_IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
    ]);
    expect(main?.env).toContainEqual({ name: 'KEPT', value: 'yes' });
    expect(main?.volumeMounts?.slice(2)).toEqual([
      { name: 'abx-home', mountPath: '/home/user', subPath: 'home' },
      { name: 'abx-home', mountPath: '/tmp', subPath: 'tmp' },
      { name: 'abx-vol-0', mountPath: '/home/user/data' },
      { name: 'abx-vol-1', mountPath: '/mnt/shared', readOnly: true },
    ]);
    // No image: no seed container; the runtime's init container makes home/ and tmp/.
    expect(pod.spec?.initContainers?.map((c) => c.name)).toEqual(['abx-runtime']);
    // An image's home is copied onto the claim once, in the image, with the runtime's node.
    const image = specOf('image', context.sandboxesDir, { image: 'python:3.12-slim' });
    const imagePod = sandboxPod(image, { ...context, homeClaim: homeClaimName(image.id) });
    const seed = imagePod.spec?.initContainers?.[1];
    expect(seed).toMatchObject({
      name: 'abx-home-seed',
      image: 'python:3.12-slim',
      command: ['/opt/abx/bin/node', '-e', expect.stringContaining('.abx-home-seeded')],
      securityContext: { runAsUser: 1000, runAsNonRoot: true },
    });
    expect(() =>
      new Pod(imagePod as ConstructorParameters<typeof Pod>[0]).validate(),
    ).not.toThrow();
  });

  test('a Sandbox with the home claim as its volumeClaimTemplate passes the CRD schema; a typo in it does not', () => {
    const spec = specOf('crd', context.sandboxesDir);
    const pod = sandboxPod(spec, { ...context, homeClaim: homeClaimName(spec.id) });
    const template = {
      metadata: { name: 'abx-home', labels: { 'abx.dev/sandbox-id': spec.id } },
      spec: claimSpec(2 * 1024 * MiB, 'ReadWriteOnce', 'fast-ssd'),
    };
    const sandbox = agentSandbox(pod, 60_000, Date.now(), template);
    expect(sandbox.spec.volumeClaimTemplates).toEqual([template]);
    // agent-sandbox names the claim <template>-<Sandbox>: the pod's volume names that.
    expect(`${template.metadata.name}-${sandbox.metadata.name}`).toBe(homeClaimName(spec.id));
    expect(sandboxProblems(sandbox as unknown as Record<string, unknown>)).toEqual([]);
    const typo = structuredClone(sandbox) as unknown as { spec: Record<string, unknown> };
    typo.spec.volumeClaimTemplates = [{ ...template, spec: { accessModes: 'ReadWriteOnce' } }];
    expect(sandboxProblems(typo as unknown as Record<string, unknown>)).not.toEqual([]);
    expect(() =>
      new PersistentVolumeClaim({
        metadata: { name: 'x' },
        spec: template.spec,
      } as ConstructorParameters<typeof PersistentVolumeClaim>[0]).validate(),
    ).not.toThrow();
  });
});

describe.skipIf(unavailable)(
  `kubernetes provider: hibernate on a home claim, plain pods (API double)${unavailable ? `: skipped, ${unavailable}` : ''}`,
  () => {
    const kube = kubeDoubles('kube-hibernate');
    const claimsOf = () => kube.double.objects('persistentvolumeclaims');

    test('hibernate deletes the pod, its Secret and NetworkPolicy and keeps the home claim; wake makes a new pod on it: what home and /tmp held is there, the user’s, and the same tokens work', async () => {
      const provider = kube.provider({ home: 'pvc', agentSandbox: false });
      expect(provider.hibernateUnavailable()).toBeUndefined();
      const spec = specOf('hib', kube.scratch, {
        network: 'internet',
        egress: { allowOut: ['192.0.2.0/24'], denyOut: [] },
        resources: { disk: 64 * MiB },
      });
      let handle = await provider.create(spec);
      const claim = homeClaimName(spec.id);
      try {
        const made = kube.double.get('persistentvolumeclaims', NAMESPACE, claim);
        expect(made?.spec).toMatchObject({
          accessModes: ['ReadWriteOnce'],
          resources: { requests: { storage: String(64 * MiB) } },
        });
        expect(made?.metadata.labels).toMatchObject({ 'abx.dev/sandbox-id': spec.id });
        // Owned by nothing: it outlives the pod.
        expect(made?.metadata.ownerReferences).toBeUndefined();
        await run(
          handle,
          spec,
          'echo kept > ~/notes.txt && mkdir -p ~/work && echo tmp > /tmp/scratch.txt',
        );
        const first = handle.startTime;
        await provider.hibernate(handle, spec);
        expect(provider.isAlive(handle)).toBe(false);
        expect(kube.double.objects('pods')).not.toContain(`pods ${NAMESPACE}/${podName(spec.id)}`);
        expect(kube.double.livePids(podName(spec.id))).toEqual([]);
        expect(kube.double.get('secrets', NAMESPACE, secretName(spec.id))).toBeUndefined();
        expect(kube.double.objects('networkpolicies')).toEqual([]);
        expect(claimsOf()).toEqual([`persistentvolumeclaims ${NAMESPACE}/${claim}`]);
        // Again (a daemon that died mid-way): nothing to do, no error.
        await provider.hibernate(handle, spec);

        handle = await provider.wake(handle, spec);
        expect(handle.startTime).not.toBe(first);
        expect(handle.pod?.egress).toEqual(spec.egress);
        expect(provider.isAlive(handle)).toBe(true);
        const files = await run(
          handle,
          spec,
          'cat ~/notes.txt /tmp/scratch.txt && stat -c %u ~/notes.txt ~/work && stat -c %a /tmp',
        );
        expect(files.stdout).toBe('kept\ntmp\n1000\n1000\n1777\n');
        // Its policy again, owned by the new pod; its Secret again, owned by the new pod.
        const policy = kube.double.get('networkpolicies', NAMESPACE, `abx-${spec.id}-egress`);
        expect(policy?.metadata.ownerReferences).toMatchObject([
          { kind: 'Pod', uid: handle.startTime },
        ]);
        expect(
          kube.double.get('secrets', NAMESPACE, secretName(spec.id))?.metadata.ownerReferences,
        ).toMatchObject([{ kind: 'Pod', uid: handle.startTime }]);
        // Another daemon finding it half-woken hibernates it again; it wakes as it was.
        const other = kube.provider({ home: 'pvc', agentSandbox: false });
        await other.hibernate(handle, spec);
        expect(kube.double.livePids(podName(spec.id))).toEqual([]);
        handle = await other.wake(handle, spec);
        expect((await run(handle, spec, 'cat ~/notes.txt')).stdout).toBe('kept\n');
      } finally {
        await provider.kill(handle);
      }
      // kill takes the claim too, and its storage.
      expect(claimsOf()).toEqual([]);
      expect(
        kube.double.objects().filter((o) => o.includes(spec.id) && !o.startsWith('events')),
      ).toEqual([]);
    }, 120_000);

    test('an image template’s home is copied onto the claim at the first start only: a wake keeps what the sandbox changed', async () => {
      // The double runs every image on this host's file system: the "image's" home is a folder
      // of this host, made for the test.
      const user = `seed${randomBytes(3).toString('hex')}`;
      const home = `/home/${user}`;
      mkdirSync(home, { mode: 0o755 });
      writeFileSync(join(home, 'from-image.txt'), 'image\n');
      chownSync(home, 1000, 1000);
      chownSync(join(home, 'from-image.txt'), 1000, 1000);
      const provider = kube.provider({ home: 'pvc', agentSandbox: false });
      const spec = specOf('seed', kube.scratch, { image: 'example/tools:1', user, workdir: home });
      let handle: SandboxHandle | undefined;
      try {
        handle = await provider.create(spec);
        expect(
          (await run(handle, spec, 'cat ~/from-image.txt && echo mine > ~/from-image.txt && pwd'))
            .stdout,
        ).toBe(`image\n${home}\n`);
        // The image changes meanwhile (a rebuilt tag): the claim keeps the sandbox's own.
        writeFileSync(join(home, 'from-image.txt'), 'image, rebuilt\n');
        await provider.hibernate(handle, spec);
        handle = await provider.wake(handle, spec);
        expect((await run(handle, spec, 'cat ~/from-image.txt')).stdout).toBe('mine\n');
      } finally {
        if (handle) await provider.kill(handle);
        rmSync(home, { recursive: true, force: true });
      }
    }, 120_000);

    test('refusals: a daemon with emptyDir homes cannot hibernate (why, and the setting); a sandbox made with one keeps running; a wake whose claim is gone names it', async () => {
      const plain = kube.provider({ agentSandbox: false });
      expect(plain.hibernateUnavailable()).toContain('--kube-home pvc');
      expect(
        kube.provider({ home: 'pvc', agentSandbox: 'claims' }).hibernateUnavailable(),
      ).toContain('claims mode');
      const spec = specOf('nohome', kube.scratch);
      const handle = await plain.create(spec);
      try {
        await expect(plain.hibernate(handle, spec)).rejects.toThrow(InvalidArgumentError);
        const pvc = kube.provider({ home: 'pvc', agentSandbox: false });
        const refused = await pvc.hibernate(handle, spec).catch((error: Error) => error);
        expect(refused).toBeInstanceOf(InvalidArgumentError);
        expect((refused as Error).message).toContain('its home is on an emptyDir');
        expect(pvc.isAlive(handle)).toBe(true);
        expect((await run(handle, spec, 'echo still')).stdout).toBe('still\n');
      } finally {
        await plain.kill(handle);
      }

      const provider = kube.provider({ home: 'pvc', agentSandbox: false });
      const lost = specOf('lost', kube.scratch);
      const hibernated = await provider.create(lost);
      await provider.hibernate(hibernated, lost);
      // Someone deletes the claim while it is hibernated.
      await fetch(
        `${kube.double.kubeConfig().getCurrentCluster()?.server}/api/v1/namespaces/${NAMESPACE}/persistentvolumeclaims/${homeClaimName(lost.id)}`,
        { method: 'DELETE', headers: { authorization: 'Bearer double-token' } },
      );
      const error = await provider.wake(hibernated, lost).catch((thrown: Error) => thrown);
      expect(error).toBeInstanceOf(SandboxStartError);
      expect((error as Error).message).toBe(
        `sandbox ${lost.id} did not wake: the PersistentVolumeClaim of its home (${NAMESPACE}/${homeClaimName(lost.id)}) is gone, deleted outside abx: its files are lost; kill it (abx kill ${lost.id})`,
      );
      await provider.kill(hibernated);
    }, 120_000);

    test('a home claim the cluster cannot provision: the create fails in time naming the claim, the reason and the setting, and leaves nothing', async () => {
      const provider = kube.provider({
        home: 'pvc',
        agentSandbox: false,
        homeStorageClass: 'fast',
        startTimeoutMs: 3000,
      });
      const spec = specOf('noclass', kube.scratch);
      const error = await provider.create(spec).catch((thrown: Error) => thrown);
      expect(error).toBeInstanceOf(SandboxStartError);
      const message = (error as Error).message;
      expect(message).toContain(
        `its PersistentVolumeClaim ${NAMESPACE}/${homeClaimName(spec.id)} is Pending: ProvisioningFailed: storageclass.storage.k8s.io "fast" not found`,
      );
      expect(message).toContain('--kube-home-storage-class (ABX_KUBE_HOME_STORAGE_CLASS)');
      expect(
        kube.double.objects().filter((o) => o.includes(spec.id) && !o.startsWith('events')),
      ).toEqual([]);
    }, 60_000);

    test('sweepOrphans deletes a home claim whose sandbox the registry does not know, and keeps a hibernated one’s', async () => {
      const provider = kube.provider({ home: 'pvc', agentSandbox: false });
      const sandboxes = join(kube.scratch, 'sweep');
      const kept = specOf('kept', sandboxes);
      const orphan = specOf('orphan', sandboxes);
      const a = await provider.create(kept);
      const b = await provider.create(orphan);
      await provider.hibernate(a, kept);
      await provider.hibernate(b, orphan);
      expect(await provider.sweepOrphans(sandboxes, new Set([kept.id]))).toEqual([orphan.id]);
      expect(claimsOf()).toContain(`persistentvolumeclaims ${NAMESPACE}/${homeClaimName(kept.id)}`);
      expect(claimsOf()).not.toContain(
        `persistentvolumeclaims ${NAMESPACE}/${homeClaimName(orphan.id)}`,
      );
      await provider.kill(a);
      expect(claimsOf()).toEqual([]);
    }, 60_000);
  },
);

describe.skipIf(unavailable)(
  `kubernetes provider: hibernate with agent-sandbox (API double)${unavailable ? `: skipped, ${unavailable}` : ''}`,
  () => {
    const kube = kubeDoubles('kube-suspend', [{ crds: true }]);

    test('the home claim is the Sandbox’s volumeClaimTemplate; hibernate sets operatingMode Suspended (shutdownTime off), wake Running: a new pod on the same claim, the Secret kept; kill takes the claim with the Sandbox', async () => {
      const provider = kube.provider({ home: 'pvc' });
      const spec = specOf('susp', kube.scratch, { timeoutMs: 600_000 });
      let handle = await provider.create(spec);
      const name = podName(spec.id);
      const claim = homeClaimName(spec.id);
      try {
        expect(handle.pod?.sandbox).toBe(true);
        const sandbox = kube.double.get('sandboxes', NAMESPACE, name);
        expect(sandbox?.spec.volumeClaimTemplates).toMatchObject([
          {
            metadata: { name: 'abx-home', labels: { 'abx.dev/sandbox-id': spec.id } },
            spec: { accessModes: ['ReadWriteOnce'] },
          },
        ]);
        expect(
          kube.double.get('persistentvolumeclaims', NAMESPACE, claim)?.metadata.ownerReferences,
        ).toMatchObject([{ kind: 'Sandbox', uid: sandbox?.metadata.uid }]);
        await run(handle, spec, 'echo before > ~/state && echo t > /tmp/t');
        await provider.hibernate(handle, spec);
        const suspended = kube.double.get('sandboxes', NAMESPACE, name);
        expect(suspended?.spec.operatingMode).toBe('Suspended');
        expect(suspended?.spec.shutdownTime).toBeUndefined();
        expect(kube.double.get('pods', NAMESPACE, name)).toBeUndefined();
        expect(kube.double.livePids(name)).toEqual([]);
        expect(kube.double.get('secrets', NAMESPACE, secretName(spec.id))).toBeDefined();
        expect(kube.double.get('persistentvolumeclaims', NAMESPACE, claim)).toBeDefined();

        const old = handle.startTime;
        handle = await provider.wake(handle, spec);
        expect(handle.startTime).not.toBe(old);
        expect(kube.double.get('sandboxes', NAMESPACE, name)?.spec.operatingMode).toBe('Running');
        expect((await run(handle, spec, 'cat ~/state /tmp/t')).stdout).toBe('before\nt\n');
        // The service then gives it its end again.
        await provider.setExpiry(handle, Date.now() + 600_000);
        expect(kube.double.get('sandboxes', NAMESPACE, name)?.spec.shutdownTime).toBeDefined();
      } finally {
        await provider.kill(handle);
      }
      expect(
        kube.double.objects().filter((o) => o.includes(spec.id) && !o.startsWith('events')),
      ).toEqual([]);
    }, 120_000);
  },
);

describe.skipIf(unavailable)(
  `kubernetes provider: volumes as claims (API double)${unavailable ? `: skipped, ${unavailable}` : ''}`,
  () => {
    const kube = kubeDoubles('kube-volumes', [{}, { defaultStorageClass: null }]);

    test('a volume is a ReadWriteMany claim of its size, labelled; two sandboxes share it (one read-only), files are the user’s, usage is measured and the size enforced; remove deletes the claim', async () => {
      const provider = kube.provider({ agentSandbox: false });
      expect(provider.volumes.unavailable()).toBeUndefined();
      const volume = volumeOf('shared-data');
      await provider.volumes.create(volume);
      const name = volumeClaimName(volume.id);
      const claim = kube.double.get('persistentvolumeclaims', NAMESPACE, name);
      expect(claim?.spec).toMatchObject({
        accessModes: ['ReadWriteMany'],
        resources: { requests: { storage: String(16 * MiB) } },
      });
      expect(claim?.metadata.labels).toEqual({
        'abx.dev/managed-by': 'abx',
        'abx.dev/volume-id': volume.id,
        'abx.dev/volume-name': 'shared-data',
      });
      expect(claim?.metadata.annotations).toEqual({ 'abx.dev/volume-name': 'shared-data' });
      expect(await provider.volumes.usage(volume)).toEqual({
        used: 0,
        total: 16 * MiB,
        enforced: true,
      });
      const writer = specOf('writer', kube.scratch, {
        volumeMounts: [{ volume, path: '/mnt/data', readOnly: false }],
      });
      const reader = specOf('reader', kube.scratch, {
        volumeMounts: [{ volume, path: '/home/user/data', readOnly: true }],
      });
      const w = await provider.create(writer);
      const r = await provider.create(reader);
      try {
        await run(
          w,
          writer,
          'head -c 4194304 /dev/zero > /mnt/data/four-mib && echo hi > /mnt/data/hello',
        );
        const seen = await run(r, reader, 'cat ~/data/hello && stat -c %u ~/data/hello');
        expect(seen.stdout).toBe('hi\n1000\n');
        const refused = await run(r, reader, 'echo no > ~/data/other');
        expect(refused.exit_code).not.toBe(0);
        expect(refused.stderr).toContain('Read-only file system');
        const usage = await provider.volumes.usage(volume);
        expect(usage.total).toBe(16 * MiB);
        expect(usage.enforced).toBe(true);
        expect(usage.used).toBeGreaterThanOrEqual(4 * MiB);
        expect(usage.used).toBeLessThan(6 * MiB);
        // Past its size: ENOSPC, the claim's storage bounds it.
        const full = await run(w, writer, 'head -c 33554432 /dev/zero > /mnt/data/big');
        expect(full.exit_code).not.toBe(0);
        expect(full.stderr).toContain('No space left on device');
      } finally {
        await provider.kill(w);
        await provider.kill(r);
      }
      // No sandbox mounts it now: the last reading stands.
      expect((await provider.volumes.usage(volume)).used).toBeGreaterThanOrEqual(4 * MiB);
      await provider.volumes.remove(volume);
      expect(kube.double.get('persistentvolumeclaims', NAMESPACE, name)).toBeUndefined();
      await expect(provider.volumes.remove(volume)).resolves.toBeUndefined();
      await expect(provider.volumes.usage(volume)).rejects.toThrow(
        `PersistentVolumeClaim ${NAMESPACE}/${name} of volume shared-data is gone (deleted outside abx)`,
      );
    }, 120_000);

    test('a share class (NFS) bounds nothing: usage says so; a WaitForFirstConsumer class binds at the first sandbox that mounts it', async () => {
      const share = kube.provider({ agentSandbox: false, volumeStorageClass: 'nfs-share' });
      const volume = volumeOf('nfs');
      await share.volumes.create(volume);
      const spec = specOf('nfs', kube.scratch, {
        volumeMounts: [{ volume, path: '/mnt/nfs', readOnly: false }],
      });
      const handle = await share.create(spec);
      try {
        await run(handle, spec, 'echo x > /mnt/nfs/x');
        expect(await share.volumes.usage(volume)).toEqual({
          used: 0,
          total: 16 * MiB,
          enforced: false,
        });
      } finally {
        await share.kill(handle);
        await share.volumes.remove(volume);
      }

      const wffc = kube.provider({ agentSandbox: false, volumeStorageClass: 'local-wffc' });
      const later = volumeOf('later');
      await wffc.volumes.create(later);
      const name = volumeClaimName(later.id);
      expect(kube.double.get('persistentvolumeclaims', NAMESPACE, name)?.status.phase).toBe(
        'Pending',
      );
      const user = specOf('wffc', kube.scratch, {
        volumeMounts: [{ volume: later, path: '/mnt/later', readOnly: false }],
      });
      const h = await wffc.create(user);
      try {
        expect(kube.double.get('persistentvolumeclaims', NAMESPACE, name)?.status.phase).toBe(
          'Bound',
        );
        expect((await run(h, user, 'touch /mnt/later/ok && echo done')).stdout).toBe('done\n');
      } finally {
        await wffc.kill(h);
        await wffc.volumes.remove(later);
      }
    }, 120_000);

    test('a claim the cluster cannot provision is refused at the volume’s create, naming the claim, the reason and what to do, and nothing is left', async () => {
      const cases = [
        {
          provider: kube.provider({ volumeStorageClass: 'fast', agentSandbox: false }),
          reason: 'ProvisioningFailed: storageclass.storage.k8s.io "fast" not found',
          advice: 'name a StorageClass of the cluster with --kube-volume-storage-class',
        },
        {
          provider: kube.provider({ volumeStorageClass: 'block-rwo', agentSandbox: false }),
          reason: 'access mode ReadWriteMany',
          advice: 'or --kube-volume-access-mode ReadWriteOnce',
        },
        {
          // A cluster without a default StorageClass.
          provider: kube.provider({ agentSandbox: false }, kube.all[1]),
          reason:
            'FailedBinding: no persistent volumes available for this claim and no storage class is set',
          advice: 'or give the cluster a default one',
          double: kube.all[1],
        },
      ];
      for (const { provider, reason, advice, double = kube.double } of cases) {
        const volume = volumeOf('bad');
        const error = await provider.volumes.create(volume).catch((thrown: Error) => thrown);
        expect(error).toBeInstanceOf(UnavailableError);
        const message = (error as Error).message;
        expect(message).toContain(
          `volume bad was not made: the cluster cannot provision its PersistentVolumeClaim ${NAMESPACE}/${volumeClaimName(volume.id)} of volume bad (Pending: `,
        );
        expect(message).toContain(reason);
        expect(message).toContain(advice);
        expect(double.objects('persistentvolumeclaims')).toEqual([]);
      }
      // ReadWriteOnce on that class works.
      const rwo = kube.provider({
        volumeStorageClass: 'block-rwo',
        volumeAccessMode: 'ReadWriteOnce',
        agentSandbox: false,
      });
      const ok = volumeOf('rwo');
      await rwo.volumes.create(ok);
      expect(
        kube.double.get('persistentvolumeclaims', NAMESPACE, volumeClaimName(ok.id))?.spec,
      ).toMatchObject({ accessModes: ['ReadWriteOnce'], storageClassName: 'block-rwo' });
      await rwo.volumes.remove(ok);
      // Claims mode mounts none.
      expect(kube.provider({ agentSandbox: 'claims' }).volumes.unavailable()).toContain(
        'claims mode',
      );
    }, 60_000);
  },
);

describe.skipIf(unavailable)(
  `kubernetes provider: metrics from metrics.k8s.io (API double)${unavailable ? `: skipped, ${unavailable}` : ''}`,
  () => {
    const kube = kubeDoubles('kube-metrics', [{ metricsApi: true }, {}]);

    test('where metrics.k8s.io is served: CPU from its rate (a busy loop shows), memory and the limits, the home claim’s disk; where not: no metrics', async () => {
      const without = kube.provider({}, kube.all[1]);
      expect((await checkCluster(without)).metricsApi).toBe(false);
      expect(without.metrics).toBeUndefined();

      const provider = kube.provider({ home: 'pvc', agentSandbox: false });
      const report = await checkCluster(provider);
      expect(report.metricsApi).toBe(true);
      // pods of metrics.k8s.io as well as the core group's.
      expect(
        report.permissions.filter((p) => `${p.verb} ${p.resource}` === 'list pods'),
      ).toHaveLength(2);
      provider.useMetricsApi();
      const measure = provider.metrics as NonNullable<KubernetesProvider['metrics']>;
      const spec = specOf('metrics', kube.scratch, {
        resources: { cpu: 1, memory: 256 * MiB, disk: 64 * MiB },
      });
      const handle = await provider.create(spec);
      try {
        const idle = await measure(handle);
        expect(idle).toMatchObject({
          cpuCount: 1,
          memTotal: 256 * MiB,
          diskTotal: 64 * MiB,
          netRxBytes: null,
          netTxBytes: null,
        });
        expect(idle.memUsed).toBeGreaterThan(MiB);
        const before = { at: Date.now(), cpu: idle.cpuTimeUs };
        await run(handle, spec, 'head -c 8388608 /dev/zero > ~/eight-mib');
        await run(
          handle,
          spec,
          'end=$(( $(date +%s) + 2 )); while [ $(date +%s) -lt $end ]; do :; done',
        );
        const busy = await measure(handle);
        const cores = (busy.cpuTimeUs - before.cpu) / ((Date.now() - before.at) * 1000);
        expect(cores).toBeGreaterThan(0.25);
        expect(busy.diskUsed).toBeGreaterThanOrEqual(8 * MiB);
        expect(busy.diskUsed).toBeLessThan(busy.diskTotal);
      } finally {
        await provider.kill(handle);
      }
      await expect(measure(handle)).rejects.toThrow('is not running');
    }, 120_000);
  },
);
