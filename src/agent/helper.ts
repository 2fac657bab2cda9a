import { shellQuote } from '../util/shell-quote.js';
import type { BaseSandbox } from './base-sandbox.js';

/**
 * The sandbox side of {@link BaseSandbox}: small programs for one interpreter (node), sent with
 * each call as `node -e <program>` and fed their arguments as one JSON line on stdin through a
 * quoted here-document. User values (paths, patterns, file text) therefore travel as data and
 * never become shell words; the program is our own text, quoted as one word.
 *
 * `sh -c` takes the whole command as one argument, which Linux caps at 128 KiB
 * (MAX_ARG_STRLEN); callers keep payloads well below that (large edits go through uploads).
 */

/** Marks the line that carries a helper's JSON answer, so stray output around it is ignored. */
const RESULT_MARK = '__ABX_AGENT_RESULT__';
/** Printed by the shell when the interpreter is not on PATH. */
export const NO_INTERPRETER_MARK = '__ABX_AGENT_NO_INTERPRETER__';
/** Here-document delimiter; a JSON line starts with `{`, so it can never equal it. */
const PAYLOAD_END = '__ABX_AGENT_PAYLOAD__';

/** The longest command we hand to `sh -c`, well under the kernel's 128 KiB per argument. */
export const MAX_COMMAND_CHARS = 120_000;

/**
 * Shared by every helper program: fs/path, errno → error code, a streaming line reader and the
 * answer. Programs define `main(input)` and return a JSON-able value. Written for plain
 * CommonJS `node -e`; no backticks in it (it is a String.raw template).
 */
const PRELUDE = String.raw`'use strict';
const fs = require('fs');
const path = require('path');
const { StringDecoder } = require('string_decoder');
function fsError(e) {
  const code = e && e.code;
  if (code === 'ENOENT' || code === 'ENOTDIR') return { error: 'file_not_found' };
  if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') return { error: 'permission_denied' };
  if (code === 'EISDIR') return { error: 'is_directory' };
  return { error: 'io_error', detail: String((e && e.message) || e) };
}
function isUtf8Prefix(buf) {
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(buf, { stream: true });
    return true;
  } catch (e) {
    return false;
  }
}
function readPrefix(file, size) {
  const fd = fs.openSync(file, 'r');
  try {
    const buf = Buffer.alloc(size);
    const got = fs.readSync(fd, buf, 0, size, 0);
    return buf.subarray(0, got);
  } finally {
    fs.closeSync(fd);
  }
}
function eachLine(file, onLine) {
  const fd = fs.openSync(file, 'r');
  const decoder = new StringDecoder('utf8');
  const buf = Buffer.alloc(65536);
  let rest = '';
  let n = 0;
  const emit = (text) => {
    n += 1;
    return onLine(text.endsWith('\r') ? text.slice(0, -1) : text, n);
  };
  try {
    for (;;) {
      const got = fs.readSync(fd, buf, 0, buf.length, null);
      if (got === 0) break;
      const parts = (rest + decoder.write(buf.subarray(0, got))).split('\n');
      rest = parts.pop();
      for (const part of parts) if (emit(part) === false) return { stopped: true, lines: n };
    }
    rest += decoder.end();
    if (rest.length > 0 && emit(rest) === false) return { stopped: true, lines: n };
    return { stopped: false, lines: n };
  } finally {
    fs.closeSync(fd);
  }
}
function answer(value) {
  process.stdout.write('\n${RESULT_MARK}' + JSON.stringify(value) + '\n');
}
`;

/** Helper programs run the prelude, then their `main`, then print the answer. */
const EPILOGUE = `
let input;
try {
  input = JSON.parse(fs.readFileSync(0, 'utf8'));
} catch (e) {
  input = undefined;
}
if (input === undefined) answer({ error: 'bad_payload' });
else {
  try {
    answer(main(input));
  } catch (e) {
    answer(Object.assign({ unexpected: true }, fsError(e)));
  }
}
`;

/** A helper's answer, or why there is none. */
export type HelperOutcome<T> = { ok: true; value: T } | { ok: false; error: string };

/** The shell command that runs a helper program with `payload` on its stdin. */
export function helperCommand(interpreter: string, program: string, payload: unknown): string {
  const quoted = shellQuote(interpreter);
  const source = `${PRELUDE}${program}${EPILOGUE}`;
  return [
    `command -v ${quoted} >/dev/null 2>&1 || { printf '%s\\n' '${NO_INTERPRETER_MARK}'; exit 127; }`,
    `${quoted} -e ${shellQuote(source)} 2>&1 <<'${PAYLOAD_END}'`,
    JSON.stringify(payload),
    PAYLOAD_END,
    '',
  ].join('\n');
}

/** The error text when the sandbox lacks the interpreter the helpers need. */
export function missingInterpreter(interpreter: string): string {
  return `the sandbox has no '${interpreter}' on its PATH; BaseSandbox runs its file tools (read, edit, ls, grep, glob, delete, executeWithOffload) as small ${interpreter} programs. Install Node.js in the sandbox or set \`interpreter\` to its path`;
}

/** Finds the helper's answer in the command output. */
export function parseHelperOutput<T>(
  output: string,
  interpreter: string,
  exitCode: number | null,
): HelperOutcome<T> {
  const at = output.lastIndexOf(`\n${RESULT_MARK}`);
  if (at >= 0) {
    const line = output.slice(at + RESULT_MARK.length + 1).split('\n', 1)[0] ?? '';
    try {
      return { ok: true, value: JSON.parse(line) as T };
    } catch {
      // fall through to the generic explanation
    }
  }
  if (output.includes(NO_INTERPRETER_MARK)) {
    return { ok: false, error: missingInterpreter(interpreter) };
  }
  const detail = output.trim().slice(0, 300) || '(no output)';
  return {
    ok: false,
    error: `unexpected answer from the sandbox (exit code ${exitCode}): ${detail}`,
  };
}

/** Runs a helper program in `sandbox` and parses its answer. */
export async function runHelper<T>(
  sandbox: BaseSandbox,
  program: string,
  payload: unknown,
): Promise<HelperOutcome<T>> {
  const result = await sandbox.execute(helperCommand(sandbox.interpreter, program, payload));
  return parseHelperOutput<T>(result.output, sandbox.interpreter, result.exitCode);
}

/** The machine-readable answer of a helper that failed: `{ error: code, ... }`. */
export interface HelperError {
  error: string;
  detail?: string;
  [key: string]: unknown;
}

/** Whether a helper answered with an error. */
export function isHelperError(value: unknown): value is HelperError {
  return (
    typeof value === 'object' && value !== null && typeof (value as HelperError).error === 'string'
  );
}
