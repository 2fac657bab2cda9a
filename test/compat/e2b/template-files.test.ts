import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, test } from 'vitest';
import { TEMPLATE_FILES_UNUSED_MS, TemplateFiles } from '../../../src/compat/e2b/template-files.js';
import { archive } from '../../helpers/crafted-tar.js';

// The store of E2B template uploads on a real folder, with its clock injected: what a prune
// removes and what it must keep.
const HOUR = 3600_000;
let dir: string;
let now: number;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'template-files-'));
  now = Date.UTC(2026, 0, 1);
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

/** A tar of `size` bytes of `fill`, and a filesHash (any hex SHA-256 the client names it by). */
function upload(fill: string, size = 1000): { tar: Buffer; hash: string } {
  const tar = archive([{ name: 'f.txt', body: fill.repeat(size) }]);
  return { tar, hash: createHash('sha256').update(`hash of ${fill}`).digest('hex') };
}

async function put(
  files: TemplateFiles,
  owner: string | null,
  what: { tar: Buffer; hash: string },
) {
  await files.receive(files.uploadToken(owner, what.hash), what.hash, Readable.from([what.tar]));
}

const blobs = () => readdirSync(join(dir, 'blobs')).sort();
const sha = (tar: Buffer) => createHash('sha256').update(tar).digest('hex');

describe('TemplateFiles prune', () => {
  test('an upload unused for 24 hours goes with its blob; a use (present, a build) keeps it', async () => {
    const files = new TemplateFiles(dir, { now: () => now });
    const a = upload('a');
    const b = upload('b');
    await put(files, 'key-1', a);
    await put(files, 'key-1', b);
    now += TEMPLATE_FILES_UNUSED_MS - HOUR;
    expect(files.present('key-1', a.hash)).toBe(true);
    const out = mkdtempSync(join(dir, 'out-'));
    await files.extract('key-1', a.hash, out);
    now += 2 * HOUR;
    expect(files.prune()).toEqual({ removed: 1, freed: b.tar.length });
    expect(files.present('key-1', b.hash)).toBe(false);
    expect(files.present('key-1', a.hash)).toBe(true);
    expect(blobs()).toEqual([sha(a.tar)]);
  });

  test("a key's least recently used uploads go past its cap; another key's stay, and a blob both name stays", async () => {
    const one = upload('1');
    const files = new TemplateFiles(dir, { now: () => now, maxBytesPerKey: 2.5 * one.tar.length });
    const two = upload('2');
    const three = upload('3');
    await put(files, 'key-1', one);
    now += 1000;
    await put(files, 'key-1', two);
    now += 1000;
    await put(files, 'key-2', one);
    now += 1000;
    expect(files.present('key-1', one.hash)).toBe(true); // used again: now two is the oldest
    now += 1000;
    await put(files, 'key-1', three);
    expect(files.present('key-1', two.hash)).toBe(false);
    expect(files.present('key-1', one.hash)).toBe(true);
    expect(files.present('key-1', three.hash)).toBe(true);
    expect(files.present('key-2', one.hash)).toBe(true);
    expect(blobs()).toEqual([sha(one.tar), sha(three.tar)].sort());

    // key-1 drops `one` later: key-2 still names the same bytes, so the blob stays.
    now += TEMPLATE_FILES_UNUSED_MS - 1000;
    files.present('key-1', three.hash);
    files.present('key-2', one.hash);
    now += 2000;
    files.prune();
    expect(files.present('key-1', one.hash)).toBe(false);
    expect(files.present('key-2', one.hash)).toBe(true);
    expect(blobs()).toEqual([sha(one.tar), sha(three.tar)].sort());
  });

  test("a build's held uploads survive any prune until it releases them", async () => {
    const a = upload('a');
    const files = new TemplateFiles(dir, { now: () => now, maxBytesPerKey: a.tar.length + 10 });
    const b = upload('b');
    await put(files, 'key-1', a);
    const release = files.hold('key-1', [a.hash]);
    now += 1000;
    // Over the cap with b: a is the least recently used, but held.
    await put(files, 'key-1', b);
    now += 2 * TEMPLATE_FILES_UNUSED_MS;
    files.prune();
    expect(files.present('key-1', a.hash)).toBe(true);
    expect(files.present('key-1', b.hash)).toBe(false);
    release();
    release(); // twice is once
    now += 2 * TEMPLATE_FILES_UNUSED_MS;
    files.prune();
    expect(files.present('key-1', a.hash)).toBe(false);
    expect(blobs()).toEqual([]);
  });

  test('junk in the index, blobs no entry names and old half-written uploads go; a young one stays', async () => {
    const files = new TemplateFiles(dir, { now: () => now });
    const a = upload('a');
    await put(files, 'key-1', a);
    mkdirSync(join(dir, 'staging'), { recursive: true });
    writeFileSync(join(dir, 'staging', 'old.part'), 'x');
    utimesSync(join(dir, 'staging', 'old.part'), now / 1000, now / 1000);
    writeFileSync(join(dir, 'blobs', 'f'.repeat(64)), 'nobody names me');
    writeFileSync(join(dir, 'index', 'key-1', 'e'.repeat(64)), 'not a sha');
    now += TEMPLATE_FILES_UNUSED_MS + HOUR;
    expect(files.present('key-1', a.hash)).toBe(true);
    writeFileSync(join(dir, 'staging', 'young.part'), 'x');
    utimesSync(join(dir, 'staging', 'young.part'), now / 1000, now / 1000);
    files.prune();
    expect(blobs()).toEqual([sha(a.tar)]);
    expect(readdirSync(join(dir, 'index', 'key-1'))).toEqual([a.hash]);
    expect(readdirSync(join(dir, 'staging'))).toEqual(['young.part']);
  });
});
