import { randomBytes } from 'node:crypto';
import { StringDecoder } from 'node:string_decoder';
import type { StreamName } from '../../protocol/wire.js';
import { killGroup } from '../../server/child-process.js';
import { type Execution, Interpreter } from './interpreter.js';

/**
 * What the shell runs first: each cell is `eval`ed inside a function, so an interrupt's trap can
 * `return` out of it (a non-interactive shell would otherwise exit on SIGINT) while variables and
 * the working directory, which a function shares with its shell, persist.
 */
export const SHELL_PRELUDE = `__abx_cell() { eval "$1"; }
`;
/** Set again before each cell: after one interrupt bash no longer runs it (seen with bash 5.2). */
const TRAP = `trap 'return 130 2>/dev/null || :' INT\n`;

/** `text` as one single-quoted shell word. */
const quote = (text: string) => `'${text.replaceAll("'", `'\\''`)}'`;

/** How much of `text`'s end could be the start of `mark` (held back until more arrives). */
function partialTail(text: string, mark: string): number {
  for (let n = Math.min(mark.length - 1, text.length); n > 0; n--) {
    if (mark.startsWith(text.slice(-n))) return n;
  }
  return 0;
}

/**
 * A long-lived bash (or sh) process. A cell is written to its stdin followed by commands that
 * print an end mark with the cell's status on stdout and on stderr; output is streamed until
 * both marks are seen, so nothing of either stream is left over for the next cell. A non-zero
 * status is reported as an `error` event named `ExitStatus`. No results.
 */
export class ShellInterpreter extends Interpreter {
  private mark = '';
  private readonly pending: Record<StreamName, string> = { stdout: '', stderr: '' };
  private readonly seen: Record<StreamName, boolean> = { stdout: false, stderr: false };
  private status = 0;

  override start(): void {
    for (const name of ['stdout', 'stderr'] as const) {
      // Decoded here: the process table's logs read the same streams as Buffers.
      const decoder = new StringDecoder('utf8');
      this.entry.child[name]?.on('data', (chunk: Buffer) =>
        this.output(name, decoder.write(chunk)),
      );
    }
    this.entry.child.stdin?.write(SHELL_PRELUDE);
  }

  protected override send(execution: Execution, count: number): void {
    this.mark = `__ABX_END_${randomBytes(8).toString('hex')}_${count}__`;
    this.seen.stdout = false;
    this.seen.stderr = false;
    const exports = Object.entries(execution.env)
      .map(([name, value]) => `export ${name}=${quote(value)}\n`)
      .join('');
    this.entry.child.stdin?.write(
      `${exports}${TRAP}__abx_cell ${quote(execution.code)} </dev/null\n` +
        `__abx_s=$?; printf '%s %s\\n' '${this.mark}' "$__abx_s"; printf '%s\\n' '${this.mark}' >&2\n`,
    );
  }

  /** A foreground program of the cell gets the interrupt too. */
  protected override interrupt(): void {
    killGroup(this.entry.child, 'SIGINT');
  }

  private output(name: StreamName, text: string): void {
    const running = this.running;
    if (!running || this.seen[name]) return;
    let data = this.pending[name] + text;
    const at = this.mark ? data.indexOf(this.mark) : -1;
    if (at < 0) {
      const hold = partialTail(data, this.mark);
      this.pending[name] = data.slice(data.length - hold);
      data = data.slice(0, data.length - hold);
      if (data) running.events.push({ type: name, text: data });
      return;
    }
    const rest = data.slice(at + this.mark.length);
    const end = rest.indexOf('\n');
    if (end < 0) {
      // The status after the mark has not all arrived yet.
      this.pending[name] = data;
      return;
    }
    if (at > 0) running.events.push({ type: name, text: data.slice(0, at) });
    if (name === 'stdout') this.status = Number(rest.slice(0, end).trim());
    this.pending[name] = '';
    this.seen[name] = true;
    if (!this.seen.stdout || !this.seen.stderr) return;
    if (this.status !== 0) {
      const value = `exit status ${this.status}`;
      running.events.push(
        this.error(running, { type: 'error', name: 'ExitStatus', value, traceback: '' }),
      );
    }
    running.finish();
  }
}
