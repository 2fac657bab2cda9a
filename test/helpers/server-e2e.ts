import { join } from 'node:path';
import { commandRegistry, Sandbox, Templates } from '../../src/index.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome } from './abx-home.js';
import { ROOT } from './build.js';

/** The template whose sandboxes have the ports capability and a YAML command (`shout`). */
export const SERVER_E2E_TEMPLATE = join(ROOT, 'test', 'fixtures', 'templates', 'server-e2e.yaml');

/**
 * A private installation with the server-e2e template built, one sandbox of it, and its command
 * server running the SandboxCommands fixture. `close()` kills everything, also after a failure.
 */
export async function servedSandbox() {
  const abx = await createAbxHome();
  let sandbox: Sandbox;
  try {
    await Templates.build(SERVER_E2E_TEMPLATE, { home: abx.home });
    sandbox = await Sandbox.create({ home: abx.home, template: 'server-e2e' });
    commandRegistry().registerClass(SandboxCommands);
    await sandbox.server.start({ commands: [SandboxCommands] });
  } catch (error) {
    // Nothing half-started stays behind when the setup itself fails.
    await abx.close();
    throw error;
  }
  return {
    abx,
    sandbox,
    async close() {
      await sandbox.kill().catch(() => undefined);
      await abx.close();
    },
  };
}
