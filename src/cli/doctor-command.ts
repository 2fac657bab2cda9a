import { type Command, Option } from 'commander';
import { ExitCode } from './errors.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';

/**
 * `abx doctor --provider kubernetes`: whether the cluster answers, the namespace, the permissions
 * the provider needs (SelfSubjectAccessReview) and whether agent-sandbox is installed. Exits 1
 * when the provider could not work there.
 */
export function addDoctorCommand(program: Command): void {
  withExamples(
    program
      .command('doctor')
      .description(
        "Check that a provider can run sandboxes here (today: a Kubernetes cluster's answer, namespace, RBAC, agent-sandbox CRDs).",
      )
      .addOption(
        new Option('--provider <name>', 'the provider to check')
          .choices(['kubernetes'])
          .default('kubernetes'),
      )
      .addOption(
        new Option('--namespace <name>', 'the namespace sandboxes run in').env(
          'ABX_KUBE_NAMESPACE',
        ),
      )
      .addOption(new Option('--context <name>', 'the kubeconfig context').env('ABX_KUBE_CONTEXT'))
      .option(
        '--kubeconfig <file>',
        'the kubeconfig file (default: KUBECONFIG, ~/.kube/config, or in-cluster)',
      )
      .option('--json', 'print the report as JSON')
      .action(
        async (options: {
          namespace?: string;
          context?: string;
          kubeconfig?: string;
          json?: boolean;
        }) => {
          const { KubernetesProvider } = await import(
            '../providers/kubernetes/kubernetes-provider.js'
          );
          const { checkCluster } = await import('../providers/kubernetes/cluster-check.js');
          const provider = new KubernetesProvider({
            ...(options.namespace ? { namespace: options.namespace } : {}),
            ...(options.context ? { context: options.context } : {}),
            ...(options.kubeconfig ? { kubeconfigPath: options.kubeconfig } : {}),
            watch: false,
          });
          const report = await checkCluster(provider).finally(() => provider.close());
          if (options.json) printJson(report);
          else {
            printLine(
              `API server  ${report.server}: ${report.reachable ? `answers (${report.version ?? 'unknown version'})` : 'does not answer'}`,
            );
            printLine(`namespace   ${report.namespace}`);
            for (const p of report.permissions) {
              printLine(`${p.allowed ? 'ok  ' : 'NO  '}        ${p.verb} ${p.resource}`);
            }
            if (report.reachable) {
              printLine(
                `agent-sandbox  ${report.agentSandbox.length > 0 ? `installed (${report.agentSandbox.join(', ')})` : 'not installed: sandboxes run as plain pods'}`,
              );
            }
            for (const problem of report.problems) printLine(`problem: ${problem}`);
          }
          if (report.problems.length > 0) throw new ExitCode(1);
        },
      ),
    'abx doctor --provider kubernetes --namespace sandboxes',
  );
}
