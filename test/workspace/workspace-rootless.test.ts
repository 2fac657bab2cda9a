import { execFileSync } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { type RootlessDaemon, startRootlessDaemon } from '../helpers/rootless.js';

// A workspace on a rootless daemon (docs/workspaces.md, "On a rootless daemon"): the launcher
// mounts the overlay in a user namespace of its own; the daemon reads the sandbox's view through
// the root of bwrap's first process. A real git repository of the daemon's user; the sandbox
// edits, creates, deletes, renames and chmods; the host folder is unwritten until apply; a file
// of another uid is nobody's in the sandbox and stays unreadable; kill leaves no folder.
const isRoot = process.getuid?.() === 0;

let daemon: RootlessDaemon | undefined;
let repo: string;
let parent: string;

// The repository is the daemon's uid's: git, run as root here, is told it is safe.
const GIT_ENV = {
  ...process.env,
  GIT_CONFIG_COUNT: '1',
  GIT_CONFIG_KEY_0: 'safe.directory',
  GIT_CONFIG_VALUE_0: '*',
};
const git = (...args: string[]) =>
  execFileSync('git', ['-C', repo, ...args], { encoding: 'utf8', env: GIT_ENV });

/** Every file of the repository (not .git) with its mode and content hash. */
function tree(dir: string): string {
  return execFileSync(
    'sh',
    ['-c', 'find . -path ./.git -prune -o -type f -printf "%m %p\\n" | sort; git ls-files -s'],
    { cwd: dir, encoding: 'utf8', env: GIT_ENV },
  );
}

beforeAll(async () => {
  if (!isRoot) return;
  daemon = await startRootlessDaemon();
  // A folder the daemon's uid can reach: its own, under a parent it may enter.
  parent = mkdtempSync(join(tmpdir(), 'abx-ws-rootless-'));
  chmodSync(parent, 0o755);
  repo = join(parent, 'repo');
  mkdirSync(join(repo, 'src'), { recursive: true });
  writeFileSync(join(repo, 'README.md'), '# demo\nline one\n');
  writeFileSync(join(repo, 'old.txt'), 'to be deleted\n');
  writeFileSync(join(repo, 'src', 'a.js'), 'export const a = 1;\n');
  writeFileSync(join(repo, 'run.sh'), 'echo run\n');
  git('init', '-q', '-b', 'main');
  git('add', '-A');
  git('-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-q', '-m', 'base');
  execFileSync('chown', ['-R', `${daemon.uid}:${daemon.uid}`, repo]);
  // Another uid's private file in the folder: the sandbox must not read it.
  writeFileSync(join(repo, 'private.txt'), 'not yours\n', { mode: 0o600 });
  chownSync(join(repo, 'private.txt'), 4242, 4242);
}, 180_000);

afterAll(async () => {
  await daemon?.close();
  if (parent) rmSync(parent, { recursive: true, force: true });
}, 60_000);

