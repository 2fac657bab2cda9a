import { mkdtemp, readdir, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, test } from 'vitest';
import { BundleCache } from '../../src/sandbox/bundle-cache.js';
import { ensureBuilt } from '../helpers/build.js';

// The cache trusts a file's stat only once its last change lies ~50 ms in the past (timestamps
// come from a coarse clock); files written by a test wait this long before they are bundled.
const settle = () => new Promise((resolve) => setTimeout(resolve, 120));

let dir: string;
let cacheDir: string;
let entry: string;
let helper: string;

beforeEach(async () => {
  ensureBuilt();
  dir = await mkdtemp(join(tmpdir(), 'abx-bundle-'));
  cacheDir = join(dir, 'cache');
  entry = join(dir, 'entry.cjs');
  helper = join(dir, 'helper.cjs');
  await writeFile(entry, "globalThis.answer = require('./helper.cjs');\n");
  await writeFile(helper, "module.exports = 'v1';\n");
  await settle();
});

afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('BundleCache', () => {
  test('a second bundle of the same modules is not built again, in memory or from disk', async () => {
    const cache = new BundleCache(() => cacheDir);
    const first = await cache.bundle([entry], {});
    expect(first.code).toContain('"v1"');
    const again = await cache.bundle([entry], {});
    expect(again.sha256).toBe(first.sha256);
    expect(cache.stats).toEqual({ builds: 1, memoryHits: 1, diskHits: 0 });

    // Another process: nothing in memory, the entry on disk.
    const other = new BundleCache(() => cacheDir);
    expect((await other.bundle([entry], {})).sha256).toBe(first.sha256);
    expect(other.stats).toEqual({ builds: 0, memoryHits: 0, diskHits: 1 });
    expect((await readdir(join(cacheDir))).filter((name) => name.endsWith('.json'))).toHaveLength(
      1,
    );
  });

  test('a changed import is bundled again, even with the same size and mtime', async () => {
    const cache = new BundleCache(() => cacheDir);
    const first = await cache.bundle([entry], {});
    const before = await stat(helper);
    await writeFile(helper, "module.exports = 'v2';\n");
    await utimes(helper, before.atime, before.mtime);
    const changed = await cache.bundle([entry], {});
    expect(changed.code).toContain('"v2"');
    expect(changed.sha256).not.toBe(first.sha256);
    expect(cache.stats.builds).toBe(2);
    // A process that finds the old entry on disk does not use it either.
    const other = new BundleCache(() => cacheDir);
    expect((await other.bundle([entry], {})).code).toContain('"v2"');
  });

  test('a touched file with the same content still hits', async () => {
    const cache = new BundleCache(() => cacheDir);
    const first = await cache.bundle([entry], {});
    const later = new Date(Date.now() + 60_000);
    await utimes(helper, later, later);
    expect((await cache.bundle([entry], {})).sha256).toBe(first.sha256);
    expect(cache.stats).toEqual({ builds: 1, memoryHits: 1, diskHits: 0 });
  });

  test('other schemas, other modules or a missing input are other bundles', async () => {
    const cache = new BundleCache(() => false);
    await cache.bundle([entry], {});
    const shipped = {
      'Cmd.run': { name: 'run', description: '', args: [], template: 't' },
    };
    const withSchemas = await cache.bundle([entry], shipped);
    expect(withSchemas.code).toContain('Cmd.run');
    await cache.bundle([helper], {});
    expect(cache.stats.builds).toBe(3);
    await rm(helper);
    await expect(cache.bundle([entry], {})).rejects.toThrow(/cannot bundle the command modules/);
  });

  test('concurrent requests for one bundle share a build; reset forgets memory', async () => {
    const cache = new BundleCache(() => false);
    const [a, b] = await Promise.all([cache.bundle([entry], {}), cache.bundle([entry], {})]);
    expect(a.sha256).toBe(b.sha256);
    expect(cache.stats.builds).toBe(1);
    cache.reset();
    await cache.bundle([entry], {});
    expect(cache.stats).toEqual({ builds: 1, memoryHits: 0, diskHits: 0 });
  });
});
