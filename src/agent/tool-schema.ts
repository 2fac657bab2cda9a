import { ArgumentError } from '../commands/errors.js';

/** One property of a tool's parameters: a scalar JSON type. */
export interface ToolProperty {
  type: 'string' | 'integer' | 'number' | 'boolean';
  description?: string;
  default?: string | number | boolean;
  /** Lowest allowed value (numbers only). */
  minimum?: number;
}

/**
 * A tool's `parameters`: a JSON Schema object of scalar properties. Every LLM tool format
 * (OpenAI, Anthropic, MCP, the AI SDK) takes it as it is.
 */
export interface ToolParameters {
  type: 'object';
  description?: string;
  properties: Record<string, ToolProperty>;
  required: string[];
  additionalProperties: false;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'object') return 'an object';
  return `${typeof value} ${JSON.stringify(value)}`;
}

function fits(property: ToolProperty, value: unknown): boolean {
  switch (property.type) {
    case 'string':
      return typeof value === 'string';
    case 'boolean':
      return typeof value === 'boolean';
    case 'integer':
      return typeof value === 'number' && Number.isSafeInteger(value);
    case 'number':
      return typeof value === 'number' && Number.isFinite(value);
  }
}

/** `read_file {file_path: string, offset?: integer}`: the usage line of an {@link ArgumentError}. */
export function schemaUsage(name: string, schema: ToolParameters): string {
  const fields = Object.entries(schema.properties).map(
    ([key, p]) => `${key}${schema.required.includes(key) ? '' : '?'}: ${p.type}`,
  );
  return `${name} {${fields.join(', ')}}`;
}

/**
 * Checks tool arguments against a {@link ToolParameters} schema with strict JSON types (no `"3"`
 * for an integer) and reports every problem in one {@link ArgumentError}, like `validateKwargs`
 * does for custom commands. Returns the arguments as a record; defaults are left to the caller.
 */
export function validateToolArgs(
  name: string,
  schema: ToolParameters,
  args: unknown,
): Record<string, unknown> {
  const given = args ?? {};
  if (typeof given !== 'object' || Array.isArray(given)) {
    throw ArgumentError.of(
      name,
      [`arguments must be a JSON object of name → value, not ${describe(given)}`],
      schemaUsage(name, schema),
    );
  }
  const record = given as Record<string, unknown>;
  const problems: string[] = [];
  for (const [key, value] of Object.entries(record)) {
    const property = schema.properties[key];
    if (!property) {
      problems.push(
        `unknown argument '${key}' (arguments: ${Object.keys(schema.properties).join(', ')})`,
      );
    } else if (!fits(property, value)) {
      problems.push(
        `${key} must be ${property.type === 'integer' ? 'an' : 'a'} ${property.type}, not ${describe(value)}`,
      );
    } else if (property.minimum !== undefined && (value as number) < property.minimum) {
      problems.push(`${key} must be at least ${property.minimum}, not ${value}`);
    }
  }
  const missing = schema.required.filter((key) => record[key] === undefined);
  if (missing.length > 0)
    problems.push(
      `missing required argument${missing.length > 1 ? 's' : ''}: ${missing.join(', ')}`,
    );
  if (problems.length > 0) throw ArgumentError.of(name, problems, schemaUsage(name, schema));
  return record;
}
