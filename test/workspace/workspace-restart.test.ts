import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { startDaemon, stopDaemon } from '../../src/installation/daemon-connection.js';
import { mountsUnder } from '../../src/providers/local/volumes.js';
import { ApiKeys } from '../../src/sandbox/api-keys.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';
import { curlAs, daemonApi, daemonInfoOf } from './fixture.js';

// A daemon restart keeps whom a workspace was mounted for (docs/workspaces.md, "Who may mount
// what"): a key that is not an admin, used by a process of uid 65534, mounts its folder; the
// daemon is stopped (gracefully, then with SIGKILL) and started again on the same home; the
// adopted sandbox's review still works and its apply still writes as that uid, refusing what
// that uid may not write (root could: a daemon that forgot the uid would write it as root).

const isRoot = process.getuid?.() === 0;
const NOBODY = 65534;

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let home: string;
let key: string;
let dir: string;

/** A call of the daemon's API from a process running as uid 65534 (curl, through setpriv). */
function asNobody(method: string, path: string, body?: unknown) {
  return curlAs(NOBODY, key, daemonInfoOf(home).apiUrl, method, path, body);
}

beforeAll(async () => {
  if (!isRoot) return;
  process.env.ABX_WARM_POOL = '0';
  abx = await createAbxHome();
  home = abx.home;
  // Root's folder (uid 65534 may read it) holding a folder of 65534's, and in it one of its own
  // that it may not write (0555): only root may.
  dir = mkdtempSync(join(tmpdir(), 'abx-ws-restart-'));
  chmodSync(dir, 0o755);
  const mine = join(dir, 'mine');
  mkdirSync(join(mine, 'ro'), { recursive: true });
  writeFileSync(join(mine, 'a.txt'), 'a\n');
  for (const path of [mine, join(mine, 'ro'), join(mine, 'a.txt')]) {
    chownSync(path, NOBODY, NOBODY);
  }
  chmodSync(join(mine, 'ro'), 0o555);
  await startDaemon(home);
  key = (await ApiKeys.create('ws-restart', { home })).key;
}, 120_000);

afterAll(async () => {
  delete process.env.ABX_WARM_POOL;
  await abx?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
}, 60_000);

/**
 * Freezes a sandbox's processes behind the daemon's back, as the daemon does while it reads a
 * workspace: its freezer cgroup (v1 or v2), else SIGSTOP.
 */
function freezeByHand(id: string): void {
  const pids = sandboxProcesses(id);
  const lines = readFileSync(`/proc/${pids[0]}/cgroup`, 'utf8').split('\n');
  const v1 = lines.find((line) => line.split(':')[1]?.split(',').includes('freezer'));
  const v2 = lines.find((line) => line.startsWith('0::'));
  const file = v1
    ? `/sys/fs/cgroup/freezer${v1.split(':')[2]}/freezer.state`
    : `/sys/fs/cgroup${v2?.slice(3)}/cgroup.freeze`;
  if ((v1 || v2) && existsSync(file)) writeFileSync(file, v1 ? 'FROZEN' : '1');
  else for (const pid of pids) process.kill(pid, 'SIGSTOP');
}

/** SIGKILLs the daemon, then starts another on the same home. */
async function killDaemon(): Promise<void> {
  const before = daemonInfoOf(home).pid;
  process.kill(before, 'SIGKILL');
  while (existsSync(`/proc/${before}`)) await new Promise((r) => setTimeout(r, 25));
  await startDaemon(home);
  expect(daemonInfoOf(home).pid).not.toBe(before);
}

