import type {
  ToolAnswer,
  ToolError,
  ToolName,
  ToolRequest,
} from '../../runtime/server/file-tools/protocol.js';

/** A tool's answer, or why the backend gave none, worded for the model (e.g. no interpreter). */
export type ToolOutcome<N extends ToolName> =
  | { ok: true; value: ToolAnswer<N> }
  | { ok: false; error: string };

/**
 * Where {@link BaseSandbox}'s file tools (read, edit, ls, delete, grep, glob) run their sandbox
 * side. Both runners hand the request to the same code (runtime/server/file-tools): the default
 * one as a small program per call through `execute()` (execute-runner.ts), `Sandbox`'s as a
 * request to envd (src/sandbox/envd-tool-runner.ts). The host side (read.ts, edit.ts...) checks
 * the arguments and words the answers, once for every runner.
 *
 * A failure of the backend itself (the sandbox is gone) throws.
 */
export interface ToolRunner {
  run<N extends ToolName>(tool: N, request: ToolRequest<N>): Promise<ToolOutcome<N>>;
}

/** Whether a tool answered with an error (`{ error: code, ... }`). */
export function isToolError(value: unknown): value is ToolError {
  return (
    typeof value === 'object' && value !== null && typeof (value as ToolError).error === 'string'
  );
}
