import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Deployment } from 'kubernetes-models/apps/v1/Deployment';
import { Ingress } from 'kubernetes-models/networking.k8s.io/v1/Ingress';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1/NetworkPolicy';
import { Role } from 'kubernetes-models/rbac.authorization.k8s.io/v1/Role';
import { RoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1/RoleBinding';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { Namespace } from 'kubernetes-models/v1/Namespace';
import { Secret } from 'kubernetes-models/v1/Secret';
import { Service } from 'kubernetes-models/v1/Service';
import { ServiceAccount } from 'kubernetes-models/v1/ServiceAccount';
import { describe, expect, test } from 'vitest';
import { parseAllDocuments } from 'yaml';
import {
  AGENT_SANDBOX_CLAIMS_PERMISSIONS,
  AGENT_SANDBOX_PERMISSIONS,
  METRICS_PERMISSIONS,
  REQUIRED_PERMISSIONS,
} from '../../src/providers/kubernetes/cluster-check.js';
import { NETWORK_LABEL } from '../../src/providers/kubernetes/pod-spec.js';
import { ROOT } from '../helpers/build.js';

// deploy/kubernetes as a cluster owner applies it (`kubectl apply -k`): every object checked
// against Kubernetes' own schemas (kubernetes-models, generated from upstream OpenAPI), and the
// manifests held to what the code reads and does, so neither can drift from the other. No
// cluster runs here: what a live API server would add (admission, defaulting) is not covered.
const DIR = join(ROOT, 'deploy', 'kubernetes');

// biome-ignore lint/suspicious/noExplicitAny: objects straight from YAML
type Manifest = Record<string, any>;

// Each model's constructor wants its own object type; the YAML is checked by validate(), not tsc.
const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  'v1/Namespace': Namespace,
  'v1/ServiceAccount': ServiceAccount,
  'v1/Service': Service,
  'v1/ConfigMap': ConfigMap,
  'v1/Secret': Secret,
  'apps/v1/Deployment': Deployment,
  'networking.k8s.io/v1/Ingress': Ingress,
  'networking.k8s.io/v1/NetworkPolicy': NetworkPolicy,
  'rbac.authorization.k8s.io/v1/Role': Role,
  'rbac.authorization.k8s.io/v1/RoleBinding': RoleBinding,
};

function documents(file: string): Manifest[] {
  return parseAllDocuments(readFileSync(join(DIR, file), 'utf8')).map((doc) => {
    expect(doc.errors, `${file}: YAML errors`).toEqual([]);
    return doc.toJS() as Manifest;
  });
}

const kustomization = documents('kustomization.yaml')[0] as { resources: string[] };
const applied = kustomization.resources.flatMap(documents);
const find = (kind: string, name?: string) => {
  const found = applied.filter((m) => m.kind === kind && (!name || m.metadata.name === name));
  expect(found.length, `${kind} ${name ?? ''} in deploy/kubernetes`).toBeGreaterThan(0);
  return found[0] as Manifest;
};

