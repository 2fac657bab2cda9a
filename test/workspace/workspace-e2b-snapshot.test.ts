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
import { Sandbox as E2bSandbox } from 'e2b';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { type DaemonInfo, Sandbox, Template, Templates } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { mountsUnder } from '../../src/providers/local/volumes.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { createAbxHome, removeTemplates } from '../helpers/abx-home.js';
import { curlAs, git, makeRepo, snapshot } from './fixture.js';

// E2B's snapshot route (the unmodified `e2b` SDK's createSnapshot) of a sandbox whose workspace
// (metadata `abx.workspace`) has changes: a sandbox made from the snapshot through E2B's SDK sees
// the folder and the changes, its own writes stay its own, the native SDK's changes() lists both,
// the host folder is never written, another key neither uses nor sees the snapshot, and removing
// it (E2B's deleteSnapshot) removes its kept layer.

const isRoot = process.getuid?.() === 0;
const NOBODY = 65534;

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let home: string;
let info: DaemonInfo;
let repo: string;
let ownKey: string;
let otherKey: string;
let own: string;
const template = `ws-e2b-tpl-${Date.now().toString(36)}`;

beforeAll(async () => {
  if (!isRoot) return;
  process.env.ABX_WARM_POOL = '0';
  abx = await createAbxHome();
  home = abx.home;
  repo = makeRepo({ 'README.md': '# demo\n', 'old.txt': 'bye\n', 'src/main.js': 'one();\n' });
  info = await startDaemon(home);
  // Keys that are not admins: the snapshot is its key's own.
  ownKey = (await ApiKeys.create('ws-e2b-own', { home })).key;
  otherKey = (await ApiKeys.create('ws-e2b-other', { home })).key;
  // Root's folder holding one of uid 65534's, and in that one of its own that only root may
  // write (0555): the workspace of a template every key may use (the daemon's key builds it).
  own = mkdtempSync(join(tmpdir(), 'abx-ws-e2b-own-'));
  chmodSync(own, 0o755);
  mkdirSync(join(own, 'mine', 'ro'), { recursive: true });
  writeFileSync(join(own, 'mine', 'notes.txt'), 'one\n');
  for (const path of ['mine', 'mine/ro', 'mine/notes.txt']) {
    chownSync(join(own, path), NOBODY, NOBODY);
  }
  chmodSync(join(own, 'mine', 'ro'), 0o555);
  await Templates.build(Template.fromBase().setWorkspace(own, '/home/user/own'), {
    home,
    name: template,
  });
}, 120_000);

afterAll(async () => {
  delete process.env.ABX_WARM_POOL;
  if (abx) await removeTemplates(home).catch(() => undefined);
  await abx?.close();
  for (const dir of [repo, own]) if (dir) rmSync(dir, { recursive: true, force: true });
}, 60_000);

const e2b = (apiKey: string) => ({ apiKey, apiUrl: info.apiUrl, sandboxUrl: info.gatewayUrl });
const names = (changes: { status: string; path: string }[]) =>
  changes.map((c) => `${c.status} ${c.path}`);

