import { createHash, randomBytes } from 'node:crypto';
import type { V1Pod, V1Secret } from '@kubernetes/client-node';
import type { SandboxSpec } from '../provider.js';
import { AGENT_SANDBOX_VERSION, shutdownTime } from './agent-sandbox.js';
import { AGENT_SANDBOX_EXTENSIONS_GROUP } from './cluster-check.js';
import {
  MANAGED_BY,
  MANAGED_BY_LABEL,
  SANDBOX_ID_LABEL,
  SANDBOXES_LABEL,
  sandboxesHash,
  TOKEN_KEY,
} from './pod-spec.js';

export const SANDBOX_TEMPLATES = 'sandboxtemplates';
export const SANDBOX_WARM_POOLS = 'sandboxwarmpools';
export const SANDBOX_CLAIMS = 'sandboxclaims';
const EXTENSIONS_API = `${AGENT_SANDBOX_EXTENSIONS_GROUP}/${AGENT_SANDBOX_VERSION}`;
/** The label of a per-template object: the hash its name carries. */
export const POD_TEMPLATE_LABEL = 'abx.dev/pod-template';
/** The process environment every pod of a template starts with; the rest comes after the claim. */
const BASE_ENV = new Set(['PATH', 'HOME', 'USER', 'LANG', 'ABX_POD_IP']);

/**
 * A sandbox's pod turned into the pod of its template: what differs per sandbox taken out (the
 * hostname, the sandbox's id and its create's variables, which envd gets with `PUT /env` once
 * claimed), and the token volume pointing at the template's bootstrap Secret.
 */
export function templatePod(pod: V1Pod, bootstrapSecret: string): V1Pod {
  const copy = structuredClone(pod);
  const spec = copy.spec as NonNullable<V1Pod['spec']>;
  delete spec.hostname;
  for (const container of spec.containers) {
    container.env = container.env?.filter((variable) => BASE_ENV.has(variable.name));
  }
  for (const volume of spec.volumes ?? []) {
    if (volume.secret) volume.secret.secretName = bootstrapSecret;
  }
  const labels = { ...copy.metadata?.labels };
  delete labels[SANDBOX_ID_LABEL];
  // Named by its pool's Sandbox, not by a sandbox.
  copy.metadata = {
    namespace: copy.metadata?.namespace as string,
    labels,
    ...(copy.metadata?.annotations ? { annotations: copy.metadata.annotations } : {}),
  };
  return copy;
}

/** What {@link templatePod} took out: the variables envd is given once the sandbox is claimed. */
export function claimedEnv(pod: V1Pod): Record<string, string> {
  const env: Record<string, string> = {};
  for (const variable of pod.spec?.containers[0]?.env ?? []) {
    if (!BASE_ENV.has(variable.name) && variable.value !== undefined) {
      env[variable.name] = variable.value;
    }
  }
  return env;
}

/** `abx-tpl-<16 hex of the template pod's SHA-256>`: the same pod, the same objects. */
export function podTemplateName(pod: V1Pod): string {
  const hash = createHash('sha256')
    .update(JSON.stringify({ metadata: pod.metadata, spec: pod.spec }))
    .digest('hex')
    .slice(0, 16);
  return `abx-tpl-${hash}`;
}

/** The bootstrap Secret of a template: `<template>-bootstrap`. */
export function bootstrapSecretName(template: string): string {
  return `${template}-bootstrap`;
}

function labelsOf(template: string, sandboxesDir: string): Record<string, string> {
  return {
    [MANAGED_BY_LABEL]: MANAGED_BY,
    [SANDBOXES_LABEL]: sandboxesHash(sandboxesDir),
    [POD_TEMPLATE_LABEL]: template.replace(/^abx-tpl-/, ''),
  };
}

/** Random bootstrap tokens, as envd's token file (client, then control). */
export function bootstrapTokens(): { client: string; control: string } {
  return {
    client: randomBytes(32).toString('base64url'),
    control: randomBytes(32).toString('base64url'),
  };
}

/** The tokens in a bootstrap Secret (undefined when it holds none). */
export function tokensOf(secret: V1Secret): { client: string; control: string } | undefined {
  const data = secret.data?.[TOKEN_KEY];
  if (!data) return undefined;
  const [client, control] = Buffer.from(data, 'base64').toString('utf8').split('\n');
  return client && control ? { client, control } : undefined;
}

/**
 * The template's bootstrap Secret, owned by its SandboxTemplate (gone with it): the tokens every
 * pod of the pool starts with, good only until a claim's create replaces them (envd `PUT /tokens`).
 */
