import type { ToolName } from '../../runtime/server/file-tools/protocol.js';
import { shellQuote } from '../util/shell-quote.js';
import type { BaseSandbox } from './base-sandbox.js';
import { programSource } from './program-source.js';
import { type ProgramAnswer, type ProgramPayload, RESULT_MARK } from './programs/protocol.js';
import type { ToolOutcome } from './tool-runner.js';

/**
 * The host side of {@link BaseSandbox}'s helper programs (`src/agent/programs/`): each call sends
 * one as `node -e <program>` and feeds it its arguments as one JSON line on stdin through a
 * quoted here-document. User values (paths, patterns, file text) therefore travel as data and
 * never become shell words; the program is our own text, quoted as one word.
 *
 * `sh -c` takes the whole command as one argument, which Linux caps at 128 KiB
 * (MAX_ARG_STRLEN); callers keep payloads well below that (large edits go through uploads).
 */

/** Printed by the shell when the interpreter is not on PATH. */
export const NO_INTERPRETER_MARK = '__ABX_AGENT_NO_INTERPRETER__';
/** Here-document delimiter; a JSON line starts with `{`, so it can never equal it. */
const PAYLOAD_END = '__ABX_AGENT_PAYLOAD__';

/** The longest command we hand to `sh -c`, well under the kernel's 128 KiB per argument. */
export const MAX_COMMAND_CHARS = 120_000;

/** The shell command that runs a helper program with `payload` on its stdin. */
export function helperCommand<N extends ToolName>(
  interpreter: string,
  program: N,
  payload: ProgramPayload<N>,
): string {
  const quoted = shellQuote(interpreter);
  return [
    `command -v ${quoted} >/dev/null 2>&1 || { printf '%s\\n' '${NO_INTERPRETER_MARK}'; exit 127; }`,
    `${quoted} -e ${shellQuote(programSource(program))} 2>&1 <<'${PAYLOAD_END}'`,
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
export function parseHelperOutput<N extends ToolName>(
  output: string,
  interpreter: string,
  exitCode: number | null,
): ToolOutcome<N> {
  const at = output.lastIndexOf(`\n${RESULT_MARK}`);
  if (at >= 0) {
    const line = output.slice(at + RESULT_MARK.length + 1).split('\n', 1)[0] ?? '';
    try {
      return { ok: true, value: JSON.parse(line) as ProgramAnswer<N> };
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
export async function runHelper<N extends ToolName>(
  sandbox: BaseSandbox,
  program: N,
  payload: ProgramPayload<N>,
): Promise<ToolOutcome<N>> {
  const result = await sandbox.execute(helperCommand(sandbox.interpreter, program, payload));
  return parseHelperOutput<N>(result.output, sandbox.interpreter, result.exitCode);
}
