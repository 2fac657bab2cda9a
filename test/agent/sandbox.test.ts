import { expect, test } from 'vitest';
import { BaseSandbox, Sandbox } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { type ContractBackend, describeBaseSandboxContract } from './contract.js';

/** One real sandbox for a whole contract run: every test works in its own folder. */
async function sandboxBackend(fileTools: Sandbox['fileTools']): Promise<ContractBackend> {
  const abx = await createAbxHome();
  try {
    const sandbox = await Sandbox.create({ home: abx.home });
    sandbox.fileTools = fileTools;
    return {
      sandbox,
      base: '/home/user/contract',
      // The host's /usr is mounted read-only in every sandbox.
      unwritableDir: '/usr',
      nativeFileTools: fileTools === 'native',
      close: async () => {
        await sandbox.kill().catch(() => undefined);
        await abx.close();
      },
    };
  } catch (error) {
    await abx.close();
    throw error;
  }
}

describeBaseSandboxContract('Sandbox (file tools in envd)', () => sandboxBackend('native'));
describeBaseSandboxContract('Sandbox (file tools through execute())', () =>
  sandboxBackend('execute'),
);

test('a Sandbox is a BaseSandbox whose id is its sandboxId', async () => {
  const abx = await createAbxHome();
  try {
    const sandbox = await Sandbox.create({ home: abx.home });
    try {
      expect(sandbox).toBeInstanceOf(BaseSandbox);
      expect(sandbox.id).toBe(sandbox.sandboxId);
      expect(sandbox.fileTools).toBe('native');
      // The SDK's own members keep working next to the agent tools.
      await sandbox.write('/home/user/both.txt', 'from write');
      expect(await sandbox.files.read('/home/user/both.txt')).toBe('from write');
      expect((await sandbox.commands.run('cat both.txt')).stdout).toBe('from write');
      expect((await sandbox.read('both.txt')).fileData?.content).toBe('from write');
      await equivalence(sandbox);
    } finally {
      await sandbox.kill();
    }
  } finally {
    await abx.close();
  }
}, 120_000);

/**
 * The same calls on the same files through both paths give equal results, error messages
 * included: relative and odd paths, every error code, limits. Mutating calls work on two copies
 * of a tree, whose paths are then compared with the copy's name taken out.
 */
async function equivalence(sandbox: Sandbox): Promise<void> {
  const setup = await sandbox.execute(
    [
      'set -e; mkdir -p eq/src/deep eq/.cache eq/empty && cd eq',
      'printf "one\\r\\ntwo\\r\\nthree" > dos.txt; : > empty.txt; printf "\\377\\376A" > blob.dat',
      'i=0; while [ $i -lt 50 ]; do echo "line $i needle"; i=$((i+1)); done > src/many.txt',
      'echo needle > src/deep/a.py; echo needle > .cache/b.py; echo "x" > src/.dot.py',
      'ln -s nowhere dangling; ln -s src/many.txt link.txt; mkfifo fifo',
      'mkdir ../eq-a && cp -r src dos.txt blob.dat ../eq-a/ && cp -r ../eq-a ../eq-b',
    ].join('\n'),
  );
  expect(setup.exitCode, setup.output).toBe(0);
  const calls: [string, (box: Sandbox) => Promise<unknown>][] = [
    ['read page', (b) => b.read('eq/src/many.txt', { offset: 10, limit: 5 })],
    ['read crlf', (b) => b.read('/home/user/eq/dos.txt')],
    ['read empty', (b) => b.read('eq/empty.txt')],
    ['read binary', (b) => b.read('eq/blob.dat')],
    ['read media', (b) => b.read('eq/dos.txt.png')],
    ['read past end', (b) => b.read('eq/dos.txt', { offset: 9 })],
    ['read limit 0', (b) => b.read('eq/dos.txt', { limit: 0 })],
    ['read dir', (b) => b.read('eq/src')],
    ['read fifo', (b) => b.read('eq/fifo')],
    ['read link', (b) => b.read('eq/link.txt', { limit: 1 })],
    ['read dangling', (b) => b.read('eq/dangling')],
    ['read empty path', (b) => b.read('')],
    ['read NUL', (b) => b.read('eq/a\0b')],
    ['ls', (b) => b.ls('eq')],
    ['ls file', (b) => b.ls('eq/dos.txt')],
    ['ls missing', (b) => b.ls('eq/nope')],
    ['grep', (b) => b.grep('needle', { path: 'eq' })],
    ['grep max', (b) => b.grep('needle', { path: 'eq', maxCount: 3 })],
    ['grep glob', (b) => b.grep('needle', { path: 'eq', glob: '*.py' })],
    ['grep slash glob', (b) => b.grep('needle', { path: 'eq', glob: 'src/**/*.txt' })],
    ['grep bad glob', (b) => b.grep('needle', { path: 'eq', glob: '../*' })],
    ['grep file', (b) => b.grep('two', { path: 'eq/dos.txt' })],
    ['grep missing', (b) => b.grep('x', { path: 'eq/nope' })],
    ['glob', (b) => b.glob('*.py', { path: 'eq' })],
    ['glob slash', (b) => b.glob('src/**', { path: 'eq' })],
    ['glob default path', (b) => b.glob('eq/*.txt')],
    ['glob bad', (b) => b.glob('a/../../b', { path: 'eq' })],
    ['glob file root', (b) => b.glob('*', { path: 'eq/dos.txt' })],
    ['glob missing', (b) => b.glob('*', { path: 'eq/nope' })],
  ];
  const mutations: [string, (box: Sandbox, root: string) => Promise<unknown>][] = [
    ['edit once', (b, r) => b.edit(`${r}/src/deep/a.py`, 'needle', 'pin')],
    ['edit many', (b, r) => b.edit(`${r}/src/many.txt`, 'needle', 'pin')],
    ['edit all', (b, r) => b.edit(`${r}/src/many.txt`, 'needle', 'pin', { replaceAll: true })],
    ['edit crlf', (b, r) => b.edit(`${r}/dos.txt`, 'one\ntwo', '1\n2')],
    ['edit missing text', (b, r) => b.edit(`${r}/dos.txt`, 'zzz', 'y')],
    ['edit not text', (b, r) => b.edit(`${r}/blob.dat`, 'A', 'B')],
    ['edit dir', (b, r) => b.edit(`${r}/src`, 'A', 'B')],
    ['edit missing', (b, r) => b.edit(`${r}/nope`, 'A', 'B')],
    ['edit empty old', (b, r) => b.edit(`${r}/dos.txt`, '', 'B')],
    ['delete file', (b, r) => b.delete(`${r}/dos.txt`)],
    ['delete missing', (b, r) => b.delete(`${r}/nope`)],
    ['delete tree', (b, r) => b.delete(`${r}/src`)],
  ];
  const run = async (fileTools: Sandbox['fileTools'], root: string) => {
    sandbox.fileTools = fileTools;
    const results: Record<string, unknown> = {};
    for (const [name, call] of calls) results[name] = await call(sandbox);
    for (const [name, call] of mutations) {
      results[name] = JSON.parse(
        JSON.stringify(await call(sandbox, root)).replaceAll(root, 'ROOT'),
      );
    }
    return results;
  };
  try {
    const execute = await run('execute', 'eq-a');
    const native = await run('native', 'eq-b');
    expect(native).toEqual(execute);
    const tree = (root: string) =>
      sandbox.execute(`cd ${root} && find . | sort && cat src/many.txt dos.txt 2>&1`);
    expect((await tree('eq-b')).output).toBe((await tree('eq-a')).output);
  } finally {
    sandbox.fileTools = 'native';
  }
}
