import { Command } from 'commander';
import { packageInfo } from '../util/package-info.js';
import { addCodeCommand } from './code-command.js';
import { addCommandsCommand } from './commands-command.js';
import { addCopyCommand } from './copy-command.js';
import { addDaemonCommand } from './daemon-command.js';
import { addDoctorCommand } from './doctor-command.js';
import { reportError } from './errors.js';
import { addExecCommand } from './exec-command.js';
import { addFileCommands } from './file-commands.js';
import { addMcpCommand } from './mcp-command.js';
import { withExamples } from './options.js';
import { addRunCommand } from './run-command.js';
import { addSandboxCommands } from './sandbox-commands.js';
import { addServerCommand } from './server-command.js';
import { addShellCommand } from './shell-command.js';
import { addTemplateCommand } from './template-command.js';

/** Builds the `abx` program. */
export function buildProgram(): Command {
  const program = new Command('abx')
    .description('Disposable, isolated Linux sandboxes for AI agents, with typed custom commands.')
    .version(packageInfo().version)
    .showSuggestionAfterError(true)
    // Subcommands inherit these two: usage errors reach runCli instead of exiting the process.
    .exitOverride()
    .configureHelp({ sortSubcommands: false });
  withExamples(program, 'id=$(abx create -q) && abx exec "$id" -- uname -a && abx kill "$id"');
  addSandboxCommands(program);
  addExecCommand(program);
  addCodeCommand(program);
  addShellCommand(program);
  addCopyCommand(program);
  addFileCommands(program);
  addRunCommand(program);
  addCommandsCommand(program);
  addServerCommand(program);
  addTemplateCommand(program);
  addDaemonCommand(program);
  addDoctorCommand(program);
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
