import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, test } from 'vitest';
import { KubernetesProvider } from '../../src/providers/kubernetes/kubernetes-provider.js';
import { podName } from '../../src/providers/kubernetes/pod-spec.js';
import { portableRuntime } from '../../src/providers/portable-runtime.js';
import type { SandboxHandle } from '../../src/providers/provider.js';
import { sandboxProblems } from '../helpers/agent-sandbox-schemas.js';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { KubeApiDouble, kubeletUnavailable } from '../helpers/kube-api-double.js';
import { providerContract } from './contract.js';

// The Kubernetes provider against the in-test API double (no cluster can run on this machine):
// every object it sends is validated against Kubernetes' schemas by the double, and the double's
// kubelet runs the pod's init container and envd for real (see test/helpers/kube-api-double.ts).
const NAMESPACE = 'sandboxes';
const unavailable = kubeletUnavailable();
if (unavailable) {
  describe.skip(`kubernetes provider contract: skipped, ${unavailable}`, () => {
    test('the provider contract', () => undefined);
  });
}
const scratch = mkdtempSync(join(tmpdir(), 'abx-kube-contract-'));
let double: KubeApiDouble;
/** A cluster with agent-sandbox installed: sandboxes are Sandboxes, their pods its controller's. */
let withCrds: KubeApiDouble;

beforeAll(async () => {
  if (unavailable) return;
  ensureBuilt();
  const runtime = await portableRuntime({
    runtimeDir: join(ROOT, 'dist', 'runtime'),
    cacheDir: join(scratch, 'runtime-image'),
  });
  double = new KubeApiDouble({ dir: join(scratch, 'node'), runtimeImageDir: runtime.dir });
  await double.start();
  withCrds = new KubeApiDouble({
    dir: join(scratch, 'crd-node'),
    runtimeImageDir: runtime.dir,
    crds: true,
    validators: { 'agents.x-k8s.io/v1beta1/sandboxes': sandboxProblems },
  });
  await withCrds.start();
}, 120_000);

afterAll(async () => {
  await double?.close();
  await withCrds?.close();
  rmSync(scratch, { recursive: true, force: true });
  const invalid = [...(double?.invalid ?? []), ...(withCrds?.invalid ?? [])];
  if (invalid.length) {
    throw new Error(`the provider sent invalid objects: ${JSON.stringify(invalid)}`);
  }
});

/** Pods, secrets and Sandboxes of sandbox `id` still in a double, and its pod's processes. */
function leftoversIn(cluster: KubeApiDouble, id: string): string[] {
  return [
    ...cluster
      .objects()
      .filter((object) => object.includes(`/abx-${id}`) && !object.startsWith('events')),
    ...cluster.livePids(podName(id)).map((pid) => `process ${pid} of pod ${podName(id)}`),
  ];
}

if (!unavailable) {
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
      // Pods, secrets and Sandboxes still in the double, and the pod's processes still running.
      leftovers: (id) => leftoversIn(double, id),
      pod: {
        crash: (handle: SandboxHandle) =>
          double.crash(handle.pod?.namespace as string, handle.pod?.name as string),
      },
    },
  );

  providerContract(
    'kubernetes with agent-sandbox (API double)',
    (options) =>
      new KubernetesProvider({
        kubeConfig: withCrds.kubeConfig(NAMESPACE),
        runtimeImage: 'abx-runtime:test',
        ...options,
      }),
    {
      mode: 'rootless',
      leftovers: (id) => leftoversIn(withCrds, id),
      pod: {
        crash: (handle: SandboxHandle) =>
          withCrds.crash(handle.pod?.namespace as string, handle.pod?.name as string),
      },
    },
  );
}
