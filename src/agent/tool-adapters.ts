import { ToolCallError } from './tool-error.js';
import type { ToolParameters } from './tool-schema.js';
import type { JsonValue, SandboxTool } from './tool-types.js';

/**
 * Adapters shape {@link SandboxTool}s for model APIs as plain objects: the project depends on no
 * agent framework, and each shape is small and stable enough to write out.
 */

/** A tool in the OpenAI Chat Completions `tools` format. */
export interface OpenAITool {
  type: 'function';
  function: { name: string; description: string; parameters: ToolParameters };
}

/** Tools for OpenAI Chat Completions (`tools: [...]`); run a `tool_calls` entry with `invoke`. */
export function toOpenAITools(tools: readonly SandboxTool[]): OpenAITool[] {
  return tools.map((t) => ({
    type: 'function',
    function: { name: t.name, description: t.description, parameters: t.parameters },
  }));
}

/** A tool in the Anthropic Messages API `tools` format. */
export interface AnthropicTool {
  name: string;
  description: string;
  input_schema: ToolParameters;
}

/** Tools for the Anthropic Messages API; run a `tool_use` block's `input` with `invoke`. */
export function toAnthropicTools(tools: readonly SandboxTool[]): AnthropicTool[] {
  return tools.map((t) => ({
    name: t.name,
    description: t.description,
    input_schema: t.parameters,
  }));
}

/**
 * The AI SDK's marks of a schema object (what its `jsonSchema()` helper returns). They are
 * `Symbol.for` symbols, so an object built here is recognised without importing `ai`.
 */
const AI_SCHEMA = Symbol.for('vercel.ai.schema');
const AI_VALIDATOR = Symbol.for('vercel.ai.validator');

/** A JSON Schema wrapped as the AI SDK's `jsonSchema()` wraps it. */
export interface VercelAISchema {
  readonly [AI_SCHEMA]: true;
  readonly [AI_VALIDATOR]: true;
  readonly _type: Record<string, unknown>;
  readonly jsonSchema: ToolParameters;
  validate(
    value: unknown,
  ): { success: true; value: Record<string, unknown> } | { success: false; error: Error };
}

/** A tool in the AI SDK `tool()` shape (`inputSchema` from v5 on, `parameters` before). */
export interface VercelAITool {
  description: string;
  inputSchema: VercelAISchema;
  /** The same schema, for AI SDK 4 which reads `parameters`. */
  parameters: VercelAISchema;
  execute(args: Record<string, unknown>): Promise<JsonValue>;
}

function aiSchema(parameters: ToolParameters): VercelAISchema {
  return {
    [AI_SCHEMA]: true,
    [AI_VALIDATOR]: true,
    _type: {},
    jsonSchema: parameters,
    // Full validation (with every problem listed) happens in invoke; the SDK only needs an object.
    validate: (value) =>
      typeof value === 'object' && value !== null && !Array.isArray(value)
        ? { success: true, value: value as Record<string, unknown> }
        : { success: false, error: new TypeError('tool arguments must be a JSON object') },
  };
}

/**
 * Tools for the Vercel AI SDK (`generateText({ tools })`), keyed by name. `execute` rejects with
 * a {@link ToolCallError}, which the SDK reports to the model as a tool error.
 */
export function toVercelAITools(tools: readonly SandboxTool[]): Record<string, VercelAITool> {
  return Object.fromEntries(
    tools.map((t) => {
      const schema = aiSchema(t.parameters);
      return [
        t.name,
        {
          description: t.description,
          inputSchema: schema,
          parameters: schema,
          execute: (args: Record<string, unknown>) => t.invoke(args),
        },
      ];
    }),
  );
}

/**
 * Runs one tool call by name and never rejects: the result, or `{ error, type }` for a model to
 * read. The step an agent loop repeats for each tool call of a model's turn.
 */
export async function callTool(
  tools: readonly SandboxTool[],
  name: string,
  args: unknown,
): Promise<{ ok: true; result: JsonValue } | { ok: false; error: string; type: string }> {
  const tool = tools.find((t) => t.name === name);
  if (!tool) {
    return {
      ok: false,
      error: `no tool '${name}'; tools: ${tools.map((t) => t.name).join(', ')}`,
      type: 'ToolNotFoundError',
    };
  }
  try {
    return { ok: true, result: await tool.invoke(args) };
  } catch (error) {
    const failure =
      error instanceof ToolCallError ? error : new ToolCallError(name, 'Error', String(error));
    return { ok: false, ...failure.toJSON() };
  }
}
