import { ArgumentError, BadRequestError } from './errors.js';

/** The argument types of the wire contract. */
export type ArgType = 'str' | 'int' | 'float' | 'bool';
export type ArgValue = string | number | boolean;

/**
 * One argument as `GET /commands` describes it. Built-in routes may also use `env`: a JSON object
 * of strings or `KEY=VALUE` lines, listed as `str` on the wire since the contract has no object
 * type.
 */
export interface ArgSpec {
  name: string;
  type: ArgType | 'env';
  required: boolean;
  default?: ArgValue;
  description?: string;
}

const TYPE_NAMES: Record<ArgSpec['type'], string> = {
  str: 'a string',
  int: 'an integer',
  float: 'a number',
  bool: 'true or false',
  env: 'an object of strings or KEY=VALUE lines',
};

const FITS: Record<ArgSpec['type'], (value: unknown) => boolean> = {
  str: (v) => typeof v === 'string',
  int: (v) => typeof v === 'number' && Number.isSafeInteger(v),
  float: (v) => typeof v === 'number' && Number.isFinite(v),
  bool: (v) => typeof v === 'boolean',
  env: (v) =>
    typeof v === 'string' ||
    (typeof v === 'object' &&
      v !== null &&
      !Array.isArray(v) &&
      Object.values(v).every((x) => typeof x === 'string')),
};

function describeJson(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'number' && Number.isInteger(value)) return `the number ${value}`;
  if (typeof value === 'object') return 'an object';
  return `${typeof value} ${JSON.stringify(value)}`;
}

function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) {
      next[j] = Math.min(
        (row[j] ?? 0) + 1,
        (next[j - 1] ?? 0) + 1,
        (row[j - 1] ?? 0) + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    }
    row = next;
  }
  return row[b.length] ?? 0;
}

function suggest(name: string, candidates: readonly string[]): string {
  let best: string | undefined;
  let bestDistance = Number.POSITIVE_INFINITY;
  for (const candidate of candidates) {
    const d = editDistance(name.toLowerCase(), candidate.toLowerCase());
    if (d < bestDistance) [best, bestDistance] = [candidate, d];
  }
  if (best !== undefined && bestDistance <= Math.max(2, Math.floor(best.length / 3))) {
    return ` (did you mean '${best}'?)`;
  }
  return candidates.length > 0 ? ` (arguments: ${candidates.join(', ')})` : ' (it takes none)';
}

/** One line of usage: `train -a epochs=<int> [-a lr=<float, default 0.01>]`. */
export function usage(name: string, args: readonly ArgSpec[]): string {
  const parts = args.map((arg) => {
    const text = `-a ${arg.name}=<${arg.type}${arg.required ? '' : `, default ${JSON.stringify(arg.default)}`}>`;
    return arg.required ? text : `[${text}]`;
  });
  return [name, ...parts].join(' ');
}

/**
 * Validates JSON kwargs with the strict rules of the client's parser (`validateKwargs` in
 * src/commands/arguments.ts, which runtime code cannot import): no `"42"` for an int, no `1` for
 * a bool. Applies defaults; reports every wrong type, unknown name and missing name at once.
 */
export function validateKwargs(
  name: string,
  args: readonly ArgSpec[],
  kwargs: unknown,
): Record<string, unknown> {
  if (kwargs === undefined) kwargs = {};
  if (typeof kwargs !== 'object' || kwargs === null || Array.isArray(kwargs)) {
    throw new ArgumentError(
      name,
      [`arguments must be a JSON object of name → value, not ${describeJson(kwargs)}`],
      usage(name, args),
    );
  }
  const problems: string[] = [];
  const names = args.map((a) => a.name);
  const given = kwargs as Record<string, unknown>;
  // Same order as the client's parser: wrong types, then unknown names, then missing ones.
  for (const [key, value] of Object.entries(given)) {
    const arg = args.find((a) => a.name === key);
    if (arg && !FITS[arg.type](value)) {
      problems.push(`${key} must be ${TYPE_NAMES[arg.type]}, not ${describeJson(value)}`);
    }
  }
  for (const key of Object.keys(given)) {
    if (!names.includes(key)) problems.push(`unknown argument '${key}'${suggest(key, names)}`);
  }
  const missing = args
    .filter((a) => a.required && !Object.hasOwn(given, a.name))
    .map((a) => a.name);
  if (missing.length > 0) {
    problems.push(
      `missing required argument${missing.length > 1 ? 's' : ''}: ${missing.join(', ')}`,
    );
  }
  if (problems.length > 0) throw new ArgumentError(name, problems, usage(name, args));
  const result: Record<string, unknown> = {};
  for (const arg of args) {
    const value = Object.hasOwn(given, arg.name) ? given[arg.name] : arg.default;
    if (value !== undefined) result[arg.name] = value;
  }
  return result;
}

const QUERY_PARSERS: Record<ArgSpec['type'], (text: string) => unknown> = {
  str: (t) => t,
  env: (t) => t,
  int: (t) => (/^[+-]?\d+$/.test(t) ? Number(t) : t),
  float: (t) => (t.trim() !== '' && Number.isFinite(Number(t)) ? Number(t) : t),
  bool: (t) => ({ true: true, '1': true, false: false, '0': false })[t.toLowerCase()] ?? t,
};

/** Query strings carry only text: convert each known parameter to its type, then validate. */
export function validateQuery(
  route: string,
  args: readonly ArgSpec[],
  query: URLSearchParams,
): Record<string, unknown> {
  const raw: Record<string, unknown> = {};
  for (const [key, text] of query) {
    if (Object.hasOwn(raw, key)) throw new BadRequestError(`query parameter ${key} is repeated`);
    const arg = args.find((a) => a.name === key);
    raw[key] = arg ? QUERY_PARSERS[arg.type](text) : text;
  }
  return validateKwargs(route, args, raw);
}

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

/** Turns an `env` argument into an environment object. */
export function envOf(value: unknown): Record<string, string> {
  if (value === undefined) return {};
  if (typeof value !== 'string') return value as Record<string, string>;
  const env: Record<string, string> = {};
  for (const line of value.split('\n')) {
    if (line.trim() === '') continue;
    const eq = line.indexOf('=');
    if (eq <= 0) throw new BadRequestError(`env line ${JSON.stringify(line)} is not KEY=VALUE`);
    env[line.slice(0, eq)] = line.slice(eq + 1);
  }
  return env;
}
