import { ToolCallError } from './tool-error.js';
import type { ToolParameters } from './tool-schema.js';
import type { JsonValue, SandboxTool } from './tool-types.js';

/**
 * Adapters shape {@link SandboxTool}s for model APIs as plain objects: the project depends on no
 * agent framework, and each shape is small and stable enough to write out.
 */

/**
 * A tool's parameters as model APIs type them: the same JSON Schema object as
 * {@link ToolParameters}, as a plain object type (OpenAI's `FunctionParameters`, Anthropic's
 * `InputSchema` and MCP's `inputSchema` are index-signature types an `interface` cannot meet).
 */
export type ToolInputSchema = { [K in keyof ToolParameters]: ToolParameters[K] };

const inputSchema = (parameters: ToolParameters): ToolInputSchema => ({ ...parameters });

/** A tool in the OpenAI Chat Completions `tools` format (`ChatCompletionFunctionTool`). */
export interface OpenAITool {
  type: 'function';
  function: { name: string; description: string; parameters: ToolInputSchema; strict?: boolean };
}

/**
 * True when OpenAI's strict mode can take the schema as it is: every property required (strict
 * mode has no optional properties; `additionalProperties` is always false here). Tools with
 * optional arguments are sent with `strict: false`, so the model may leave them out and the
 * tool's defaults apply.
 */
function strictAllowed(parameters: ToolParameters): boolean {
  return Object.keys(parameters.properties).every((name) => parameters.required.includes(name));
}

/** Tools for OpenAI Chat Completions (`tools: [...]`); run a `tool_calls` entry with `invoke`. */
export function toOpenAITools(tools: readonly SandboxTool[]): OpenAITool[] {
  return tools.map((t) => ({
    type: 'function',
    function: {
      name: t.name,
      description: t.description,
      parameters: inputSchema(t.parameters),
      strict: strictAllowed(t.parameters),
    },
  }));
}

/** A tool in the OpenAI Responses API's flat `tools` format (`FunctionTool`). */
export interface OpenAIResponsesTool {
  type: 'function';
  name: string;
  description: string;
  parameters: ToolInputSchema;
  strict: boolean;
}

/**
 * Tools for the OpenAI Responses API (`responses.create({ tools })`), strict where the schema
 * allows it; run a `function_call` output item's `arguments` (JSON) with `invoke`.
 */
export function toOpenAIResponsesTools(tools: readonly SandboxTool[]): OpenAIResponsesTool[] {
  return tools.map((t) => ({
    type: 'function',
    name: t.name,
    description: t.description,
    parameters: inputSchema(t.parameters),
    strict: strictAllowed(t.parameters),
  }));
}

/** A tool in the Anthropic Messages API `tools` format (`Tool`). */
export interface AnthropicTool {
  name: string;
  description: string;
  input_schema: ToolInputSchema;
}

/** Tools for the Anthropic Messages API; run a `tool_use` block's `input` with `invoke`. */
export function toAnthropicTools(tools: readonly SandboxTool[]): AnthropicTool[] {
  return tools.map((t) => ({
    name: t.name,
    description: t.description,
    input_schema: inputSchema(t.parameters),
  }));
}

/** What a Standard Schema's `validate` answers (the `@standard-schema/spec` result). */
export type StandardResult<T> =
  | { readonly value: T; readonly issues?: undefined }
  | { readonly issues: ReadonlyArray<{ readonly message: string }> };

/**
 * A Standard Schema (`@standard-schema/spec` v1) with its JSON Schema (Standard JSON Schema): what
 * the AI SDK 6 and later take as a tool's `inputSchema`, written out so this package needs
 * neither `ai` nor the spec package.
 */
export interface ToolStandardSchema {
  readonly '~standard': {
    readonly version: 1;
    readonly vendor: string;
    readonly validate: (value: unknown) => StandardResult<Record<string, unknown>>;
    readonly types?: {
      readonly input: Record<string, unknown>;
      readonly output: Record<string, unknown>;
    };
    readonly jsonSchema: {
      readonly input: (options: { readonly target: string }) => Record<string, unknown>;
      readonly output: (options: { readonly target: string }) => Record<string, unknown>;
    };
  };
}

/** A tool in the AI SDK's `tool()` shape: `{ description, inputSchema, execute }`. */
export interface VercelAITool<Schema = ToolStandardSchema> {
  description: string;
  inputSchema: Schema;
  execute(args: Record<string, unknown>): Promise<JsonValue>;
}

/**
 * The tool's parameters as a Standard Schema. `validate` only checks for an object: full checks
 * (every problem listed) happen in `invoke`, whose ToolCallError the SDK hands the model.
 */
function standardSchema(parameters: ToolParameters): ToolStandardSchema {
  const json = () => ({ ...parameters }) as Record<string, unknown>;
  return {
    '~standard': {
      version: 1,
      vendor: 'agent-sandbox',
      validate: (value) =>
        typeof value === 'object' && value !== null && !Array.isArray(value)
          ? { value: value as Record<string, unknown> }
          : { issues: [{ message: 'tool arguments must be a JSON object' }] },
      jsonSchema: { input: json, output: json },
    },
  };
}

/**
 * Tools for the Vercel AI SDK (`generateText({ tools })`), keyed by name: a `ToolSet`. `execute`
 * rejects with a {@link ToolCallError}, which the SDK reports to the model as a tool error.
 *
 * The input schemas are Standard Schemas, which the AI SDK takes from version 6 on. For an
 * earlier SDK, pass its own `jsonSchema` helper: `toVercelAITools(tools, { jsonSchema })` (the
 * AI SDK 5 `import { jsonSchema } from 'ai'`), and the schemas are made by it.
 */
export function toVercelAITools(tools: readonly SandboxTool[]): Record<string, VercelAITool>;
export function toVercelAITools<Schema>(
  tools: readonly SandboxTool[],
  options: { jsonSchema: (schema: ToolInputSchema) => Schema },
): Record<string, VercelAITool<Schema>>;
export function toVercelAITools(
  tools: readonly SandboxTool[],
  options?: { jsonSchema: (schema: ToolInputSchema) => unknown },
): Record<string, VercelAITool<unknown>> {
  return Object.fromEntries(
    tools.map((t) => [
      t.name,
      {
        description: t.description,
        inputSchema: options
          ? options.jsonSchema(inputSchema(t.parameters))
          : standardSchema(t.parameters),
        execute: (args: Record<string, unknown>) => t.invoke(args),
      },
    ]),
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
