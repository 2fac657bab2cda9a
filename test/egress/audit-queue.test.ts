import { describe, expect, test } from 'vitest';
import {
  type EgressAuditEntry,
  EgressAuditQueue,
  QUEUE_FULL,
} from '../../src/egress/audit-queue.js';

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

/** A read's entries: a decision by its name, a note of drops by its kind. */
const names = (rows: EgressAuditEntry[]) =>
  rows.map((r) => (r.kind === 'dropped' ? r.kind : r.name));

// What the daemon reads of egress's decisions (GET /audit): acknowledged by seq within an epoch.
describe("egress's audit queue", () => {
  test('a read acknowledges the rows up to its `after`; a lost answer is read again', () => {
    const queue = new EgressAuditQueue();
    queue.push(row('a'));
    queue.push(row('b'));
    const first = queue.take(undefined, 0);
    expect(first.rows.map((r) => r.seq)).toEqual([1, 2]);
    expect(names(first.rows)).toEqual(['a', 'b']);
    // The daemon did not get that answer: it asks again from what it had, and gets both again.
    expect(names(queue.take(first.epoch, 0).rows)).toEqual(['a', 'b']);
    queue.push(row('c'));
    expect(names(queue.take(first.epoch, 2).rows)).toEqual(['c']);
    expect(queue.take(first.epoch, 3).rows).toEqual([]);
  });

  test("another epoch's cursor acknowledges nothing; past its bound a sandbox's drops are one note, acknowledged like a row", () => {
    const queue = new EgressAuditQueue(2);
    for (const name of ['a', 'b', 'c', 'd']) queue.push(row(name));
    queue.push({ ...row('e'), sandbox: 'other' });
    // A daemon that read an older egress process's seq 5 must not lose this one's rows.
    const read = queue.take('an-older-epoch', 5);
    expect(read.rows.map((r) => (r.kind === 'dropped' ? [r.sandbox, r.count] : r.name))).toEqual([
      'a',
      'b',
      ['sbx', 2],
      ['other', 1],
    ]);
    expect(read.rows[2]).toMatchObject({ kind: 'dropped', reason: QUEUE_FULL });
    // The answer was lost: the same notes come again, and a drop since then is a note of its own.
    queue.drop('sbx', QUEUE_FULL, 1);
    const again = queue.take(read.epoch, 0);
    expect(again.rows.map((r) => r.seq)).toEqual([...read.rows.map((r) => r.seq), 5]);
    expect(again.rows[4]).toMatchObject({ kind: 'dropped', sandbox: 'sbx', count: 1 });
    // An unknown number (a full raw-TCP set) stays unknown whatever is added to it.
    queue.drop('x', 'its set was full', null);
    queue.drop('x', 'its set was full', 3);
    expect(queue.take(read.epoch, 5).rows).toMatchObject([{ sandbox: 'x', count: null }]);
    expect(queue.take(read.epoch, 6).rows).toEqual([]);
  });
});
