import type { Command } from 'commander';
import { Templates } from '../sandbox/templates.js';

/** `abx template build|list|rm`. */
export function addTemplateCommand(program: Command): void {
  const template = program
    .command('template')
    .description('Build, list and remove sandbox templates (template.yaml).')
    .addHelpText('after', '\nExample:\n  abx template build samples/template.yaml');

  template
    .command('build <path>')
    .description('Build a template: run its setup steps once; new sandboxes start from the result.')
    .option('--json', 'print the built template as JSON')
    .action(async (path: string, options: { json?: boolean }) => {
      const built = await Templates.build(path);
      process.stdout.write(
        options.json
          ? `${JSON.stringify(built, null, 2)}\n`
          : `built template '${built.name}' (${built.setup.length} setup step${built.setup.length === 1 ? '' : 's'}, capabilities: ${built.capabilities.join(', ')})\n`,
      );
    });

  template
    .command('list')
    .alias('ls')
    .description('List built templates (base is always there).')
    .option('--json', 'print JSON')
    .action(async (options: { json?: boolean }) => {
      const templates = await Templates.list();
      if (options.json) {
        process.stdout.write(`${JSON.stringify(templates, null, 2)}\n`);
        return;
      }
      const rows = [
        ['NAME', 'CAPABILITIES', 'NETWORK', 'TIMEOUT', 'BUILT'],
        ...templates.map((t) => [
          t.name,
          t.capabilities.join(','),
          t.network,
          `${Math.round(t.timeoutMs / 1000)}s`,
          t.builtAt ?? 'built in',
        ]),
      ];
      const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => r[i]?.length ?? 0))) ?? [];
      for (const row of rows) {
        process.stdout.write(
          `${row
            .map((cell, i) => cell.padEnd(widths[i] ?? 0))
            .join('  ')
            .trimEnd()}\n`,
        );
      }
    });

  template
    .command('rm <name>')
    .description('Remove a built template.')
    .action(async (name: string) => {
      await Templates.remove(name);
      process.stdout.write(`removed template '${name}'\n`);
    });
}
