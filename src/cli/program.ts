import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Command, CommanderError, Option } from 'commander';
import { describeCommand, formatCommandTable } from '../commands/discovery.js';
import { toJSONSchema } from '../commands/json-schema.js';
import { listCommands } from '../commands/list-commands.js';
import { loadTemplate } from '../commands/template.js';
import { packageInfo } from '../util/package-info.js';
import { addDaemonCommand } from './daemon-command.js';
import { addTemplateCommand } from './template-command.js';

/** Exit codes: 0 ok, 1 error, 2 usage error. */
const EXIT_USAGE = 2;

async function commandsAction(options: {
  template: string;
  module?: string[];
  json?: boolean;
  schema?: boolean;
}): Promise<void> {
  const template =
    options.template.endsWith('.yaml') || options.template.endsWith('.yml')
      ? loadTemplate(options.template)
      : options.template;
  // Importing a module runs its @sandbox decorators, which register its commands.
  for (const file of options.module ?? []) await import(pathToFileURL(resolve(file)).href);
  const commands = listCommands(template);
  if (options.schema) {
    const schemas = Object.fromEntries(commands.map((c) => [c.name, toJSONSchema(c)]));
    process.stdout.write(`${JSON.stringify(schemas, null, 2)}\n`);
  } else if (options.json) {
    process.stdout.write(
      `${JSON.stringify({ commands: commands.map(describeCommand) }, null, 2)}\n`,
    );
  } else {
    process.stdout.write(`${formatCommandTable(commands)}\n`);
  }
}

/** Builds the `abx` program. */
export function buildProgram(): Command {
  const program = new Command('abx')
    .description('Disposable, isolated Linux sandboxes for AI agents, with typed custom commands.')
    .version(packageInfo().version)
    .showSuggestionAfterError(true)
    .exitOverride();

  program
    .command('commands')
    .alias('list-commands')
    .description('List the custom commands of a template: its YAML commands and decorated methods.')
    .requiredOption('-t, --template <path|name>', 'a template.yaml to load, or a template name')
    .option(
      '-m, --module <file>',
      'a compiled JS module whose @sandbox classes to include (repeatable)',
      (value: string, previous: string[] = []) => [...previous, value],
    )
    .addOption(new Option('--json', 'print the discovery document').conflicts('schema'))
    .option('--schema', 'print the JSON Schema of each command, by name')
    .addHelpText(
      'after',
      '\nExample:\n  abx commands --template samples/template.yaml --module samples/build/data-tools.js --json',
    )
    .action(commandsAction);
  addDaemonCommand(program);
  addTemplateCommand(program);
  return program;
}

/** Runs `abx` with `argv` (as in `process.argv`) and returns the exit code. */
export async function runCli(argv: readonly string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync([...argv]);
    return 0;
  } catch (error) {
    if (error instanceof CommanderError) {
      // commander has already printed the message (or the help/version text).
      return error.exitCode === 0 ? 0 : EXIT_USAGE;
    }
    const { name, message } = error as Error;
    process.stderr.write(`abx: ${name}: ${message}\n`);
    return 1;
  }
}
