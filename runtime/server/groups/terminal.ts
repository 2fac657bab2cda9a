import { readFile, readlink } from 'node:fs/promises';
import { posixShell, runToCompletion } from '../child-process.js';
import { BadRequestError, toolUnavailable } from '../errors.js';
import { safePath } from '../file-system.js';
import { processInfo } from '../process-table.js';
import { defineGroup } from '../route-group.js';
import { argList, envOf } from '../validate.js';
import { which } from '../which.js';
import { outputFrom } from './process.js';

/** Longest a read may wait for new output, so a request cannot be parked forever. */
const MAX_WAIT_MS = 30_000;

/**
 * The pty of a terminal, found through the child of `script` (the shell): resizing needs the
 * slave side, and `script` only knows the master.
 */
async function ptyOf(pid: number | undefined): Promise<string> {
  const children = await readFile(`/proc/${pid}/task/${pid}/children`, 'utf8').catch(() => '');
  const shell = children.trim().split(' ')[0];
  const tty = shell ? await readlink(`/proc/${shell}/fd/0`).catch(() => '') : '';
  if (!tty.startsWith('/dev/pts/')) throw new BadRequestError('the terminal has exited');
  return tty;
}

async function setSize(pid: number | undefined, cols: number, rows: number): Promise<void> {
  if (cols < 1 || rows < 1 || cols > 1000 || rows > 1000) {
    throw new BadRequestError('cols and rows must be between 1 and 1000');
  }
  const tty = await ptyOf(pid);
  // Setting the size on the slave makes the kernel send SIGWINCH to the shell's foreground job.
  const result = await runToCompletion(
    'stty',
    ['-F', tty, 'cols', String(cols), 'rows', String(rows)],
    {
      timeoutMs: 5000,
      what: 'stty',
    },
  );
  if (result.exit_code !== 0) throw new BadRequestError(`cannot resize: ${result.stderr.trim()}`);
}

/**
 * Interactive sessions over a pty without a native addon: util-linux `script -qefc` allocates the
 * pty and runs the command in it; the server talks to `script` over pipes.
 */
export const TERMINAL = defineGroup('TERMINAL', '/terminal', 'interactive pty sessions', [
  {
    method: 'POST',
    path: '/terminal',
    summary:
      'Opens a pty session running `command` (default an interactive bash) at `cols`×`rows`.',
    args: argList({
      'command?': ['str', 'bash -i'],
      'cols?': ['int', 80],
      'rows?': ['int', 24],
      'cwd?': ['str', '.'],
      'env?': 'env',
    }),
    handler: async ({ args, ctx }) => {
      const script = await which('script');
      if (!script) throw toolUnavailable('script (util-linux)', 'a terminal');
      const [cols, rows] = [args.cols as number, args.rows as number];
      if (cols < 1 || rows < 1) throw new BadRequestError('cols and rows must be positive');
      // The command travels in the environment, so it is never spliced into a shell line.
      const entry = await ctx.terminals.start(
        script,
        ['-qefc', `stty cols ${cols} rows ${rows}; eval "$ABX_TERMINAL_COMMAND"`, '/dev/null'],
        {
          command: args.command as string,
          cwd: safePath(args.cwd as string, 'cwd'),
          env: {
            TERM: 'xterm-256color',
            // script runs its command with $SHELL: the runtime's where the image has no /bin/sh.
            ...(posixShell() === '/bin/sh' ? {} : { SHELL: posixShell() }),
            ...envOf(args.env),
            ABX_TERMINAL_COMMAND: args.command as string,
          },
        },
      );
      return processInfo(entry);
    },
  },
  {
    method: 'POST',
    path: '/terminal/{id}/write',
    summary: 'Types `data` into the terminal (include "\\n" to submit a line).',
    args: argList({ data: 'str' }),
    handler: ({ ctx, params, args }) => {
      ctx.terminals.write(params.id ?? '', args.data as string);
      return { written: Buffer.byteLength(args.data as string) };
    },
  },
  {
    method: 'POST',
    path: '/terminal/{id}/resize',
    summary: 'Changes the pty size; the program in it gets SIGWINCH.',
    args: argList({ cols: 'int', rows: 'int' }),
    handler: async ({ ctx, params, args }) => {
      const entry = ctx.terminals.get(params.id ?? '');
      await setSize(entry.child.pid, args.cols as number, args.rows as number);
      return { cols: args.cols, rows: args.rows };
    },
  },
  {
    method: 'GET',
    path: '/terminal/{id}/read',
    summary:
      'Screen output from byte `offset` (and `exit_code` once the shell ended); `wait_ms` waits (≤ 30 s) for output past it.',
    args: argList({ 'offset?': ['int', 0], 'wait_ms?': ['int', 0] }),
    handler: async ({ ctx, params, args, closed }) => {
      const entry = ctx.terminals.get(params.id ?? '');
      const { output } = entry;
      const offset = args.offset as number;
      if (offset < 0) throw new BadRequestError('offset must not be negative');
      await output.waitPast(
        offset,
        Math.min(Math.max(0, args.wait_ms as number), MAX_WAIT_MS),
        closed,
      );
      // Once the shell has ended, its exit code (abx shell exits with it).
      return { ...outputFrom(output, offset), exit_code: entry.exitCode };
    },
  },
  {
    method: 'DELETE',
    path: '/terminal/{id}',
    summary: 'Closes the session, killing everything running in it.',
    handler: ({ ctx, params }) => {
      ctx.terminals.remove(params.id ?? '');
      return { id: params.id, closed: true };
    },
  },
]);
