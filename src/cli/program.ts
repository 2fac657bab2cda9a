import { Command, Option } from 'commander';
import { packageInfo } from '../util/package-info.js';
import { addCodeCommand } from './code-command.js';
import { addCommandsCommand } from './commands-command.js';
import { addCopyCommand } from './copy-command.js';
import { addDaemonCommand } from './daemon-command.js';
import { addDoctorCommand } from './doctor-command.js';
import { reportError } from './errors.js';
import { addExecCommand } from './exec-command.js';
import { addFileCommands } from './file-commands.js';
import { addKeysCommand } from './keys-command.js';
import { addKubernetesCommand } from './kubernetes-command.js';
import { addMcpCommand } from './mcp-command.js';
import { withExamples } from './options.js';
import { addRunCommand } from './run-command.js';
import { addSandboxCommands } from './sandbox-commands.js';
import { addServerCommand } from './server-command.js';
import { addShellCommand } from './shell-command.js';
import { addTemplateCommand } from './template-command.js';
import { addUrlCommand } from './url-command.js';

/** Builds the `abx` program. */
export function buildProgram(): Command {
  const program = new Command('abx')
    .description('Disposable, isolated Linux sandboxes for AI agents, with typed custom commands.')
    .version(packageInfo().version)
    .showSuggestionAfterError(true)
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
    'ABX_API_URL=https://abx.example.com:8443 ABX_API_KEY=... abx ls',
  );
  addSandboxCommands(program);
  addExecCommand(program);
  addCodeCommand(program);
  addShellCommand(program);
  addCopyCommand(program);
  addFileCommands(program);
  addRunCommand(program);
  addCommandsCommand(program);
  addServerCommand(program);
  addUrlCommand(program);
  addTemplateCommand(program);
  addKeysCommand(program);
  addDaemonCommand(program);
  addDoctorCommand(program);
  addKubernetesCommand(program);
  addMcpCommand(program);
  return program;
}

/** Runs `abx` with `argv` (as in `process.argv`) and returns the exit code. */
export async function runCli(argv: readonly string[]): Promise<number> {
  try {
    await buildProgram().parseAsync([...argv]);
    return 0;
  } catch (error) {
    return reportError(error);
  }
}
