import type { Command } from 'commander';
import { CommandTimeoutError } from '../errors.js';
import { Sandbox } from '../sandbox/sandbox.js';
import { ExitCode } from './errors.js';
import { collectPairs, durationArg, sandboxUserArg, withExamples } from './options.js';
import { formatSpan, onBrokenPipe } from './output.js';

/** Exit code of a command stopped by `--timeout`, as timeout(1) gives. */
const TIMEOUT_EXIT = 124;

interface ExecOptions {
  cwd?: string;
  env?: Record<string, string>;
  timeout?: number;
  stdin?: boolean;
  user?: string;
}

/** Quotes one word for `sh`, so a value passed as an argument never becomes shell syntax. */
export function shellQuote(word: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}

/**
 * The shell line for `exec`'s words: one word is a command line of its own (so `'ls | wc -l'`
 * works), several are an argv whose words are quoted, so they arrive in the sandbox as given.
 */
export function commandLine(words: readonly string[]): string {
  return words.length === 1 ? (words[0] ?? '') : words.map(shellQuote).join(' ');
}

/** Sends this process's stdin to the command, in order, then closes the command's stdin. */
async function forwardStdin(send: (data: string) => Promise<void>, close: () => Promise<void>) {
  process.stdin.setEncoding('utf8');
  for await (const chunk of process.stdin) await send(chunk as string);
  await close();
}

async function exec(id: string, words: string[], options: ExecOptions): Promise<void> {
  const sandbox = await Sandbox.connect(id);
  const commands = options.user === 'root' ? sandbox.root.commands : sandbox.commands;
  const handle = await commands.start(commandLine(words), {
    ...(options.cwd ? { cwd: options.cwd } : {}),
    ...(options.env ? { envs: options.env } : {}),
    // A person at the CLI decides how long a command may take: no limit unless asked.
    timeoutMs: options.timeout ?? 0,
    stdin: options.stdin ?? false,
    allowNonZeroExit: true,
    onStdout: (data) => process.stdout.write(data),
    onStderr: (data) => process.stderr.write(data),
  });
  // A reader of our stdout that goes away ends the command as it would end a local one.
  onBrokenPipe(() => void handle.kill('SIGPIPE').catch(() => false));
  // Ctrl-C (or a kill of abx) reaches the command's whole process group, as it would locally.
  const relay = (signal: NodeJS.Signals) => void handle.kill(signal).catch(() => false);
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, relay);
  if (options.stdin) {
    forwardStdin(handle.sendStdin.bind(handle), handle.closeStdin.bind(handle)).catch(() => {
      // the command exited before reading all of it: nothing left to feed
    });
  }
  try {
    const { exitCode } = await handle.wait();
    if (exitCode !== 0) throw new ExitCode(exitCode);
  } catch (error) {
    if (!(error instanceof CommandTimeoutError)) throw error;
    // Its output has been printed as it came; what is left to say is why it stopped. Exit 124,
    // as timeout(1) does.
    process.stderr.write(
      `abx: the command ran past --timeout ${formatSpan(options.timeout ?? 0)} and was stopped (its process group was killed); give it longer with --timeout, e.g. --timeout 10m\n`,
    );
    throw new ExitCode(TIMEOUT_EXIT);
  } finally {
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.off(signal, relay);
    // An unfinished read of stdin would keep abx alive after the command is done.
    if (options.stdin) process.stdin.destroy();
  }
}

/** `abx exec ID -- CMD ARGS...`. */
export function addExecCommand(program: Command): void {
  withExamples(
    program
      .command('exec')
      .description(
        "Run a command in a sandbox, streaming its output live; abx exits with the command's code.",
      )
      .argument('<id>', 'the sandbox')
      .argument(
        '<command...>',
        'one word: a shell command line; several: a program and its arguments (quoted for you)',
      )
      .option('--cwd <dir>', "working directory (default: the template's workdir)")
      .option(
        '-e, --env <KEY=VALUE>',
        'environment variable of the command (repeatable)',
        collectPairs,
      )
      .option(
        '--timeout <duration>',
        'kill the command after this long (default: no limit)',
        durationArg,
      )
      .option('-i, --stdin', "send abx's stdin to the command")
      .option(
        '-u, --user <user>',
        "run as root (a sandbox whose template has allow_root: true) or as the sandbox's user (the default)",
        sandboxUserArg,
      )
      .action(exec),
    'abx exec i1a2b3c4d5e6f7g8 -- python3 -c "print(6 * 7)"',
    "abx exec i1a2b3c4d5e6f7g8 -- 'ls -l | wc -l'",
    'echo hello | abx exec -i i1a2b3c4d5e6f7g8 -- cat',
    'abx exec --user root i1a2b3c4d5e6f7g8 -- apt-get install -y jq',
  );
}