export function bootstrapSecret(
  template: { name: string; uid: string },
  namespace: string,
  sandboxesDir: string,
  tokens: { client: string; control: string },
): V1Secret {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: {
      name: bootstrapSecretName(template.name),
      namespace,
      labels: labelsOf(template.name, sandboxesDir),
      ownerReferences: [
        {
          apiVersion: EXTENSIONS_API,
          kind: 'SandboxTemplate',
          name: template.name,
          uid: template.uid,
          blockOwnerDeletion: true,
        },
      ],
    },
    type: 'Opaque',
    data: {
      [TOKEN_KEY]: Buffer.from(`${tokens.client}\n${tokens.control}\n`).toString('base64'),
    },
  };
}

/**
 * The SandboxTemplate of a pod template. `networkPolicyManagement: Unmanaged`: the controller's
 * managed policy lets only its Sandbox Router in, which would shut the control plane out of envd;
 * deploy/kubernetes/networkpolicy.yaml is the policy (only the control plane reaches sandboxes).
 */
export function sandboxTemplate(pod: V1Pod, name: string, sandboxesDir: string) {
  const metadata = pod.metadata ?? {};
  return {
    apiVersion: EXTENSIONS_API,
    kind: 'SandboxTemplate',
    metadata: {
      name,
      namespace: metadata.namespace as string,
      labels: labelsOf(name, sandboxesDir),
    },
    spec: {
      podTemplate: {
        metadata: {
          ...(metadata.labels ? { labels: metadata.labels } : {}),
          ...(metadata.annotations ? { annotations: metadata.annotations } : {}),
        },
        spec: pod.spec as NonNullable<V1Pod['spec']>,
      },
      networkPolicyManagement: 'Unmanaged',
      envVarsInjectionPolicy: 'Disallowed',
    },
  };
}

/** The SandboxWarmPool of a template, named like it. */
export function sandboxWarmPool(
  name: string,
  namespace: string,
  sandboxesDir: string,
  replicas: number,
) {
  return {
    apiVersion: EXTENSIONS_API,
    kind: 'SandboxWarmPool',
    metadata: { name, namespace, labels: labelsOf(name, sandboxesDir) },
    spec: { replicas, sandboxTemplateRef: { name }, updateStrategy: { type: 'OnReplenish' } },
  };
}

/** The SandboxClaim of one sandbox (`abx-<id>`): a pod of the template's pool, ended on time. */
export function sandboxClaim(
  spec: SandboxSpec,
  name: string,
  namespace: string,
  pool: string,
  sandboxesDir: string,
  now = Date.now(),
) {
  return {
    apiVersion: EXTENSIONS_API,
    kind: 'SandboxClaim',
    metadata: {
      name,
      namespace,
      labels: {
        [MANAGED_BY_LABEL]: MANAGED_BY,
        [SANDBOX_ID_LABEL]: spec.id,
        [SANDBOXES_LABEL]: sandboxesHash(sandboxesDir),
      },
    },
    spec: {
      warmPoolRef: { name: pool },
      ...(spec.timeoutMs
        ? {
            lifecycle: {
              shutdownTime: shutdownTime(now + spec.timeoutMs),
              shutdownPolicy: 'Delete',
            },
          }
        : {}),
    },
  };
}

/** What a claim's status says (status.conditions Ready, status.sandbox), as the provider reads it. */
export interface ClaimStatus {
  status?: {
    conditions?: { type: string; status: string; reason?: string; message?: string }[];
    sandbox?: { name?: string; podIPs?: string[] };
  };
  metadata?: { uid?: string; deletionTimestamp?: string };
}

/** The bound Sandbox's name and pod address once the claim is Ready; else why not. */
export function claimProgress(
  claim: ClaimStatus,
): { bound: true; sandbox: string; podIP: string } | { bound: false; why: string } {
  const ready = claim.status?.conditions?.find((c) => c.type === 'Ready');
  const sandbox = claim.status?.sandbox?.name;
  const podIP = claim.status?.sandbox?.podIPs?.[0];
  if (ready?.status === 'True' && sandbox && podIP) return { bound: true, sandbox, podIP };
  if (!sandbox) {
    return {
      bound: false,
      why: `the claim is not bound to a Sandbox yet${ready?.reason ? ` (${ready.reason}${ready.message ? `: ${ready.message}` : ''})` : ''}`,
    };
  }
  return {
    bound: false,
    why: `its Sandbox ${sandbox} is not ready${ready?.reason ? ` (${ready.reason}${ready.message ? `: ${ready.message}` : ''})` : ''}`,
  };
}
