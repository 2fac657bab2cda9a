import { execFileSync } from 'node:child_process';
import {
  existsSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { InvalidArgumentError, Sandbox } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { mountsUnder } from '../../src/providers/local/volumes.js';
import { abxIn } from '../cli/abx.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { daemonApi, daemonInfoOf, makeRepo } from './fixture.js';

// A workspace in a sandbox of the local provider on a root daemon: a real git repository mounted
// copy-on-write; the sandbox edits, creates and deletes files; the host folder is not written;
// changes() and diff() are exactly that; kill leaves no mount and no layer.

const isRoot = process.getuid?.() === 0;
const STAGE = '/run/abx-volumes';

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let home: string;
let repo: string;

const daemonInfo = () => daemonInfoOf(home);

/** A raw call of the daemon's API with a key (default: the daemon's own). */
const api = (method: string, path: string, body?: unknown, key?: string) =>
  daemonApi(home, method, path, body, key);

const git = (...args: string[]) => execFileSync('git', ['-C', repo, ...args], { encoding: 'utf8' });

/** The repository's files and their contents, `.git` left out. */
function snapshot(): string {
  return execFileSync(
    'sh',
    ['-c', 'find . -path ./.git -prune -o -type f -print | sort | xargs sha256sum'],
    { cwd: repo, encoding: 'utf8' },
  );
}

beforeAll(async () => {
  if (!isRoot) return;
  abx = await createAbxHome();
  home = abx.home;
  repo = makeRepo({
    'README.md': '# demo\n\nline one\nline two\n',
    'old.txt': 'to be deleted\n',
    'src/main.js': 'console.log(1);\n',
  });
  await startDaemon(home);
}, 120_000);

afterAll(async () => {
  await abx?.close();
  if (repo) rmSync(repo, { recursive: true, force: true });
}, 60_000);

describe.skipIf(!isRoot)('a workspace in a root daemon sandbox (local provider)', () => {
  test('edits stay in the sandbox; changes() and diff() are exactly them; apply() writes them; kill leaves nothing', async () => {
    const before = snapshot();
    const box = await Sandbox.create({ home, workspace: { from: repo } });
    let killed = false;
    try {
      const dir = join(home, 'sandboxes', box.sandboxId, 'workspace');
      const run = async (cmd: string) => (await box.commands.run(cmd)).stdout.trim();
      // The sandbox's user owns what the host folder's owner owns, and may write it.
      expect(await run('cd ~/workspace && stat -c %U README.md && id -un')).toBe('user\nuser');
      await run(
        [
          'cd ~/workspace',
          'printf "# demo\\n\\nline one\\nline 2\\n" > README.md',
          'echo "export const x = 1;" > src/new.js',
          'rm old.txt',
        ].join(' && '),
      );
      expect(await run('ls ~/workspace ~/workspace/src')).toContain('new.js');
      // The host folder is unchanged while the sandbox runs.
      expect(snapshot()).toBe(before);
      expect(git('status', '--porcelain')).toBe('');

      const changes = await box.workspace.changes();
      expect(changes.map((c) => [c.status, c.path])).toEqual([
        ['modified', 'README.md'],
        ['deleted', 'old.txt'],
        ['added', 'src/new.js'],
      ]);
      const patch = await box.workspace.diff();
      expect(patch).toContain('diff --git a/README.md b/README.md');
      expect(patch).toContain('+line 2');
      writeFileSync(join(dir, '..', 'check.patch'), patch);
      // git takes it as it is; the host is still untouched.
      execFileSync('git', ['-C', repo, 'apply', '--check', join(dir, '..', 'check.patch')]);
      const raw = await request(
        `${daemonInfo().apiUrl}/v1/sandboxes/${box.sandboxId}/workspace/diff`,
        {
          headers: {
            authorization: `Bearer ${readFileSync(join(home, 'api-key'), 'utf8').trim()}`,
          },
        },
      );
      expect(raw.statusCode).toBe(200);
      expect(raw.headers['content-type']).toMatch(/^text\/x-diff/);
      expect(await raw.body.text()).toBe(patch);
      expect(snapshot()).toBe(before);

      // Apply: a host edit since the start (README.md touched) is a conflict; nothing written.
      const readme = join(repo, 'README.md');
      utimesSync(readme, new Date(), new Date(Date.now() + 1000));
      const conflict = await box.workspace.apply().catch((error: Error) => error);
      expect(conflict).toBeInstanceOf(InvalidArgumentError);
      expect((conflict as Error).message).toMatch(/README\.md/);
      expect(snapshot()).toBe(before);
      const dry = await box.workspace.apply({ paths: ['src/'], dryRun: true });
      expect(dry.applied.map((c) => c.path)).toEqual(['src/new.js']);
      expect(snapshot()).toBe(before);
      const done = await box.workspace.apply({ force: true });
      expect(done.applied.map((c) => c.path).sort()).toEqual([
        'README.md',
        'old.txt',
        'src/new.js',
      ]);
      expect(done.forced.map((f) => f.path)).toEqual(['README.md']);
      expect(git('status', '--porcelain', '-uall')).toBe(
        ' M README.md\n D old.txt\n?? src/new.js\n',
      );
      expect(readFileSync(readme, 'utf8')).toBe('# demo\n\nline one\nline 2\n');
      // Written as the folder's owner; the sandbox's view now equals the host folder.
      expect(statSync(join(repo, 'src', 'new.js')).uid).toBe(statSync(repo).uid);
      expect(await box.workspace.changes()).toEqual([]);
      // The sandbox is frozen only while the daemon reads its workspace.
      expect(await run('echo thawed')).toBe('thawed');
      const applied = snapshot();

      // While it runs: its overlay is on the host (the daemon reads it), nothing is staged.
      expect(mountsUnder(dir)).toEqual([join(dir, 'merged')]);
      expect(existsSync(STAGE) ? mountsUnder(STAGE) : []).toEqual([]);
      killed = await box.kill();
      expect(killed).toBe(true);
      expect(mountsUnder(dir)).toEqual([]);
      expect(existsSync(dir)).toBe(false);
      expect(mountsUnder(repo)).toEqual([]);
      expect(existsSync(STAGE) ? mountsUnder(STAGE) : []).toEqual([]);
      expect(snapshot()).toBe(applied);
      expect(statSync(repo).isDirectory()).toBe(true);
    } finally {
      if (!killed) await box.kill().catch(() => undefined);
    }
  }, 60_000);

  test('refusals: bad from and path, a sandbox without one; a hibernate keeps the changes', async () => {
    const bad = async (workspace: unknown) => api('POST', '/v1/sandboxes', { workspace });
    const notDir = await bad({ from: join(repo, 'README.md') });
    expect(notDir.status).toBe(400);
    expect(notDir.body.error).toMatch(/is not an existing directory/);
    expect((await bad({ from: 'relative/dir' })).body.error).toMatch(/must be the absolute path/);
    for (const path of ['/proc/x', '/etc', '/home/user/../x', '/run/abx']) {
      const refused = await bad({ from: repo, path });
      expect(refused.status, path).toBe(400);
      expect(refused.body.error).toMatch(/workspace\.path/);
    }
    expect((await bad({ from: repo, nope: 1 })).body.error).toMatch(/workspace\.nope/);
    // Who may mount what (a key that is not an admin): workspace-access.test.ts.
    // Nothing was mounted or left by the refusals.
    expect(existsSync(STAGE) ? mountsUnder(STAGE) : []).toEqual([]);
    expect(mountsUnder(join(home, 'sandboxes'))).toEqual([]);

    const box = await Sandbox.create({ home, workspace: { from: repo, path: '/mnt/ws' } });
    try {
      expect((await box.commands.run('head -1 /mnt/ws/README.md')).stdout).toBe('# demo\n');
    } finally {
      await box.kill();
    }
    // A hibernate unmounts it and keeps the layer; the wake mounts it again, the changes kept.
    const sleeper = await Sandbox.create({ home, workspace: { from: repo, path: '/tmp/ws' } });
    try {
      await sleeper.commands.run('echo kept > /tmp/ws/kept.txt');
      const dir = join(home, 'sandboxes', sleeper.sandboxId, 'workspace');
      expect(await sleeper.pause({ memory: false })).toBe(true);
      expect(mountsUnder(dir)).toEqual([]);
      expect(existsSync(join(dir, 'upper', 'kept.txt'))).toBe(true);
      await sleeper.resume();
      expect((await sleeper.commands.run('cat /tmp/ws/kept.txt')).stdout).toBe('kept\n');
      expect((await sleeper.workspace.changes()).map((c) => [c.status, c.path])).toEqual([
        ['added', 'kept.txt'],
      ]);
      expect(existsSync(join(repo, 'kept.txt'))).toBe(false);
    } finally {
      await sleeper.kill();
    }
    const plain = await Sandbox.create({ home });
    try {
      const none = await api('GET', `/v1/sandboxes/${plain.sandboxId}/workspace/changes`);
      expect(none.status).toBe(400);
      expect(none.body.error).toMatch(/has no workspace/);
    } finally {
      await plain.kill();
    }
  }, 60_000);

  test('the CLI: abx create --workspace DIR:PATH, abx diff (patch, --stat, --name-only), abx apply --dry-run, then apply', async () => {
    const folder = mkdtempSync(join(tmpdir(), 'abx-ws-cli-'));
    const { abx: cli } = abxIn(home);
    let id = '';
    try {
      writeFileSync(join(folder, 'notes.txt'), 'one\ntwo\n');
      const made = await cli(['create', '-q', '--workspace', `${folder}:/home/user/proj`]);
      expect([made.code, made.stderr]).toEqual([0, '']);
      id = made.stdout.trim();
      const edit = await cli([
        'exec',
        id,
        '--',
        'cd ~/proj && echo three >> notes.txt && echo hi > new.txt',
      ]);
      expect(edit.code).toBe(0);
      const names = await cli(['diff', '--name-only', id]);
      expect([names.code, names.stdout]).toEqual([0, 'new.txt\nnotes.txt\n']);
      const stat = await cli(['diff', '--stat', id]);
      expect(stat.stdout).toBe(
        ' new.txt | +1 -0\n notes.txt | +1 -0\n 2 files changed, 2 insertions(+), 0 deletions(-)\n',
      );
      const patch = await cli(['diff', id]);
      expect(patch.stdout).toMatch(/^diff --git a\/new\.txt b\/new\.txt\n/);
      expect(patch.stdout).toContain('+three\n');
      // --stat --patch: the stat, a blank line, the same patch (as git diff --stat --patch).
      const both = await cli(['diff', '--stat', '--patch', id]);
      expect(both.stdout).toBe(`${stat.stdout}\n${patch.stdout}`);
      const dry = await cli(['apply', '--dry-run', id]);
      expect(dry.stdout).toBe(
        'would apply added new.txt\nwould apply modified notes.txt\n2 changes would apply (dry run: nothing written)\n',
      );
      expect(existsSync(join(folder, 'new.txt'))).toBe(false);
      const applied = await cli(['apply', id, 'notes.txt']);
      expect([applied.code, applied.stdout]).toEqual([
        0,
        'applied modified notes.txt\n1 change applied\n',
      ]);
      expect(readFileSync(join(folder, 'notes.txt'), 'utf8')).toBe('one\ntwo\nthree\n');
      expect(existsSync(join(folder, 'new.txt'))).toBe(false);
      const wrong = await cli(['create', '--workspace', '']);
      expect(wrong.code).toBe(2);
    } finally {
      if (id) await cli(['kill', id]);
      rmSync(folder, { recursive: true, force: true });
    }
  }, 60_000);
});
