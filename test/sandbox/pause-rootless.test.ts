import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { DaemonInfo } from '../../src/index.js';
import { type RootlessDaemon, startRootlessDaemon } from '../helpers/rootless.js';
import { freezeKeepsProcesses, hibernateKeepsFiles, sdkCallsResume } from './pause-scenarios.js';

// Pause and resume with a rootless daemon: without a freezer cgroup of its own the sandbox's
// processes are stopped with SIGSTOP; with cgroups delegated to it, the freezer. A hibernate
// copies the home and /tmp (tmpfs mounts that end with the sandbox) into its folder.

for (const delegateCgroups of [false, true]) {
  describe(`a rootless daemon ${delegateCgroups ? 'with cgroups delegated (the freezer)' : 'without cgroups (SIGSTOP)'}`, () => {
    let daemon: RootlessDaemon;

    beforeAll(async () => {
      daemon = await startRootlessDaemon({ delegateCgroups });
    }, 300_000);

    afterAll(async () => {
      await daemon?.close();
    });

    test('the isolation report says how a pause freezes', () => {
      const info = JSON.parse(readFileSync(join(daemon.home, 'daemon.json'), 'utf8')) as DaemonInfo;
      expect(info.isolation?.limits.pause?.how).toMatch(
        delegateCgroups ? /^the cgroup freezer/ : /^SIGSTOP to each process/,
      );
    });

    test('a frozen sandbox stops where it is and goes on after a resume', async () => {
      await freezeKeepsProcesses({ home: daemon.home });
    }, 120_000);

    test('a hibernated sandbox keeps its home, /tmp and environment', async () => {
      await hibernateKeepsFiles({ home: daemon.home });
    }, 180_000);

    test('SDK calls resume a paused sandbox', async () => {
      await sdkCallsResume({ home: daemon.home });
    }, 120_000);
  });
}
