import type { Command } from 'commander';
import { parseCommandArgs } from '../commands/arguments.js';
import { CommandNotFoundError, type CommandResult } from '../errors.js';
import { Sandbox } from '../sandbox/sandbox.js';
import { sandboxCommands } from './custom-commands.js';
import { ExitCode } from './errors.js';
import { withSpinner } from './feedback.js';
import { collect, withExamples } from './options.js';
import { printJson, printLine } from './output.js';

async function run(
  id: string,
  name: string,
  options: { arg?: string[]; json?: boolean },
): Promise<void> {
  const sandbox = await Sandbox.connect(id);
  const commands = await sandboxCommands(sandbox);
  const command = commands.find((c) => c.name === name);
  if (!command)
    throw CommandNotFoundError.of(
      name,
      commands.map((c) => c.name),
    );
  // Bad arguments stop here (ArgumentError, exit 2), before the command is sent anywhere.
  const kwargs = parseCommandArgs(command, options.arg ?? []);
  const result = await withSpinner(`running ${name}`, () => sandbox.run(name, kwargs));
  if (command.source === 'yaml') {
    const { stdout, stderr, exitCode } = result as CommandResult;
    if (options.json) printJson(result);
    else {
      process.stdout.write(stdout);
      process.stderr.write(stderr);
    }
    if (exitCode !== 0) throw new ExitCode(exitCode);
  } else if (typeof result === 'string' && !options.json) {
    printLine(result);
  } else {
    printJson(result);
  }
}

/** `abx run ID NAME -a key=value ...`. */
export function addRunCommand(program: Command): void {
  withExamples(
    program
      .command('run')
      .description(
        "Run a custom command: a YAML one in a shell (abx exits with its code), a decorated one on the sandbox's command server (its result is printed as JSON).",
      )
      .argument('<id>', 'the sandbox')
      .argument('<name>', 'the command; `abx commands ID` lists them')
      .option('-a, --arg <key=value>', 'an argument of the command (repeatable)', collect)
      .option('--json', 'print the result as JSON (for YAML commands: stdout, stderr, exitCode)')
      .action(run),
    'abx run i1a2b3c4d5e6f7g8 head -a path=data.csv -a lines=3',
    'abx run i1a2b3c4d5e6f7g8 add -a x=40 --json',
  );
}
