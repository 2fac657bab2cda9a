import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { type Command, Option } from 'commander';
import { packageInfo } from '../util/package-info.js';
import { ExitCode } from './errors.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';

/** What the daemon's check prints (src/providers/kubernetes/cluster-check.ts). */
interface ClusterReport {
  server?: string;
  namespace?: string;
  reachable: boolean;
  version?: string;
  permissions: { verb: string; resource: string; allowed: boolean }[];
  agentSandbox: string[];
  problems: string[];
}

/**
 * `abx doctor --provider kubernetes`: whether the cluster answers, the namespace, the permissions
 * the provider needs (SelfSubjectAccessReview) and whether agent-sandbox is installed. The check
 * runs in the daemon's program (`ABX_DOCTOR`), which holds the provider; exits 1 when the provider
 * could not work there.
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
      .addOption(
        new Option(
          '--kube-agent-sandbox <mode>',
          "the daemon's agent-sandbox mode: claims also checks the extensions and their permissions",
        )
          .choices(['auto', 'true', 'false', 'claims'])
          .env('ABX_KUBE_AGENT_SANDBOX'),
      )
      .option(
        '--kubeconfig <file>',
        'the kubeconfig file (default: KUBECONFIG, ~/.kube/config, or in-cluster)',
      )
      .option('--json', 'print the report as JSON')
      .action(
        async (options: {
          namespace?: string;
          context?: string;
          kubeAgentSandbox?: string;
          kubeconfig?: string;
          json?: boolean;
        }) => {
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
                  ...(options.kubeAgentSandbox
                    ? { ABX_KUBE_AGENT_SANDBOX: options.kubeAgentSandbox }
                    : {}),
                  ...(options.kubeconfig ? { KUBECONFIG: options.kubeconfig } : {}),
                },
                timeout: 60_000,
              },
              (_error, stdout) => resolve(stdout),
            );
          });
          let report: ClusterReport;
          try {
            report = JSON.parse(output.trim().split('\n').pop() ?? '') as ClusterReport;
          } catch {
            throw new Error(`the check printed no report: ${output.slice(0, 500)}`);
          }
          if (options.json) printJson(report);
          else {
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
            }
            for (const problem of report.problems) printLine(`problem: ${problem}`);
          }
          if (report.problems.length > 0) throw new ExitCode(1);
        },
      ),
    'abx doctor --provider kubernetes --namespace sandboxes',
  );
}
