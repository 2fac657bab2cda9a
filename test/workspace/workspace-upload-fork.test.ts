import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { startDaemon, stopDaemon } from '../../src/installation/daemon-connection.js';
import { mountsUnder } from '../../src/providers/local/volumes.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { daemonApi, daemonInfoOf } from './fixture.js';

// An uploaded workspace (a remote client's folder) in forks and snapshots (root daemon, local
// provider): a fork shares the uploaded base and gets its own copy of the changes; the base goes
// with the last sandbox that names it, and survives a daemon restart while one does; a snapshot
// keeps a copy of the base and the changes, independent of the upload.

const isRoot = process.getuid?.() === 0;

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let home: string;
let folder: string;
let alice: { apiUrl: string; apiKey: string };
let bobKey: string;

const daemonInfo = () => daemonInfoOf(home);
/** The uploaded bases in use (`$ABX_HOME/workspace-bases/ID`). */
const bases = () => {
  const dir = join(home, 'workspace-bases');
  return existsSync(dir) ? readdirSync(dir) : [];
};

/** A raw call of the daemon's API with `key`. */
const api = (method: string, path: string, key: string, body?: unknown) =>
  daemonApi(home, method, path, body, key);

const names = (changes: { status: string; path: string }[]) =>
  changes.map((c) => `${c.status} ${c.path}`);
const sh = async (box: Sandbox, cmd: string) =>
  (await box.commands.run(`cd ~/workspace && ${cmd}`)).stdout.trim();

beforeAll(async () => {
  if (!isRoot) return;
  abx = await createAbxHome();
  home = abx.home;
  await startDaemon(home);
  alice = {
    apiUrl: daemonInfo().apiUrl,
    apiKey: (await ApiKeys.create('ws-up-alice', { home })).key,
  };
  bobKey = (await ApiKeys.create('ws-up-bob', { home })).key;
  folder = mkdtempSync(join(tmpdir(), 'abx-ws-upfork-'));
  writeFileSync(join(folder, 'a.txt'), 'a\n');
  writeFileSync(join(folder, 'b.txt'), 'b\n');
  mkdirSync(join(folder, 'keep'));
  writeFileSync(join(folder, 'keep', 'k.txt'), 'k\n');
}, 120_000);

afterAll(async () => {
  await abx?.close();
  if (folder) rmSync(folder, { recursive: true, force: true });
}, 60_000);

describe.skipIf(!isRoot)('an uploaded workspace in forks and snapshots (root daemon)', () => {
  test('a fork shares the base and copies the changes; the base goes with the last sandbox', async () => {
    const boxes: Sandbox[] = [];
    try {
      const source = await Sandbox.create({ ...alice, workspace: { from: folder, upload: true } });
      boxes.push(source);
      await sh(source, 'echo a2 >> a.txt && rm b.txt && echo c > c.txt');
      const [uploadId] = bases();
      expect(uploadId).toMatch(/^wsu_/);
      // Another key's fork and snapshot: the sandbox does not exist for it.
      for (const path of ['fork', 'snapshot']) {
        const other = await api('POST', `/v1/sandboxes/${source.sandboxId}/${path}`, bobKey, {
          name: 'ws-up-bob',
        });
        expect({ path, status: other.status }).toEqual({ path, status: 404 });
      }
      expect(bases()).toEqual([uploadId]);

      const fork = (await source.fork())[0] as Sandbox;
      boxes.push(fork);
      // One base for both: the fork sees it and the source's changes at fork time.
      expect(bases()).toEqual([uploadId]);
      expect(await sh(fork, 'ls; cat a.txt')).toBe('a.txt\nc.txt\nkeep\na\na2');
      await sh(source, 'echo s > s.txt');
      await sh(fork, 'echo f > f.txt');
      expect(names(await source.workspace.changes())).toEqual([
        'modified a.txt',
        'deleted b.txt',
        'added c.txt',
        'added s.txt',
      ]);
      expect(names(await fork.workspace.changes())).toEqual([
        'modified a.txt',
        'deleted b.txt',
        'added c.txt',
        'added f.txt',
      ]);
      // The daemon's apply stays refused for the fork too (the client applies locally).
      await expect(fork.workspace.apply()).rejects.toThrow(/applyLocal/);

      // Killing the source keeps the fork's base; killing the fork too removes it.
      await source.kill();
      expect(bases()).toEqual([uploadId]);
      expect(await sh(fork, 'cat keep/k.txt')).toBe('k');
      await fork.kill();
      expect(bases()).toEqual([]);
      expect(mountsUnder(join(home, 'sandboxes'))).toEqual([]);
    } finally {
      await Promise.all(boxes.map((box) => box.kill().catch(() => false)));
    }
  }, 90_000);

  test('a snapshot keeps a copy of the base and the changes; its sandboxes outlive the upload and a daemon restart', async () => {
    const boxes: Sandbox[] = [];
    const templateDir = join(home, 'templates', 'ws-up-snap');
    try {
      const source = await Sandbox.create({
        ...alice,
        workspace: { from: folder, upload: true, path: '/home/user/workspace' },
      });
      boxes.push(source);
      await sh(source, 'echo a2 >> a.txt && rm b.txt && echo c > c.txt');
      await source.snapshot({ name: 'ws-up-snap' });
      await source.kill();
      boxes.length = 0;
      // The upload's base went with its only sandbox; the snapshot has its own copy.
      expect(bases()).toEqual([]);
      expect(readFileSync(join(templateDir, 'workspace-upload', 'base', 'b.txt'), 'utf8')).toBe(
        'b\n',
      );

      const made = await Sandbox.create({ ...alice, template: 'ws-up-snap' });
      boxes.push(made);
      expect(await sh(made, 'ls; cat a.txt; stat -c %U c.txt')).toBe(
        'a.txt\nc.txt\nkeep\na\na2\nuser',
      );
      expect(names(await made.workspace.changes())).toEqual([
        'modified a.txt',
        'deleted b.txt',
        'added c.txt',
      ]);
      await expect(made.workspace.apply()).rejects.toThrow(/applyLocal/);
      // Its own base (a new id), made from the snapshot's copy.
      const [base] = bases();
      expect(base).toMatch(/^wsu_/);

      // A daemon restart keeps a base a sandbox uses and removes one no row names.
      const stray = join(home, 'workspace-bases', 'wsu_AAAAAAAAAAAAAAAA');
      mkdirSync(join(stray, 'base'), { recursive: true });
      await stopDaemon(home);
      await startDaemon(home);
      expect(bases()).toEqual([base]);
      alice.apiUrl = daemonInfo().apiUrl;
      const again = await Sandbox.connect(made.sandboxId, alice);
      expect(await sh(again, 'cat keep/k.txt a.txt')).toBe('k\na\na2');

      // The template's removal removes its copy; the sandbox keeps its base until its kill.
      expect((await api('DELETE', '/v1/templates/ws-up-snap', alice.apiKey)).status).toBe(200);
      expect(existsSync(templateDir)).toBe(false);
      expect(await sh(again, 'cat keep/k.txt')).toBe('k');
      await again.kill();
      expect(bases()).toEqual([]);
    } finally {
      await Promise.all(boxes.map((box) => box.kill().catch(() => false)));
      await api('DELETE', '/v1/templates/ws-up-snap', alice.apiKey).catch(() => undefined);
    }
  }, 120_000);
});
