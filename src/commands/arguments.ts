import { distance } from 'fastest-levenshtein';
import {
  type ArgType,
  type ArgValue,
  type CustomCommand,
  type CustomCommandArg,
  fitsType,
  type Kwargs,
} from './custom-command.js';
import { ArgumentError } from './errors.js';

const TYPE_HINTS: Record<ArgType, string> = {
  str: 'text',
  int: 'a whole number such as 42',
  float: 'a number such as 4.2 or 1e3',
  bool: 'true/false, yes/no or 1/0',
};

/** One line of usage: `train -a epochs=<int> [-a lr=<float, default 0.01>]`. */
export function commandUsage(command: CustomCommand): string {
  const parts = command.args.map((arg) => {
    const text = `-a ${arg.name}=<${arg.type}${arg.required ? '' : `, default ${JSON.stringify(arg.default)}`}>`;
    return arg.required ? text : `[${text}]`;
  });
  return [command.name, ...parts].join(' ');
}

function suggest(name: string, candidates: readonly string[]): string {
  let best: string | undefined;
  let bestDistance = Number.POSITIVE_INFINITY;
  for (const candidate of candidates) {
    const d = distance(name.toLowerCase(), candidate.toLowerCase());
    if (d < bestDistance) {
      best = candidate;
      bestDistance = d;
    }
  }
  if (best !== undefined && bestDistance <= Math.max(2, Math.floor(best.length / 3))) {
    return ` (did you mean '${best}'?)`;
  }
  return candidates.length > 0 ? ` (arguments: ${candidates.join(', ')})` : ' (it takes none)';
}

/** Converts one command-line word to a typed value, or returns why it cannot. */
function convertText(arg: CustomCommandArg, text: string): { value: ArgValue } | { error: string } {
  switch (arg.type) {
    case 'str':
      return { value: text };
    case 'int': {
      const value = Number(text);
      if (/^[+-]?\d+$/.test(text.trim()) && Number.isSafeInteger(value)) return { value };
      break;
    }
    case 'float': {
      const value = Number(text);
      if (/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(text.trim()) && Number.isFinite(value)) {
        return { value };
      }
      break;
    }
    case 'bool': {
      const lower = text.trim().toLowerCase();
      if (['true', 'yes', '1'].includes(lower)) return { value: true };
      if (['false', 'no', '0'].includes(lower)) return { value: false };
      break;
    }
  }
  return { error: `${arg.name}: ${JSON.stringify(text)} is not ${TYPE_HINTS[arg.type]}` };
}

/** Adds unknown and missing names to `problems`, throws if any, else applies defaults. */
function finish(
  command: CustomCommand,
  given: Map<string, ArgValue>,
  seen: ReadonlySet<string>,
  problems: string[],
): Kwargs {
  const names = command.args.map((a) => a.name);
  for (const name of seen) {
    if (!names.includes(name)) problems.push(`unknown argument '${name}'${suggest(name, names)}`);
  }
  const missing = command.args.filter((a) => a.required && !seen.has(a.name)).map((a) => a.name);
  if (missing.length > 0) {
    problems.push(
      `missing required argument${missing.length > 1 ? 's' : ''}: ${missing.join(', ')}`,
    );
  }
  if (problems.length > 0) throw new ArgumentError(command.name, problems, commandUsage(command));
  const kwargs: Kwargs = {};
  for (const arg of command.args) {
    const value = given.get(arg.name) ?? arg.default;
    if (value !== undefined) kwargs[arg.name] = value;
  }
  return kwargs;
}

/**
 * Parses `key=value` words (the CLI's `-a key=value`) into typed kwargs. `int` takes `42` but not
 * `4.2`; `float` takes `4.2` and `1e3`; `bool` takes true/false/yes/no/1/0 in any case; a value
 * may itself contain `=`. Defaults are applied. Every problem is reported in one
 * {@link ArgumentError}: bad values, unknown names (with a suggestion), repeats, missing names.
 */
export function parseCommandArgs(command: CustomCommand, pairs: readonly string[]): Kwargs {
  const problems: string[] = [];
  const given = new Map<string, ArgValue>();
  const seen = new Set<string>();
  for (const pair of pairs) {
    const eq = pair.indexOf('=');
    if (eq <= 0) {
      problems.push(`${JSON.stringify(pair)} is not key=value`);
      continue;
    }
    const name = pair.slice(0, eq);
    if (seen.has(name)) {
      problems.push(`${name} is given more than once`);
      continue;
    }
    seen.add(name);
    const arg = command.args.find((a) => a.name === name);
    if (!arg) continue;
    const converted = convertText(arg, pair.slice(eq + 1));
    if ('error' in converted) problems.push(converted.error);
    else given.set(name, converted.value);
  }
  return finish(command, given, seen, problems);
}

function describeJson(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'number' && Number.isInteger(value)) return `the number ${value}`;
  if (typeof value === 'object') return 'an object';
  return `${typeof value} ${JSON.stringify(value)}`;
}

const JSON_TYPE_NAMES: Record<ArgType, string> = {
  str: 'a string',
  int: 'an integer',
  float: 'a number',
  bool: 'true or false',
};

/**
 * Validates JSON kwargs (an SDK call, a request body) with strict JSON types: no `"42"` for an
 * int, no `1` for a bool. Defaults are applied; every problem is reported at once.
 */
export function validateKwargs(command: CustomCommand, kwargs: unknown): Kwargs {
  if (kwargs === undefined) kwargs = {};
  if (typeof kwargs !== 'object' || kwargs === null || Array.isArray(kwargs)) {
    throw new ArgumentError(
      command.name,
      [`arguments must be a JSON object of name → value, not ${describeJson(kwargs)}`],
      commandUsage(command),
    );
  }
  const problems: string[] = [];
  const given = new Map<string, ArgValue>();
  const seen = new Set(Object.keys(kwargs));
  for (const [name, value] of Object.entries(kwargs)) {
    const arg = command.args.find((a) => a.name === name);
    if (arg && !fitsType(arg.type, value)) {
      problems.push(`${name} must be ${JSON_TYPE_NAMES[arg.type]}, not ${describeJson(value)}`);
      continue;
    }
    given.set(name, value as ArgValue);
  }
  return finish(command, given, seen, problems);
}
