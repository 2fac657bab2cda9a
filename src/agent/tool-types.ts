import type { ToolParameters } from './tool-schema.js';

/** A value that survives `JSON.stringify` / `JSON.parse` unchanged. */
export type JsonValue =
  | string
  | number
  | boolean
  | null
  | JsonValue[]
  | { [key: string]: JsonValue };

/**
 * One tool a model can call, bound to one sandbox. Shape it for a framework with
 * `toOpenAITools`, `toAnthropicTools` or `toVercelAITools`, or serve it over MCP with `serveMcp`.
 */
export interface SandboxTool {
  /** The tool name the model calls: a custom command's name, or `ls`, `read_file`... */
  readonly name: string;
  readonly description: string;
  /** JSON Schema of the arguments object (an LLM tool's `parameters` / `input_schema`). */
  readonly parameters: ToolParameters;
  /** `command` for a custom command (YAML or decorated), `file` for a file tool, `code` for run_code. */
  readonly kind: 'command' | 'file' | 'code';
  /**
   * Validates `args` against {@link parameters} and runs the tool in the sandbox. Resolves with a
   * plain JSON value; rejects with a `ToolCallError` only (bad arguments, a failed operation, a
   * remote error), never with anything else.
   */
  invoke(args?: unknown): Promise<JsonValue>;
}

/** Names of the file tools, in the order {@link SandboxTool}s list them. */
export const FILE_TOOL_NAMES = [
  'ls',
  'read_file',
  'write_file',
  'edit_file',
  'glob',
  'grep',
  'execute',
] as const;

/** One of {@link FILE_TOOL_NAMES}. */
export type FileToolName = (typeof FILE_TOOL_NAMES)[number];

/** Round-trips through JSON: drops `undefined` fields and guarantees a plain value. */
export function toJsonValue(value: unknown): JsonValue {
  return value === undefined ? null : (JSON.parse(JSON.stringify(value)) as JsonValue);
}
