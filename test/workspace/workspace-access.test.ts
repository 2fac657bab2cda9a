import { execFile } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  type DaemonInfo,
  InvalidArgumentError,
  Sandbox,
  type SandboxError,
} from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { curlAs, snapshot } from './fixture.js';

// Who may mount which host folder (docs/workspaces.md, "Who may mount what"), against a real
// root daemon: a key that is not an admin, used by a process running as uid 65534, may mount
// only a folder that uid can read; then that uid is the sandbox's user on the tree, and an
// apply writes only where it may. An admin key may mount any folder.

const isRoot = process.getuid?.() === 0;
const NOBODY = 65534;
const OTHER = 4321;
const run = promisify(execFile);

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let home: string;
let key: string;
let otherKey: string;
const folders: string[] = [];

const daemonInfo = () => JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as DaemonInfo;

/** A call of the daemon's API from a process running as uid 65534 (curl, through setpriv). */
async function asNobody(
  method: string,
  path: string,
  body: unknown,
  as = key,
  url = daemonInfo().apiUrl,
) {
  const { status, text } = await curlAs(NOBODY, as, url, method, path, body);
  return { status, body: JSON.parse(text) as Record<string, unknown> };
}

/** A folder of mode `mode` owned by `uid`, in /tmp (which every uid may search). */
function folder(uid: number, mode: number): string {
  const dir = mkdtempSync(join(tmpdir(), 'abx-ws-access-'));
  folders.push(dir);
  chownSync(dir, uid, uid);
  chmodSync(dir, mode);
  return dir;
}

function file(path: string, uid: number, text: string): void {
  writeFileSync(path, text);
  chownSync(path, uid, uid);
}

beforeAll(async () => {
  if (!isRoot) return;
  abx = await createAbxHome();
  home = abx.home;
  await startDaemon(home);
  key = (await ApiKeys.create('ws-local', { home })).key;
  otherKey = (await ApiKeys.create('ws-other', { home })).key;
}, 120_000);

afterAll(async () => {
  await abx?.close();
  for (const dir of folders) rmSync(dir, { recursive: true, force: true });
}, 60_000);

