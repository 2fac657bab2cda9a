import { type Command, InvalidArgumentError } from 'commander';
import type { SandboxLogLine } from '../sandbox/sandbox-logs.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';
import { paint } from './style.js';

const LEVEL_COLOURS = { debug: 'dim', info: 'cyan', warn: 'yellow', error: 'red' } as const;

/** A line as `abx logs` prints it: time, level, message, then its fields as key=value. */
function logText(line: SandboxLogLine): string {
  const fields = Object.entries(line.fields).map(([key, value]) => `${key}=${value}`);
  const level = paint(LEVEL_COLOURS[line.level] ?? 'dim', line.level.toUpperCase().padEnd(5));
  return [line.timestamp, level, line.message, ...fields].join(' ');
}

function lineCount(text: string): number {
  const count = Number(text);
  if (!/^\d+$/.test(text) || count < 1 || count > 10_000) {
    throw new InvalidArgumentError(`give a whole number of lines from 1 to 10000, not '${text}'`);
  }
  return count;
}

async function logs(
  id: string,
  options: { follow?: boolean; lines?: number; json?: boolean },
): Promise<void> {
  // Loaded here: `abx logs` alone needs the SDK.
  const { openControl } = await import('../sandbox/sandbox-api.js');
  const { followSandboxLogs, readSandboxLogs } = await import('../sandbox/sandbox-logs.js');
  const { connection, client } = await openControl();
  const print = (line: SandboxLogLine) =>
    options.json ? printLine(JSON.stringify(line)) : printLine(logText(line));
  // The newest N, printed oldest first.
  const kept = (
    await readSandboxLogs(client, id, {
      direction: 'backward',
      ...(options.lines === undefined ? {} : { limit: options.lines }),
    })
  ).reverse();
  if (!options.follow) {
    if (options.json) return printJson(kept);
    for (const line of kept) print(line);
    return;
  }
  for (const line of kept) print(line);
  const last = kept.at(-1);
  const after = last ? Date.parse(last.timestamp) : 0;
  // The stream repeats the kept lines from `after` on: those up to the last printed are skipped.
  let skipping = last !== undefined;
  for await (const line of followSandboxLogs(connection, id, { start: after })) {
    if (skipping && Date.parse(line.timestamp) <= after) {
      if (JSON.stringify(line) === JSON.stringify(last)) skipping = false;
      continue;
    }
    skipping = false;
    print(line);
  }
}

/** `abx logs ID`: a sandbox's log, running or ended. */
export function addLogsCommand(program: Command): void {
  withExamples(
    program
      .command('logs')
      .description(
        "Show a sandbox's log, running or ended: envd's own lines and the processes it starts and ends, each with its time and level (the newest 10000 lines and 1 MiB are kept, as long as the sandbox's record).",
      )
      .argument('<id>', 'the sandbox')
      .option('-n, --lines <count>', 'only the newest lines (1 to 10000)', lineCount)
      .option('-f, --follow', 'then print each new line as it comes, until the sandbox ends')
      .option('--json', 'print the lines as JSON (with --follow: a JSON line each)')
      .action(logs),
    'abx logs i1a2b3c4d5e6f7g8 -n 50',
    'abx logs i1a2b3c4d5e6f7g8 --follow',
  );
}
