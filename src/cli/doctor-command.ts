import { type Command, Option } from 'commander';
import { ExitCode } from './errors.js';
import { withExamples } from './options.js';

/**
 * `abx doctor`: whether a provider can run sandboxes on this machine, one line per check with
 * what was found and, for anything not ok, its fix. Without `--provider` it checks the local
 * provider (bubblewrap). Exits 1 when the chosen provider cannot run sandboxes; optional features
 * (code contexts, the browser group, image templates…) only warn. The checks live in modules
 * imported when the command runs, so `abx` itself starts without them.
 */
export function addDoctorCommand(program: Command): void {
  withExamples(
    program
      .command('doctor')
      .description(
        'Check that a provider can run sandboxes here: each check with what it found and, when not ok, the fix. Exit 0 when the provider can run sandboxes.',
      )
      .addOption(
        new Option(
          '--provider <name>',
          'the provider to check: local (bubblewrap on this machine), docker (its Docker engine) or kubernetes (a cluster)',
        )
          .choices(['local', 'docker', 'kubernetes'])
          .default('local'),
      )
      .addOption(
        new Option('--namespace <name>', 'kubernetes: the namespace sandboxes run in').env(
          'ABX_KUBE_NAMESPACE',
        ),
      )
      .addOption(
        new Option('--context <name>', 'kubernetes: the kubeconfig context').env(
          'ABX_KUBE_CONTEXT',
        ),
      )
      .addOption(
        new Option(
          '--kube-agent-sandbox <mode>',
          "kubernetes: the daemon's agent-sandbox mode: claims also checks the extensions and their permissions",
        )
          .choices(['auto', 'true', 'false', 'claims'])
          .env('ABX_KUBE_AGENT_SANDBOX'),
      )
      .option(
        '--kubeconfig <file>',
        'kubernetes: the kubeconfig file (default: KUBECONFIG, ~/.kube/config, or in-cluster)',
      )
      .option('--json', 'print the report as JSON')
      .action(
        async (options: {
          provider: 'local' | 'docker' | 'kubernetes';
          namespace?: string;
          context?: string;
          kubeAgentSandbox?: string;
          kubeconfig?: string;
          json?: boolean;
        }) => {
          if (options.provider === 'kubernetes') {
            const { kubernetesDoctor } = await import('./doctor-kubernetes.js');
            if (!(await kubernetesDoctor(options))) throw new ExitCode(1);
            return;
          }
          const { printReport } = await import('./doctor-report.js');
          const report =
            options.provider === 'docker'
              ? await (await import('./doctor-docker.js')).dockerDoctor()
              : await (await import('./doctor-local.js')).localDoctor();
          printReport(report, options.json === true);
          if (!report.ready) throw new ExitCode(1);
        },
      ),
    'abx doctor',
    'abx doctor --provider docker --json',
    'abx doctor --provider kubernetes --namespace sandboxes',
  );
}