describe.skipIf(!isRoot)('a workspace on a rootless daemon', () => {
  test('edits stay in the sandbox; changes, diff and apply are exactly them; kill leaves nothing', async () => {
    const home = (daemon as RootlessDaemon).home;
    const before = tree(repo);
    const box = await Sandbox.create({ home, workspace: { from: repo } });
    const dir = join(home, 'sandboxes', box.sandboxId, 'workspace');
    try {
      const run = async (cmd: string) => {
        const done = await box.commands.run(cmd);
        return done.stdout.trim();
      };
      expect(await run('cd ~/workspace && stat -c %U README.md && stat -c %U private.txt')).toBe(
        'user\nnobody',
      );
      // The daemon's home (its path) does not show in the sandbox's mount table.
      const mounts = await run('cat /proc/self/mountinfo');
      expect(mounts).toContain('upperdir=upper');
      expect(mounts).not.toContain(home);
      const unread = await box.commands
        .run('cat ~/workspace/private.txt')
        .catch((error: { exitCode?: number }) => error);
      expect((unread as { exitCode?: number }).exitCode).not.toBe(0);
      await run(
        [
          'cd ~/workspace',
          'printf "# demo\\nline 2\\n" > README.md',
          'rm old.txt',
          'mv src/a.js src/b.js',
          'echo new > new.txt',
          'chmod +x run.sh',
        ].join(' && '),
      );
      // Nothing of it on the host yet.
      expect(tree(repo)).toBe(before);

      const changes = await box.workspace.changes();
      expect(changes.map((c) => [c.status, c.path]).sort()).toEqual([
        ['added', 'new.txt'],
        ['deleted', 'old.txt'],
        ['modified', 'README.md'],
        ['modified', 'run.sh'],
        ['renamed', 'src/b.js'],
      ]);
      const patch = await box.workspace.diff();
      writeFileSync(join(parent, 'check.patch'), patch);
      git('apply', '--check', join(parent, 'check.patch'));
      expect(tree(repo)).toBe(before);

      const done = await box.workspace.apply();
      expect(done.applied).toHaveLength(5);
      expect(readFileSync(join(repo, 'README.md'), 'utf8')).toBe('# demo\nline 2\n');
      expect(statSync(join(repo, 'run.sh')).mode & 0o111).not.toBe(0);
      expect(existsSync(join(repo, 'src', 'a.js'))).toBe(false);
      expect(statSync(join(repo, 'new.txt')).uid).toBe((daemon as RootlessDaemon).uid);
      expect(git('status', '--porcelain', '-uall')).toBe(
        ' M README.md\n D old.txt\n M run.sh\n D src/a.js\n?? new.txt\n?? private.txt\n?? src/b.js\n',
      );
      expect(await box.workspace.changes()).toEqual([]);
      expect(await run('echo thawed')).toBe('thawed');
    } finally {
      await box.kill();
    }
    expect(existsSync(dir)).toBe(false);
  }, 180_000);

  test('a hibernate keeps the changes (its layer on disk), a fork gets its own copy of them, a snapshot keeps them', async () => {
    const home = (daemon as RootlessDaemon).home;
    const before = tree(repo);
    const box = await Sandbox.create({ home, workspace: { from: repo } });
    const forks: Sandbox[] = [];
    try {
      await box.commands.run('cd ~/workspace && echo kept > kept.txt && rm new.txt');
      expect(await box.pause({ memory: false })).toBe(true);
      await box.resume();
      expect((await box.commands.run('cat ~/workspace/kept.txt')).stdout).toBe('kept\n');
      const listed = async (sandbox: Sandbox) =>
        (await sandbox.workspace.changes()).map((c) => [c.status, c.path]);
      expect(await listed(box)).toEqual([
        ['added', 'kept.txt'],
        ['deleted', 'new.txt'],
      ]);
      const [fork] = await box.fork();
      if (!fork) throw new Error('no fork');
      forks.push(fork);
      await fork.commands.run('cd ~/workspace && echo mine > fork.txt');
      expect(await listed(fork)).toEqual([
        ['added', 'fork.txt'],
        ['added', 'kept.txt'],
        ['deleted', 'new.txt'],
      ]);
      expect(await listed(box)).toEqual([
        ['added', 'kept.txt'],
        ['deleted', 'new.txt'],
      ]);
      expect(tree(repo)).toBe(before);
      // A snapshot keeps them too: a sandbox made from it has them (the snapshot's layer is the
      // daemon's uid's, a rootless sandbox having no uid of its own).
      await box.snapshot({ name: 'rootless-ws-snap' });
      const made = await Sandbox.create({ home, template: 'rootless-ws-snap' });
      forks.push(made);
      expect(await listed(made)).toEqual([
        ['added', 'kept.txt'],
        ['deleted', 'new.txt'],
      ]);
      expect((await made.commands.run('cat ~/workspace/kept.txt')).stdout).toBe('kept\n');
    } finally {
      for (const fork of forks) await fork.kill();
      await box.kill();
    }
  }, 180_000);

  test('an uploaded workspace: a fork shares its base, a snapshot keeps a copy; the base goes with the last sandbox', async () => {
    const home = (daemon as RootlessDaemon).home;
    const bases = join(home, 'workspace-bases');
    const folder = join(parent, 'upload');
    mkdirSync(folder);
    writeFileSync(join(folder, 'a.txt'), 'a\n');
    writeFileSync(join(folder, 'b.txt'), 'b\n');
    const boxes: Sandbox[] = [];
    try {
      const box = await Sandbox.create({ home, workspace: { from: folder, upload: true } });
      boxes.push(box);
      await box.commands.run('cd ~/workspace && echo a2 >> a.txt && rm b.txt');
      const [fork] = await box.fork();
      if (!fork) throw new Error('no fork');
      boxes.push(fork);
      expect(readdirSync(bases)).toHaveLength(1);
      await box.snapshot({ name: 'rootless-ws-up-snap' });
      await box.kill();
      expect((await fork.commands.run('cd ~/workspace && ls && cat a.txt')).stdout).toBe(
        'a.txt\na\na2\n',
      );
      await fork.kill();
      expect(readdirSync(bases)).toEqual([]);
      const made = await Sandbox.create({ home, template: 'rootless-ws-up-snap' });
      boxes.push(made);
      expect((await made.workspace.changes()).map((c) => `${c.status} ${c.path}`)).toEqual([
        'modified a.txt',
        'deleted b.txt',
      ]);
      await made.kill();
      expect(readdirSync(bases)).toEqual([]);
    } finally {
      for (const box of boxes) await box.kill().catch(() => false);
    }
  }, 120_000);
});
