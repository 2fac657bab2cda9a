import { execFileSync, spawn } from 'node:child_process';
import {
  chmodSync,
  closeSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  apply,
  changes,
  WorkspaceRefusedError,
  WorkspaceWriteError,
} from '../../src/workspace/index.js';
import { git, makeRepo, snapshot } from './fixture.js';

// An apply that fails while writing undoes itself (docs/workspaces.md, "Applying"): the host
// folder is left as it was, mode for mode, with no temporary file or backup in it. Root only:
// a full tmpfs and a busy mount point are the real failures.

const isRoot = process.getuid?.() === 0;
const mounts: string[] = [];
const dirs: string[] = [];
afterAll(() => {
  for (const m of mounts.reverse()) execFileSync('umount', [m]);
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const withoutGit = (tree: Record<string, string>) =>
  Object.fromEntries(Object.entries(tree).filter(([p]) => p !== '.git' && !p.startsWith('.git/')));
const leftovers = (tree: Record<string, string>) =>
  Object.keys(tree).filter((p) => p.split('/').some((n) => n.startsWith('.abx-apply-')));

async function writeError(p: Promise<unknown>): Promise<WorkspaceWriteError> {
  const err = await p.catch((e: unknown) => e);
  expect(err).toBeInstanceOf(WorkspaceWriteError);
  return err as WorkspaceWriteError;
}

describe.skipIf(!isRoot)('an apply that fails while writing is rolled back', () => {
  it('a full disk: nothing of the host is touched, and the same apply succeeds once there is room', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'abx-workspace-full-'));
    dirs.push(dir);
    const small = join(dir, 'small');
    mkdirSync(small);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=256k,mode=0755', 'tmpfs', small]);
    mounts.push(small);
    writeFileSync(join(small, 'a-small.txt'), 'old\n');
    writeFileSync(join(small, 'gone.txt'), 'gone\n');
    mkdirSync(join(small, 'd'));
    writeFileSync(join(small, 'd', 'moved.txt'), 'moved\n');
    const view = join(dir, 'view');
    execFileSync('cp', ['-a', small, view]);
    const since = Date.now() + 1;
    await new Promise((r) => setTimeout(r, 5));
    writeFileSync(join(view, 'a-small.txt'), 'fits\n');
    unlinkSync(join(view, 'gone.txt'));
    execFileSync('mv', [join(view, 'd'), join(view, 'e')]);
    mkdirSync(join(view, 'new'));
    writeFileSync(join(view, 'new', 'b-large.bin'), Buffer.alloc(1024 * 1024, 1));
    const ch = await changes(small, view);
    const before = snapshot(small);

    const err = await writeError(apply(ch, { since }));
    expect(err.path).toBe('new/b-large.bin');
    expect(err.rolledBack).toBe(true);
    expect(err.written).toEqual([]);
    expect(err.notRestored).toEqual([]);
    expect(err.message).toMatch(
      /^apply failed at new\/b-large\.bin and was rolled back: the host folder is as it was, nothing written: .*ENOSPC/,
    );
    expect(err.undone).toEqual(expect.arrayContaining(['removed the new new']));
    expect(snapshot(small)).toEqual(before);
    expect(leftovers(snapshot(small))).toEqual([]);

    // No old entry was touched (new content is written before anything is replaced), so the
    // same apply is no conflict once there is room.
    execFileSync('mount', ['-o', 'remount,size=4m', small]);
    const done = await apply(ch, { since });
    expect(done.applied.map((c) => c.path).sort()).toEqual(
      ['a-small.txt', 'e/moved.txt', 'gone.txt', 'new/b-large.bin'].sort(),
    );
    expect(snapshot(small)).toEqual(snapshot(view));
  });

  it('a failure after files were deleted, renamed, replaced, chmod-ed and made: the repository is as it was', async () => {
    const base = makeRepo(
      {
        'del.txt': 'delete me\n',
        'gone/x.txt': 'in a folder that goes\n',
        'ren-src.txt': 'renamed\n',
        'mod.txt': 'old content\n',
        'mode.sh': 'echo mode\n',
        'keep/k.txt': 'kept\n',
        'dirfile/inner.txt': 'a folder that becomes a file\n',
        'z-busy.txt': 'busy\n',
      },
      'abx-ws-rollback-',
    );
    dirs.push(base);
    symlinkSync('mod.txt', join(base, 'link'));
    chmodSync(join(base, 'keep'), 0o750);
    git(base, 'add', '-A');
    git(base, 'commit', '-q', '-m', 'link');
    const view = `${base}-view`;
    dirs.push(view);
    execFileSync('cp', ['-a', base, view]);
    const since = Date.now() + 1;
    await new Promise((r) => setTimeout(r, 5));
    unlinkSync(join(view, 'del.txt'));
    rmSync(join(view, 'gone'), { recursive: true });
    execFileSync('mv', [join(view, 'ren-src.txt'), join(view, 'keep', 'ren-dst.txt')]);
    writeFileSync(join(view, 'mod.txt'), 'new content\n');
    chmodSync(join(view, 'mode.sh'), 0o755);
    unlinkSync(join(view, 'link'));
    symlinkSync('keep/k.txt', join(view, 'link'));
    mkdirSync(join(view, 'made', 'deep'), { recursive: true });
    writeFileSync(join(view, 'made', 'deep', 'n.txt'), 'new\n');
    writeFileSync(join(view, 'z-busy.txt'), 'busy, changed\n');
    rmSync(join(view, 'dirfile'), { recursive: true });
    writeFileSync(join(view, 'dirfile'), 'now a file\n');
    const ch = await changes(base, view);
    expect(ch.entries.map((c) => `${c.status} ${c.path}`).sort()).toEqual(
      [
        'added dirfile',
        'deleted del.txt',
        'deleted dirfile/inner.txt',
        'deleted gone/x.txt',
        'modified link',
        'modified mod.txt',
        'modified mode.sh',
        'modified z-busy.txt',
        'added made/deep/n.txt',
        'renamed keep/ren-dst.txt',
      ].sort(),
    );
    // z-busy.txt, last in the order written, is a mount point: it cannot be renamed or
    // replaced (EBUSY), after every other change was put in place.
    execFileSync('mount', ['--bind', join(base, 'z-busy.txt'), join(base, 'z-busy.txt')]);
    mounts.push(join(base, 'z-busy.txt'));
    const before = snapshot(base);
    const owner = statSync(join(base, 'mod.txt')).uid;

    const err = await writeError(apply(ch, { since }));
    expect(err.path).toBe('z-busy.txt');
    expect(err.message).toMatch(/EBUSY/);
    expect([err.rolledBack, err.written, err.notRestored]).toEqual([true, [], []]);
    // Every kind of step was taken, and undone in reverse.
    expect(err.undone.join('\n')).toMatch(
      new RegExp(
        [
          "set mode\\.sh's mode back to 644",
          'put back the old mod\\.txt',
          'removed made/deep/n\\.txt',
          'put back the old link',
          'removed dirfile',
          'moved \\.abx-apply-[0-9a-f]{12}\\.dirfile\\.bak back to dirfile',
          'moved keep/ren-dst\\.txt back to ren-src\\.txt',
          'moved gone/\\.abx-apply-[0-9a-f]{12}\\.x\\.txt\\.bak back to gone/x\\.txt',
          'moved \\.abx-apply-[0-9a-f]{12}\\.del\\.txt\\.bak back to del\\.txt',
          'removed the new made/deep',
          'removed the new made',
        ].join('[^]*'),
      ),
    );
    expect(snapshot(base)).toEqual(before);
    expect(leftovers(snapshot(base))).toEqual([]);
    expect(git(base, 'status', '--porcelain')).toBe('');
    expect(statSync(join(base, 'mod.txt')).uid).toBe(owner);

    // The entries the undo put back were renamed or linked (their ctime is new): a retry takes
    // them for host edits until forced.
    execFileSync('umount', [mounts.pop() as string]);
    const again = await apply(ch, { since }).catch((e: unknown) => e);
    expect(again).toBeInstanceOf(WorkspaceRefusedError);
    expect((again as WorkspaceRefusedError).refusals.map((r) => r.path).sort()).toEqual(
      [
        'del.txt',
        'dirfile/inner.txt',
        'gone/x.txt',
        'link',
        'mod.txt',
        'mode.sh',
        'ren-src.txt',
      ].sort(),
    );
    await apply(ch, { since, force: true });
    expect(withoutGit(snapshot(base))).toEqual(withoutGit(snapshot(view)));
    expect(leftovers(snapshot(base))).toEqual([]);
  });

  it('a real SIGKILL in the second pass leaves the backups named, and the next apply names them', async () => {
    const base = mkdtempSync(join(tmpdir(), 'abx-ws-killed-'));
    dirs.push(base);
    for (let i = 0; i < 4000; i++) writeFileSync(join(base, `f${i}.txt`), `old ${i}\n`);
    const view = `${base}-view`;
    dirs.push(view);
    mkdirSync(view);
    const since = Date.now() + 1;
    await new Promise((r) => setTimeout(r, 5));
    const ch = await changes(base, view);
    expect(ch.entries).toHaveLength(4000);
    // The bundled apply the daemon runs as a user (dist/workspace-apply.cjs), killed as soon as
    // the first backup shows; its input from a file, as the loop below holds this event loop.
    const input = `${base}.json`;
    dirs.push(input);
    writeFileSync(input, JSON.stringify({ changes: ch, options: { since } }));
    const fd = openSync(input, 'r');
    const child = spawn(process.execPath, [join(process.cwd(), 'dist', 'workspace-apply.cjs')], {
      stdio: [fd, 'ignore', 'ignore'],
    });
    closeSync(fd);
    try {
      let seen: string[] = [];
      const until = Date.now() + 20_000;
      while (seen.length === 0 && Date.now() < until) {
        seen = readdirSync(base).filter((n) => n.endsWith('.bak'));
      }
      child.kill('SIGKILL');
      expect(seen.length).toBeGreaterThan(0);
    } finally {
      child.kill('SIGKILL');
      await new Promise((r) =>
        child.exitCode === null && child.signalCode === null ? child.once('exit', r) : r(null),
      );
    }
    const left = readdirSync(base).filter((n) => n.startsWith('.abx-apply-'));
    const gone = 4000 - readdirSync(base).filter((n) => /^f\d+\.txt$/.test(n)).length;
    // Not rolled back: each deleted file is a backup that names it, with its old content.
    expect(left.length).toBe(gone);
    for (const n of left) {
      const name = /^\.abx-apply-[0-9a-f]{12}\.(f\d+\.txt)\.bak$/.exec(n)?.[1];
      expect(readFileSync(join(base, n), 'utf8')).toBe(`old ${name?.slice(1, -4)}\n`);
    }
    const err = await apply(ch, { since: Date.now() + 60_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(WorkspaceRefusedError);
    expect(
      (err as WorkspaceRefusedError).refusals
        .filter((r) => r.reason.startsWith('an apply that was killed'))
        .map((r) => r.path)
        .sort(),
    ).toEqual([...left].sort());
  }, 60_000);

  it('the next apply refuses while a killed apply left its backups or temporary files, and never writes those names', async () => {
    const base = makeRepo({ 'a.txt': 'a\n', 'sub/b.txt': 'b\n' }, 'abx-ws-leftover-');
    dirs.push(base);
    const view = `${base}-view`;
    dirs.push(view);
    execFileSync('cp', ['-a', base, view]);
    const since = Date.now() + 1;
    await new Promise((r) => setTimeout(r, 5));
    writeFileSync(join(view, 'sub', 'b.txt'), 'b2\n');
    writeFileSync(join(view, '.abx-apply-planted'), 'x\n');
    // What a SIGKILLed apply leaves: a backup (the old b.txt) and a temporary file, seen in
    // the sandbox's view too (the host folder is its lower layer).
    for (const root of [base, view]) {
      writeFileSync(join(root, 'sub', '.abx-apply-0123456789ab.b.txt.bak'), 'b\n');
      writeFileSync(join(root, 'sub', '.abx-apply-ba9876543210'), 'b2\n');
    }
    const ch = await changes(base, view);
    const before = snapshot(base);
    const err = await apply(ch, { since, dryRun: true }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(WorkspaceRefusedError);
    expect(
      Object.fromEntries((err as WorkspaceRefusedError).refusals.map((r) => [r.path, r.reason])),
    ).toEqual({
      '.abx-apply-planted': ".abx-apply-* names are apply's own",
      'sub/.abx-apply-0123456789ab.b.txt.bak':
        'an apply that was killed midway (or runs now) set the old b.txt aside here: rename it back over b.txt, or remove it, then apply again',
      'sub/.abx-apply-ba9876543210':
        'a temporary file of an apply that was killed midway (or runs now): remove it, then apply again',
    });
    expect(snapshot(base)).toEqual(before);
    unlinkSync(join(base, 'sub', '.abx-apply-0123456789ab.b.txt.bak'));
    unlinkSync(join(base, 'sub', '.abx-apply-ba9876543210'));
    const done = await apply(ch, { since, paths: ['sub/'] });
    expect(done.applied.map((c) => c.path)).toEqual(['sub/b.txt']);
  });
});
