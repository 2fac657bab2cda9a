import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, test } from 'vitest';
import { LocalShellSandbox } from '../../src/index.js';
import { describeBaseSandboxContract } from './contract.js';

describeBaseSandboxContract('LocalShellSandbox', async () => {
  const root = await mkdtemp(join(tmpdir(), 'abx-local-shell-'));
  return {
    sandbox: new LocalShellSandbox({ root }),
    base: join(root, 'contract'),
    // sysfs refuses new files even to root.
    unwritableDir: '/sys',
    close: () => rm(root, { recursive: true, force: true }),
  };
});

test('LocalShellSandbox runs commands in its root and resolves relative paths there', async () => {
  const root = await mkdtemp(join(tmpdir(), 'abx-local-shell-'));
  try {
    const box = new LocalShellSandbox({ root, id: 'mine' });
    expect(box.id).toBe('mine');
    expect((await box.execute('pwd')).output.trim()).toBe(root);
    await box.write('rel/file.txt', 'x');
    expect((await box.ls('rel')).entries?.map((e) => e.path)).toEqual([`${root}/rel/file.txt`]);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('LocalShellSandbox marks output beyond maxOutputBytes as truncated', async () => {
  const root = await mkdtemp(join(tmpdir(), 'abx-local-shell-'));
  try {
    const box = new LocalShellSandbox({ root, maxOutputBytes: 10 });
    const result = await box.execute('echo 0123456789abcdef');
    expect(result).toEqual({ output: '0123456789', exitCode: 0, truncated: true });
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});
