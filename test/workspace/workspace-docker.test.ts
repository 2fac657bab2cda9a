import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test, vi } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { sandboxesDirHash } from '../../src/providers/docker/container-config.js';
import type { EngineFacts } from '../../src/providers/docker/engine.js';
import { dockerWorkspaceUnavailable } from '../../src/providers/docker/workspace.js';
import { mountsUnder } from '../../src/providers/local/volumes.js';
import { type DockerHome, dockerHome } from '../compat/e2b/docker-home.js';
import { dockerEngine } from '../helpers/docker-images.js';
import { makeRepo } from './fixture.js';

// A workspace on the Docker provider (root daemon, real engine): the daemon mounts the overlay on
// the host and the engine binds it into the container. A real git repository; the container
// edits, creates, deletes, renames and chmods files; the host folder is not written until
// apply(); changes(), diff() and apply() are exactly that; a fork and a hibernate keep the
// changes; kill leaves no mount and no layer.

const engine = await dockerEngine();
const isRoot = process.getuid?.() === 0;
const skip = !isRoot
  ? 'needs root (the daemon mounts the overlay on the host)'
  : (engine.reason ?? false);

/** Every file and link of a tree but .git: its mode, path and content hash, sorted. */
const TREE =
  "find . -path ./.git -prune -o ! -type d -printf '%m %p\\n' | sort -k2 && find . -path ./.git -prune -o -type f -print | sort | xargs sha256sum";

