import { describe, expect, test } from 'vitest';
import { completeUtf8Length } from '../../runtime/envd/process-events.js';
import { OutputLog } from '../../runtime/server/output-log.js';

describe('OutputLog', () => {
  test('reads from any offset, at most maxBytes, across chunks', () => {
    const log = new OutputLog();
    for (const part of ['abc', 'def', 'ghi']) log.append(Buffer.from(part));
    expect(log.read(2, 4)).toEqual({ data: Buffer.from('cdef'), offset: 2, next: 6 });
    expect(log.read(6)).toEqual({ data: Buffer.from('ghi'), offset: 6, next: 9 });
    expect(log.read(20)).toEqual({ data: Buffer.alloc(0), offset: 20, next: 9 });
  });

  test('drops the oldest chunks past its capacity and says where it starts', () => {
    const log = new OutputLog(10 * 1024);
    const big = (char: string) => Buffer.alloc(6 * 1024, char);
    for (const char of 'abc') log.append(big(char));
    expect(log.start).toBe(12 * 1024);
    expect(log.end).toBe(18 * 1024);
    const { data, offset } = log.read(0);
    expect(offset).toBe(12 * 1024);
    expect(data.equals(big('c'))).toBe(true);
  });

  test('a burst of tiny writes is merged, so offsets still add up', () => {
    const log = new OutputLog();
    for (let i = 0; i < 10_000; i++) log.append(Buffer.from(`${i % 10}`));
    expect(log.end).toBe(10_000);
    expect(log.read(9_995).data.toString()).toBe('56789');
  });
});

describe('completeUtf8Length', () => {
  const euro = Buffer.from('€'); // e2 82 ac
  test.each([
    ['ascii', Buffer.from('abc'), 3],
    ['whole character', Buffer.concat([Buffer.from('a'), euro]), 4],
    ['lead byte only', Buffer.concat([Buffer.from('a'), euro.subarray(0, 1)]), 1],
    ['two of three bytes', Buffer.concat([Buffer.from('a'), euro.subarray(0, 2)]), 1],
    ['not UTF-8 at all', Buffer.from([0x61, 0xff]), 2],
    ['empty', Buffer.alloc(0), 0],
  ])('%s', (_, data, expected) => {
    expect(completeUtf8Length(data)).toBe(expected);
  });
});
