import type { V1PersistentVolumeClaimSpec, V1Pod } from '@kubernetes/client-node';
import { AGENT_SANDBOX_GROUP } from './cluster-check.js';

/** The version of kubernetes-sigs/agent-sandbox's API this provider speaks. */
export const AGENT_SANDBOX_VERSION = 'v1beta1';
export const SANDBOXES = 'sandboxes';

/** An agent-sandbox `Sandbox` (agents.x-k8s.io/v1beta1), the fields this provider sets. */
export interface AgentSandbox {
  apiVersion: string;
  kind: 'Sandbox';
  metadata: { name: string; namespace: string; labels: Record<string, string>; uid?: string };
  spec: {
    podTemplate: {
      metadata: { labels?: Record<string, string>; annotations?: Record<string, string> };
      spec: NonNullable<V1Pod['spec']>;
    };
    /**
     * Claims its controller makes (named `<name>-<Sandbox's name>`, owned by the Sandbox: gone
     * with it) and puts in the pod as the volume of that name: the home claim (`--kube-home pvc`).
     */
    volumeClaimTemplates?: {
      metadata: { name: string; labels?: Record<string, string> };
      spec: V1PersistentVolumeClaimSpec;
    }[];
    /**
     * `Suspended`: its controller deletes the pod and keeps the Sandbox and its claims (a
     * hibernate); `Running` (the default) makes the pod again. agents.x-k8s.io/v1beta1 says this
     * with `operatingMode` (kubernetes-sigs/agent-sandbox#801); v1alpha1 said `replicas: 0`/`1`.
     */
    operatingMode?: 'Running' | 'Suspended';
    shutdownTime?: string;
    shutdownPolicy: 'Delete' | 'Retain';
  };
}

/** A Sandbox's operating mode: `Suspended` while its sandbox is hibernated. */
export type OperatingMode = NonNullable<AgentSandbox['spec']['operatingMode']>;

/** A `shutdownTime`: RFC 3339 in whole seconds, as Kubernetes writes times. */
export function shutdownTime(at: number): string {
  return new Date(Math.ceil(at / 1000) * 1000).toISOString().replace(/\.\d+Z$/, 'Z');
}

/**
 * The `Sandbox` whose controller makes a sandbox's pod (named like the Sandbox, owned by it): the
 * pod of {@link sandboxPod} as its podTemplate, and the sandbox's end as `shutdownTime` with
 * `shutdownPolicy: Delete`, so the cluster removes it on time even when no control plane runs.
 * A Sandbox directly, not a SandboxClaim: a claim takes a pod of a SandboxWarmPool made from a
 * shared SandboxTemplate, which cannot carry this sandbox's own token (see docs/providers.md).
 */
export function agentSandbox(
  pod: V1Pod,
  timeoutMs: number | undefined,
  now = Date.now(),
  /** The home claim's template (its name is the pod's home volume's), with `--kube-home pvc`. */
  homeClaim?: NonNullable<AgentSandbox['spec']['volumeClaimTemplates']>[number],
): AgentSandbox {
  const metadata = pod.metadata ?? {};
  return {
    apiVersion: `${AGENT_SANDBOX_GROUP}/${AGENT_SANDBOX_VERSION}`,
    kind: 'Sandbox',
    metadata: {
      name: metadata.name as string,
      namespace: metadata.namespace as string,
      labels: { ...metadata.labels },
    },
    spec: {
      podTemplate: {
        metadata: {
          ...(metadata.labels ? { labels: metadata.labels } : {}),
          ...(metadata.annotations ? { annotations: metadata.annotations } : {}),
        },
        spec: pod.spec as NonNullable<V1Pod['spec']>,
      },
      ...(homeClaim ? { volumeClaimTemplates: [homeClaim] } : {}),
      ...(timeoutMs ? { shutdownTime: shutdownTime(now + timeoutMs) } : {}),
      shutdownPolicy: 'Delete',
    },
  };
}
