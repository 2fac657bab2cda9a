/**
 * What the host and the sandbox-side programs agree on beyond the tools' own protocol
 * (runtime/server/file-tools/protocol.ts): program names, marks and capture's limits. Imported by
 * both sides, so it holds no code that runs.
 *
 * A tool program gets its request as one JSON line on stdin and prints
 * `\n${RESULT_MARK}<json answer>\n` (capture, which filters a command's output, speaks its own
 * line protocol instead).
 */
import type {
  EditRequest,
  ToolAnswer,
  ToolName,
  ToolRequest,
} from '../../../runtime/server/file-tools/protocol.js';

/** The programs built into `dist/agent/<name>.cjs`, each from `src/agent/programs/<name>.ts`. */
export const PROGRAM_NAMES = ['read', 'edit', 'ls', 'delete', 'grep', 'glob', 'capture'] as const;
export type ProgramName = (typeof PROGRAM_NAMES)[number];

/** Marks the line that carries a program's JSON answer, so stray output around it is ignored. */
export const RESULT_MARK = '__ABX_AGENT_RESULT__';

/** First line of capture's output: `<mark> <offloaded 0|1> <capped 0|1>`. */
export const CAPTURE_META_MARK = '__ABX_OFFLOAD__';
/** The preview of offloaded output: at most this many lines and bytes from each end. */
export const PREVIEW_HEAD_LINES = 5;
export const PREVIEW_TAIL_LINES = 5;
export const PREVIEW_HEAD_BYTES = 2000;
export const PREVIEW_TAIL_BYTES = 2000;

/** A large edit's strings travel as uploaded files, which the program reads and removes. */
export type EditProgramPayload =
  | EditRequest
  | { path: string; replaceAll: boolean; oldFile: string; newFile: string };

/** What a tool program reads on stdin: the tool's request (edit's may name files instead). */
export type ProgramPayload<N extends ToolName> = N extends 'edit'
  ? EditProgramPayload
  : ToolRequest<N>;
/** What a tool program prints after {@link RESULT_MARK}. */
export type ProgramAnswer<N extends ToolName> = ToolAnswer<N>;
