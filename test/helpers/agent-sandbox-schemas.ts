import { Ajv } from 'ajv';
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
      },
    },
  },
};

const ajv = new Ajv({ allErrors: true, strict: true });
const checkSandbox = ajv.compile(SANDBOX_V1BETA1_SCHEMA);

/** Problems of a Sandbox against the transcribed schema and its pod template's PodSpec. */
export function sandboxProblems(object: Record<string, unknown>): string[] {
  const problems: string[] = [];
  if (!checkSandbox(object)) {
    for (const error of checkSandbox.errors ?? []) {
      problems.push(`${error.instancePath || '(root)'} ${error.message}`);
    }
  }
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
