import { execFileSync, spawnSync } from 'node:child_process';
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  renameSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { changes, type WorkspaceChanges } from '../../src/workspace/index.js';

// A real overlay needs root (or a user namespace); the folder-only tests cover the rest.
const canMount = process.getuid?.() === 0 && spawnSync('mount', ['--version']).status === 0;

describe.skipIf(!canMount)('changes() with the overlay upper layer as a hint', () => {
  const tmp = mkdtempSync(join(tmpdir(), 'abx-workspace-overlay-'));
  const base = join(tmp, 'lower');
  const upper = join(tmp, 'upper');
  const merged = join(tmp, 'merged');
  let mounted = false;

  beforeAll(() => {
    for (const d of [base, upper, join(tmp, 'work'), merged]) mkdirSync(d);
    const files: Record<string, string> = {
      'keep/a.txt': 'a\n',
      'keep/deep/c.txt': 'c\n',
      'edit.txt': 'before\n',
      'touched.txt': 'same\n',
      'deleted.txt': 'gone\n',
      'opaque/o1.txt': 'o1\n',
      'opaque/o2.txt': 'o2\n',
      'opaque/sub/s.txt': 's\n',
      'gone/g.txt': 'g\n',
      'mv.txt': 'moving\n',
      'mode.sh': 'echo\n',
      'tofile/t.txt': 't\n',
    };
    for (const [p, text] of Object.entries(files)) {
      mkdirSync(join(base, p, '..'), { recursive: true });
      writeFileSync(join(base, p), text);
    }
    // Many untouched files: the hint never needs to look at them.
    mkdirSync(join(base, 'many'));
    for (let i = 0; i < 500; i++) writeFileSync(join(base, 'many', `f${i}`), `${i}\n`);
    execFileSync('mount', [
      '-t',
      'overlay',
      'overlay',
      '-o',
      `lowerdir=${base},upperdir=${upper},workdir=${join(tmp, 'work')}`,
      merged,
    ]);
    mounted = true;

    // The agent, in the merged view.
    const m = (p: string) => join(merged, p);
    writeFileSync(m('edit.txt'), 'after\n');
    chmodSync(m('touched.txt'), 0o644); // copied up, unchanged
    unlinkSync(m('deleted.txt')); // a whiteout
    rmSync(m('opaque'), { recursive: true });
    mkdirSync(m('opaque')); // an opaque directory
    writeFileSync(m('opaque/o1.txt'), 'o1 again\n');
    rmSync(m('gone'), { recursive: true });
    mkdirSync(m('moved'));
    renameSync(m('mv.txt'), m('moved/mv.txt'));
    chmodSync(m('mode.sh'), 0o755);
    mkdirSync(m('newdir'));
    writeFileSync(m('newdir/n.txt'), 'n\n');
    rmSync(m('tofile'), { recursive: true });
    writeFileSync(m('tofile'), 'now a file\n');
    symlinkSync('edit.txt', m('link'));
    // A directory rename: a redirect when the kernel has redirect_dir, else mv copies it.
    execFileSync('mv', [m('keep/deep'), m('keep/deep2')]);
  });

  afterAll(() => {
    if (mounted && spawnSync('umount', [merged]).status !== 0) spawnSync('umount', ['-l', merged]);
    rmSync(tmp, { recursive: true, force: true });
  });

  const listed = (ch: WorkspaceChanges) =>
    ch.entries.map((c) => (c.from ? [c.status, c.path, c.from] : [c.status, c.path]));

  it('finds whiteouts, opaque directories, renames and type changes, as the full walk does', async () => {
    const full = await changes(base, merged);
    const hinted = await changes(base, merged, { upper });
    expect(listed(full)).toEqual([
      ['deleted', 'deleted.txt'],
      ['modified', 'edit.txt'],
      ['deleted', 'gone/g.txt'],
      ['renamed', 'keep/deep2/c.txt', 'keep/deep/c.txt'],
      ['added', 'link'],
      ['modified', 'mode.sh'],
      ['renamed', 'moved/mv.txt', 'mv.txt'],
      ['added', 'newdir/n.txt'],
      ['modified', 'opaque/o1.txt'],
      ['deleted', 'opaque/o2.txt'],
      ['deleted', 'opaque/sub/s.txt'],
      ['added', 'tofile'],
      ['deleted', 'tofile/t.txt'],
    ]);
    expect(hinted).toEqual(full);
  });
});

describe.skipIf(!canMount)(
  'changes() with the hint, a directory moved over another (redirect_dir=on)',
  () => {
    const tmp = mkdtempSync(join(tmpdir(), 'abx-workspace-redirect-'));
    const base = join(tmp, 'lower');
    const upper = join(tmp, 'upper');
    const merged = join(tmp, 'merged');
    let mounted = false;

    beforeAll(() => {
      for (const d of [base, upper, join(tmp, 'work'), merged]) mkdirSync(d);
      mkdirSync(join(base, 'd/e'), { recursive: true });
      mkdirSync(join(base, 'x'));
      writeFileSync(join(base, 'd/e/f'), 'f\n');
      writeFileSync(join(base, 'd/g'), 'dg\n');
      writeFileSync(join(base, 'x/g'), 'xg\n');
      const options = `redirect_dir=on,lowerdir=${base},upperdir=${upper},workdir=${join(tmp, 'work')}`;
      execFileSync('mount', ['-t', 'overlay', 'overlay', '-o', options, merged]);
      mounted = true;
      rmSync(join(merged, 'x'), { recursive: true });
      renameSync(join(merged, 'd'), join(merged, 'x'));
    });

    afterAll(() => {
      if (mounted && spawnSync('umount', [merged]).status !== 0)
        spawnSync('umount', ['-l', merged]);
      rmSync(tmp, { recursive: true, force: true });
    });

    it('sees the moved files under the old name, as the full walk does', async () => {
      const full = await changes(base, merged);
      expect(full.entries.map((c) => [c.status, c.path, c.from])).toEqual([
        ['deleted', 'd/g', undefined],
        ['renamed', 'x/e/f', 'd/e/f'],
        ['modified', 'x/g', undefined],
      ]);
      expect(await changes(base, merged, { upper })).toEqual(full);
    });
  },
);