describe.skipIf(skip)('a workspace on the docker provider (root daemon)', () => {
  let abx: DockerHome;
  let repo: string;
  const git = (...args: string[]) =>
    execFileSync('git', ['-C', repo, ...args], { encoding: 'utf8' });
  const tree = (dir: string) => execFileSync('sh', ['-c', TREE], { cwd: dir, encoding: 'utf8' });

  beforeAll(async () => {
    repo = makeRepo(
      {
        'README.md': '# demo\n\nline one\nline two\n',
        'old.txt': 'to be deleted\n',
        'name.txt': 'renamed, not changed\n',
        'run.sh': 'echo run\n',
      },
      'abx-ws-docker-',
    );
    abx = await dockerHome(engine.docker as NonNullable<typeof engine.docker>);
  }, 300_000);

  afterAll(async () => {
    await abx?.close();
    if (repo) rmSync(repo, { recursive: true, force: true });
  }, 60_000);

  test('the container edits, creates, deletes, renames and chmods; changes(), diff() and apply() are exactly that; kill leaves nothing', async () => {
    const before = tree(repo);
    const box = await Sandbox.create({ home: abx.home, workspace: { from: repo } });
    let killed = false;
    try {
      const dir = join(abx.home, 'sandboxes', box.sandboxId, 'workspace');
      const run = async (cmd: string) => (await box.commands.run(cmd)).stdout.trim();
      // The container's user owns what the folder's owner owns, and writes it.
      expect(await run('cd ~/workspace && stat -c %U README.md && id -un')).toBe('user\nuser');
      await run(
        [
          'cd ~/workspace',
          'printf "# demo\\n\\nline one\\nline 2\\n" > README.md',
          'mkdir -p src && echo "export const x = 1;" > src/new.js',
          'rm old.txt',
          'mv name.txt moved.txt',
          'chmod +x run.sh',
        ].join(' && '),
      );
      // The host folder is unwritten while the sandbox runs.
      expect(tree(repo)).toBe(before);
      expect(git('status', '--porcelain')).toBe('');

      const changes = await box.workspace.changes();
      expect(changes.map((c) => [c.status, c.path, c.from ?? ''])).toEqual([
        ['modified', 'README.md', ''],
        ['renamed', 'moved.txt', 'name.txt'],
        ['deleted', 'old.txt', ''],
        ['modified', 'run.sh', ''],
        ['added', 'src/new.js', ''],
      ]);
      const chmod = changes.find((c) => c.path === 'run.sh');
      expect([chmod?.contentChanged, chmod?.modeChanged, chmod?.after?.mode]).toEqual([
        false,
        true,
        0o755,
      ]);

      // git takes the patch in a copy of the repository, and makes it what the sandbox sees.
      const patch = await box.workspace.diff();
      const copy = mkdtempSync(join(tmpdir(), 'abx-ws-docker-copy-'));
      try {
        execFileSync('cp', ['-a', `${repo}/.`, copy]);
        writeFileSync(join(copy, '..', `${copy.split('/').pop()}.patch`), patch);
        const patchFile = join(copy, '..', `${copy.split('/').pop()}.patch`);
        execFileSync('git', ['-C', copy, 'apply', '--check', patchFile]);
        execFileSync('git', ['-C', copy, 'apply', patchFile]);
        rmSync(patchFile);
        const view = await run(`cd ~/workspace && ${TREE}`);
        expect(tree(copy).trim()).toBe(view);
      } finally {
        rmSync(copy, { recursive: true, force: true });
      }
      expect(tree(repo)).toBe(before);

      // A fork gets its own copy of the upper layer: the same changes; its writes are its own.
      const [fork] = await box.fork();
      try {
        const copied = await (fork as Sandbox).workspace.changes();
        expect(copied.map((c) => [c.status, c.path])).toEqual(
          changes.map((c) => [c.status, c.path]),
        );
        await (fork as Sandbox).commands.run('echo fork > ~/workspace/fork.txt');
        expect((await box.commands.run('ls ~/workspace')).stdout).not.toContain('fork.txt');
      } finally {
        await (fork as Sandbox).kill();
      }
      expect(mountsUnder(join(abx.home, 'sandboxes', (fork as Sandbox).sandboxId))).toEqual([]);

      // A snapshot keeps the changes: a sandbox made from it mounts the folder again over them.
      await box.snapshot({ name: 'docker-ws-snap' });
      const made = await Sandbox.create({ home: abx.home, template: 'docker-ws-snap' });
      try {
        expect((await made.workspace.changes()).map((c) => [c.status, c.path])).toEqual(
          changes.map((c) => [c.status, c.path]),
        );
        expect((await made.commands.run('cat ~/workspace/moved.txt')).stdout).toBe(
          'renamed, not changed\n',
        );
      } finally {
        await made.kill();
      }

      // A hibernate unmounts the overlay and keeps its layer; the wake mounts it again.
      expect(await box.pause({ memory: false })).toBe(true);
      expect(mountsUnder(dir)).toEqual([]);
      expect(existsSync(join(dir, 'upper', 'moved.txt'))).toBe(true);
      await box.resume();
      expect(await run('cat ~/workspace/moved.txt')).toBe('renamed, not changed');

      const done = await box.workspace.apply();
      expect(done.applied.map((c) => c.path).sort()).toEqual(
        ['README.md', 'moved.txt', 'old.txt', 'run.sh', 'src/new.js'].sort(),
      );
      // The host folder is the sandbox's view now; git sees exactly those changes.
      expect(tree(repo).trim()).toBe(await run(`cd ~/workspace && ${TREE}`));
      expect(git('status', '--porcelain', '-uall').split('\n').sort().join('\n')).toBe(
        [
          '',
          ' D name.txt',
          ' D old.txt',
          ' M README.md',
          ' M run.sh',
          '?? moved.txt',
          '?? src/new.js',
        ]
          .sort()
          .join('\n'),
      );
      expect(await box.workspace.changes()).toEqual([]);

      // While it runs, the overlay is mounted on the host; kill takes it and its layers.
      expect(mountsUnder(dir)).toEqual([join(dir, 'merged')]);
      killed = await box.kill();
      expect(killed).toBe(true);
      expect(mountsUnder(dir)).toEqual([]);
      expect(mountsUnder(repo)).toEqual([]);
      expect(existsSync(dir)).toBe(false);
    } finally {
      if (!killed) await box.kill().catch(() => undefined);
    }
  }, 60_000);

  test('an uploaded workspace: a fork shares its base, a snapshot keeps a copy; the base goes with the last sandbox', async () => {
    const bases = join(abx.home, 'workspace-bases');
    const folder = mkdtempSync(join(tmpdir(), 'abx-ws-docker-up-'));
    writeFileSync(join(folder, 'a.txt'), 'a\n');
    writeFileSync(join(folder, 'b.txt'), 'b\n');
    const boxes: Sandbox[] = [];
    try {
      const box = await Sandbox.create({
        home: abx.home,
        workspace: { from: folder, upload: true },
      });
      boxes.push(box);
      await box.commands.run('cd ~/workspace && echo a2 >> a.txt && rm b.txt');
      const [fork] = await box.fork();
      boxes.push(fork as Sandbox);
      expect(readdirSync(bases)).toHaveLength(1);
      await box.snapshot({ name: 'docker-ws-up-snap' });
      await box.kill();
      expect(
        (await (fork as Sandbox).commands.run('cd ~/workspace && ls && cat a.txt')).stdout,
      ).toBe('a.txt\na\na2\n');
      await (fork as Sandbox).kill();
      expect(readdirSync(bases)).toEqual([]);
      const made = await Sandbox.create({ home: abx.home, template: 'docker-ws-up-snap' });
      boxes.push(made);
      expect((await made.workspace.changes()).map((c) => `${c.status} ${c.path}`)).toEqual([
        'modified a.txt',
        'deleted b.txt',
      ]);
      await made.kill();
      expect(readdirSync(bases)).toEqual([]);
      expect(mountsUnder(join(abx.home, 'sandboxes'))).toEqual([]);
    } finally {
      for (const box of boxes) await box.kill().catch(() => false);
      rmSync(folder, { recursive: true, force: true });
    }
  }, 90_000);

  test('a failed start (envd cannot run) leaves no mount, no layer and no container', async () => {
    const failed = await Sandbox.create({
      home: abx.home,
      workspace: { from: repo },
      envs: { NODE_OPTIONS: '--no-such-option' },
    }).catch((error: Error) => error);
    expect(failed).toBeInstanceOf(Error);
    expect((failed as Error).message).toMatch(/did not start[\s\S]*NODE_OPTIONS/);
    expect(mountsUnder(join(abx.home, 'sandboxes'))).toEqual([]);
    const left = execFileSync(
      'sh',
      ['-c', `ls -d ${abx.home}/sandboxes/*/workspace 2>/dev/null || true`],
      {
        encoding: 'utf8',
      },
    );
    expect(left).toBe('');
    const containers = await engine.docker?.listContainers({
      all: true,
      filters: { label: [`abx.sandboxes-dir=${sandboxesDirHash(join(abx.home, 'sandboxes'))}`] },
    });
    expect(containers).toEqual([]);
  }, 30_000);
});