describe.skipIf(!isRoot)('a daemon restart and a workspace mounted for a local user', () => {
  test('after a graceful stop and after a SIGKILL, the adopted sandbox still reviews, and applies as that user', async () => {
    const made = await asNobody('POST', '/v1/sandboxes', {
      workspace: { from: dir, path: '/home/user/ws' },
    });
    expect(made.status, made.text).toBe(200);
    const id = JSON.parse(made.text).sandboxId as string;
    try {
      const sh = async (cmd: string) => {
        const box = await Sandbox.connect(id, { home });
        const done = await box.commands.run(`cd ~/ws/mine && ${cmd}`, { timeoutMs: 20_000 });
        expect(done.exitCode, done.stderr).toBe(0);
      };
      // A change it may apply, and one in the folder only root may write (the sandbox may make
      // it writable in its own layer).
      await sh('echo more >> a.txt && chmod u+w ro && echo new > ro/new.txt');

      /** What must hold after each restart: the review, and the apply as uid 65534. */
      const check = async (file: string, expected: string[]) => {
        const changes = await asNobody('GET', `/v1/sandboxes/${id}/workspace/changes`);
        expect(changes.status, changes.text).toBe(200);
        const entries = JSON.parse(changes.text).entries as { status: string; path: string }[];
        expect(entries.map((c) => `${c.status} ${c.path}`)).toEqual(expected);
        const diff = await asNobody('GET', `/v1/sandboxes/${id}/workspace/diff`);
        expect(diff.status, diff.text).toBe(200);
        expect(diff.text).toContain(`+++ b/mine/${file}`);
        // Everything: refused for ro/, as uid 65534 (nothing written).
        const all = await asNobody('POST', `/v1/sandboxes/${id}/workspace/apply`, {});
        expect(all.status, all.text).toBe(400);
        expect(JSON.parse(all.text).code).toBe('workspace_refused');
        expect(all.text).toContain(
          `mine/ro/new.txt: uid ${NOBODY} (the user the workspace was mounted for) may not write and search the folder ${join(dir, 'mine', 'ro')}`,
        );
        expect(existsSync(join(dir, 'mine', 'ro', 'new.txt'))).toBe(false);
        const one = await asNobody('POST', `/v1/sandboxes/${id}/workspace/apply`, {
          paths: [`mine/${file}`],
        });
        expect(one.status, one.text).toBe(200);
        expect(statSync(join(dir, 'mine', file)).uid).toBe(NOBODY);
      };

      await stopDaemon(home);
      await startDaemon(home);
      await check('a.txt', ['modified mine/a.txt', 'added mine/ro/new.txt']);
      expect(readFileSync(join(dir, 'mine', 'a.txt'), 'utf8')).toBe('a\nmore\n');

      await sh('echo b > b.txt');
      // Frozen, as a daemon killed while it read the workspace (or copied it for a fork or a
      // snapshot) leaves it: the next daemon adopts it running, so it must run.
      freezeByHand(id);
      await killDaemon();
      await sh('true');
      // The file applied before is no change any more; the new one is.
      await check('b.txt', ['added mine/b.txt', 'added mine/ro/new.txt']);
      expect(readFileSync(join(dir, 'mine', 'b.txt'), 'utf8')).toBe('b\n');

      // Hibernated across a SIGKILL: the wake mounts it again, for the same uid.
      await sh('echo c > c.txt');
      const box = await Sandbox.connect(id, { home });
      expect(await box.pause({ memory: false })).toBe(true);
      await killDaemon();
      expect((await Sandbox.list({ home, state: ['paused'] })).map((s) => s.sandboxId)).toEqual([
        id,
      ]);
      const woken = await daemonApi(home, 'POST', `/v1/sandboxes/${id}/resume`, {});
      expect(woken.status, JSON.stringify(woken.body)).toBe(200);
      await check('c.txt', ['added mine/c.txt', 'added mine/ro/new.txt']);

      // The adopted sandbox's kill unmounts its workspace and removes its layers.
      expect(await Sandbox.kill(id, { home })).toBe(true);
      expect(mountsUnder(join(home, 'sandboxes'))).toEqual([]);
      expect(existsSync(join(home, 'sandboxes', id))).toBe(false);
      expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(id);
    } finally {
      await Sandbox.kill(id, { home }).catch(() => false);
    }
  }, 90_000);
});
