import type { ToolCallError } from '../agent/tool-error.js';
import type { JsonValue, SandboxTool } from '../agent/tool-types.js';

/** An MCP `tools/list` entry. */
export interface McpToolInfo {
  name: string;
  description: string;
  inputSchema: SandboxTool['parameters'];
}

/** An MCP `tools/call` result (the subset this server sends). */
export interface McpCallResult {
  [key: string]: unknown;
  content: { type: 'text'; text: string }[];
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
}

/** A tool as `tools/list` describes it. */
export function mcpToolInfo(tool: SandboxTool): McpToolInfo {
  return { name: tool.name, description: tool.description, inputSchema: tool.parameters };
}

/**
 * A successful call: the result as text (a string as it is, anything else as JSON) and, for an
 * object, also as `structuredContent` so clients need not parse the text.
 */
export function mcpSuccess(result: JsonValue): McpCallResult {
  const text = typeof result === 'string' ? result : JSON.stringify(result);
  const structured =
    typeof result === 'object' && result !== null && !Array.isArray(result)
      ? { structuredContent: result }
      : {};
  return { content: [{ type: 'text', text }], ...structured };
}

/**
 * A failed call as an MCP tool error (`isError: true`), which the model sees, rather than a
 * protocol error: `{ error, type }` (the command server's error shape) as text and as
 * `structuredContent`, `type` being the remote error class.
 */
export function mcpFailure(error: Pick<ToolCallError, 'message' | 'type'>): McpCallResult {
  const body = { error: error.message, type: error.type };
  return {
    content: [{ type: 'text', text: JSON.stringify(body) }],
    structuredContent: body,
    isError: true,
  };
}
