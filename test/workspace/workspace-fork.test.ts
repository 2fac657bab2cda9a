import { execFile } from 'node:child_process';
import { existsSync, lstatSync, renameSync, rmSync, utimesSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { InvalidArgumentError, Sandbox } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { mountsUnder } from '../../src/providers/local/volumes.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { daemonApi, daemonInfoOf, git, makeRepo } from './fixture.js';

// A sandbox's workspace in its forks and snapshots (root daemon, local provider): each fork gets
// its own copy of the upper layer (whiteouts, opaque folders, owners) over the same host folder;
// a snapshot keeps the changes, and creating from it mounts the folder again for the key that
// may mount it.

const isRoot = process.getuid?.() === 0;
const run = promisify(execFile);

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let home: string;
let repo: string;

const daemonInfo = () => daemonInfoOf(home);

/** A raw call of the daemon's API with a key (default: the daemon's own). */
const api = (method: string, path: string, body?: unknown, key?: string) =>
  daemonApi(home, method, path, body, key);

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

  test('a snapshot keeps the changes; creating from it mounts the folder again, for a key that may', async () => {
    const folder = makeRepo({ 'notes.txt': 'one\n', 'gone.txt': 'bye\n', 'keep/a.txt': 'a\n' });
    const boxes: Sandbox[] = [];
    const templateDir = join(home, 'templates', 'ws-snap');
    try {
      const source = await Sandbox.create({
        home,
        workspace: { from: folder, path: '/home/user/proj' },
      });
      boxes.push(source);
      await source.commands.run(
        'cd ~/proj && echo two >> notes.txt && rm gone.txt && echo n > new.txt && rm -rf keep && mkdir keep',
      );
      await source.snapshot({ name: 'ws-snap' });
      // The layer is kept with the snapshot: the whiteout a character device 0/0.
      const whiteout = lstatSync(join(templateDir, 'workspace', 'gone.txt'));
      expect([whiteout.isCharacterDevice(), whiteout.rdev]).toEqual([true, 0]);
      await killAll([source]);
      boxes.length = 0;

      const made = await Sandbox.create({ home, template: 'ws-snap' });
      boxes.push(made);
      expect(
        (await made.commands.run('cd ~/proj && cat notes.txt && ls -A && stat -c %U new.txt'))
          .stdout,
      ).toBe('one\ntwo\n.git\nkeep\nnew.txt\nnotes.txt\nuser\n');
      const expected = [
        'deleted gone.txt',
        'deleted keep/a.txt',
        'added new.txt',
        'modified notes.txt',
      ];
      expect(names(await made.workspace.changes())).toEqual(expected);
      expect(
        (await made.workspace.apply({ dryRun: true })).applied.map((c) => `${c.status} ${c.path}`),
      ).toEqual(expected);
      expect(git(folder, 'status', '--porcelain')).toBe('');

      // Its own workspace besides the snapshot's: refused. A key that may not mount: 403.
      const both = await api('POST', '/v1/sandboxes', {
        template: 'ws-snap',
        workspace: { from: folder },
      });
      expect(both.status).toBe(400);
      expect(both.body.error).toMatch(/cannot name a workspace of its own/);
      expect((await api('POST', '/v1/templates/ws-snap/publish', {})).status).toBe(200);
      const key = await ApiKeys.create('ws-snap-plain', { home });
      // From a process of uid 65534, which cannot read the folder (a 0700 one of root's).
      const { stdout } = await run(
        'setpriv',
        [
          '--reuid=65534',
          '--regid=65534',
          '--clear-groups',
          'curl',
          '-sS',
          '--max-time',
          '30',
          '-H',
          `authorization: Bearer ${key.key}`,
          '-H',
          'content-type: application/json',
          '--data-binary',
          JSON.stringify({ template: 'ws-snap' }),
          '-w',
          '\n%{http_code}',
          `${daemonInfo().apiUrl}/v1/sandboxes`,
        ],
        { timeout: 40_000 },
      );
      expect(stdout.slice(stdout.lastIndexOf('\n') + 1)).toBe('403');
      expect(stdout).toContain('workspace_denied');
      // The host folder gone: 400 naming it; nothing left behind.
      const moved = `${folder}.moved`;
      renameSync(folder, moved);
      try {
        const gone = await api('POST', '/v1/sandboxes', { template: 'ws-snap' });
        expect(gone.status).toBe(400);
        expect(gone.body.error).toContain(folder);
      } finally {
        renameSync(moved, folder);
      }
      await killAll(boxes);
      boxes.length = 0;
      expect(mountsUnder(join(home, 'sandboxes'))).toEqual([]);

      // Removing the snapshot removes its layer.
      expect((await api('DELETE', '/v1/templates/ws-snap')).status).toBe(200);
      expect(existsSync(templateDir)).toBe(false);
    } finally {
      await killAll(boxes);
      await api('DELETE', '/v1/templates/ws-snap').catch(() => undefined);
      rmSync(folder, { recursive: true, force: true });
    }
  }, 60_000);
});
