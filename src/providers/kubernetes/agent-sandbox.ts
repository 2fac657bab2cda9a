import type { V1Pod } from '@kubernetes/client-node';
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
    shutdownTime?: string;
    shutdownPolicy: 'Delete' | 'Retain';
  };
}

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
      ...(timeoutMs ? { shutdownTime: shutdownTime(now + timeoutMs) } : {}),
      shutdownPolicy: 'Delete',
    },
  };
}
