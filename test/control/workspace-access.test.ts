import {
  chmodSync,
  chownSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { workspaceAccess, workspaceWriteRefusals } from '../../src/control/workspace-access.js';
import { PermissionDeniedError } from '../../src/errors.js';
import type { WorkspaceChange } from '../../src/workspace/index.js';

// The rule of who may mount which host folder, and where an apply may write for the user a
// workspace was mounted for, checked as that user (setpriv: root only). Through a daemon:
// test/workspace/workspace-access.test.ts.

const isRoot = process.getuid?.() === 0;
const U = 65534;
const OTHER = 4321;
let base: string;
let view: string;

const change = (status: WorkspaceChange['status'], path: string, from?: string) =>
  ({ status, path, ...(from ? { from } : {}) }) as WorkspaceChange;

beforeAll(() => {
  if (!isRoot) return;
  base = mkdtempSync(join(tmpdir(), 'abx-ws-rule-'));
  view = mkdtempSync(join(tmpdir(), 'abx-ws-rule-view-'));
  chownSync(base, U, U);
  chmodSync(base, 0o755);
  // U's own file; another uid's file U may not write; a sticky folder everyone may write.
  writeFileSync(join(base, 'mine.txt'), 'x');
  chownSync(join(base, 'mine.txt'), U, U);
  writeFileSync(join(base, 'theirs.txt'), 'x');
  chownSync(join(base, 'theirs.txt'), OTHER, OTHER);
  mkdirSync(join(base, 'sticky'), { mode: 0o777 });
  chmodSync(join(base, 'sticky'), 0o1777);
  writeFileSync(join(base, 'sticky', 'theirs.txt'), 'x');
  chownSync(join(base, 'sticky', 'theirs.txt'), OTHER, OTHER);
  chmodSync(join(base, 'sticky', 'theirs.txt'), 0o666);
  // A folder of root's holding a folder of U's: removing U's emptied folder writes root's.
  mkdirSync(join(base, 'rootdir', 'gone'), { recursive: true, mode: 0o755 });
  chownSync(join(base, 'rootdir', 'gone'), U, U);
  writeFileSync(join(base, 'rootdir', 'gone', 'last.txt'), 'x');
  chownSync(join(base, 'rootdir', 'gone', 'last.txt'), U, U);
  mkdirSync(join(view, 'rootdir'));
  mkdirSync(join(view, 'sticky'));
  symlinkSync('/root', join(base, 'to-root'));
});

afterAll(() => {
  if (base) rmSync(base, { recursive: true, force: true });
  if (view) rmSync(view, { recursive: true, force: true });
});

describe.skipIf(!isRoot)('workspaceAccess', () => {
  test('an admin any folder; no local user nothing; a local user what it can read, resolved as it would', async () => {
    expect(await workspaceAccess('/root', { admin: true, peerUid: undefined })).toEqual({
      from: '/root',
    });
    const remote = await workspaceAccess(base, { admin: false, peerUid: undefined }).catch(
      (error: Error) => error,
    );
    expect(remote).toBeInstanceOf(PermissionDeniedError);
    const denied = await workspaceAccess(join(base, 'to-root'), { admin: false, peerUid: U }).catch(
      (error: Error) => error,
    );
    expect(denied).toBeInstanceOf(PermissionDeniedError);
    expect((denied as Error).message).toContain(`uid ${U}, the user the client runs as`);
    // A link U may follow: the real path is what is mounted.
    symlinkSync(base, `${base}-link`);
    try {
      const grant = await workspaceAccess(`${base}-link`, { admin: false, peerUid: U });
      expect(grant.from).toBe(base);
      expect(grant.user?.uid).toBe(U);
    } finally {
      rmSync(`${base}-link`);
    }
  });
});

describe.skipIf(!isRoot)('workspaceWriteRefusals', () => {
  test('only what the user may write: folders, files, sticky folders, emptied folders', async () => {
    const refused = await workspaceWriteRefusals(U, base, view, [
      change('modified', 'mine.txt'),
      change('added', 'new/deep/file.txt'),
      change('modified', 'theirs.txt'),
      change('deleted', 'sticky/theirs.txt'),
      change('deleted', 'rootdir/gone/last.txt'),
    ]);
    expect(refused.map((r) => r.path).sort()).toEqual([
      'rootdir/gone/last.txt',
      'sticky/theirs.txt',
      'theirs.txt',
    ]);
    expect(refused.find((r) => r.path === 'theirs.txt')?.reason).toBe(
      `uid ${U} (the user the workspace was mounted for) may not write the file ${join(base, 'theirs.txt')}`,
    );
    expect(refused.find((r) => r.path === 'rootdir/gone/last.txt')?.reason).toContain(
      `may not write and search the folder ${join(base, 'rootdir')}`,
    );
    expect(
      await workspaceWriteRefusals(OTHER, base, view, [change('deleted', 'sticky/theirs.txt')]),
    ).toEqual([]);
  });
});