describe.skipIf(!isRoot)('who may mount which host folder', () => {
  test('a key that is not an admin: 403 for a folder its local user cannot read', async () => {
    const otherHome = folder(OTHER, 0o700);
    const refused = [
      '/root',
      otherHome,
      ...(existsSync('/etc/ssl/private') ? ['/etc/ssl/private'] : []),
    ];
    for (const from of refused) {
      const answer = await asNobody('POST', '/v1/sandboxes', { workspace: { from } });
      expect([answer.status, answer.body.code], from).toEqual([403, 'workspace_denied']);
      expect(answer.body.error).toContain(`workspace.from ${from}: uid ${NOBODY}`);
    }
    // Through the gateway (one URL for the API and the sandboxes), the API's client is the
    // daemon itself: no local user, whoever sent it, even for a folder every uid may read.
    const forwarded = await asNobody(
      'POST',
      '/v1/sandboxes',
      { workspace: { from: '/usr/share' } },
      key,
      daemonInfo().gatewayUrl,
    );
    expect([forwarded.status, forwarded.body.code]).toEqual([403, 'workspace_denied']);
    expect(forwarded.body.error).toMatch(/did not come from a process on the daemon's host/);
    // A folder that is not there as that user sees it; a link it may not follow.
    const missing = await asNobody('POST', '/v1/sandboxes', { workspace: { from: '/nope' } });
    expect(missing.status).toBe(400);
    const own = folder(NOBODY, 0o755);
    const link = join(own, 'to-root');
    await run('ln', ['-s', '/root', link]);
    const linked = await asNobody('POST', '/v1/sandboxes', { workspace: { from: link } });
    expect([linked.status, linked.body.code]).toEqual([403, 'workspace_denied']);
    // Nothing was started.
    expect(await Sandbox.list({ home })).toEqual([]);
  }, 60_000);

  test("allowed for its own folder: the sandbox gets that user's rights, and apply writes only where it may", async () => {
    const own = folder(NOBODY, 0o755);
    file(join(own, 'mine.txt'), NOBODY, 'mine\n');
    file(join(own, 'other.txt'), OTHER, 'not mine\n');
    // A folder of root's the user may read, not write, holding a file of the user's; and a
    // folder of the user's that it may not write (0555) as it is.
    mkdirSync(join(own, 'locked'), { mode: 0o755 });
    file(join(own, 'locked', 'stuck.txt'), NOBODY, 'stuck\n');
    mkdirSync(join(own, 'ro'), { mode: 0o555 });
    chownSync(join(own, 'ro'), NOBODY, NOBODY);
    const made = await asNobody('POST', '/v1/sandboxes', {
      workspace: { from: own, path: '/home/user/own' },
    });
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    const id = made.body.sandboxId as string;
    try {
      const box = await Sandbox.connect(id, { home });
      const sh = async (cmd: string) => (await box.commands.run(cmd)).stdout;
      expect(
        await sh('cd ~/own && stat -c "%n %U" mine.txt other.txt locked locked/stuck.txt'),
      ).toBe('mine.txt user\nother.txt nobody\nlocked nobody\nlocked/stuck.txt user\n');
      // What the user may not write, the sandbox may not either (root's folder is nobody's).
      expect(await sh('cd ~/own && (echo x > locked/new.txt) 2>/dev/null || echo refused')).toBe(
        'refused\n',
      );
      // Its own read-only folder it may make writable in its layer: the host's stays 0555.
      await sh('cd ~/own && echo changed >> mine.txt && chmod u+w ro && echo new > ro/new.txt');
      // Another key does not reach this key's sandbox's workspace: as an unknown sandbox.
      const foreign = await asNobody('POST', `/v1/sandboxes/${id}/workspace/apply`, {}, otherKey);
      expect(foreign.status).toBe(404);

      const refused = await asNobody('POST', `/v1/sandboxes/${id}/workspace/apply`, {});
      expect([refused.status, refused.body.code]).toEqual([400, 'workspace_refused']);
      expect(refused.body.error).toContain(
        `ro/new.txt: uid ${NOBODY} (the user the workspace was mounted for) may not write and search the folder ${join(own, 'ro')}`,
      );
      expect(refused.body.error).not.toContain('mine.txt');
      expect(readFileSync(join(own, 'mine.txt'), 'utf8')).toBe('mine\n');
      const dry = await asNobody('POST', `/v1/sandboxes/${id}/workspace/apply`, {
        paths: ['ro/'],
        dryRun: true,
      });
      expect([dry.status, dry.body.code]).toEqual([400, 'workspace_refused']);
      const applied = await asNobody('POST', `/v1/sandboxes/${id}/workspace/apply`, {
        paths: ['mine.txt'],
      });
      expect(applied.status, JSON.stringify(applied.body)).toBe(200);
      expect(readFileSync(join(own, 'mine.txt'), 'utf8')).toBe('mine\nchanged\n');
      expect(existsSync(join(own, 'ro', 'new.txt'))).toBe(false);
    } finally {
      await Sandbox.kill(id, { home });
    }
  }, 90_000);

  test("an admin's apply writes as the folder's owner, not as root: where the owner may not write, root does not either", async () => {
    // The owner's folder holds `ro/`, mode 0555: root could write in it, its owner cannot.
    const dir = folder(OTHER, 0o755);
    mkdirSync(join(dir, 'ro'));
    file(join(dir, 'ro', 'keep.txt'), OTHER, 'keep\n');
    chownSync(join(dir, 'ro'), OTHER, OTHER);
    chmodSync(join(dir, 'ro'), 0o555);
    file(join(dir, 'ok.txt'), OTHER, 'one\n');
    const box = await Sandbox.create({ home, workspace: { from: dir } });
    try {
      // The sandbox is the owner there: it may make ro/ writable in its own view.
      const edit = await box.commands.run(
        'cd ~/workspace && chmod u+w ro && echo new > ro/new.txt && echo two > ok.txt',
      );
      expect(edit.exitCode).toBe(0);
      const before = snapshot(dir);
      const failed = (await box.workspace.apply().catch((error: Error) => error)) as SandboxError;
      expect(failed).toBeInstanceOf(InvalidArgumentError);
      expect(failed.message).toMatch(
        /^apply failed at ro\/new\.txt and was rolled back: the host folder is as it was, nothing written: EACCES/,
      );
      expect(failed.message).toMatch(new RegExp(`as uid ${OTHER}\\)$`));
      // The rollback's fields cross the user's process and the API (workspace_write_failed).
      expect([failed.code, failed.details]).toEqual([
        'workspace_write_failed',
        { path: 'ro/new.txt', written: [], rolledBack: true, notRestored: [] },
      ]);
      // ok.txt, written before it (in path order), is not: the host is as it was, no temporary
      // file left.
      expect(snapshot(dir)).toEqual(before);
      expect(readFileSync(join(dir, 'ok.txt'), 'utf8')).toBe('one\n');
      expect(Object.keys(before).sort()).toEqual(['ok.txt', 'ro', 'ro/keep.txt']);
    } finally {
      await box.kill();
    }
  }, 60_000);

  test('an admin key (here the daemon key) may mount /root', async () => {
    const box = await Sandbox.create({ home, workspace: { from: '/root', path: '/mnt/root' } });
    try {
      expect((await box.commands.run('test -d /mnt/root && echo yes')).stdout).toBe('yes\n');
    } finally {
      await box.kill();
    }
  }, 60_000);
});