describe('deploy/kubernetes', () => {
  test('every object of the kustomization and of the Secrets example is valid Kubernetes', () => {
    const all = [...applied, ...documents('secrets.example.yaml')];
    for (const manifest of all) {
      const Model = MODELS[`${manifest.apiVersion}/${manifest.kind}`];
      expect(Model, `a model for ${manifest.apiVersion} ${manifest.kind}`).toBeDefined();
      const Valid = Model as NonNullable<typeof Model>;
      expect(
        () => new Valid(manifest as never).validate(),
        `${manifest.kind} ${manifest.metadata?.name}`,
      ).not.toThrow();
    }
    // The check can fail: a field of the wrong type is refused.
    const broken = structuredClone(find('Deployment'));
    broken.spec.replicas = 'two';
    expect(() => new Deployment(broken as never).validate()).toThrow();
  });

  test('the Role grants exactly what the provider does, in the sandboxes namespace only', () => {
    const role = find('Role');
    expect(role.metadata.namespace).toBe('abx-sandboxes');
    const granted = role.rules.flatMap((rule: Manifest) =>
      rule.apiGroups.flatMap((group: string) =>
        rule.resources.flatMap((resource: string) =>
          rule.verbs.map((verb: string) => `${verb} ${resource}.${group}`),
        ),
      ),
    );
    const needed = [
      ...REQUIRED_PERMISSIONS,
      ...AGENT_SANDBOX_PERMISSIONS,
      ...AGENT_SANDBOX_CLAIMS_PERMISSIONS,
      ...METRICS_PERMISSIONS,
    ].flatMap((p) => p.verbs.map((verb) => `${verb} ${p.resource}.${p.group}`));
    expect(granted.sort()).toEqual(needed.sort());
    expect(applied.filter((m) => m.kind.startsWith('Cluster'))).toEqual([]);
    const binding = find('RoleBinding');
    expect(binding.roleRef.name).toBe(role.metadata.name);
    const account = find('ServiceAccount');
    expect(binding.subjects).toEqual([
      { kind: 'ServiceAccount', name: account.metadata.name, namespace: 'abx-system' },
    ]);
    expect(find('Deployment').spec.template.spec.serviceAccountName).toBe(account.metadata.name);
  });

  test('the control plane: two replicas, every variable one the daemon reads, no root', () => {
    const deployment = find('Deployment');
    expect(deployment.spec.replicas).toBe(2);
    const pod = deployment.spec.template.spec;
    const [container] = pod.containers;
    const env = Object.fromEntries(
      container.env.map((e: Manifest) => [e.name, e.value ?? e.valueFrom]),
    );
    expect(env.ABX_PROVIDER).toBe('kubernetes');
    expect(env.ABX_DATABASE_URL.secretKeyRef).toMatchObject({ name: 'abx-database' });
    // A variable the daemon does not read would be a setting that silently does nothing.
    const daemonSources = ['src/control/daemon-main.ts', 'src/cli/daemon-command.ts']
      .map((file) => readFileSync(join(ROOT, file), 'utf8'))
      .join('\n');
    for (const name of Object.keys(env)) expect(daemonSources, name).toContain(`'${name}'`);
    expect(env.ABX_KUBE_NAMESPACE).toBe(find('Role').metadata.namespace);
    expect(pod.securityContext).toMatchObject({ runAsNonRoot: true, runAsUser: 1000 });
    expect(container.securityContext).toMatchObject({
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ['ALL'] },
    });
    // Both replicas mount the same token secret and API key where the daemon reads them.
    const mounts = container.volumeMounts.map((m: Manifest) => m.mountPath);
    expect(mounts).toEqual(
      expect.arrayContaining(['/var/lib/abx/token-secret', '/var/lib/abx/api-key']),
    );
    const ports = container.ports.map((p: Manifest) => p.containerPort);
    expect(ports).toEqual([
      Number(env.ABX_LISTEN.split(':')[1]),
      Number(env.ABX_GATEWAY_LISTEN.split(':')[1]),
    ]);
  });

  test('the Ingress sends the API host and the sandbox wildcard to their ports, under TLS', () => {
    const config = find('ConfigMap', 'abx-config');
    const domain = config.data.domain as string;
    const ingress = find('Ingress');
    const byHost = Object.fromEntries(
      ingress.spec.rules.map((r: Manifest) => [r.host, r.http.paths[0].backend.service.port.name]),
    );
    expect(byHost).toEqual({ [`api.${domain}`]: 'api', [`*.${domain}`]: 'gateway' });
    expect(ingress.spec.tls[0].hosts.sort()).toEqual([`*.${domain}`, `api.${domain}`].sort());
    const service = find('Service');
    expect(service.spec.ports.map((p: Manifest) => p.name).sort()).toEqual(['api', 'gateway']);
  });

  test('sandbox pods take connections from the control plane only; network none gets no egress, internet only its own policy’s', () => {
    const policies = applied.filter((m) => m.kind === 'NetworkPolicy');
    const ingress = policies.find((p) => p.spec.policyTypes.includes('Ingress')) as Manifest;
    expect(ingress.metadata.namespace).toBe('abx-sandboxes');
    expect(ingress.spec.podSelector).toEqual({});
    expect(ingress.spec.ingress).toEqual([
      {
        from: [
          {
            namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'abx-system' } },
            podSelector: {
              matchLabels: find('Deployment').spec.selector.matchLabels,
            },
          },
        ],
      },
    ]);
    const egress = policies.filter((p) => p.spec.policyTypes.includes('Egress'));
    // The label the provider puts on a pod of a `network: none` template: no egress at all.
    // On `internet`: none but what the sandbox's own NetworkPolicy allows (policies add up).
    expect(egress.map((p) => [p.spec.podSelector, p.spec.egress])).toEqual([
      [{ matchLabels: { [NETWORK_LABEL]: 'none' } }, []],
      [{ matchLabels: { [NETWORK_LABEL]: 'internet' } }, []],
    ]);
  });
});
