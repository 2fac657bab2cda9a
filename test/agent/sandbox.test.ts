import { expect, test } from 'vitest';
import { BaseSandbox, Sandbox } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { describeBaseSandboxContract } from './contract.js';

// One real sandbox for the whole contract: every test works in its own folder.
describeBaseSandboxContract('Sandbox (bubblewrap, through envd)', async () => {
  const abx = await createAbxHome();
  try {
    const sandbox = await Sandbox.create({ home: abx.home });
    return {
      sandbox,
      base: '/home/user/contract',
      // The host's /usr is mounted read-only in every sandbox.
      unwritableDir: '/usr',
      close: async () => {
        await sandbox.kill().catch(() => undefined);
        await abx.close();
      },
    };
  } catch (error) {
    await abx.close();
    throw error;
  }
});

test('a Sandbox is a BaseSandbox whose id is its sandboxId', async () => {
  const abx = await createAbxHome();
  try {
    const sandbox = await Sandbox.create({ home: abx.home });
    try {
      expect(sandbox).toBeInstanceOf(BaseSandbox);
      expect(sandbox.id).toBe(sandbox.sandboxId);
      // The SDK's own members keep working next to the agent tools.
      await sandbox.write('/home/user/both.txt', 'from write');
      expect(await sandbox.files.read('/home/user/both.txt')).toBe('from write');
      expect((await sandbox.commands.run('cat both.txt')).stdout).toBe('from write');
    } finally {
      await sandbox.kill();
    }
  } finally {
    await abx.close();
  }
});
