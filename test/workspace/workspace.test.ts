import { execFileSync } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  renameSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  apply,
  changes,
  diff,
  type WorkspaceChanges,
  WorkspaceRefusedError,
} from '../../src/workspace/index.js';
import { GIT_ENV, git, snapshot, treeOf } from './fixture.js';

const tmp = mkdtempSync(join(tmpdir(), 'abx-workspace-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const QUOTED = 'naïve "q".txt';
// A binary file with NUL bytes, fixed so a failure can be replayed.
const BINARY = Buffer.from([
  0x50,
  0x4b,
  0,
  0,
  ...Array.from({ length: 300 }, (_, i) => (i * 37) % 256),
]);

/** A base repository, committed. */
function makeBase(dir: string): void {
  mkdirSync(dir);
  const umask = process.umask(0o022);
  git(dir, 'init', '-q', '-b', 'main', '.');
  writeFileSync(
    join(dir, 'a.txt'),
    'int main() {\nline1\nline2\nline3\nline4\nline5\nline6\nline7\n}\n',
  );
  writeFileSync(join(dir, 'with space.txt'), 'keep\n');
  writeFileSync(join(dir, 'old.txt'), 'x\n');
  writeFileSync(join(dir, 'mv.sh'), 'echo moved\n');
  writeFileSync(join(dir, 'del.txt'), 'del\n');
  writeFileSync(join(dir, 'nonl.txt'), 'no newline');
  writeFileSync(join(dir, 'tc'), 'type change\n');
  writeFileSync(join(dir, QUOTED), 'ü\n');
  symlinkSync('a.txt', join(dir, 'link'));
  mkdirSync(join(dir, 'gone'));
  writeFileSync(join(dir, 'gone/x.txt'), 'x\n');
  writeFileSync(join(dir, 'gone/y.txt'), 'y\n');
  git(dir, 'add', '-A');
  git(dir, 'commit', '-qm', 'base');
  process.umask(umask);
}

/** The scripted agent: what it does in the view. */
function agent(view: string): void {
  writeFileSync(
    join(view, 'a.txt'),
    'int main() {\nline1\nline2\nLINE3\nline4\nline5\nline6\nline7\n}',
  );
  writeFileSync(join(view, 'new file.txt'), 'new\n');
  unlinkSync(join(view, 'del.txt'));
  mkdirSync(join(view, 'bin'));
  renameSync(join(view, 'mv.sh'), join(view, 'bin/renamed.sh'));
  chmodSync(join(view, 'bin/renamed.sh'), 0o755);
  chmodSync(join(view, 'old.txt'), 0o755);
  writeFileSync(join(view, 'blob.bin'), BINARY);
  unlinkSync(join(view, 'link'));
  symlinkSync('with space.txt', join(view, 'link'));
  mkdirSync(join(view, 'sub'));
  symlinkSync('../a.txt', join(view, 'sub/inner-link'));
  writeFileSync(join(view, 'nonl.txt'), 'now with newline\n');
  writeFileSync(join(view, QUOTED), 'ü2\n');
  rmSync(join(view, 'gone'), { recursive: true });
  unlinkSync(join(view, 'tc'));
  symlinkSync('a.txt', join(view, 'tc'));
  writeFileSync(join(view, '.git/agent-was-here'), 'left out\n');
  // Whatever the umask: modes a git patch can carry (diff() is then complete).
  for (const p of ['new file.txt', 'blob.bin']) chmodSync(join(view, p), 0o644);
}

const EXPECTED = [
  ['modified', 'a.txt'],
  ['renamed', 'bin/renamed.sh', 'mv.sh'],
  ['added', 'blob.bin'],
  ['deleted', 'del.txt'],
  ['deleted', 'gone/x.txt'],
  ['deleted', 'gone/y.txt'],
  ['modified', 'link'],
  ['modified', QUOTED],
  ['added', 'new file.txt'],
  ['modified', 'nonl.txt'],
  ['modified', 'old.txt'],
  ['added', 'sub/inner-link'],
  ['typechange', 'tc'],
];

function listed(ch: WorkspaceChanges): string[][] {
  return ch.entries.map((c) => (c.from ? [c.status, c.path, c.from] : [c.status, c.path]));
}

describe('a scripted agent in a copy of a git repository', () => {
  let base: string;
  let view: string;
  let since: number;
  let ch: WorkspaceChanges;

  beforeAll(async () => {
    base = join(tmp, 'base');
    view = join(tmp, 'view');
    makeBase(base);
    since = Date.now() + 1;
    await new Promise((r) => setTimeout(r, 20));
    execFileSync('cp', ['-a', base, view]);
    agent(view);
    ch = await changes(base, view);
  });

  it('changes() lists exactly what the agent did, .git left out', () => {
    expect(listed(ch)).toEqual(EXPECTED);
    const byPath = Object.fromEntries(ch.entries.map((c) => [c.path, c]));
    expect(byPath['old.txt']).toMatchObject({ modeChanged: true, contentChanged: false });
    expect(byPath['old.txt'].after?.mode).toBe(0o755);
    expect(byPath['bin/renamed.sh']).toMatchObject({ modeChanged: true, contentChanged: false });
    expect(byPath['blob.bin']).toMatchObject({ binary: true });
    expect(byPath['a.txt']).toMatchObject({
      binary: false,
      contentChanged: true,
      modeChanged: false,
    });
    expect(byPath.link.before?.target).toBe('a.txt');
    expect(byPath.link.after?.target).toBe('with space.txt');
    expect(byPath.tc.before?.kind).toBe('file');
    expect(byPath.tc.after?.kind).toBe('symlink');
  });

  it('changes() follows a root given through a link, and fails clearly on a missing one', async () => {
    symlinkSync(base, join(tmp, 'base-link'));
    const through = await changes(join(tmp, 'base-link'), view);
    expect(through.base).toBe(base);
    expect(through.entries).toEqual(ch.entries);
    await expect(changes(join(tmp, 'nowhere'), view)).rejects.toThrow(
      `the base folder ${join(tmp, 'nowhere')} is not a directory`,
    );
  });

  it("changes() with .git lists the agent's file in it", async () => {
    const all = await changes(base, view, { includeGit: true });
    expect(all.entries.map((c) => c.path)).toContain('.git/agent-was-here');
  });

  it('diff() is what git diff --binary --full-index writes, and git apply makes the same tree', async () => {
    const d = await diff(ch);
    expect(d.complete).toBe(true);
    expect(d.names).toEqual(EXPECTED.map((e) => e[1]));
    expect(d.stat.find((s) => s.path === 'a.txt')).toMatchObject({
      added: 2,
      deleted: 2,
      binary: false,
    });
    expect(d.stat.find((s) => s.path === 'blob.bin')).toMatchObject({
      binary: true,
      bytesAfter: BINARY.length,
    });

    // git's own diff of the same change, from a second copy of the view.
    const gitView = join(tmp, 'git-view');
    execFileSync('cp', ['-a', view, gitView]);
    git(gitView, 'add', '-A');
    const theirs = execFileSync('git', ['diff', '--cached', '--binary', '--full-index', '-M'], {
      cwd: gitView,
      env: GIT_ENV,
    });
    // Byte for byte, but for the deflated data of binary literals: Node's zlib (Chromium's)
    // compresses otherwise than git's, both inflate to the same bytes (git apply checks below).
    const deflated = (p: Buffer) =>
      p.toString('latin1').replace(/^(literal \d+\n)(?:[A-Za-z]\S*\n)+/gm, '$1…\n');
    expect(deflated(d.patch)).toBe(deflated(theirs));
    expect(deflated(d.patch)).toContain('GIT binary patch\nliteral 304\n…\n\nliteral 0\n…\n');

    const clone = join(tmp, 'clone');
    git(tmp, 'clone', '-q', base, clone);
    const patchFile = join(tmp, 'agent.patch');
    writeFileSync(patchFile, d.patch);
    git(clone, 'apply', '--check', patchFile);
    git(clone, 'apply', patchFile);
    expect(treeOf(clone)).toBe(treeOf(gitView));
    expect((await changes(clone, view)).entries).toEqual([]);
  });

  it('apply() leaves the base equal to the view, and git status shows exactly those changes', async () => {
    const result = await apply(ch, { since });
    expect(result.applied.map((c) => c.path).sort()).toEqual(EXPECTED.map((e) => e[1]).sort());
    expect((await changes(base, view)).entries).toEqual([]);
    git(base, 'add', '-A');
    const status = git(base, 'status', '--porcelain', '-z').split('\0').filter(Boolean);
    expect(status).toEqual([
      'M  a.txt',
      'R  bin/renamed.sh',
      'mv.sh',
      'A  blob.bin',
      'D  del.txt',
      'D  gone/x.txt',
      'D  gone/y.txt',
      'M  link',
      `M  ${QUOTED}`,
      'A  new file.txt',
      'M  nonl.txt',
      'M  old.txt',
      'A  sub/inner-link',
      'T  tc',
    ]);
    expect(snapshot(base).gone).toBeUndefined();
  });
});

describe('conflicts', () => {
  it('a host edit after `since` is refused by name and nothing is written; force writes it', async () => {
    const base = join(tmp, 'c-base');
    const view = join(tmp, 'c-view');
    mkdirSync(base);
    writeFileSync(join(base, 'shared.txt'), 'one\n');
    writeFileSync(join(base, 'other.txt'), 'two\n');
    utimesSync(
      join(base, 'shared.txt'),
      new Date(Date.now() - 60_000),
      new Date(Date.now() - 60_000),
    );
    execFileSync('cp', ['-a', base, view]);
    const since = Date.now();
    writeFileSync(join(view, 'shared.txt'), 'agent\n');
    writeFileSync(join(view, 'agent-new.txt'), 'new\n');
    const ch = await changes(base, view);
    await new Promise((r) => setTimeout(r, 20));
    writeFileSync(join(base, 'shared.txt'), 'host\n');
    const before = snapshot(base);

    const err = await apply(ch, { since }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(WorkspaceRefusedError);
    expect((err as WorkspaceRefusedError).refusals).toEqual([
      { path: 'shared.txt', reason: 'changed on the host after the workspace was made' },
    ]);
    expect(snapshot(base)).toEqual(before);

    // Same content, old times: the recorded "before" hash still catches it.
    utimesSync(join(base, 'shared.txt'), new Date(since - 60_000), new Date(since - 60_000));
    const again = await apply(ch, { since: Date.now() + 1000 }).catch((e: unknown) => e);
    expect((again as WorkspaceRefusedError).refusals).toEqual([
      { path: 'shared.txt', reason: 'its content on the host is not what the change replaces' },
    ]);
    expect(snapshot(base)).toEqual(before);

    const dry = await apply(ch, { since, force: true, dryRun: true });
    expect(dry.applied.map((c) => c.path)).toEqual(['agent-new.txt', 'shared.txt']);
    expect(snapshot(base)).toEqual(before);

    const forced = await apply(ch, { since, force: true, paths: ['shared.txt'] });
    expect(forced.forced.map((r) => r.path)).toEqual(['shared.txt']);
    expect(forced.applied.map((c) => c.path)).toEqual(['shared.txt']);
    expect(snapshot(base)['agent-new.txt']).toBeUndefined();
    expect((await changes(base, view)).entries.map((c) => c.path)).toEqual(['agent-new.txt']);
  });
});

describe('force over a host that moved on', () => {
  it('writes the view over host deletions and edits: renames and chmods come from the view', async () => {
    const base = join(tmp, 'f-base');
    const view = join(tmp, 'f-view');
    mkdirSync(base);
    for (const name of ['r.txt', 'gone.txt', 'm.sh']) writeFileSync(join(base, name), `${name}\n`);
    execFileSync('cp', ['-a', base, view]);
    const since = Date.now();
    renameSync(join(view, 'r.txt'), join(view, 'r2.txt'));
    unlinkSync(join(view, 'gone.txt'));
    chmodSync(join(view, 'm.sh'), 0o755);
    const ch = await changes(base, view);
    expect(listed(ch)).toEqual([
      ['deleted', 'gone.txt'],
      ['modified', 'm.sh'],
      ['renamed', 'r2.txt', 'r.txt'],
    ]);
    unlinkSync(join(base, 'r.txt'));
    unlinkSync(join(base, 'gone.txt'));
    writeFileSync(join(base, 'm.sh'), 'host\n');

    const err = await apply(ch, { since }).catch((e: unknown) => e);
    expect((err as WorkspaceRefusedError).refusals.map((r) => r.path)).toEqual([
      'gone.txt',
      'm.sh',
      'r.txt',
    ]);
    const result = await apply(ch, { since, force: true });
    expect(result.forced.map((r) => r.path)).toEqual(['gone.txt', 'm.sh', 'r.txt']);
    expect((await changes(base, view)).entries).toEqual([]);
  });
});

describe('text hunks as git writes them', () => {
  it('several hunks, function names, CRLF, a line added at the top and one removed at the end', async () => {
    const base = join(tmp, 'h-base');
    const view = join(tmp, 'h-view');
    mkdirSync(base);
    git(base, 'init', '-q', '.');
    const lines = Array.from({ length: 120 }, (_, i) =>
      i % 20 === 0 ? `function f${i}() {` : `  body ${i}`,
    );
    writeFileSync(join(base, 'long.js'), `${lines.join('\n')}\n`);
    writeFileSync(join(base, 'crlf.txt'), 'one\r\ntwo\r\nthree\r\n');
    writeFileSync(join(base, 'latin1.txt'), Buffer.from('caf\xe9\n', 'latin1'));
    git(base, 'add', '-A');
    git(base, 'commit', '-qm', 'base');
    execFileSync('cp', ['-a', base, view]);
    const edited = [...lines];
    edited.unshift('// header');
    edited[30] = '  changed 29';
    edited[75] = '  changed 74';
    edited.splice(100, 2, '  replaced', '  two', '  three');
    edited.pop();
    writeFileSync(join(view, 'long.js'), `${edited.join('\n')}\n`);
    writeFileSync(join(view, 'crlf.txt'), 'one\r\nTWO\r\nthree\r\n');
    writeFileSync(join(view, 'latin1.txt'), Buffer.from('caf\xe9!\n', 'latin1'));

    const d = await diff(await changes(base, view));
    git(view, 'add', '-A');
    const theirs = execFileSync('git', ['diff', '--cached', '--full-index'], {
      cwd: view,
      env: GIT_ENV,
    });
    expect(d.patch.toString('latin1')).toBe(theirs.toString('latin1'));
    expect(d.patch.toString('latin1')).toContain('@@ function f20() {');
  });
});

describe.skipIf(process.getuid?.() !== 0)('apply() as root', () => {
  it("writes as the folder's owner: a replaced file keeps its owner, a new one takes its folder's", async () => {
    const base = join(tmp, 'o-base');
    const view = join(tmp, 'o-view');
    mkdirSync(join(base, 'sub'), { recursive: true });
    writeFileSync(join(base, 'mine.txt'), 'one\n');
    chownSync(base, 1000, 1000);
    chownSync(join(base, 'sub'), 1000, 1000);
    chownSync(join(base, 'mine.txt'), 1000, 1000);
    execFileSync('cp', ['-a', base, view]);
    const since = Date.now() + 1;
    await new Promise((r) => setTimeout(r, 5));
    writeFileSync(join(view, 'mine.txt'), 'two\n');
    writeFileSync(join(view, 'sub/new.txt'), 'new\n');
    mkdirSync(join(view, 'fresh'));
    writeFileSync(join(view, 'fresh/deep.txt'), 'deep\n');
    await apply(await changes(base, view), { since });
    for (const p of ['mine.txt', 'sub/new.txt', 'fresh', 'fresh/deep.txt']) {
      const st = lstatSync(join(base, p));
      expect([p, st.uid, st.gid]).toEqual([p, 1000, 1000]);
    }
  });
});
