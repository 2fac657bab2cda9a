/**
 * Arguments of commands and routes: their wire description and **the one** validator of kwargs,
 * used by the SDK (before a call leaves), the CLI (`-a key=value` words) and the command server
 * (every request). Built-ins only.
 */
import { ArgumentError } from './errors.js';

/** The argument types a command can declare. */
export const ARG_TYPES = ['str', 'int', 'float', 'bool'] as const;
export type ArgType = (typeof ARG_TYPES)[number];
/** A value an argument can hold. */
export type ArgValue = string | number | boolean;
/** Typed keyword arguments of a call. */
export type Kwargs = Record<string, ArgValue>;

/**
 * One argument as `GET /commands` describes it. Built-in routes may also take `env`: a JSON
 * object of strings or `KEY=VALUE` lines, and `argv`: a JSON array of strings, a program and its
 * arguments (both listed as `str` on the wire, which has no object or list type).
 */
export interface ArgSpec {
  name: string;
  type: ArgType | 'env' | 'argv';
  required: boolean;
  default?: ArgValue;
  description?: string;
}

/** Environment variable names (and argument names, which become shell variables). */
export const ENV_NAME_PATTERN = /^[A-Za-z_][A-Za-z0-9_]*$/;
/** Command names travel in URL paths and CLI words. */
export const COMMAND_NAME_PATTERN = /^[A-Za-z_][A-Za-z0-9_-]*$/;

/** True when `value` is a valid value of `type` (strict JSON: `int` needs a safe integer). */
export function fitsType(type: ArgSpec['type'], value: unknown): boolean {
  switch (type) {
    case 'str':
      return typeof value === 'string';
    case 'int':
      return typeof value === 'number' && Number.isSafeInteger(value);
    case 'float':
      return typeof value === 'number' && Number.isFinite(value);
    case 'bool':
      return typeof value === 'boolean';
    case 'env':
      return (
        typeof value === 'string' ||
        (typeof value === 'object' &&
          value !== null &&
          !Array.isArray(value) &&
          Object.values(value).every((x) => typeof x === 'string'))
      );
    case 'argv':
      // A program to run and its arguments: none empty-named, no NUL (which exec cannot pass).
      return (
        Array.isArray(value) &&
        value.length > 0 &&
        value[0] !== '' &&
        value.every((x) => typeof x === 'string' && !x.includes('\0'))
      );
  }
}

/** One line of usage: `train -a epochs=<int> [-a lr=<float, default 0.01>]`. */
export function usage(name: string, args: readonly ArgSpec[]): string {
  const parts = args.map((arg) => {
    const text = `-a ${arg.name}=<${arg.type}${arg.required ? '' : `, default ${JSON.stringify(arg.default)}`}>`;
    return arg.required ? text : `[${text}]`;
  });
  return [name, ...parts].join(' ');
}

/** Levenshtein distance (two rows); names are short. */
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

/** ` (did you mean 'x'?)` for a close name, else the names that exist. */
export function suggestName(name: string, candidates: readonly string[]): string {
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

function describeJson(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'number' && Number.isInteger(value)) return `the number ${value}`;
  if (typeof value === 'object') return 'an object';
  return `${typeof value} ${JSON.stringify(value)}`;
}

const JSON_TYPE_NAMES: Record<ArgSpec['type'], string> = {
  str: 'a string',
  int: 'an integer',
  float: 'a number',
  bool: 'true or false',
  env: 'an object of strings or KEY=VALUE lines',
  argv: 'a non-empty array of strings (the program first) without NUL characters',
};

/** Adds unknown and missing names to `problems`, throws if any, else applies defaults. */
function finish(
  name: string,
  args: readonly ArgSpec[],
  given: ReadonlyMap<string, unknown>,
  seen: ReadonlySet<string>,
  problems: string[],
): Record<string, unknown> {
  const names = args.map((a) => a.name);
  for (const key of seen) {
    if (!names.includes(key)) problems.push(`unknown argument '${key}'${suggestName(key, names)}`);
  }
  const missing = args.filter((a) => a.required && !seen.has(a.name)).map((a) => a.name);
  if (missing.length > 0) {
    problems.push(
      `missing required argument${missing.length > 1 ? 's' : ''}: ${missing.join(', ')}`,
    );
  }
  if (problems.length > 0) throw ArgumentError.of(name, problems, usage(name, args));
  const kwargs: Record<string, unknown> = {};
  for (const arg of args) {
    const value = given.has(arg.name) ? given.get(arg.name) : arg.default;
    if (value !== undefined) kwargs[arg.name] = value;
  }
  return kwargs;
}

