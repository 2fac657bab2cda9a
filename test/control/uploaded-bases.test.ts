import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, test } from 'vitest';
import type { SandboxRecord } from '../../src/control/registry.js';
import { SqliteRegistry } from '../../src/control/sqlite-registry.js';
import { UploadedBases } from '../../src/control/workspace-uploads.js';
import { sandboxRow } from './registry-stores.js';

// The count of an uploaded workspace's base is the registry's rows (docs/workspaces.md, "Whose
// base, and until when"), on a real SQLite registry: a base goes when no running, paused or
// pooled row names it and no create or fork under way holds it; nothing but a base of its own
// folder is ever removed.

let dir: string;
let registry: SqliteRegistry;
let bases: UploadedBases;

/** A base folder with a file, as an upload leaves it. */
function makeBase(id: string): string {
  const base = bases.baseOf(id);
  mkdirSync(base, { recursive: true });
  writeFileSync(join(base, 'a.txt'), 'a\n');
  return base;
}

/** A row of a sandbox whose workspace's base is `from`. */
async function rowNaming(from: string, overrides: Partial<SandboxRecord> = {}) {
  const row = sandboxRow(overrides);
  row.handle.workspace = {
    from,
    path: '/home/user/workspace',
    view: '',
    upper: '',
    dir: '',
    mountedAt: 0,
  };
  expect(await registry.insertSandbox(row)).toBe(true);
  return row;
}

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'abx-bases-'));
  registry = new SqliteRegistry(join(dir, 'abx.db'));
  bases = new UploadedBases(join(dir, 'workspace-bases'), registry);
});

afterEach(async () => {
  await registry.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('uploaded workspace bases, counted by registry rows', () => {
  test('a base shared by two sandboxes goes with the last one; a pin holds one without a row', async () => {
    const shared = makeBase('wsu_AAAAAAAAAAAAAAAA');
    const source = await rowNaming(shared);
    const fork = await rowNaming(shared);
    expect(
      await registry.pauseSandbox(fork.id, { memory: false, at: 1 }, Date.now() + 60_000),
    ).toBe(true);
    await registry.endSandbox(source.id, 'killed', 'killed');
    await bases.dropIfUnused(shared);
    expect(existsSync(shared)).toBe(true); // the paused fork names it
    await registry.endSandbox(fork.id, 'expired', 'expired');
    await bases.dropIfUnused(shared);
    expect(existsSync(join(dir, 'workspace-bases', 'wsu_AAAAAAAAAAAAAAAA'))).toBe(false);

    // A create under way (no row yet) holds its base; its failure removes it.
    const pinned = makeBase('wsu_BBBBBBBBBBBBBBBB');
    bases.pin(pinned);
    await bases.dropIfUnused(pinned);
    expect(existsSync(pinned)).toBe(true);
    await bases.unpin(pinned);
    expect(existsSync(pinned)).toBe(false);
  });

  test('only a base of its own folder is ever removed; the start sweeps those no row names', async () => {
    const host = join(dir, 'host', 'base');
    mkdirSync(host, { recursive: true });
    const elsewhere = join(dir, 'other', 'workspace-bases', 'wsu_CCCCCCCCCCCCCCCC', 'base');
    mkdirSync(elsewhere, { recursive: true });
    const odd = join(dir, 'workspace-bases', 'not-an-id', 'base');
    mkdirSync(odd, { recursive: true });
    for (const from of [host, elsewhere, odd]) {
      await bases.dropIfUnused(from);
      expect(existsSync(from)).toBe(true);
    }
    rmSync(join(dir, 'workspace-bases', 'not-an-id'), { recursive: true });

    const used = makeBase('wsu_DDDDDDDDDDDDDDDD');
    await rowNaming(used);
    const left = makeBase('wsu_EEEEEEEEEEEEEEEE');
    expect(await bases.sweep()).toEqual(['wsu_EEEEEEEEEEEEEEEE']);
    expect([existsSync(used), existsSync(left)]).toEqual([true, false]);
  });

  test('a sweep while a create writes its row and lets go of its pin keeps that base', async () => {
    // The rows are read just before the create's row is written; the pin goes just after.
    let meanwhile: (() => Promise<void>) | undefined;
    bases = new UploadedBases(join(dir, 'workspace-bases'), {
      listSandboxes: async (filter) => {
        const read = await registry.listSandboxes(filter);
        const step = meanwhile;
        meanwhile = undefined;
        await step?.();
        return read;
      },
    });
    const base = makeBase('wsu_FFFFFFFFFFFFFFFF');
    bases.pin(base);
    meanwhile = async () => {
      await rowNaming(base);
      await bases.unpin(base);
    };
    expect(await bases.sweep()).toEqual([]);
    expect(existsSync(base)).toBe(true);
  });
});
