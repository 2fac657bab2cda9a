import { shellQuote } from '../util/shell-quote.js';
import type { BaseSandbox } from './base-sandbox.js';
import { missingInterpreter, NO_INTERPRETER_MARK } from './helper.js';
import { programSource } from './program-source.js';
import { CAPTURE_META_MARK } from './programs/protocol.js';
import type { ExecuteOffloadResult, ExecuteWithOffloadOptions } from './types.js';

/** Default cap on the output kept at `capturePath`. */
export const DEFAULT_MAX_CAPTURE_BYTES = 10 * 1024 * 1024;

const EXIT_MARK = '__ABX_OFFLOAD_EXIT__';

/**
 * The wrapper, POSIX sh: the command runs in a subshell (its `exit` cannot end the wrapper) with
 * stdout and stderr piped into the capture program (programs/capture.ts); its exit code goes
 * through a side file because `$?` after a pipeline is the last stage's.
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
    `{ ( eval "$__abx_cmd" ); echo "$?" > "$__abx_ecf"; } 2>&1 | ${node} -e ${shellQuote(programSource('capture'))} ${shellQuote(options.capturePath)} ${inline} ${max}`,
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
  const meta = new RegExp(`^${CAPTURE_META_MARK} ([01]) ([01])\\n`).exec(output);
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
