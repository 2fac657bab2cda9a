import { describe, expect, test } from 'vitest';
import { formatContentWithLineNumbers, MAX_LINE_LENGTH } from '../../src/index.js';

describe('formatContentWithLineNumbers', () => {
  test('right-aligns numbers, two spaces, from the given start line', () => {
    expect(formatContentWithLineNumbers('a\nb\n', 9)).toBe('     9  a\n    10  b');
    expect(formatContentWithLineNumbers(['x', ''])).toBe('     1  x\n     2  ');
  });

  test('splits long lines into N.1, N.2 rows', () => {
    const long = `${'a'.repeat(MAX_LINE_LENGTH)}${'b'.repeat(MAX_LINE_LENGTH)}c`;
    const rows = formatContentWithLineNumbers(`short\n${long}`).split('\n');
    expect(rows.map((r) => r.slice(0, 8))).toEqual([
      '     1  ',
      '     2  ',
      '   2.1  ',
      '   2.2  ',
    ]);
    expect(rows[3]).toBe('   2.2  c');
  });

  test('an empty text gives no rows', () => {
    expect(formatContentWithLineNumbers('')).toBe('');
  });
});
