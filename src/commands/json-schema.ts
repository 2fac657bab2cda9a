import type { ArgType, ArgValue, CustomCommand } from './custom-command.js';

/** A JSON Schema (draft 2020-12 subset) for a command's kwargs object. */
export interface CommandJSONSchema {
  type: 'object';
  description?: string;
  properties: Record<
    string,
    { type: 'string' | 'integer' | 'number' | 'boolean'; description?: string; default?: ArgValue }
  >;
  required: string[];
  additionalProperties: false;
}

const JSON_TYPES = {
  str: 'string',
  int: 'integer',
  float: 'number',
  bool: 'boolean',
} as const satisfies Record<ArgType, string>;

/**
 * The kwargs of a command as a JSON Schema object: usable as an LLM tool's `parameters`, and
 * accepting exactly what `validateKwargs` accepts.
 */
export function toJSONSchema(command: CustomCommand): CommandJSONSchema {
  const properties: CommandJSONSchema['properties'] = {};
  for (const arg of command.args) {
    properties[arg.name] = {
      type: JSON_TYPES[arg.type],
      ...(arg.description ? { description: arg.description } : {}),
      ...(arg.default === undefined ? {} : { default: arg.default }),
    };
  }
  return {
    type: 'object',
    ...(command.description ? { description: command.description } : {}),
    properties,
    required: command.args.filter((a) => a.required).map((a) => a.name),
    additionalProperties: false,
  };
}
