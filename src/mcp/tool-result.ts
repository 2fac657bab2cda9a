import type { ToolInputSchema } from '../agent/tool-adapters.js';
import type { ToolCallError } from '../agent/tool-error.js';
import type { JsonValue, SandboxTool } from '../agent/tool-types.js';

/** An MCP `tools/list` entry. */
export interface McpToolInfo {
  name: string;
  description: string;
  inputSchema: ToolInputSchema;
}

/** An MCP `tools/call` result (the subset this server sends). */
export interface McpCallResult {
  [key: string]: unknown;
  content: ({ type: 'text'; text: string } | { type: 'image'; data: string; mimeType: string })[];
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
}

/** A tool as `tools/list` describes it. */
export function mcpToolInfo(tool: SandboxTool): McpToolInfo {
  return { name: tool.name, description: tool.description, inputSchema: { ...tool.parameters } };
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
  return { content: [{ type: 'text', text }, ...imagesOf(result)], ...structured };
}

const IMAGE_TYPES: Record<string, string> = { png: 'image/png', jpeg: 'image/jpeg' };

/** run_code's images (its `results[].png`/`jpeg`, base64) as MCP image content too. */
function imagesOf(result: JsonValue): { type: 'image'; data: string; mimeType: string }[] {
  const results =
    typeof result === 'object' && result !== null && !Array.isArray(result)
      ? (result as { results?: unknown }).results
      : undefined;
  if (!Array.isArray(results)) return [];
  return results.flatMap((item) =>
    Object.entries(IMAGE_TYPES).flatMap(([format, mimeType]) => {
      const data = (item as Record<string, unknown> | null)?.[format];
      return typeof data === 'string' ? [{ type: 'image' as const, data, mimeType }] : [];
    }),
  );
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
