import type { Command } from 'commander';
import type { BuildProgress } from '../../runtime/protocol/wire.js';
import { Templates } from '../sandbox/templates.js';
import { withSpinner } from './feedback.js';
import { withExamples } from './options.js';
import { formatSpan, plural, printJson, printLine, printTable } from './output.js';
import { type OutputStream, paint } from './style.js';

/** One line per build step on a terminal (stderr); nothing in a pipe, where it would be noise. */
function printProgress(event: BuildProgress, stream: OutputStream = process.stderr): void {
  if (stream.isTTY !== true) return;
  const where =
    event.phase === 'step' ? `[${(event.step ?? 0) + 1}/${event.of ?? '?'}]` : `[${event.phase}]`;
  stream.write(`\r\u001b[2K${paint('dim', where, stream)} ${event.text}\n`);
}

/** `abx template build|list|rm`. */
export function addTemplateCommand(program: Command): void {
  const template = withExamples(
    program
      .command('template')
      .description('Build, list and remove sandbox templates (template.yaml).'),
    'abx template build samples/template.yaml',
  );

  withExamples(
    template
      .command('build <path>')
      .description(
        'Build a template: run its setup steps once; new sandboxes start from the result.',
      )
      .option('--json', 'print the built template as JSON')
      .action(async (path: string, options: { json?: boolean }) => {
        const built = await withSpinner(`building ${path}`, () =>
          Templates.build(path, { onProgress: (event) => printProgress(event) }),
        );
        if (options.json) return printJson(built);
        printLine(
          `built template '${built.name}' (${plural(built.setup.length, 'setup step')}, capabilities: ${built.capabilities.join(', ')})`,
        );
      }),
    'abx template build samples/template.yaml --json',
  );

  withExamples(
    template
      .command('list')
      .alias('ls')
      .description('List built templates (base is always there).')
      .option('--json', 'print JSON')
      .action(async (options: { json?: boolean }) => {
        const templates = await Templates.list();
        if (options.json) return printJson(templates);
        printTable(
          ['NAME', 'CAPABILITIES', 'NETWORK', 'TIMEOUT', 'BUILT'],
          templates.map((t) => [
            t.name,
            t.capabilities.join(','),
            t.network,
            formatSpan(t.timeoutMs),
            t.builtAt ?? 'built in',
          ]),
        );
      }),
    'abx template list --json',
  );

  withExamples(
    template
      .command('rm <name>')
      .description('Remove a built template.')
      .action(async (name: string) => {
        await Templates.remove(name);
        printLine(`removed template '${name}'`);
      }),
    'abx template rm data-tools',
  );
}
