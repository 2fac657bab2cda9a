import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { kubeconfigSource } from '../providers/kubernetes/kubeconfig-source.js';
import { packageInfo } from '../util/package-info.js';
import { printJson, printLine } from './output.js';

/** What the daemon's check prints (src/providers/kubernetes/cluster-check.ts). */
interface ClusterReport {
  server?: string;
  namespace?: string;
  reachable: boolean;
  version?: string;
  permissions: { verb: string; resource: string; allowed: boolean }[];
  agentSandbox: string[];
  /** Whether the cluster serves metrics.k8s.io (absent from an older daemon's report). */
  metricsApi?: boolean;
  problems: string[];
}

export interface KubernetesDoctorOptions {
  namespace?: string;
  context?: string;
  kubeAgentSandbox?: string;
  kubeconfig?: string;
  json?: boolean;
}

/**
 * `abx doctor --provider kubernetes`: whether the cluster answers, the namespace, the permissions
 * the provider needs (SelfSubjectAccessReview) and whether agent-sandbox is installed. The check
 * runs in the daemon's program (`ABX_DOCTOR`), which holds the provider (and the Kubernetes
 * client, which the CLI never loads). Returns true when the provider could work there.
 */
export async function kubernetesDoctor(options: KubernetesDoctorOptions): Promise<boolean> {
  const found = kubeconfigSource(options.kubeconfig);
  const report =
    'missing' in found
      ? ({
          reachable: false,
          permissions: [],
          agentSandbox: [],
          problems: [found.missing],
        } satisfies ClusterReport)
      : await clusterReport(options);
  if (options.json) printJson(report);
  else if ('missing' in found) {
    printLine('kubeconfig  none found');
    for (const problem of report.problems) printLine(`problem: ${problem}`);
  } else {
    printLine(
      `API server  ${report.server ?? '?'}: ${report.reachable ? `answers (${report.version ?? 'unknown version'})` : 'does not answer'}`,
    );
    printLine(`namespace   ${report.namespace ?? '?'}`);
    for (const p of report.permissions) {
      printLine(`${p.allowed ? 'ok' : 'NO'}          ${p.verb} ${p.resource}`);
    }
    if (report.reachable) {
      printLine(
        `agent-sandbox  ${report.agentSandbox.length > 0 ? `installed (${report.agentSandbox.join(', ')})` : 'not installed: sandboxes run as plain pods'}`,
      );
      printLine(
        `metrics     ${report.metricsApi ? 'metrics.k8s.io served: sandbox metrics (CPU, memory) come from it' : 'metrics.k8s.io not served: sandboxes have no metrics (install metrics-server)'}`,
      );
    }
    for (const problem of report.problems) printLine(`problem: ${problem}`);
  }
  return report.problems.length === 0;
}

async function clusterReport(options: KubernetesDoctorOptions): Promise<ClusterReport> {
  const output = await new Promise<string>((resolve) => {
    execFile(
      process.execPath,
      [join(packageInfo().root, 'dist', 'daemon.js')],
      {
        env: {
          ...process.env,
          ABX_DOCTOR: 'kubernetes',
          ...(options.namespace ? { ABX_KUBE_NAMESPACE: options.namespace } : {}),
          ...(options.context ? { ABX_KUBE_CONTEXT: options.context } : {}),
          ...(options.kubeAgentSandbox ? { ABX_KUBE_AGENT_SANDBOX: options.kubeAgentSandbox } : {}),
          ...(options.kubeconfig ? { KUBECONFIG: options.kubeconfig } : {}),
        },
        timeout: 60_000,
      },
      (_error, stdout) => resolve(stdout),
    );
  });
  try {
    return JSON.parse(output.trim().split('\n').pop() ?? '') as ClusterReport;
  } catch {
    throw new Error(`the check printed no report: ${output.slice(0, 500)}`);
  }
}
