import { Ajv } from 'ajv';
import { PersistentVolumeClaim } from 'kubernetes-models/v1/PersistentVolumeClaim';
import { Pod } from 'kubernetes-models/v1/Pod';

// JSON schema of the agent-sandbox objects this project sends, for the fields it uses,
// transcribed from kubernetes-sigs/agent-sandbox's CRD definition
// k8s/crds/agents.x-k8s.io_sandboxes.yaml (version v1beta1, served and stored) at commit
// 2fd412d55ecae90861a101a5424a75473de97c36. spec.podTemplate.spec is Kubernetes' own PodSpec
// there (the full generated schema): it is checked with kubernetes-models, as pods are. A field
// the CRD does not have would be pruned silently by the API server; here it is refused, so a typo
// cannot pass.
const STRING_MAP = { type: 'object', additionalProperties: { type: 'string' } };

export const SANDBOX_V1BETA1_SCHEMA = {
  type: 'object',
  required: ['apiVersion', 'kind', 'metadata', 'spec'],
  properties: {
    apiVersion: { const: 'agents.x-k8s.io/v1beta1' },
    kind: { const: 'Sandbox' },
    metadata: { type: 'object' },
    spec: {
      type: 'object',
      required: ['podTemplate'],
      additionalProperties: false,
      properties: {
        operatingMode: { type: 'string', enum: ['Running', 'Suspended'] },
        podTemplate: {
          type: 'object',
          required: ['spec'],
          additionalProperties: false,
          properties: {
            metadata: {
              type: 'object',
              additionalProperties: false,
              properties: { annotations: STRING_MAP, labels: STRING_MAP },
            },
            spec: {
              type: 'object',
              required: ['containers'],
              properties: { containers: { type: 'array' } },
            },
          },
        },
        service: { type: 'boolean' },
        shutdownPolicy: { type: 'string', enum: ['Delete', 'Retain'] },
        // format: date-time in the CRD; as RFC 3339's pattern here (no ajv-formats dependency).
        shutdownTime: {
          type: 'string',
          pattern: '^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(\\.\\d+)?(Z|[+-]\\d{2}:\\d{2})$',
        },
        // Each item's spec is Kubernetes' own PersistentVolumeClaimSpec there: checked with
        // kubernetes-models, as claims are.
        volumeClaimTemplates: {
          type: 'array',
          items: {
            type: 'object',
            required: ['spec'],
            additionalProperties: false,
            properties: {
              metadata: {
                type: 'object',
                additionalProperties: false,
                properties: {
                  annotations: STRING_MAP,
                  labels: STRING_MAP,
                  name: { type: 'string' },
                },
              },
              spec: { type: 'object' },
            },
          },
        },
      },
    },
  },
};

const DATE_TIME = {
  type: 'string',
  pattern: '^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(\\.\\d+)?(Z|[+-]\\d{2}:\\d{2})$',
};
const POD_TEMPLATE = SANDBOX_V1BETA1_SCHEMA.properties.spec.properties.podTemplate;
const NAME_REF = {
  type: 'object',
  required: ['name'],
  additionalProperties: false,
  properties: { name: { type: 'string' } },
};
const CONDITIONS = {
  type: 'array',
  items: {
    type: 'object',
    required: ['lastTransitionTime', 'message', 'reason', 'status', 'type'],
    additionalProperties: false,
    properties: {
      lastTransitionTime: DATE_TIME,
      message: { type: 'string', maxLength: 32768 },
      observedGeneration: { type: 'integer', minimum: 0 },
      reason: {
        type: 'string',
        minLength: 1,
        maxLength: 1024,
        pattern: '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$',
      },
      status: { type: 'string', enum: ['True', 'False', 'Unknown'] },
      type: { type: 'string', maxLength: 316 },
    },
  },
};

// The extensions (group extensions.agents.x-k8s.io, version v1beta1, served and stored), from
// k8s/crds/extensions.agents.x-k8s.io_{sandboxtemplates,sandboxwarmpools,sandboxclaims}.yaml at
// the same commit: the fields this project sends and the double's controller writes (status);
// networkPolicy and volumeClaimTemplates, which neither uses, are left out (so refused here).
export const SANDBOX_TEMPLATE_V1BETA1_SCHEMA = {
  type: 'object',
  required: ['apiVersion', 'kind', 'metadata', 'spec'],
  properties: {
    apiVersion: { const: 'extensions.agents.x-k8s.io/v1beta1' },
    kind: { const: 'SandboxTemplate' },
    metadata: { type: 'object' },
    spec: {
      type: 'object',
      required: ['podTemplate'],
      additionalProperties: false,
      properties: {
        envVarsInjectionPolicy: { type: 'string', enum: ['Allowed', 'Overrides', 'Disallowed'] },
        networkPolicyManagement: { type: 'string', enum: ['Managed', 'Unmanaged'] },
        podTemplate: POD_TEMPLATE,
        service: { type: 'boolean' },
        volumeClaimTemplatesPolicy: {
          type: 'string',
          enum: ['Disallowed', 'Allowed', 'Overrides'],
        },
      },
    },
  },
};

export const SANDBOX_WARM_POOL_V1BETA1_SCHEMA = {
  type: 'object',
  required: ['apiVersion', 'kind', 'metadata', 'spec'],
  properties: {
    apiVersion: { const: 'extensions.agents.x-k8s.io/v1beta1' },
    kind: { const: 'SandboxWarmPool' },
    metadata: { type: 'object' },
    spec: {
      type: 'object',
      required: ['sandboxTemplateRef'],
      additionalProperties: false,
      properties: {
        replicas: { type: 'integer', minimum: 0, maximum: 2147483647 },
        sandboxTemplateRef: NAME_REF,
        updateStrategy: {
          type: 'object',
          additionalProperties: false,
          properties: { type: { type: 'string', enum: ['Recreate', 'OnReplenish'] } },
        },
      },
    },
    status: {
      type: 'object',
      additionalProperties: false,
      properties: {
        observedGeneration: { type: 'integer', minimum: 0 },
        readyReplicas: { type: 'integer' },
        replicas: { type: 'integer' },
        selector: { type: 'string' },
      },
    },
  },
};

