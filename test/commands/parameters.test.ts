import { describe, expect, test } from 'vitest';
import { parseParameters } from '../../src/commands/parameters.js';

describe('parseParameters reads any function form with a real parser', () => {
  test.each([
    ['a method', { m(a: string, b = 2) {} }.m, ['a', 'b=2']],
    ['an async method', { async m(a: string) {} }.m, ['a']],
    ['a generator method', { *m(a: string, b = 'x') {} }.m, ['a', 'b="x"']],
    ['a string-keyed method', { 'my-cmd'(a = true) {} }['my-cmd'], ['a=true']],
    ['a function', function named(a: number, b = -1.5) {}, ['a', 'b=-1.5']],
    ['an arrow', (a: number, b = `t`) => {}, ['a', 'b="t"']],
    ['a single-parameter arrow', (a: number) => a, ['a']],
  ])('%s', (_, fn, expected) => {
    const params = parseParameters(fn as () => unknown).map((p) =>
      p.kind === 'identifier'
        ? p.default
          ? `${p.name}=${p.default.literal ? JSON.stringify(p.default.value) : p.default.text}`
          : p.name
        : `${p.kind}:${p.text}`,
    );
    expect(params).toEqual(expected);
  });

  test('non-literal defaults, destructuring and rest are reported with their source text', () => {
    const fn = function f(
      { a }: { a: number },
      [b]: number[],
      c = Math.max(1, 2),
      ...rest: number[]
    ) {
      return [a, b, c, rest];
    };
    expect(parseParameters(fn as () => unknown)).toEqual([
      { kind: 'destructured', text: '{ a }' },
      { kind: 'destructured', text: '[b]' },
      { kind: 'identifier', name: 'c', default: { literal: false, text: 'Math.max(1, 2)' } },
      { kind: 'rest', text: '...rest' },
    ]);
  });

  test('native and bound functions cannot be read', () => {
    expect(() => parseParameters(Math.max)).toThrow(/native or bound function/);
    expect(() => parseParameters((() => 1).bind(null))).toThrow(/native or bound function/);
  });
});
