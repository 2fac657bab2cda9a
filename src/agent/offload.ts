import { shellQuote } from '../util/shell-quote.js';
import type { BaseSandbox } from './base-sandbox.js';
import { missingInterpreter, NO_INTERPRETER_MARK } from './helper.js';
import type { ExecuteOffloadResult, ExecuteWithOffloadOptions } from './types.js';

/** Default cap on the output kept at `capturePath`. */
export const DEFAULT_MAX_CAPTURE_BYTES = 10 * 1024 * 1024;

const HEAD_LINES = 5;
const TAIL_LINES = 5;
const HEAD_BYTES = 2000;
const TAIL_BYTES = 2000;
const META_MARK = '__ABX_OFFLOAD__';
const EXIT_MARK = '__ABX_OFFLOAD_EXIT__';

/**
 * Reads the command's combined output from stdin. Up to `inline` bytes are held in memory and
 * printed whole (no file is ever created); past that, everything goes to the capture file and
 * only a head/tail preview is printed. Past `max` bytes it keeps reading and discarding, so the
 * command never gets SIGPIPE and exits with its own code.
 */
const CAPTURE_PROGRAM = String.raw`'use strict';
const fs = require('fs');
const path = require('path');
const file = process.argv[1];
const inline = Number(process.argv[2]);
const max = Number(process.argv[3]);
let held = [];
let heldBytes = 0;
let fd = null;
let kept = 0;
let capped = false;
let newlines = 0;
let lastByte = -1;
function writeAll(buf) {
  let at = 0;
  while (at < buf.length) at += fs.writeSync(fd, buf, at, buf.length - at);
}
process.stdin.on('data', (chunk) => {
  if (kept >= max) { capped = true; return; }
  let piece = chunk;
  if (kept + piece.length > max) { piece = piece.subarray(0, max - kept); capped = true; }
  kept += piece.length;
  for (let i = piece.indexOf(10); i !== -1; i = piece.indexOf(10, i + 1)) newlines += 1;
  if (piece.length > 0) lastByte = piece[piece.length - 1];
  if (fd !== null) return writeAll(piece);
  held.push(piece);
  heldBytes += piece.length;
  if (heldBytes > inline) {
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fd = fs.openSync(file, 'w');
    writeAll(Buffer.concat(held));
    held = [];
  }
});
process.stdin.on('end', () => {
  if (fd === null) {
    process.stdout.write('${META_MARK} 0 ' + (capped ? 1 : 0) + '\n');
    process.stdout.write(Buffer.concat(held));
    return;
  }
  fs.closeSync(fd);
  const lines = newlines + (lastByte !== 10 && kept > 0 ? 1 : 0);
  const slice = (start, length) => {
    const buf = Buffer.alloc(length);
    const rfd = fs.openSync(file, 'r');
    try {
      return buf.subarray(0, fs.readSync(rfd, buf, 0, length, start)).toString('utf8');
    } finally {
      fs.closeSync(rfd);
    }
  };
  const head = slice(0, Math.min(${HEAD_BYTES}, kept)).split('\n').slice(0, ${HEAD_LINES});
  let tail = slice(Math.max(0, kept - ${TAIL_BYTES}), Math.min(${TAIL_BYTES}, kept)).split('\n');
  if (tail[tail.length - 1] === '') tail.pop();
  tail = tail.slice(-${TAIL_LINES});
  const omitted = lines - head.length - tail.length;
  const preview = omitted > 0
    ? head.join('\n') + '\n... [' + omitted + ' lines omitted] ...\n' + tail.join('\n')
    : slice(0, Math.min(${HEAD_BYTES + TAIL_BYTES}, kept));
  process.stdout.write('${META_MARK} 1 ' + (capped ? 1 : 0) + '\n' + preview);
});
`;

/**
 * The wrapper, POSIX sh: the command runs in a subshell (its `exit` cannot end the wrapper) with
 * stdout and stderr piped into the capture program; its exit code goes through a side file
 * because `$?` after a pipeline is the last stage's.
 */
function wrapperCommand(
  interpreter: string,
  command: string,
  options: ExecuteWithOffloadOptions,
): string {
  const node = shellQuote(interpreter);
  const max = Math.max(0, Math.floor(options.maxCaptureBytes ?? DEFAULT_MAX_CAPTURE_BYTES));
  const inline = Math.max(0, Math.floor(options.maxInlineBytes));
  return [
    `command -v ${node} >/dev/null 2>&1 || { printf '%s\\n' '${NO_INTERPRETER_MARK}'; exit 127; }`,
    `__abx_cmd=${shellQuote(command)}`,
    `__abx_ecf="\${TMPDIR:-/tmp}/.abx-offload-$$.ec"`,
    `{ ( eval "$__abx_cmd" ); echo "$?" > "$__abx_ecf"; } 2>&1 | ${node} -e ${shellQuote(CAPTURE_PROGRAM)} ${shellQuote(options.capturePath)} ${inline} ${max}`,
    `__abx_ec=$(cat "$__abx_ecf" 2>/dev/null)`,
    `rm -f "$__abx_ecf"`,
    `printf '\\n%s %s\\n' '${EXIT_MARK}' "\${__abx_ec:-1}"`,
    '',
  ].join('\n');
}

/** {@link BaseSandbox.executeWithOffload}. */
export async function executeWithOffload(
  sandbox: BaseSandbox,
  command: string,
  options: ExecuteWithOffloadOptions,
): Promise<ExecuteOffloadResult> {
  const timeout = options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs };
  if (!sandbox.enableCaptureOffload) {
    return { offloaded: false, response: await sandbox.execute(command, timeout) };
  }
  const result = await sandbox.execute(
    wrapperCommand(sandbox.interpreter, command, options),
    timeout,
  );
  const output = result.output;
  const meta = new RegExp(`^${META_MARK} ([01]) ([01])\\n`).exec(output);
  const exit = new RegExp(`\\n${EXIT_MARK} (\\d+)\\n$`).exec(output);
  if (!meta || !exit) {
    if (output.includes(NO_INTERPRETER_MARK)) {
      return {
        offloaded: false,
        response: {
          output: missingInterpreter(sandbox.interpreter),
          exitCode: 127,
          truncated: false,
        },
      };
    }
    // Not the wrapper's shape (a timeout, a lost stream): hand back what came, never re-run.
    return { offloaded: false, response: result };
  }
  return {
    offloaded: meta[1] === '1',
    response: {
      output: output.slice(meta[0].length, exit.index),
      exitCode: Number(exit[1]),
      truncated: meta[2] === '1' || result.truncated,
    },
  };
}
