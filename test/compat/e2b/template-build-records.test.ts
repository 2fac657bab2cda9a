import { randomUUID } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, test } from 'vitest';
import {
  appendLog,
  type BuildRecord,
  BuildRecords,
  INTERRUPTED,
  MAX_LOG_CHARS,
  MAX_LOG_LINES,
} from '../../../src/compat/e2b/template-build-records.js';

// The records of E2B template builds on a real folder: what a restarted daemon reads back.
let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'build-records-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

function record(status: BuildRecord['status'], createdAt: number): BuildRecord {
  return {
    id: randomUUID(),
    template: 'tpl',
    owner: 'key-1',
    status,
    resources: {},
    logs: [],
    logChars: 0,
    createdAt,
  };
}

describe('BuildRecords', () => {
  test('a restart reads finished builds as they were and a running one as stopped', () => {
    const records = new BuildRecords(dir);
    const ready = record('ready', 1);
    appendLog(ready, 'step-output-line');
    const failed = record('error', 2);
    failed.reason = { message: 'step 2 failed', step: '2' };
    const running = record('building', 3);
    appendLog(running, 'half way');
    const waiting = record('waiting', 4);
    for (const r of [ready, failed, running, waiting]) records.save(r);

    const cleared: string[] = [];
    const loaded = new BuildRecords(dir).load((id) => cleared.push(id));
    expect(loaded.map((r) => [r.id, r.status])).toEqual([
      [ready.id, 'ready'],
      [failed.id, 'error'],
      [running.id, 'error'],
      [waiting.id, 'waiting'],
    ]);
    expect(loaded[0]?.logs.map((l) => l.message)).toEqual(['step-output-line']);
    expect(loaded[1]?.reason).toEqual({ message: 'step 2 failed', step: '2' });
    expect(loaded[2]?.reason).toEqual({ message: INTERRUPTED });
    expect(loaded[2]?.logs.map((l) => l.message)).toEqual(['half way', INTERRUPTED]);
    expect(cleared).toEqual([running.id]);
    // Rewritten: a second restart reads the same, and clears nothing again.
    const again = new BuildRecords(dir).load((id) => cleared.push(id));
    expect(again[2]?.status).toBe('error');
    expect(cleared).toEqual([running.id]);
  });

  test('keeps the newest records, removing older files; junk and stray temporary files go', () => {
    const records = new BuildRecords(dir, 3);
    const all = [5, 1, 4, 2, 3].map((t) => record('ready', t));
    for (const r of all) records.save(r);
    writeFileSync(join(dir, 'not-json.json'), '{');
    writeFileSync(join(dir, `${randomUUID()}.json`), JSON.stringify({ id: 'x' }));
    writeFileSync(join(dir, `${all[0]?.id}.json.abc.tmp`), 'half');
    const loaded = records.load();
    expect(loaded.map((r) => r.createdAt)).toEqual([3, 4, 5]);
    expect(readdirSync(dir).sort()).toEqual(loaded.map((r) => `${r.id}.json`).sort());
  });

  test('a file named for another id than it holds is not read (no record replaces another)', () => {
    const records = new BuildRecords(dir);
    const mine = record('ready', 1);
    records.save(mine);
    writeFileSync(join(dir, `${randomUUID()}.json`), JSON.stringify({ ...mine, owner: 'other' }));
    expect(records.load().map((r) => r.owner)).toEqual(['key-1']);
  });

  test('a log stops at its line or character cap, saying so once', () => {
    const build = record('building', 1);
    for (let i = 0; i < MAX_LOG_LINES + 5; i++) appendLog(build, `line ${i}`);
    expect(build.logs).toHaveLength(MAX_LOG_LINES + 1);
    expect(build.logs.at(-1)?.message).toMatch(/the build log is full/);

    const wide = record('building', 1);
    const line = 'x'.repeat(4000);
    for (let i = 0; i < MAX_LOG_CHARS / 4000 + 10; i++) appendLog(wide, line);
    expect(wide.logChars).toBeLessThanOrEqual(MAX_LOG_CHARS + 200);
    expect(wide.logs.at(-1)?.message).toMatch(/the build log is full/);
    expect(wide.logs.filter((l) => l.message.includes('full'))).toHaveLength(1);
    // One line longer than a line may be is cut, not dropped.
    const long = record('building', 1);
    appendLog(long, 'y'.repeat(10_000), 'error', 3);
    expect(long.logs[0]).toMatchObject({ level: 'error', step: '3' });
    expect(long.logs[0]?.message).toHaveLength(4001);
  });
});