describe.skipIf(!isRoot)("E2B's snapshot of a sandbox with a workspace (root daemon)", () => {
  test('keeps the changes for its key only; sandboxes from it see them and write their own; removal removes the layer', async () => {
    const host = snapshot(repo);
    const started: E2bSandbox[] = [];
    let snapshotId: string | undefined;
    try {
      const source = await E2bSandbox.create('base', {
        ...e2b(ownKey),
        metadata: { 'abx.workspace': `${repo}:/home/user/proj` },
      });
      started.push(source);
      const sh = async (box: E2bSandbox, cmd: string) =>
        (await box.commands.run(`cd /home/user/proj && ${cmd}`)).stdout;
      await sh(source, 'echo edited >> README.md && rm old.txt && echo n > new.txt');

      // E2B's pause with persistence (a hibernate): no snapshot while paused (409, saying to
      // resume); E2B's connect resumes it, its workspace's changes with it.
      expect(await source.pause({ keepMemory: false })).toBe(true);
      await expect(source.createSnapshot()).rejects.toThrow(/409.*resume/);
      await E2bSandbox.connect(source.sandboxId, e2b(ownKey));
      expect(await sh(source, 'cat README.md; ls')).toBe(
        '# demo\nedited\nREADME.md\nnew.txt\nsrc\n',
      );
      const templatesBefore = readdirSync(join(home, 'templates')).sort();
      const snap = await source.createSnapshot();
      snapshotId = snap.snapshotId;
      const layer = join(home, 'templates', snapshotId, 'workspace');
      expect(existsSync(layer)).toBe(true);
      const kept = snapshot(layer);
      // After the snapshot, the source's writes are not the snapshot's.
      await sh(source, 'echo later > later.txt');

      // Another key: neither uses nor sees it (E2B's not-found shape), nor removes it.
      const foreign = await request(`${info.apiUrl}/v2/sandboxes`, {
        method: 'POST',
        headers: { 'x-api-key': otherKey, 'content-type': 'application/json' },
        body: JSON.stringify({ templateID: snapshotId }),
      });
      const refused = (await foreign.body.json()) as { code: number; message: string };
      expect([foreign.statusCode, refused.code]).toEqual([404, 404]);
      expect(refused.message).toContain(snapshotId);
      await expect(E2bSandbox.create(snapshotId, e2b(otherKey))).rejects.toThrow(/404/);
      const listed = async (key: string) =>
        (await E2bSandbox.listSnapshots(e2b(key)).nextItems()).map((s) => s.snapshotId);
      expect(await listed(otherKey)).not.toContain(snapshotId);
      expect(await listed(ownKey)).toContain(snapshotId);
      expect(await E2bSandbox.deleteSnapshot(snapshotId, e2b(otherKey))).toBe(false);
      await expect(E2bSandbox.createSnapshot(source.sandboxId, e2b(otherKey))).rejects.toThrow(
        /not found/,
      );
      expect(existsSync(layer)).toBe(true);

      // Its key's sandbox from it: the folder and the snapshot's changes, not the source's later.
      const made = await E2bSandbox.create(snapshotId, e2b(ownKey));
      started.push(made);
      expect(await sh(made, 'cat README.md; ls -A; stat -c %U new.txt')).toBe(
        '# demo\nedited\n.git\nREADME.md\nnew.txt\nsrc\nuser\n',
      );
      await sh(made, 'echo two >> src/main.js && echo mine > mine.txt');
      // Its writes are its own: not the source's, not the kept layer's.
      expect(await sh(source, 'cat src/main.js; ls mine.txt 2>&1 || true')).toMatch(
        /^one\(\);\n.*No such file/s,
      );
      expect(snapshot(layer)).toEqual(kept);
      // The native SDK, with the same key: the snapshot's changes plus its own.
      const native = await Sandbox.connect(made.sandboxId, {
        apiUrl: info.apiUrl,
        apiKey: ownKey,
        gatewayUrl: info.gatewayUrl,
      });
      expect(names(await native.workspace.changes())).toEqual([
        'modified README.md',
        'added mine.txt',
        'added new.txt',
        'deleted old.txt',
        'modified src/main.js',
      ]);
      // Another key does not reach the sandbox made from it either.
      const otherChanges = await request(
        `${info.apiUrl}/v1/sandboxes/${made.sandboxId}/workspace/changes`,
        { headers: { authorization: `Bearer ${otherKey}` } },
      );
      await otherChanges.body.dump();
      expect(otherChanges.statusCode).toBe(404);
      // The host folder was never written.
      expect(snapshot(repo)).toEqual(host);
      expect(git(repo, 'status', '--porcelain')).toBe('');

      // A create from it naming a workspace of its own: refused in E2B's shape, nothing made.
      await expect(
        E2bSandbox.create(snapshotId, {
          ...e2b(ownKey),
          metadata: { 'abx.workspace': `${repo}:/home/user/proj` },
        }),
      ).rejects.toThrow(/400.*cannot name a workspace of its own/);

      // Removal (its key, through E2B's SDK) removes the template's folder and its layer; the
      // sandbox made from it keeps its own copy.
      expect(await source.kill()).toBe(true);
      expect(await E2bSandbox.deleteSnapshot(snapshotId, e2b(ownKey))).toBe(true);
      snapshotId = undefined;
      expect(readdirSync(join(home, 'templates')).sort()).toEqual(templatesBefore);
      expect(existsSync(layer)).toBe(false);
      expect(await sh(made, 'cat new.txt mine.txt')).toBe('n\nmine\n');
      expect(names(await native.workspace.changes())).toHaveLength(5);
      expect(await made.kill()).toBe(true);
      started.length = 0;
      expect(mountsUnder(join(home, 'sandboxes'))).toEqual([]);
      const sandboxes = join(home, 'sandboxes');
      expect(existsSync(sandboxes) ? readdirSync(sandboxes) : []).toEqual([]);
      expect(snapshot(repo)).toEqual(host);
    } finally {
      await Promise.all(started.map((box) => box.kill().catch(() => false)));
      if (snapshotId) await E2bSandbox.deleteSnapshot(snapshotId, e2b(ownKey)).catch(() => false);
    }
  }, 90_000);

  test("a template's workspace, mounted for a local user through E2B's face: its snapshot's sandboxes are that user's too", async () => {
    /** E2B's control API from a process of uid 65534 (curl through setpriv), with `ownKey`. */
    const asNobody = async (method: string, path: string, body?: unknown) => {
      const { status, text } = await curlAs(NOBODY, ownKey, info.apiUrl, method, path, body);
      return { status, json: text ? JSON.parse(text) : {} };
    };
    const ids: string[] = [];
    let snapshotId: string | undefined;
    try {
      const source = await asNobody('POST', '/v2/sandboxes', { templateID: template });
      expect(source.status, JSON.stringify(source.json)).toBe(201);
      ids.push(source.json.sandboxID);
      const connect = (id: string) =>
        E2bSandbox.connect(id, { ...e2b(ownKey) }).then((box) => ({
          sh: async (cmd: string) => (await box.commands.run(`cd ~/own/mine && ${cmd}`)).stdout,
        }));
      await (await connect(source.json.sandboxID)).sh('echo two >> notes.txt');
      const snap = await asNobody('POST', `/sandboxes/${source.json.sandboxID}/snapshots`, {});
      expect(snap.status, JSON.stringify(snap.json)).toBe(201);
      snapshotId = snap.json.snapshotID as string;
      const made = await asNobody('POST', '/v2/sandboxes', { templateID: snapshotId });
      expect(made.status, JSON.stringify(made.json)).toBe(201);
      ids.push(made.json.sandboxID);
      const box = await connect(made.json.sandboxID);
      expect(
        await box.sh('cat notes.txt; stat -c %U notes.txt; chmod u+w ro && echo n > ro/new.txt'),
      ).toBe('one\ntwo\nuser\n');
      // Applied from the snapshot's sandbox: as uid 65534, the user it was created for, which
      // may write notes.txt but not in ro/ (root could).
      const apply = (body: unknown) =>
        asNobody('POST', `/v1/sandboxes/${made.json.sandboxID}/workspace/apply`, body);
      const refused = await apply({});
      expect([refused.status, refused.json.code]).toEqual([400, 'workspace_refused']);
      expect(refused.json.error).toContain(
        `mine/ro/new.txt: uid ${NOBODY} (the user the workspace was mounted for) may not write`,
      );
      expect(existsSync(join(own, 'mine', 'ro', 'new.txt'))).toBe(false);
      const applied = await apply({ paths: ['mine/notes.txt'] });
      expect(applied.status, JSON.stringify(applied.json)).toBe(200);
      expect(readFileSync(join(own, 'mine', 'notes.txt'), 'utf8')).toBe('one\ntwo\n');
      expect(statSync(join(own, 'mine', 'notes.txt')).uid).toBe(NOBODY);
    } finally {
      for (const id of ids) await Sandbox.kill(id, { home }).catch(() => false);
      if (snapshotId) await E2bSandbox.deleteSnapshot(snapshotId, e2b(ownKey)).catch(() => false);
    }
  }, 60_000);
});