export const SANDBOX_CLAIM_V1BETA1_SCHEMA = {
  type: 'object',
  required: ['apiVersion', 'kind', 'metadata', 'spec'],
  properties: {
    apiVersion: { const: 'extensions.agents.x-k8s.io/v1beta1' },
    kind: { const: 'SandboxClaim' },
    metadata: { type: 'object' },
    spec: {
      type: 'object',
      required: ['warmPoolRef'],
      additionalProperties: false,
      properties: {
        additionalPodMetadata: {
          type: 'object',
          additionalProperties: false,
          properties: { annotations: STRING_MAP, labels: STRING_MAP },
        },
        env: {
          type: 'array',
          items: {
            type: 'object',
            required: ['name', 'value'],
            additionalProperties: false,
            properties: {
              containerName: { type: 'string' },
              name: { type: 'string' },
              value: { type: 'string' },
            },
          },
        },
        lifecycle: {
          type: 'object',
          additionalProperties: false,
          properties: {
            shutdownPolicy: { type: 'string', enum: ['Delete', 'DeleteForeground', 'Retain'] },
            shutdownTime: DATE_TIME,
            ttlSecondsAfterFinished: { type: 'integer', minimum: 0 },
          },
        },
        warmPoolRef: NAME_REF,
      },
    },
    status: {
      type: 'object',
      additionalProperties: false,
      properties: {
        conditions: CONDITIONS,
        sandbox: {
          type: 'object',
          additionalProperties: false,
          properties: {
            name: { type: 'string' },
            podIPs: { type: 'array', items: { type: 'string' } },
          },
        },
      },
    },
  },
};

const ajv = new Ajv({ allErrors: true, strict: true });
const checkSandbox = ajv.compile(SANDBOX_V1BETA1_SCHEMA);
const checkTemplate = ajv.compile(SANDBOX_TEMPLATE_V1BETA1_SCHEMA);
const checkWarmPool = ajv.compile(SANDBOX_WARM_POOL_V1BETA1_SCHEMA);
const checkClaim = ajv.compile(SANDBOX_CLAIM_V1BETA1_SCHEMA);

/** Problems of an object against one compiled schema. */
function schemaProblems(check: typeof checkSandbox, object: object): string[] {
  if (check(object)) return [];
  return (check.errors ?? []).map((e) => `${e.instancePath || '(root)'} ${e.message}`);
}

/** Problems of a SandboxTemplate: its schema, and its pod template's PodSpec. */
export function sandboxTemplateProblems(object: Record<string, unknown>): string[] {
  return [...schemaProblems(checkTemplate, object), ...podTemplateProblems(object)];
}

/** Problems of a SandboxWarmPool against its schema. */
export function sandboxWarmPoolProblems(object: Record<string, unknown>): string[] {
  return schemaProblems(checkWarmPool, object);
}

/** Problems of a SandboxClaim against its schema. */
export function sandboxClaimProblems(object: Record<string, unknown>): string[] {
  return schemaProblems(checkClaim, object);
}

/** The validators of every agent-sandbox resource, for the double (`group/version/resource`). */
export const AGENT_SANDBOX_VALIDATORS = {
  'agents.x-k8s.io/v1beta1/sandboxes': (o: Record<string, unknown>) => sandboxProblems(o),
  'extensions.agents.x-k8s.io/v1beta1/sandboxtemplates': sandboxTemplateProblems,
  'extensions.agents.x-k8s.io/v1beta1/sandboxwarmpools': sandboxWarmPoolProblems,
  'extensions.agents.x-k8s.io/v1beta1/sandboxclaims': sandboxClaimProblems,
};

/** Problems of a Sandbox against the transcribed schema, its PodSpec and its claims' specs. */
export function sandboxProblems(object: Record<string, unknown>): string[] {
  return [
    ...schemaProblems(checkSandbox, object),
    ...podTemplateProblems(object),
    ...claimTemplateProblems(object),
  ];
}

/** Problems of each `spec.volumeClaimTemplates[]`'s PersistentVolumeClaimSpec. */
function claimTemplateProblems(object: Record<string, unknown>): string[] {
  const templates =
    (object.spec as { volumeClaimTemplates?: { metadata?: { name?: string }; spec?: object }[] })
      ?.volumeClaimTemplates ?? [];
  const problems: string[] = [];
  for (const [i, template] of templates.entries()) {
    try {
      new PersistentVolumeClaim({
        metadata: { name: template.metadata?.name ?? 'template' },
        spec: template.spec,
      } as ConstructorParameters<typeof PersistentVolumeClaim>[0]).validate();
    } catch (error) {
      problems.push(`spec.volumeClaimTemplates[${i}]: ${(error as Error).message}`);
    }
  }
  return problems;
}

/** Problems of `spec.podTemplate`'s PodSpec, checked with kubernetes-models as pods are. */
function podTemplateProblems(object: Record<string, unknown>): string[] {
  const problems: string[] = [];
  const template = (object.spec as { podTemplate?: { metadata?: object; spec?: object } })
    ?.podTemplate;
  if (template?.spec) {
    try {
      new Pod({
        metadata: { name: 'template', ...template.metadata },
        spec: template.spec,
      } as ConstructorParameters<typeof Pod>[0]).validate();
    } catch (error) {
      problems.push(`spec.podTemplate: ${(error as Error).message}`);
    }
  }
  return problems;
}
