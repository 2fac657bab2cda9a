import type { Command } from 'commander';
import { Sandbox } from '../sandbox/sandbox.js';
import { formatBytes } from './feedback.js';
import { withExamples } from './options.js';
import { printJson, printTable } from './output.js';

async function list(id: string, path: string, options: { json?: boolean }): Promise<void> {
  const sandbox = await Sandbox.connect(id);
  const entries = await sandbox.files.list(path);
  if (options.json) return printJson(entries);
  printTable(
    ['MODE', 'SIZE', 'MODIFIED', 'NAME'],
    entries.map((e) => [
      e.mode,
      e.type === 'directory' ? '-' : formatBytes(e.size),
      e.mtime.replace(/\.\d+Z$/, 'Z'),
      e.type === 'directory' ? { text: `${e.name}/`, colour: 'cyan' } : e.name,
    ]),
  );
}

async function cat(id: string, paths: string[]): Promise<void> {
  const sandbox = await Sandbox.connect(id);
  // Streamed as bytes: binary files and files larger than memory come out intact.
  for (const path of paths) {
    for await (const chunk of await sandbox.files.read(path, { format: 'stream' })) {
      if (!process.stdout.write(chunk)) await new Promise((r) => process.stdout.once('drain', r));
    }
  }
}

/** `abx ls` and `abx cat`: look at a sandbox's files. */
export function addFileCommands(program: Command): void {
  withExamples(
    program
      .command('ls')
      .description("List a directory in a sandbox (default: the template's workdir).")
      .argument('<id>', 'the sandbox')
      .argument('[path]', 'a directory, absolute or relative to the workdir', '.')
      .option('--json', 'print the entries as JSON')
      .action(list),
    'abx ls i1a2b3c4d5e6f7g8 /home/user --json',
  );

  withExamples(
    program
      .command('cat')
      .description('Print files of a sandbox to stdout.')
      .argument('<id>', 'the sandbox')
      .argument('<paths...>', 'files, absolute or relative to the workdir')
      .action(cat),
    'abx cat i1a2b3c4d5e6f7g8 /etc/os-release',
  );
}
