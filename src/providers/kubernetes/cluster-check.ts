import { ApisApi, AuthorizationV1Api, type KubeConfig, VersionApi } from '@kubernetes/client-node';
import { kubeError } from './kube-client.js';

/** The API groups of kubernetes-sigs/agent-sandbox: the core `Sandbox`, and its extensions. */
export const AGENT_SANDBOX_GROUP = 'agents.x-k8s.io';
export const AGENT_SANDBOX_EXTENSIONS_GROUP = 'extensions.agents.x-k8s.io';

/** What the provider does in its namespace, as RBAC rules (group, resource, verbs). */
export const REQUIRED_PERMISSIONS: readonly { group: string; resource: string; verbs: string[] }[] =
  [
    { group: '', resource: 'pods', verbs: ['create', 'get', 'list', 'watch', 'delete'] },
    // get: a pod's control token, for envd's statfs of the claims it mounts (volume usage); in
    // claims mode also the per-template bootstrap Secret another replica made.
    { group: '', resource: 'secrets', verbs: ['create', 'delete', 'get'] },
    { group: '', resource: 'events', verbs: ['list'] },
    // abx volumes, and homes with --kube-home pvc: a claim each, swept with its sandbox.
    {
      group: '',
      resource: 'persistentvolumeclaims',
      verbs: ['create', 'get', 'list', 'delete'],
    },
    // An internet sandbox's own NetworkPolicy: made, replaced (get, update), swept, deleted.
    {
      group: 'networking.k8s.io',
      resource: 'networkpolicies',
      verbs: ['create', 'get', 'update', 'list', 'delete'],
    },
  ];
/** What it also does where agent-sandbox is installed. */
export const AGENT_SANDBOX_PERMISSIONS: readonly {
  group: string;
  resource: string;
  verbs: string[];
}[] = [
  // patch: a sandbox's shutdownTime moves with its timeout (setExpiry).
  {
    group: AGENT_SANDBOX_GROUP,
    resource: 'sandboxes',
    verbs: ['create', 'get', 'list', 'delete', 'patch'],
  },
];

/**
 * What it also does with `--kube-agent-sandbox claims`: a SandboxTemplate, a SandboxWarmPool and
 * a bootstrap Secret (read back when another daemon made it) per pod template, a SandboxClaim
 * per sandbox (patch: its lifecycle's shutdownTime moves with the sandbox's timeout).
 */
export const AGENT_SANDBOX_CLAIMS_PERMISSIONS: readonly {
  group: string;
  resource: string;
  verbs: string[];
}[] = [
  { group: AGENT_SANDBOX_EXTENSIONS_GROUP, resource: 'sandboxtemplates', verbs: ['create', 'get'] },
  { group: AGENT_SANDBOX_EXTENSIONS_GROUP, resource: 'sandboxwarmpools', verbs: ['create'] },
  {
    group: AGENT_SANDBOX_EXTENSIONS_GROUP,
    resource: 'sandboxclaims',
    verbs: ['create', 'get', 'list', 'delete', 'patch'],
  },
];

/** The resource metrics API (metrics-server): sandbox metrics come from it where it is served. */
export const METRICS_API_GROUP = 'metrics.k8s.io';
/** What the provider does where it is: list the namespace's pod metrics. */
export const METRICS_PERMISSIONS: readonly { group: string; resource: string; verbs: string[] }[] =
  [{ group: METRICS_API_GROUP, resource: 'pods', verbs: ['list'] }];

/** What `abx doctor --provider kubernetes` (and a kubernetes daemon's start) learns. */
export interface ClusterReport {
  server: string;
  namespace: string;
  reachable: boolean;
  /** The server's version (`v1.31.2`), when it answered. */
  version?: string;
  /** Each permission the provider needs, and whether this account has it (SelfSubjectAccessReview). */
  permissions: { verb: string; resource: string; allowed: boolean; reason?: string }[];
  /** The agent-sandbox API groups the server serves (empty: not installed). */
  agentSandbox: string[];
  /** Whether the server serves metrics.k8s.io (metrics-server): sandbox metrics come from it. */
  metricsApi: boolean;
  /** What is wrong, each with what to do; empty when the provider can work. */
  problems: string[];
}

/** Asks the cluster what the provider needs to know before it runs sandboxes there. */
export async function checkCluster(
  target: {
    config: KubeConfig;
    namespace: string;
    server: string;
  },
  /** The agent-sandbox mode to check for: 'claims' needs the extensions and their permissions. */
  mode?: string,
): Promise<ClusterReport> {
  const { config, namespace, server } = target;
  const report: ClusterReport = {
    server,
    namespace,
    reachable: false,
    permissions: [],
    agentSandbox: [],
    metricsApi: false,
    problems: [],
  };
  try {
    const version = await config.makeApiClient(VersionApi).getCode();
    report.version = version.gitVersion;
    report.reachable = true;
  } catch (error) {
    report.problems.push(kubeError(error, 'asking its version', server).message);
    return report;
  }
  try {
    const groups = await config.makeApiClient(ApisApi).getAPIVersions();
    report.agentSandbox = groups.groups
      .map((group) => group.name)
      .filter((name) => name === AGENT_SANDBOX_GROUP || name === AGENT_SANDBOX_EXTENSIONS_GROUP);
    report.metricsApi = groups.groups.some((group) => group.name === METRICS_API_GROUP);
  } catch (error) {
    report.problems.push(kubeError(error, 'listing its API groups', server).message);
  }
  const authorization = config.makeApiClient(AuthorizationV1Api);
  const claims = mode === 'claims';
  if (claims && !report.agentSandbox.includes(AGENT_SANDBOX_EXTENSIONS_GROUP)) {
    report.problems.push(
      `the cluster does not serve ${AGENT_SANDBOX_EXTENSIONS_GROUP}/v1beta1, which --kube-agent-sandbox claims needs: install agent-sandbox with its extensions, or use --kube-agent-sandbox true`,
    );
  }
  const needed = [
    ...REQUIRED_PERMISSIONS,
    ...(report.agentSandbox.includes(AGENT_SANDBOX_GROUP) ? AGENT_SANDBOX_PERMISSIONS : []),
    ...(claims ? AGENT_SANDBOX_CLAIMS_PERMISSIONS : []),
    ...(report.metricsApi ? METRICS_PERMISSIONS : []),
  ];
  for (const { group, resource, verbs } of needed) {
    for (const verb of verbs) {
      try {
        const review = await authorization.createSelfSubjectAccessReview({
          body: {
            apiVersion: 'authorization.k8s.io/v1',
            kind: 'SelfSubjectAccessReview',
            spec: { resourceAttributes: { namespace, group, resource, verb } },
          },
        });
        const allowed = review.status?.allowed === true;
        report.permissions.push({
          verb,
          resource,
          allowed,
          ...(review.status?.reason ? { reason: review.status.reason } : {}),
        });
        if (!allowed) {
          report.problems.push(
            `this account may not ${verb} ${group ? `${resource}.${group}` : resource} in namespace ${namespace}: add it to the daemon's Role (docs/providers.md, "RBAC")`,
          );
        }
      } catch (error) {
        report.problems.push(kubeError(error, `reviewing ${verb} ${resource}`, server).message);
      }
    }
  }
  return report;
}
