import { resolve } from 'node:path';
import type { Command } from 'commander';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';

interface DiffOptions {
  stat?: boolean;
  nameOnly?: boolean;
  patch?: boolean;
  json?: boolean;
}

/** `abx diff ID`: the workspace's changes as a git patch, its stat, or its names. */
async function diff(id: string, options: DiffOptions): Promise<void> {
  // Loaded here: `abx diff` alone needs the SDK.
  const { getWorkspaceDiffReport, openControl } = await import('../sandbox/sandbox-api.js');
  const { client } = await openControl();
  const answer = await getWorkspaceDiffReport(client, id);
  if (options.json) return printJson(answer);
  // As git: each part asked for, in this order; the patch alone when none is.
  if (options.nameOnly) {
    for (const name of answer.names) printLine(name);
  }
  if (options.stat) {
    let added = 0;
    let deleted = 0;
    for (const entry of answer.stat) {
      const name = entry.from ? `${entry.from} => ${entry.path}` : entry.path;
      const counts = entry.binary ? 'Bin' : `+${entry.added} -${entry.deleted}`;
      printLine(` ${name} | ${counts}`);
      added += entry.added;
      deleted += entry.deleted;
    }
    printLine(
      ` ${answer.stat.length} file${answer.stat.length === 1 ? '' : 's'} changed, ${added} insertion${added === 1 ? '' : 's'}(+), ${deleted} deletion${deleted === 1 ? '' : 's'}(-)`,
    );
  }
  if (options.patch || (!options.nameOnly && !options.stat)) {
    if ((options.nameOnly || options.stat) && answer.patch !== '') printLine('');
    process.stdout.write(answer.patch);
  }
  // What a patch cannot carry is said on stderr, so the patch on stdout stays whole.
  for (const left of answer.omitted) {
    process.stderr.write(`abx: not in the patch: ${left.path} (${left.reason})\n`);
  }
}

interface ApplyOptions {
  dryRun?: boolean;
  force?: boolean;
  json?: boolean;
  local?: string;
}

/** `abx apply ID [PATHS…]`: writes the workspace's changes into the host folder. */
async function apply(id: string, paths: string[], options: ApplyOptions): Promise<void> {
  const request = {
    ...(paths.length > 0 ? { paths } : {}),
    ...(options.dryRun ? { dryRun: true } : {}),
    ...(options.force ? { force: true } : {}),
  };
  let result: Awaited<ReturnType<typeof import('../sandbox/sandbox-api.js').applyWorkspace>>;
  if (options.local !== undefined) {
    // An uploaded workspace: written here, into the folder it came from.
    const { Sandbox } = await import('../sandbox/sandbox.js');
    const box = await Sandbox.connect(id);
    result = await box.workspace.applyLocal({ dir: resolve(options.local), ...request });
  } else {
    const { applyWorkspace, openControl } = await import('../sandbox/sandbox-api.js');
    const { client } = await openControl();
    result = await applyWorkspace(client, id, request);
  }
  if (options.json) return printJson(result);
  const verb = result.dryRun ? 'would apply' : 'applied';
  for (const change of result.applied) {
    printLine(`${verb} ${change.status} ${change.from ? `${change.from} → ` : ''}${change.path}`);
  }
  for (const forced of result.forced) {
    printLine(`forced over a host change: ${forced.path} (${forced.reason})`);
  }
  printLine(
    `${result.applied.length} change${result.applied.length === 1 ? '' : 's'} ${verb}${result.dryRun ? ' (dry run: nothing written)' : ''}`,
  );
}

/** `abx diff` and `abx apply`: review a sandbox's workspace and write it back (docs/workspaces.md). */
export function addWorkspaceCommands(program: Command): void {
  withExamples(
    program
      .command('diff')
      .description(
        "Show what changed in a sandbox's workspace (abx create --workspace) against its host folder: a git patch, or --stat / --name-only (with --patch: both).",
      )
      .argument('<id>', 'the sandbox')
      .option('--stat', 'one line per changed file, with lines added and removed')
      .option('--name-only', 'the changed paths only')
      .option('--patch', 'the patch too, after --stat or --name-only (alone: the default)')
      .option('--json', 'the patch, stat, names and what the patch cannot carry, as JSON')
      .action(diff),
    'abx diff i1a2b3c4d5e6f7g8 > agent.patch && git apply --check agent.patch',
    'abx diff --stat i1a2b3c4d5e6f7g8',
  );
  withExamples(
    program
      .command('apply')
      .description(
        "Write a sandbox's workspace changes into its host folder, each file atomically, as the folder's owner; host files changed since the sandbox started are refused unless --force.",
      )
      .argument('<id>', 'the sandbox')
      .argument('[paths...]', 'only these changes (a path, or a folder such as src/)')
      .option('--dry-run', 'check everything, write nothing')
      .option('--force', 'write over host edits made since the sandbox started')
      .option(
        '--local <dir>',
        'a workspace uploaded with abx create --upload: write the changes into this folder here',
      )
      .option('--json', 'print what was applied as JSON')
      .action(apply),
    'abx apply --dry-run i1a2b3c4d5e6f7g8',
    'abx apply i1a2b3c4d5e6f7g8 src/ README.md',
    'abx apply i1a2b3c4d5e6f7g8 --local .',
  );
}
