import { StringDecoder } from 'node:string_decoder';
import type { StreamName } from '../../protocol/wire.js';
import { killGroup } from '../../server/child-process.js';
import { randomBytes } from '../../server/file-tools/random.js';
import { type Execution, Interpreter } from './interpreter.js';

/**
 * How a bash context's shell is started: interactive (`-i`), so an interrupt aborts the command
 * line that runs (a builtin loop too) and the shell reads the next one, as at a terminal; without
 * line editing, job control, history or startup files.
 */
export const BASH_ARGS = [
  '--norc',
  '--noprofile',
  '--noediting',
  '+o',
  'history',
  '+H',
  '+m',
  '-i',
];

/**
 * What the interactive bash runs first. Its own stderr goes to /dev/null (it writes a newline
 * there on an interrupt, and its prompts); cells write to fds 18 and 19, copies of the pipes.
 * After each command line bash runs PROMPT_COMMAND, which prints the end marks once per cell, also
 * after an interrupt aborted the line. SIGINT is ignored between cells (a cell resets it), so an
 * interrupt cannot land while bash reads a cell's line, nor cut the marks short.
 */
const bashPrelude = (mark: string) =>
  "builtin trap '' INT; set +H +o history; unset HISTFILE MAILCHECK PROMPT_COMMAND; " +
  'PS1= PS2= PS0= ; exec 18>&1 19>&2 2>/dev/null; ' +
  "__abx_end() { local s=$?; builtin trap '' INT; [[ -n $__abx_mark ]] || return 0; " +
  `builtin printf '%s %s\\n' "$__abx_mark" "$s" >&18; builtin printf '%s\\n' "$__abx_mark" >&19; ` +
  `__abx_mark=; }; PROMPT_COMMAND=__abx_end; __abx_mark='${mark}'\n`;

/** What prints the end marks after an sh cell (130 if its trap ran: see TRAP). */
const endMarks = (mark: string) =>
  `__abx_s=$?; [ -z "$__abx_int" ] || __abx_s=130; ` +
  `printf '%s %s\\n' '${mark}' "$__abx_s"; printf '%s\\n' '${mark}' >&2\n`;
/**
 * What a POSIX sh (no bash) runs first: each cell is `eval`ed inside a function, so an
 * interrupt's trap can `return` out of it (a non-interactive shell would otherwise exit on
 * SIGINT) while variables and the working directory, which a function shares with its shell,
 * persist. `command` keeps a syntax error in `eval` from ending the shell (dash, busybox).
 */
const shPrelude = (mark: string) => `__abx_cell() { command eval "$1"; }\n${endMarks(mark)}`;
/**
 * Set again before each sh cell (after one interrupt bash no longer ran it, seen with bash 5.2).
 * The flag makes the status 130: after a trap dash restores `$?`, so `return 130` may give 0.
 */
const TRAP = `__abx_int=; trap '__abx_int=1; return 130 2>/dev/null || :' INT\n`;

/** How often an interrupted cell that has not ended is sent SIGINT again. */
const INTERRUPT_REPEAT_MS = 500;

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
 * A long-lived shell process: bash started with {@link BASH_ARGS}, else `sh`. A cell is written
 * to its stdin, then an end mark with the cell's status is printed on stdout and on stderr;
 * output is streamed until both marks are seen, so nothing of either stream is left over for the
 * next cell. A non-zero status is reported as an `error` event named `ExitStatus`. No results.
 *
 * bash `source`s each cell at the top level (so `declare` makes globals, as in a terminal;
 * sourced, bash does not print `[1] <pid>` for `cmd &`); what it prints while starting is
 * dropped: the prelude is cell 0, whose output is discarded up to its marks, and the first cell
 * is written only after them.
 */
export class ShellInterpreter extends Interpreter {
  private readonly bash = this.entry.child.spawnargs.includes('-i');
  private mark = '';
  private starting = true;
  /** The first cell, written once the prelude's marks arrived. */
  private queued: (() => void) | undefined;
  private interrupted: unknown;
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
    this.mark = newMark(0);
    this.entry.child.stdin?.write(this.bash ? bashPrelude(this.mark) : shPrelude(this.mark));
  }

  protected override send(execution: Execution, count: number): void {
    const write = () => {
      this.mark = newMark(count);
      this.seen.stdout = false;
      this.seen.stderr = false;
      const env = Object.entries(execution.env);
      if (this.bash) {
        const exports = env.map(([name, value]) => `builtin export ${name}=${quote(value)}; `);
        this.entry.child.stdin?.write(
          `__abx_mark='${this.mark}'; ${exports.join('')}builtin trap - INT; ` +
            `builtin source <(builtin printf '%s' ${quote(execution.code)}) </dev/null >&18 2>&19\n`,
        );
      } else {
        const exports = env.map(([name, value]) => `export ${name}=${quote(value)}\n`);
        this.entry.child.stdin?.write(
          `${exports.join('')}${TRAP}__abx_cell ${quote(execution.code)} </dev/null\n${endMarks(this.mark)}`,
        );
      }
    };
    if (this.starting) this.queued = write;
    else write();
  }

  /**
   * A foreground program of the cell gets the interrupt too. Sent again while the cell runs on:
   * one that arrived before the cell started (bash ignores SIGINT between cells) is lost.
   */
  protected override interrupt(): void {
    const running = this.running;
    if (!running || this.interrupted === running) return;
    this.interrupted = running;
    const again = () => {
      if (this.running !== running || this.dead) return;
      killGroup(this.entry.child, 'SIGINT');
      setTimeout(again, INTERRUPT_REPEAT_MS).unref();
    };
    again();
  }

  private output(name: StreamName, text: string): void {
    if (this.seen[name]) return;
    // While the prelude runs its output is dropped; else it goes to the cell that runs.
    const running = this.starting ? undefined : this.running;
    if (!running && !this.starting) return;
    let data = this.pending[name] + text;
    const at = data.indexOf(this.mark);
    if (at < 0) {
      const hold = partialTail(data, this.mark);
      this.pending[name] = data.slice(data.length - hold);
      data = data.slice(0, data.length - hold);
      if (data) running?.events.push({ type: name, text: data });
      return;
    }
    const rest = data.slice(at + this.mark.length);
    const end = rest.indexOf('\n');
    if (end < 0) {
      // The status after the mark has not all arrived yet.
      this.pending[name] = data;
      return;
    }
    if (at > 0) running?.events.push({ type: name, text: data.slice(0, at) });
    if (name === 'stdout') this.status = Number(rest.slice(0, end).trim());
    this.pending[name] = '';
    this.seen[name] = true;
    if (!this.seen.stdout || !this.seen.stderr) return;
    if (!running) {
      this.starting = false;
      const queued = this.queued;
      this.queued = undefined;
      queued?.();
      return;
    }
    if (this.status !== 0) {
      const value = `exit status ${this.status}`;
      running.events.push(
        this.error(running, { type: 'error', name: 'ExitStatus', value, traceback: '' }),
      );
    }
    running.finish();
  }
}

/** A mark no output contains by chance. */
const newMark = (count: number) => `__ABX_END_${randomBytes(8).toString('hex')}_${count}__`;
