import { type Colour, paint } from './style.js';

/** One cell of a table: text, optionally coloured on a terminal. */
export type Cell = string | { text: string; colour: Colour };

/** Writes `text` to stdout as one or more whole lines. */
export function printLine(text = ''): void {
  process.stdout.write(text.endsWith('\n') ? text : `${text}\n`);
}

/** Writes `value` as indented JSON: what `--json` prints, for `jq` and for people. */
export function printJson(value: unknown): void {
  printLine(JSON.stringify(value, null, 2));
}

/**
 * Writes a table with a header row, columns padded to their widest cell. Padding is computed on
 * the plain text, before colour codes go in, so colour never shifts the columns.
 */
export function printTable(header: readonly string[], rows: readonly (readonly Cell[])[]): void {
  const plain = (cell: Cell) => (typeof cell === 'string' ? cell : cell.text);
  const widths = header.map((title, i) =>
    Math.max(title.length, ...rows.map((row) => plain(row[i] ?? '').length)),
  );
  const render = (cells: readonly Cell[], headerRow: boolean) =>
    cells
      .map((cell, i) => {
        const text = i === cells.length - 1 ? plain(cell) : plain(cell).padEnd(widths[i] ?? 0);
        if (headerRow) return paint('bold', text);
        return typeof cell === 'string' ? text : paint(cell.colour, text);
      })
      .join('  ')
      .trimEnd();
  printLine(render(header, true));
  for (const row of rows) printLine(render(row, false));
}

/** Writes `key: value` lines with the values aligned, keys dimmed on a terminal. */
export function printFields(fields: readonly (readonly [string, string])[]): void {
  const width = Math.max(...fields.map(([key]) => key.length)) + 1;
  for (const [key, value] of fields) printLine(`${paint('dim', `${key}:`.padEnd(width))} ${value}`);
}

/** A span of time the way people read it: `45s`, `12m`, `3h 5m`, `2d 4h`. */
export function formatSpan(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 24) return m % 60 ? `${h}h ${m % 60}m` : `${h}h`;
  const d = Math.floor(h / 24);
  return h % 24 ? `${d}d ${h % 24}h` : `${d}d`;
}

/** `3m ago` for a past instant. */
export function ago(iso: string, now = Date.now()): string {
  return `${formatSpan(now - Date.parse(iso))} ago`;
}

/** `in 4m` for a future instant, `3m ago` for a past one. */
export function relative(iso: string, now = Date.now()): string {
  const delta = Date.parse(iso) - now;
  return delta >= 0 ? `in ${formatSpan(delta)}` : `${formatSpan(-delta)} ago`;
}

/** `1 file`, `3 files`. */
export function plural(count: number, noun: string): string {
  return `${count} ${noun}${count === 1 ? '' : 's'}`;
}

/** Exit code of a program killed by SIGPIPE, as a shell reports it. */
export const BROKEN_PIPE_EXIT = 141;

/**
 * Calls `action` when the reader of stdout goes away (`abx cat ID big.log | head`): that is how
 * such a pipeline ends, not an error to print a stack trace for. Replaces the default that
 * {@link endQuietlyOnBrokenPipe} installs.
 */
export function onBrokenPipe(action: () => void): void {
  brokenPipeAction = action;
}

let brokenPipeAction: (() => void) | undefined;

/**
 * Makes a closed stdout or stderr (`abx daemon status | head -3`) end any command quietly, as a
 * program killed by SIGPIPE would (exit 141), unless the command chose what to do with
 * {@link onBrokenPipe} (`exec` stops the sandbox's command first).
 */
export function endQuietlyOnBrokenPipe(): void {
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (error: NodeJS.ErrnoException) => {
      if (error.code !== 'EPIPE') throw error;
      if (brokenPipeAction) brokenPipeAction();
      else process.exit(BROKEN_PIPE_EXIT);
    });
  }
}