describe('which docker daemons refuse a workspace, and why', () => {
  const facts = { rootless: false, usernsRemap: false } as EngineFacts;
  test('a non-root daemon, a remote engine, a rootless engine, an unknown userns-remap range', () => {
    const getuid = vi.spyOn(process, 'getuid').mockReturnValue(1000);
    try {
      expect(dockerWorkspaceUnavailable('/var/run/docker.sock', facts)).toMatch(
        /only for a root daemon for now.*run the daemon as root/,
      );
    } finally {
      getuid.mockRestore();
    }
    if (!isRoot) return;
    expect(dockerWorkspaceUnavailable('/var/run/docker.sock', facts)).toBeUndefined();
    expect(dockerWorkspaceUnavailable('tcp://10.0.0.2:2375', facts)).toMatch(
      /engine at tcp:\/\/10\.0\.0\.2:2375 is not reached through a socket of this host/,
    );
    expect(dockerWorkspaceUnavailable('/run/docker.sock', { ...facts, rootless: true })).toMatch(
      /only with a root Docker engine/,
    );
    expect(dockerWorkspaceUnavailable('/run/docker.sock', { ...facts, usernsRemap: true })).toMatch(
      /userns-remap/,
    );
    expect(
      dockerWorkspaceUnavailable('/run/docker.sock', {
        ...facts,
        usernsRemap: true,
        usernsRoot: 100000,
      }),
    ).toBeUndefined();
  });
});
