import { type Command, Option } from 'commander';
import type { CustomCommand } from '../commands/custom-command.js';
import { describeCommand, formatCommandTable } from '../commands/discovery.js';
import { toJSONSchema } from '../commands/json-schema.js';
import { Sandbox } from '../sandbox/sandbox.js';
import { localCommands, sandboxCommands } from './custom-commands.js';
import { UsageError } from './errors.js';
import { collect, withExamples } from './options.js';
import { printJson, printLine } from './output.js';

interface CommandsOptions {
  template?: string;
  module?: string[];
  json?: boolean;
  schema?: boolean;
}

async function commandsOf(
  id: string | undefined,
  options: CommandsOptions,
): Promise<CustomCommand[]> {
  if (id && options.template) {
    throw new UsageError('give a sandbox id or --template, not both', 'abx commands --help');
  }
  if (id) {
    if (options.module)
      throw new UsageError('--module goes with --template', 'abx commands --help');
    return sandboxCommands(await Sandbox.connect(id));
  }
  if (options.template) return localCommands(options.template, options.module);
  throw new UsageError('give a sandbox id or --template', 'abx commands --help');
}

async function commands(id: string | undefined, options: CommandsOptions): Promise<void> {
  const found = await commandsOf(id, options);
  if (options.schema) {
    printJson(Object.fromEntries(found.map((c) => [c.name, toJSONSchema(c)])));
  } else if (options.json) {
    printJson({ commands: found.map(describeCommand) });
  } else {
    printLine(formatCommandTable(found));
  }
}

/** `abx commands ID|--template T`. */
export function addCommandsCommand(program: Command): void {
  withExamples(
    program
      .command('commands')
      .alias('list-commands')
      .description(
        'List custom commands (YAML and decorated) with their arguments: of a running sandbox, or of a template on this machine.',
      )
      .argument('[id]', "a sandbox: its template's commands and its command server's")
      .option('-t, --template <path|name>', 'a template.yaml to load, or a template name')
      .option(
        '-m, --module <file>',
        'with --template: a compiled JS module whose @sandbox classes to include (repeatable)',
        collect,
      )
      .addOption(new Option('--json', 'print the discovery document').conflicts('schema'))
      .option('--schema', 'print the JSON Schema of each command, by name')
      .action(commands),
    'abx commands --template samples/template.yaml --module samples/build/data-tools.js --json',
    'abx commands i1a2b3c4d5e6f7g8 --schema',
  );
}
