import type { ArgSpec, ArgValue } from '../protocol/arguments.js';
import { ENV_NAME_PATTERN } from '../protocol/arguments.js';
import { BadRequestError } from './errors.js';

/** Shorthand for an argument list: `{ path: 'str', 'recursive?': ['bool', false] }`. */
export function argList(
  shape: Record<string, ArgSpec['type'] | [ArgSpec['type'], ArgValue?, string?]>,
): ArgSpec[] {
  return Object.entries(shape).map(([key, spec]) => {
    const [type, value, description] = Array.isArray(spec) ? spec : [spec];
    const optional = key.endsWith('?');
    return {
      name: optional ? key.slice(0, -1) : key,
      type,
      required: !optional,
      ...(value === undefined ? {} : { default: value }),
      ...(description === undefined ? {} : { description }),
    };
  });
}

/** Turns an `env` argument (an object of strings, or `KEY=VALUE` lines) into an environment. */
export function envOf(value: unknown): Record<string, string> {
  if (value === undefined) return {};
  const env: Record<string, string> =
    typeof value === 'string' ? envLines(value) : { ...(value as Record<string, string>) };
  const bad = Object.keys(env).filter((name) => !ENV_NAME_PATTERN.test(name));
  if (bad.length > 0) {
    throw new BadRequestError(
      `env names must be letters, digits and _ (not starting with a digit): ${bad.map((n) => JSON.stringify(n)).join(', ')}`,
    );
  }
  return env;
}

function envLines(text: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    const eq = line.indexOf('=');
    if (eq <= 0) throw new BadRequestError(`env line ${JSON.stringify(line)} is not KEY=VALUE`);
    env[line.slice(0, eq)] = line.slice(eq + 1);
  }
  return env;
}
