import { describe, test } from 'vitest';
import { podName } from '../../src/providers/kubernetes/pod-spec.js';
import type { SandboxHandle } from '../../src/providers/provider.js';
import type { KubeApiDouble } from '../helpers/kube-api-double.js';
import { kubeDoubles, NAMESPACE } from '../helpers/kube-fixture.js';
import { providerContract } from './contract.js';

// The Kubernetes provider against the in-test API double (no cluster can run on this machine):
// every object it sends is validated against Kubernetes' schemas by the double, and the double's
// kubelet runs the pod's init container and envd for real (see test/helpers/kube-api-double.ts).
/**
 * Plain pods, a cluster with agent-sandbox installed (sandboxes are Sandboxes), and one where
 * sandboxes are SandboxClaims on a SandboxWarmPool per template.
 */
const kube = kubeDoubles('kube-contract', [{}, { crds: true }, { crds: true }]);
const { unavailable } = kube;
if (unavailable) {
  describe.skip(`kubernetes provider contract: skipped, ${unavailable}`, () => {
    test('the provider contract', () => undefined);
  });
}

/**
 * Pods, secrets, Sandboxes and SandboxClaims of sandbox `id` still in a double, and its pod's
 * processes. A claimed sandbox's pod and Sandbox are named by the pool (the handle says).
 */
function leftoversIn(cluster: KubeApiDouble, id: string, handle?: SandboxHandle): string[] {
  const pod = handle?.pod?.claim ? handle.pod.name : podName(id);
  return [
    ...cluster
      .objects()
      .filter(
        (object) =>
          (object.includes(`/abx-${id}`) || object.endsWith(`/${pod}`)) &&
          !object.startsWith('events'),
      ),
    ...cluster.livePids(pod).map((pid) => `process ${pid} of pod ${pod}`),
  ];
}

if (!unavailable) {
  providerContract(
    'kubernetes (API double)',
    (options) => kube.provider({ namespace: NAMESPACE, ...options }),
    {
      mode: 'rootless',
      // Pods, secrets and Sandboxes still in the double, and the pod's processes still running.
      leftovers: (id) => leftoversIn(kube.double, id),
      pod: {
        crash: (handle: SandboxHandle) =>
          kube.double.crash(handle.pod?.namespace as string, handle.pod?.name as string),
      },
    },
  );

  providerContract(
    'kubernetes with agent-sandbox (API double)',
    (options) => kube.provider(options, kube.all[1]),
    {
      mode: 'rootless',
      leftovers: (id) => leftoversIn(kube.all[1] as KubeApiDouble, id),
      pod: {
        crash: (handle: SandboxHandle) =>
          kube.all[1]?.crash(handle.pod?.namespace as string, handle.pod?.name as string),
      },
    },
  );

  providerContract(
    'kubernetes with agent-sandbox claims (API double)',
    (options) => kube.provider({ agentSandbox: 'claims', ...options }, kube.all[2]),
    {
      mode: 'rootless',
      leftovers: (id, _dir, handle) => leftoversIn(kube.all[2] as KubeApiDouble, id, handle),
      pod: {
        crash: (handle: SandboxHandle) =>
          kube.all[2]?.crash(handle.pod?.namespace as string, handle.pod?.name as string),
        // Left out: a pooled pod was started before its sandbox existed, so it has its Sandbox's
        // name (the sandbox's id is in ABX_SANDBOX_ID, given at the claim).
        hostname: (handle: SandboxHandle) => handle.pod?.name as string,
      },
    },
  );
}
