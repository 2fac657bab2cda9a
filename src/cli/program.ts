import { Command, Option } from 'commander';
import { closeConnections } from '../util/idle-connections.js';
import { packageInfo } from '../util/package-info.js';
import { EXIT_CODES_HELP, reportError } from './errors.js';
import { withExamples } from './options.js';
import { endQuietlyOnBrokenPipe } from './output.js';

type Register = (program: Command) => void;

/**
 * Every subcommand, in the order `abx --help` lists them: the names (aliases included) each
 * module adds, and how to load it. A command's module, and what it imports (the SDK, undici,
 * the Kubernetes client...), is loaded only when that command runs: `abx --version` and
 * `abx list` then start in a fraction of the time a program with every module loaded took.
 */
const SUBCOMMANDS: readonly { names: readonly string[]; load: () => Promise<Register> }[] = [
  {
    names: [
      'create',
      'list',
      'ps',
      'info',
      'kill',
      'pause',
      'resume',
      'fork',
      'timeout',
      'network',
      'metrics',
      'snapshot',
    ],
    load: async () => (await import('./sandbox-commands.js')).addSandboxCommands,
  },
  { names: ['logs'], load: async () => (await import('./logs-command.js')).addLogsCommand },
  { names: ['audit'], load: async () => (await import('./audit-command.js')).addAuditCommand },
  { names: ['events'], load: async () => (await import('./events-command.js')).addEventsCommand },
  {
    names: ['diff', 'apply'],
    load: async () => (await import('./workspace-command.js')).addWorkspaceCommands,
  },
  { names: ['exec'], load: async () => (await import('./exec-command.js')).addExecCommand },
  { names: ['code'], load: async () => (await import('./code-command.js')).addCodeCommand },
  { names: ['shell'], load: async () => (await import('./shell-command.js')).addShellCommand },
  { names: ['cp'], load: async () => (await import('./copy-command.js')).addCopyCommand },
  { names: ['ls', 'cat'], load: async () => (await import('./file-commands.js')).addFileCommands },
  { names: ['run'], load: async () => (await import('./run-command.js')).addRunCommand },
  {
    names: ['commands', 'list-commands'],
    load: async () => (await import('./commands-command.js')).addCommandsCommand,
  },
  { names: ['server'], load: async () => (await import('./server-command.js')).addServerCommand },
  { names: ['url'], load: async () => (await import('./url-command.js')).addUrlCommand },
  {
    names: ['dashboard'],
    load: async () => (await import('./dashboard-command.js')).addDashboardCommand,
  },
  {
    names: ['template'],
    load: async () => (await import('./template-command.js')).addTemplateCommand,
  },
  { names: ['volume'], load: async () => (await import('./volume-command.js')).addVolumeCommand },
  { names: ['secret'], load: async () => (await import('./secret-command.js')).addSecretCommand },
  {
    names: ['webhook'],
    load: async () => (await import('./webhook-command.js')).addWebhookCommand,
  },
  { names: ['keys'], load: async () => (await import('./keys-command.js')).addKeysCommand },
  { names: ['daemon'], load: async () => (await import('./daemon-command.js')).addDaemonCommand },
  { names: ['doctor'], load: async () => (await import('./doctor-command.js')).addDoctorCommand },
  {
    names: ['kubernetes'],
    load: async () => (await import('./kubernetes-command.js')).addKubernetesCommand,
  },
  { names: ['mcp'], load: async () => (await import('./mcp-command.js')).addMcpCommand },
  { names: ['e2b'], load: async () => (await import('./e2b-command.js')).addE2bCommand },
];

/** The program's own options that take a value (`--api-url URL`), to step over when reading argv. */
const VALUE_OPTIONS = new Set(['--api-url', '--api-key', '--ca-cert', '--gateway-url']);

/**
 * The subcommand modules `args` (argv without node and the script) needs: the one it names; none
 * for `--version` alone; all of them otherwise (help, `help CMD`, a mistyped name, which
 * commander answers with a suggestion from every name).
 */
export function subcommandsFor(args: readonly string[]): typeof SUBCOMMANDS {
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] as string;
    if (arg === '--') break;
    if (arg.startsWith('-')) {
      if (VALUE_OPTIONS.has(arg)) i++;
      continue;
    }
    const named = SUBCOMMANDS.find((entry) => entry.names.includes(arg));
    return named ? [named] : SUBCOMMANDS;
  }
  const versionOnly = args.some((arg) => arg === '-V' || arg === '--version');
  return versionOnly ? [] : SUBCOMMANDS;
}

/**
 * Builds the `abx` program with the subcommands `args` needs (see {@link subcommandsFor}); every
 * one when `args` is not given.
 */
export async function buildProgram(args?: readonly string[]): Promise<Command> {
  const program = new Command('abx')
    .description('Disposable, isolated Linux sandboxes for AI agents, with typed custom commands.')
    .version(packageInfo().version)
    .showSuggestionAfterError(true)
    .addHelpText('after', `\n${EXIT_CODES_HELP}`)
    // Subcommands inherit these two: usage errors reach runCli instead of exiting the process.
    .exitOverride()
    .configureHelp({ sortSubcommands: false })
    .addOption(
      new Option(
        '--api-url <url>',
        'a remote control plane (abx daemon start --listen), e.g. https://abx.example.com:8443; no local daemon is used',
      ).env('ABX_API_URL'),
    )
    .addOption(
      new Option(
        '--api-key <key>',
        "the remote control plane's API key (prefer ABX_API_KEY: arguments are visible to other users)",
      ).env('ABX_API_KEY'),
    )
    .addOption(
      new Option(
        '--ca-cert <file>',
        "a PEM CA to trust for the remote control plane's TLS, besides the system's",
      ).env('ABX_CA_CERT'),
    )
    .addOption(
      new Option(
        '--gateway-url <url>',
        "the remote gateway's address when {port}-{id}.{domain} names do not resolve here, e.g. https://10.0.0.5:8444",
      ).env('ABX_GATEWAY_URL'),
    )
    // The SDK reads the environment: options given on the command line go there.
    .hook('preAction', (command) => {
      const options = command.opts<{
        apiUrl?: string;
        apiKey?: string;
        caCert?: string;
        gatewayUrl?: string;
      }>();
      const set = (name: string, value: string | undefined) => {
        if (value !== undefined) process.env[name] = value;
      };
      set('ABX_API_URL', options.apiUrl);
      set('ABX_API_KEY', options.apiKey);
      set('ABX_CA_CERT', options.caCert);
      set('ABX_GATEWAY_URL', options.gatewayUrl);
    });
  withExamples(
    program,
    'id=$(abx create -q) && abx exec "$id" -- uname -a && abx kill "$id"',
    'ABX_API_URL=https://abx.example.com:8443 ABX_API_KEY=... abx list',
  );
  const modules = args === undefined ? SUBCOMMANDS : subcommandsFor(args);
  // Loaded together, registered in the table's order: help lists them the same every time.
  for (const register of await Promise.all(modules.map((entry) => entry.load()))) {
    register(program);
  }
  return program;
}

/** Runs `abx` with `argv` (as in `process.argv`) and returns the exit code. */
export async function runCli(argv: readonly string[]): Promise<number> {
  endQuietlyOnBrokenPipe();
  try {
    await (await buildProgram(argv.slice(2))).parseAsync([...argv]);
    return 0;
  } catch (error) {
    return reportError(error);
  } finally {
    // The command is done: kept-alive connections would hold the process open a while longer.
    await closeConnections();
  }
}
