import type { Command } from 'commander';
import type { BuildProgress } from '../../runtime/protocol/wire.js';
import { Templates } from '../sandbox/templates.js';
import { withSpinner } from './feedback.js';
import { withExamples } from './options.js';
import { formatSpan, plural, printJson, printLine, printTable } from './output.js';
import { type OutputStream, paint } from './style.js';

/**
 * One line per build step on stderr: on a terminal (over the spinner), or anywhere with
 * `--progress` (a CI log); nothing in a pipe otherwise, where it would be noise.
 */
function printProgress(
  event: BuildProgress,
  always: boolean,
  stream: OutputStream = process.stderr,
): void {
  const terminal = stream.isTTY === true;
  if (!terminal && !always) return;
  const where =
    event.phase === 'step'
      ? `[${(event.step ?? 0) + 1}/${event.of ?? '?'}]`
      : event.phase === 'output'
        ? '  │'
        : `[${event.phase}]`;
  stream.write(`${terminal ? '\r\u001b[2K' : ''}${paint('dim', where, stream)} ${event.text}\n`);
}

/** `abx template build|list|rm`. */
export function addTemplateCommand(program: Command): void {
  const template = withExamples(
    program
      .command('template')
      .description(
        "Build, list, remove and publish sandbox templates (template.yaml). An admin key's builds are the shared catalogue; another key's builds and every snapshot are that key's own until an admin publishes them.",
      ),
    'abx template build samples/template.yaml',
  );

  withExamples(
    template
      .command('build <path>')
      .description(
        "Build a template: run its setup steps once; new sandboxes start from the result. Built with an admin key it is shared by every key; with another key it is that key's own (rebuild only your own).",
      )
      .option('--json', 'print the built template as JSON')
      .option(
        '--progress',
        'print a line per step on stderr even when it is not a terminal (CI logs, scripts)',
      )
      .action(async (path: string, options: { json?: boolean; progress?: boolean }) => {
        const built = await withSpinner(`building ${path}`, () =>
          Templates.build(path, {
            onProgress: (event) => printProgress(event, options.progress === true),
          }),
        );
        if (options.json) return printJson(built);
        printLine(
          `built template '${built.name}' (${plural(built.setup.length, 'setup step')}, capabilities: ${built.capabilities.join(', ')})`,
        );
      }),
    'abx template build samples/template.yaml --json',
    'abx template build template.yaml --progress 2>build.log',
  );

  withExamples(
    template
      .command('list')
      .alias('ls')
      .description(
        "List the templates this key may use: base, the shared catalogue and the key's own (an admin key: every template). SHARED says which.",
      )
      .option('--json', 'print JSON')
      .action(async (options: { json?: boolean }) => {
        const templates = await Templates.list();
        if (options.json) return printJson(templates);
        printTable(
          ['NAME', 'SHARED', 'CAPABILITIES', 'NETWORK', 'TIMEOUT', 'BUILT'],
          templates.map((t) => [
            t.name,
            t.shared ? 'yes' : t.owner ? `no (${t.owner})` : 'no',
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
      .description(
        'Remove a built template: your own; one in the shared catalogue needs an admin key.',
      )
      .action(async (name: string) => {
        await Templates.remove(name);
        printLine(`removed template '${name}'`);
      }),
    'abx template rm data-tools',
  );

  withExamples(
    template
      .command('publish <name>')
      .description(
        "Share a template (a key's own build, a snapshot) with every key: it joins the catalogue that every key lists and creates sandboxes from. --unpublish takes it back out (its owner and admins only). Needs an admin key.",
      )
      .option('--unpublish', 'take it out of the shared catalogue instead')
      .option('--json', 'print the template as JSON')
      .action(async (name: string, options: { unpublish?: boolean; json?: boolean }) => {
        const published = await Templates.publish(name, { shared: options.unpublish !== true });
        if (options.json) return printJson(published);
        printLine(
          published.shared
            ? `template '${name}' is shared: every key lists it and creates sandboxes from it`
            : `template '${name}' is no longer shared: only its owner${published.owner ? ` (${published.owner})` : ''} and admin keys see it`,
        );
      }),
    'abx template publish prepared',
    'abx template publish prepared --unpublish',
  );
}
