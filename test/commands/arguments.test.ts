import { describe, expect, test } from 'vitest';
import {
  ArgumentError,
  type CustomCommand,
  commandUsage,
  parseCommandArgs,
  parseTemplate,
  validateKwargs,
} from '../../src/index.js';

const [demo] = parseTemplate(`name: t
custom_commands:
  demo:
    command: echo {x} {y} {ratio} {flag} {epochs}
    args:
      - { name: x, type: int }
      - { name: y, type: str, default: hello }
      - { name: ratio, type: float, default: 0.5 }
      - { name: flag, type: bool, default: false }
      - { name: epochs, type: int, default: 3 }
`).customCommands as [CustomCommand];

function argumentError(run: () => unknown): ArgumentError {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(ArgumentError);
    return error as ArgumentError;
  }
  throw new Error('expected an ArgumentError');
}

describe('parseCommandArgs (-a key=value)', () => {
  test('converts to the declared types and applies defaults', () => {
    expect(parseCommandArgs(demo, ['x=42', 'y=world'])).toEqual({
      x: 42,
      y: 'world',
      ratio: 0.5,
      flag: false,
      epochs: 3,
    });
  });

  test('int takes whole numbers only', () => {
    expect(parseCommandArgs(demo, ['x=-7']).x).toBe(-7);
    expect(argumentError(() => parseCommandArgs(demo, ['x=4.2'])).problems).toEqual([
      'x: "4.2" is not a whole number such as 42',
    ]);
    expect(argumentError(() => parseCommandArgs(demo, ['x=abc'])).problems).toEqual([
      'x: "abc" is not a whole number such as 42',
    ]);
    expect(
      argumentError(() => parseCommandArgs(demo, ['x=99999999999999999999'])).problems,
    ).toHaveLength(1);
  });

  test('float takes decimals and exponents', () => {
    expect(parseCommandArgs(demo, ['x=1', 'ratio=4.2']).ratio).toBe(4.2);
    expect(parseCommandArgs(demo, ['x=1', 'ratio=1e3']).ratio).toBe(1000);
    expect(parseCommandArgs(demo, ['x=1', 'ratio=-.5']).ratio).toBe(-0.5);
    for (const bad of ['', 'abc', '0x10', '1,5', 'Infinity']) {
      expect(argumentError(() => parseCommandArgs(demo, ['x=1', `ratio=${bad}`])).problems).toEqual(
        [`ratio: ${JSON.stringify(bad)} is not a number such as 4.2 or 1e3`],
      );
    }
  });

  test('bool takes true/false/yes/no/1/0 in any case', () => {
    const flag = (text: string) => parseCommandArgs(demo, ['x=1', `flag=${text}`]).flag;
    for (const yes of ['true', 'TRUE', 'Yes', '1']) expect(flag(yes)).toBe(true);
    for (const no of ['false', 'False', 'NO', '0']) expect(flag(no)).toBe(false);
    expect(argumentError(() => flag('maybe')).problems).toEqual([
      'flag: "maybe" is not true/false, yes/no or 1/0',
    ]);
  });

  test('a value may contain = and is kept verbatim', () => {
    expect(parseCommandArgs(demo, ['x=1', 'y=a=b=c', 'epochs=2']).y).toBe('a=b=c');
    expect(parseCommandArgs(demo, ['x=1', 'y=']).y).toBe('');
  });

  test('every problem is reported at once, with the usage', () => {
    const error = argumentError(() =>
      parseCommandArgs(demo, ['epoch=3', 'ratio=x', 'y=a', 'y=b', 'junk']),
    );
    expect(error.problems).toEqual([
      'ratio: "x" is not a number such as 4.2 or 1e3',
      'y is given more than once',
      '"junk" is not key=value',
      "unknown argument 'epoch' (did you mean 'epochs'?)",
      'missing required argument: x',
    ]);
    expect(error.usage).toBe(
      'demo -a x=<int> [-a y=<str, default "hello">] [-a ratio=<float, default 0.5>] [-a flag=<bool, default false>] [-a epochs=<int, default 3>]',
    );
    expect(error.message).toContain("invalid arguments for 'demo': ratio:");
  });

  test('an unknown name far from any argument lists the arguments', () => {
    expect(argumentError(() => parseCommandArgs(demo, ['x=1', 'zzzzzz=1'])).problems).toEqual([
      "unknown argument 'zzzzzz' (arguments: x, y, ratio, flag, epochs)",
    ]);
  });
});

describe('validateKwargs (JSON)', () => {
  test('strict JSON types, defaults applied', () => {
    expect(validateKwargs(demo, { x: 42, ratio: 2, flag: true })).toEqual({
      x: 42,
      y: 'hello',
      ratio: 2,
      flag: true,
      epochs: 3,
    });
  });

  test('no coercion: strings are not numbers, numbers are not bools', () => {
    const error = argumentError(() =>
      validateKwargs(demo, { x: '42', y: 5, ratio: '0.1', flag: 1, epochs: 2.5 }),
    );
    expect(error.problems).toEqual([
      'x must be an integer, not string "42"',
      'y must be a string, not the number 5',
      'ratio must be a number, not string "0.1"',
      'flag must be true or false, not the number 1',
      'epochs must be an integer, not number 2.5',
    ]);
  });

  test('null, arrays and objects are refused as values', () => {
    const error = argumentError(() => validateKwargs(demo, { x: null, y: ['a'], ratio: {} }));
    expect(error.problems).toEqual([
      'x must be an integer, not null',
      'y must be a string, not an array',
      'ratio must be a number, not an object',
    ]);
  });

  test('the kwargs must be an object', () => {
    for (const bad of [[1], 'x=1', null, 5]) {
      expect(argumentError(() => validateKwargs(demo, bad)).problems[0]).toMatch(
        /^arguments must be a JSON object of name → value, not /,
      );
    }
  });

  test('unknown and missing names are reported together', () => {
    expect(argumentError(() => validateKwargs(demo, { fla: true })).problems).toEqual([
      "unknown argument 'fla' (did you mean 'flag'?)",
      'missing required argument: x',
    ]);
  });

  test('a command without arguments accepts no kwargs and an empty object', () => {
    const [bare] = parseTemplate('name: t\ncustom_commands:\n  ls:\n    command: ls\n')
      .customCommands as [CustomCommand];
    expect(validateKwargs(bare, undefined)).toEqual({});
    expect(validateKwargs(bare, {})).toEqual({});
    expect(argumentError(() => validateKwargs(bare, { a: 1 })).problems).toEqual([
      "unknown argument 'a' (it takes none)",
    ]);
    expect(commandUsage(bare)).toBe('ls');
  });
});