/**
 * Validates JSON kwargs (an SDK call, a request body) with strict JSON types: no `"42"` for an
 * int, no `1` for a bool. Applies defaults; reports every wrong type, unknown name and missing
 * name at once, in one {@link ArgumentError}.
 */
export function validateKwargs(
  name: string,
  args: readonly ArgSpec[],
  kwargs: unknown,
): Record<string, unknown> {
  if (kwargs === undefined) kwargs = {};
  if (typeof kwargs !== 'object' || kwargs === null || Array.isArray(kwargs)) {
    throw ArgumentError.of(
      name,
      [`arguments must be a JSON object of name → value, not ${describeJson(kwargs)}`],
      usage(name, args),
    );
  }
  const problems: string[] = [];
  const given = new Map<string, unknown>();
  const seen = new Set(Object.keys(kwargs));
  for (const [key, value] of Object.entries(kwargs)) {
    const arg = args.find((a) => a.name === key);
    if (arg && !fitsType(arg.type, value)) {
      problems.push(`${key} must be ${JSON_TYPE_NAMES[arg.type]}, not ${describeJson(value)}`);
      continue;
    }
    given.set(key, value);
  }
  return finish(name, args, given, seen, problems);
}

const TEXT_HINTS: Record<ArgSpec['type'], string> = {
  str: 'text',
  env: 'KEY=VALUE lines',
  argv: 'a JSON array of strings, the program first',
  int: 'a whole number such as 42',
  float: 'a number such as 4.2 or 1e3',
  bool: 'true/false, yes/no or 1/0',
};

/** Converts one command-line word to a typed value, or returns why it cannot. */
function convertText(arg: ArgSpec, text: string): { value: ArgValue } | { error: string } {
  switch (arg.type) {
    case 'str':
    case 'env':
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
    case 'argv': {
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch {
        break;
      }
      // Typed as the other values for the caller: a route reads it back as string[].
      if (fitsType('argv', value)) return { value: value as unknown as ArgValue };
      break;
    }
  }
  return { error: `${arg.name}: ${JSON.stringify(text)} is not ${TEXT_HINTS[arg.type]}` };
}

/**
 * Parses `key=value` words (the CLI's `-a key=value`) into typed kwargs. `int` takes `42` but not
 * `4.2`; `float` takes `4.2` and `1e3`; `bool` takes true/false/yes/no/1/0 in any case; a value
 * may itself contain `=`. Defaults are applied. Every problem is reported in one
 * {@link ArgumentError}: bad values, unknown names (with a suggestion), repeats, missing names.
 */
export function parseArgPairs(
  name: string,
  args: readonly ArgSpec[],
  pairs: readonly string[],
): Record<string, unknown> {
  const problems: string[] = [];
  const given = new Map<string, unknown>();
  const seen = new Set<string>();
  for (const pair of pairs) {
    const eq = pair.indexOf('=');
    if (eq <= 0) {
      problems.push(`${JSON.stringify(pair)} is not key=value`);
      continue;
    }
    const key = pair.slice(0, eq);
    if (seen.has(key)) {
      problems.push(`${key} is given more than once`);
      continue;
    }
    seen.add(key);
    const arg = args.find((a) => a.name === key);
    if (!arg) continue;
    const converted = convertText(arg, pair.slice(eq + 1));
    if ('error' in converted) problems.push(converted.error);
    else given.set(key, converted.value);
  }
  return finish(name, args, given, seen, problems);
}

/**
 * Query strings carry only text: converts each known parameter to its type (leniently; a value
 * that does not convert stays text and fails validation with a clear message), then validates.
 */
export function validateQuery(
  route: string,
  args: readonly ArgSpec[],
  query: URLSearchParams,
): Record<string, unknown> {
  const raw: Record<string, unknown> = {};
  const repeated: string[] = [];
  for (const [key, text] of query) {
    if (Object.hasOwn(raw, key)) {
      repeated.push(`query parameter ${key} is repeated`);
      continue;
    }
    const arg = args.find((a) => a.name === key);
    const converted = arg ? convertText(arg, text) : { value: text };
    raw[key] = 'value' in converted ? converted.value : text;
  }
  if (repeated.length > 0) throw ArgumentError.of(route, repeated, usage(route, args));
  return validateKwargs(route, args, raw);
}
