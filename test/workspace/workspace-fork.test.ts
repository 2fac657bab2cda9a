import { execFileSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { InvalidArgumentError, Sandbox } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { createAbxHome } from '../helpers/abx-home.js';

// A sandbox's workspace in its forks and snapshots (root daemon, local provider): each fork gets
// its own copy of the upper layer (whiteouts, opaque folders, owners) over the same host folder;
// a snapshot keeps the changes, and creating from it mounts the folder again for the key that
// may mount it.

const isRoot = process.getuid?.() === 0;

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let home: string;
let repo: string;

/** The host mount points at or under `dir`. */
function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((point) => point === dir || point.startsWith(`${dir}/`));
}

const git = (dir: string, ...args: string[]) =>
  execFileSync('git', ['-C', dir, ...args], { encoding: 'utf8' });

/** A git repository with these files, committed. */
function makeRepo(files: Record<string, string>): string {
  const dir = mkdtempSync(join(tmpdir(), 'abx-ws-fork-'));
  git(dir, 'init', '-q', '-b', 'main');
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(join(dir, path, '..'), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
  git(dir, 'add', '-A');
  git(dir, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-q', '-m', 'base');
  return dir;
}

const names = (changes: { status: string; path: string }[]) =>
  changes.map((c) => `${c.status} ${c.path}`);

/** Kills each sandbox; then none of them has a mount or a folder left. */
async function killAll(boxes: Sandbox[]): Promise<void> {
  await Promise.all(boxes.map((box) => box.kill().catch(() => false)));
  for (const box of boxes) {
    const dir = join(home, 'sandboxes', box.sandboxId);
    expect(mountsUnder(dir)).toEqual([]);
    expect(existsSync(dir)).toBe(false);
  }
}

beforeAll(async () => {
  if (!isRoot) return;
  abx = await createAbxHome();
  home = abx.home;
  repo = makeRepo({
    'README.md': '# demo\n',
    'old.txt': 'to be deleted\n',
    'src/main.js': 'console.log(1);\n',
    'dir/a.txt': 'a\n',
    'dir/b.txt': 'b\n',
  });
  await startDaemon(home);
}, 120_000);

afterAll(async () => {
  await abx?.close();
  if (repo) rmSync(repo, { recursive: true, force: true });
}, 60_000);

describe.skipIf(!isRoot)('a workspace in forks and snapshots (root daemon)', () => {
  test('a fork gets its own copy of the changes; each lists and applies only its own', async () => {
    const boxes: Sandbox[] = [];
    try {
      const source = await Sandbox.create({ home, workspace: { from: repo } });
      boxes.push(source);
      const run = async (box: Sandbox, cmd: string) =>
        (await box.commands.run(`cd ~/workspace && ${cmd}`)).stdout.trim();
      // A modification, a deletion (a whiteout) and a folder made anew (an opaque folder).
      await run(
        source,
        'echo edited >> README.md && rm old.txt && rm -rf dir && mkdir dir && echo c > dir/c.txt',
      );
      // A host edit after the source mounted the folder, before the fork: a conflict in the fork.
      const touched = new Date();
      utimesSync(join(repo, 'src', 'main.js'), touched, touched);
      const [fork] = await source.fork();
      boxes.push(fork as Sandbox);
      const copy = fork as Sandbox;
      const common = ['modified README.md', 'deleted dir/a.txt', 'deleted dir/b.txt'];
      expect(await run(copy, 'ls -A; ls dir; cat README.md; stat -c %U dir/c.txt')).toBe(
        '.git\nREADME.md\ndir\nsrc\nc.txt\n# demo\nedited\nuser',
      );
      // Each goes on on its own: the fork's writes (in a folder the source made) and the source's.
      await run(copy, 'echo "console.log(2);" > src/main.js && echo f > dir/fork.txt');
      await run(source, 'echo s > src/source.js');
      expect(names(await source.workspace.changes())).toEqual([
        ...common,
        'added dir/c.txt',
        'deleted old.txt',
        'added src/source.js',
      ]);
      expect(names(await copy.workspace.changes())).toEqual([
        ...common,
        'added dir/c.txt',
        'added dir/fork.txt',
        'deleted old.txt',
        'modified src/main.js',
      ]);
      expect(await run(source, 'ls dir; cat src/main.js')).toBe('c.txt\nconsole.log(1);');

      // Apply from the fork: since is the source's mount, so the host edit is a conflict.
      const refused = await copy.workspace.apply().catch((error: Error) => error);
      expect(refused).toBeInstanceOf(InvalidArgumentError);
      expect((refused as Error).message).toMatch(/src\/main\.js/);
      expect(git(repo, 'status', '--porcelain')).toBe('');
      const done = await copy.workspace.apply({ force: true });
      expect(done.forced.map((f) => f.path)).toEqual(['src/main.js']);
      expect(git(repo, 'status', '--porcelain', '-uall')).toBe(
        ' M README.md\n D dir/a.txt\n D dir/b.txt\n D old.txt\n M src/main.js\n?? dir/c.txt\n?? dir/fork.txt\n',
      );
      expect(existsSync(join(repo, 'src', 'source.js'))).toBe(false);
      git(repo, 'checkout', '-q', '--', '.');
      git(repo, 'clean', '-qfd');
    } finally {
      await killAll(boxes);
    }
  }, 60_000);
});
