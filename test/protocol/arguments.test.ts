import { describe, expect, test } from 'vitest';
import {
  type ArgSpec,
  parseArgPairs,
  usage,
  validateKwargs,
  validateQuery,
} from '../../runtime/protocol/arguments.js';
import { ArgumentError, InvalidArgumentError, SandboxError } from '../../src/index.js';

// The one kwargs validator: the SDK, the CLI and the command server all call these functions, so
// what they answer here is what a user sees from each of them.
const ARGS: ArgSpec[] = [
  { name: 'path', type: 'str', required: true },
  { name: 'top', type: 'int', required: false, default: 10 },
  { name: 'ratio', type: 'float', required: false, default: 0.5 },
  { name: 'verbose', type: 'bool', required: false, default: false },
  { name: 'label', type: 'str', required: false, description: 'no default' },
];

function problemsOf(run: () => unknown): readonly string[] {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(ArgumentError);
    return (error as ArgumentError).problems;
  }
  throw new Error('expected an ArgumentError');
}

describe('validateKwargs (JSON)', () => {
  test('applies defaults and keeps what fits', () => {
    expect(validateKwargs('summarize', ARGS, { path: 'a' })).toEqual({
      path: 'a',
      top: 10,
      ratio: 0.5,
      verbose: false,
    });
    expect(validateKwargs('summarize', ARGS, { path: 'a', ratio: 4, label: 'x' })).toEqual({
      path: 'a',
      top: 10,
      ratio: 4,
      verbose: false,
      label: 'x',
    });
  });

  test.each<[string, unknown, string]>([
    ['int given a float', { path: 'a', top: 1.5 }, 'top must be an integer, not number 1.5'],
    ['int past the safe range', { path: 'a', top: 2 ** 53 }, 'top must be an integer'],
    ['text for an int', { path: 'a', top: '3' }, 'top must be an integer, not string "3"'],
    ['a number for a bool', { path: 'a', verbose: 1 }, 'verbose must be true or false'],
    ['null', { path: null }, 'path must be a string, not null'],
    ['infinity', { path: 'a', ratio: Number.POSITIVE_INFINITY }, 'ratio must be a number'],
    ['an object', { path: { x: 1 } }, 'path must be a string, not an object'],
    ['an array', { path: ['a'] }, 'path must be a string, not an array'],
    ['nothing', {}, 'missing required argument: path'],
    [
      'a close name',
      { path: 'a', verbos: true },
      "unknown argument 'verbos' (did you mean 'verbose'?)",
    ],
    ['a far name', { path: 'a', zzzzzzzz: 1 }, "unknown argument 'zzzzzzzz' (arguments: path, top"],
    ['an array body', [1], 'arguments must be a JSON object of name → value, not an array'],
    ['a string body', 'path=a', 'not string "path=a"'],
    ['a null body', null, 'not null'],
  ])('%s is refused, saying why', (_, kwargs, problem) => {
    expect(problemsOf(() => validateKwargs('summarize', ARGS, kwargs)).join('\n')).toContain(
      problem,
    );
  });

  test('every problem at once: wrong types, then unknown names, then missing ones', () => {
    const problems = problemsOf(() =>
      validateKwargs('summarize', ARGS, { top: 'x', verbose: 'yes', pth: 'a' }),
    );
    expect(problems).toEqual([
      'top must be an integer, not string "x"',
      'verbose must be true or false, not string "yes"',
      "unknown argument 'pth' (did you mean 'path'?)",
      'missing required argument: path',
    ]);
  });

  test('the error carries the usage line and is a SandboxError of status 400', () => {
    const error = (() => {
      try {
        validateKwargs('summarize', ARGS, {});
      } catch (e) {
        return e as ArgumentError;
      }
    })();
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect(error).toBeInstanceOf(SandboxError);
    expect([error?.status, error?.type, error?.command]).toEqual([
      400,
      'ArgumentError',
      'summarize',
    ]);
    expect(error?.usage).toBe(usage('summarize', ARGS));
    expect(error?.usage).toBe(
      'summarize -a path=<str> [-a top=<int, default 10>] [-a ratio=<float, default 0.5>] [-a verbose=<bool, default false>] [-a label=<str, default undefined>]',
    );
  });

  test('a hostile body with thousands of names gets a capped list', () => {
    const body = Object.fromEntries(Array.from({ length: 5000 }, (_, i) => [`x${i}`, i]));
    const problems = problemsOf(() => validateKwargs('summarize', ARGS, body));
    expect(problems).toHaveLength(21);
    expect(problems.at(-1)).toBe('and 4981 more problems');
  });

  test('__proto__ is an unknown name, not a prototype', () => {
    const body = JSON.parse('{"path": "a", "__proto__": {"top": 99}}');
    expect(problemsOf(() => validateKwargs('summarize', ARGS, body))).toEqual([
      "unknown argument '__proto__' (arguments: path, top, ratio, verbose, label)",
    ]);
  });
});

describe('parseArgPairs (CLI words)', () => {
  test('converts text to each type; a value may hold =', () => {
    expect(
      parseArgPairs('summarize', ARGS, ['path=a=b', 'top=-3', 'ratio=1e3', 'verbose=YES']),
    ).toEqual({ path: 'a=b', top: -3, ratio: 1000, verbose: true });
  });

  test('bad words, repeats, unknown and missing names in one error', () => {
    expect(
      problemsOf(() => parseArgPairs('summarize', ARGS, ['top=4.2', 'top=1', 'nokey', 'pat=a'])),
    ).toEqual([
      'top: "4.2" is not a whole number such as 42',
      'top is given more than once',
      '"nokey" is not key=value',
      "unknown argument 'pat' (did you mean 'path'?)",
      'missing required argument: path',
    ]);
  });
});

describe('validateQuery (query strings)', () => {
  test('converts known parameters, then validates like a body', () => {
    expect(
      validateQuery('r', ARGS, new URLSearchParams('path=a&top=5&verbose=true&ratio=.5')),
    ).toEqual({ path: 'a', top: 5, ratio: 0.5, verbose: true });
    expect(
      problemsOf(() => validateQuery('r', ARGS, new URLSearchParams('path=a&top=five'))),
    ).toEqual(['top must be an integer, not string "five"']);
  });

  test('a repeated parameter is refused', () => {
    expect(
      problemsOf(() => validateQuery('r', ARGS, new URLSearchParams('path=a&path=b'))),
    ).toEqual(['query parameter path is repeated']);
  });
});
