import { describe, expect, test } from 'vitest';
import { EgressAuditQueue } from '../../src/egress/audit-queue.js';

const row = (name: string) => ({
  at: 1,
  sandbox: 'sbx',
  kind: 'dns' as const,
  name,
  port: 53,
  allowed: false,
  rule: 'denied',
  up: 0,
  down: 0,
});

// What the daemon reads of egress's decisions (GET /audit): acknowledged by seq within an epoch.
describe("egress's audit queue", () => {
  test('a read acknowledges the rows up to its `after`; a lost answer is read again', () => {
    const queue = new EgressAuditQueue();
    queue.push(row('a'));
    queue.push(row('b'));
    const first = queue.take(undefined, 0);
    expect(first.rows.map((r) => [r.seq, r.name])).toEqual([
      [1, 'a'],
      [2, 'b'],
    ]);
    // The daemon did not get that answer: it asks again from what it had, and gets both again.
    expect(queue.take(first.epoch, 0).rows.map((r) => r.name)).toEqual(['a', 'b']);
    queue.push(row('c'));
    expect(queue.take(first.epoch, 2).rows.map((r) => r.name)).toEqual(['c']);
    expect(queue.take(first.epoch, 3).rows).toEqual([]);
  });

  test("another epoch's cursor acknowledges nothing; past its bound the queue counts drops once", () => {
    const queue = new EgressAuditQueue(2);
    for (const name of ['a', 'b', 'c', 'd']) queue.push(row(name));
    // A daemon that read an older egress process's seq 5 must not lose this one's rows.
    const read = queue.take('an-older-epoch', 5);
    expect(read.rows.map((r) => r.name)).toEqual(['a', 'b']);
    expect(read.dropped).toBe(2);
    expect(queue.take(read.epoch, 0).dropped).toBe(0);
  });
});
