import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll } from 'vitest';
import { KubernetesProvider } from '../../src/providers/kubernetes/kubernetes-provider.js';
import { podName } from '../../src/providers/kubernetes/pod-spec.js';
import { portableRuntime } from '../../src/providers/portable-runtime.js';
import type { SandboxHandle } from '../../src/providers/provider.js';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { KubeApiDouble } from '../helpers/kube-api-double.js';
import { providerContract } from './contract.js';

// The Kubernetes provider against the in-test API double (no cluster can run on this machine):
// every object it sends is validated against Kubernetes' schemas by the double, and the double's
// kubelet runs the pod's init container and envd for real (see test/helpers/kube-api-double.ts).
const NAMESPACE = 'sandboxes';
const scratch = mkdtempSync(join(tmpdir(), 'abx-kube-contract-'));
let double: KubeApiDouble;

beforeAll(async () => {
  ensureBuilt();
  const runtime = await portableRuntime({
    runtimeDir: join(ROOT, 'dist', 'runtime'),
    cacheDir: join(scratch, 'runtime-image'),
  });
  double = new KubeApiDouble({ dir: join(scratch, 'node'), runtimeImageDir: runtime.dir });
  await double.start();
}, 120_000);

afterAll(async () => {
  await double?.close();
  rmSync(scratch, { recursive: true, force: true });
  if (double?.invalid.length) {
    throw new Error(`the provider sent invalid objects: ${JSON.stringify(double.invalid)}`);
  }
});

providerContract(
  'kubernetes (API double)',
  (options) =>
    new KubernetesProvider({
      kubeConfig: double.kubeConfig(NAMESPACE),
      namespace: NAMESPACE,
      runtimeImage: 'abx-runtime:test',
      ...options,
    }),
  {
    mode: 'rootless',
    // Pods, secrets and claims still in the double, and the pod's processes still running.
    leftovers: (id) => [
      ...double
        .objects()
        .filter((object) => object.includes(`/abx-${id}`) && !object.startsWith('events')),
      ...double.livePids(podName(id)).map((pid) => `process ${pid} of pod ${podName(id)}`),
    ],
    pod: {
      crash: (handle: SandboxHandle) =>
        double.crash(handle.pod?.namespace as string, handle.pod?.name as string),
    },
  },
);
