import type { Command } from 'commander';
import { Sandbox } from '../sandbox/sandbox.js';
import { Terminal } from '../sandbox/terminal.js';
import { ExitCode } from './errors.js';
import { collectPairs, withExamples } from './options.js';

interface ShellOptions {
  command?: string;
  cwd?: string;
  env?: Record<string, string>;
}

/**
 * Keystrokes typed while a write is in flight are sent together with the next one: each write is
 * a request, and one per key would fall behind a fast typist (or a paste).
 */
function keystrokeSender(terminal: Terminal) {
  let pending = '';
  let sending: Promise<void> | undefined;
  const flush = async () => {
    while (pending) {
      const data = pending;
      pending = '';
      await terminal.write(data);
    }
    sending = undefined;
  };
  return (data: string) => {
    pending += data;
    sending ??= flush();
    return sending;
  };
}

async function shell(id: string, options: ShellOptions): Promise<void> {
  const sandbox = await Sandbox.connect(id);
  const { stdin, stdout } = process;
  const terminal = await Terminal.open(sandbox, {
    cols: stdout.columns || 80,
    rows: stdout.rows || 24,
    ...(options.command ? { command: options.command } : {}),
    ...(options.cwd ? { cwd: options.cwd } : {}),
    envs: { ...options.env },
  });
  const send = keystrokeSender(terminal);
  // Raw mode hands every key (Ctrl-C, arrows, tab) to the sandbox's shell instead of acting here.
  if (stdin.isTTY) stdin.setRawMode(true);
  stdin.setEncoding('utf8');
  const onInput = (data: string) => void send(data).catch(() => undefined);
  const onResize = () =>
    void terminal.resize(stdout.columns || 80, stdout.rows || 24).catch(() => undefined);
  // Piped input that runs out ends the session as Ctrl-D at the prompt would. A Ctrl-D that
  // reaches the pty before the shell has set up its line editor can be swallowed by the switch of
  // terminal modes, so it is repeated until the session ends.
  let endOfInput: NodeJS.Timeout | undefined;
  const onEnd = () => {
    const eof = () => void send('\u0004').catch(() => undefined);
    eof();
    endOfInput = setInterval(eof, 500);
  };
  stdin.on('data', onInput);
  stdin.once('end', onEnd);
  stdout.on('resize', onResize);
  try {
    for await (const chunk of terminal.output()) stdout.write(chunk);
  } finally {
    clearInterval(endOfInput);
    stdin.off('data', onInput);
    stdin.off('end', onEnd);
    stdout.off('resize', onResize);
    if (stdin.isTTY) stdin.setRawMode(false);
    stdin.pause();
    await terminal.close();
  }
  // Like ssh: abx shell ends with the code of the shell it ran.
  if (terminal.exitCode) throw new ExitCode(terminal.exitCode);
}

/** `abx shell ID`. */
export function addShellCommand(program: Command): void {
  withExamples(
    program
      .command('shell')
      .description('Open an interactive shell in a sandbox (a real pty; exit or Ctrl-D leaves).')
      .argument('<id>', 'the sandbox')
      .option('-c, --command <cmd>', 'what to run in the pty instead of bash', 'bash -i')
      .option('--cwd <dir>', "working directory (default: the template's workdir)")
      .option(
        '-e, --env <KEY=VALUE>',
        'environment variable of the session (repeatable)',
        collectPairs,
      )
      .action(shell),
    'abx shell i1a2b3c4d5e6f7g8',
    'abx shell i1a2b3c4d5e6f7g8 --command top',
  );
}
