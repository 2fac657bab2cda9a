import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, Templates } from '../../src/index.js';
import { isEnvdFront } from '../../src/providers/local/envd-sleep.js';
import { isEnvdCommandLine } from '../../src/providers/provider.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { type RootlessDaemon, startRootlessDaemon } from '../helpers/rootless.js';

// envd's front in real sandboxes (docs/providers.md, "envd's front"): a sandbox that has run
// commands and had files written has no Node process; a route only Node's envd serves starts it,
// and it sleeps again once idle (ABX_ENVD_IDLE_MS 1500 here) while the front stays.

const IDLE_MS = 1500;
const FRONT_BUILT = existsSync(join(ROOT, 'dist', 'runtime', 'envd-front'));
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function cmdline(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
}

/** The sandbox's front and its Node envd processes. */
function envdParts(id: string): { front: number[]; node: number[] } {
  const pids = sandboxProcesses(id);
  return {
    front: pids.filter((pid) => isEnvdFront(cmdline(pid))),
    node: pids.filter((pid) => isEnvdCommandLine(cmdline(pid))),
  };
}

async function untilNodeSleeps(id: string): Promise<void> {
  // The idle time, the last keep-alive connection's 5 s, a check's second, room on a busy host.
  const deadline = Date.now() + 20_000;
  while (envdParts(id).node.length > 0) {
    if (Date.now() > deadline) throw new Error(`Node's envd of ${id} still runs`);
    await sleep(100);
  }
}

/** What both daemons' sandboxes must do under the front. */
async function scenario(home: string): Promise<void> {
  const box = await Sandbox.create({ home, envs: { GREETING: 'hello' } });
  try {
    expect((await box.commands.run('echo "$GREETING"; id -u')).stdout).toMatch(/^hello\n\d+\n$/);
    await box.files.write('/home/user/note.txt', 'kept');
    expect(await box.files.read('/home/user/note.txt')).toBe('kept');
    const background = await box.commands.start('sleep 60');
    expect(envdParts(box.sandboxId)).toEqual({ front: [expect.any(Number)], node: [] });

    // A code context is Node's envd's: it starts, and the front's process is still listed.
    const context = await box.createCodeContext({ language: 'python' });
    expect((await box.runCode('print(6 * 7)', { context })).logs.stdout.join('')).toBe('42\n');
    expect(envdParts(box.sandboxId).node).toHaveLength(1);
    expect((await box.commands.list()).map((p) => p.pid)).toContain(background.pid);
    await box.removeCodeContext(context);
    await untilNodeSleeps(box.sandboxId);

    // The front stayed: the process it started is still its, and ids go on.
    expect(await box.commands.kill(background.pid)).toBe(true);
    const later = await box.commands.start('true');
    await later.wait();
    expect(Number(later.pid.slice(1))).toBeGreaterThan(Number(background.pid.slice(1)));
    expect(envdParts(box.sandboxId).front).toHaveLength(1);
    // The daemon reads envd's log as it grows (a long poll): the lines come within moments.
    await expect
      .poll(async () => (await box.logs()).map((line) => line.message), { timeout: 10_000 })
      .toEqual(expect.arrayContaining(['envd started', "envd's Node process started"]));
    expect((await box.logs())[0]?.message).toBe('envd started');

    // A hibernate and a resume: the home comes back (filled once, by Node's envd, before the
    // front answered), and changes after it stay through Node's sleep.
    expect(await box.pause({ memory: false })).toBe(true);
    expect(await box.resume()).toBe(true);
    // The first command after the resume already sees the home as it was.
    expect((await box.commands.run('cat ~/note.txt')).stdout).toBe('kept');
    await box.commands.run('echo v2 > ~/note.txt; echo b > ~/b.txt; rm ~/b.txt');
    const back = await box.commands.run('cat ~/note.txt; ls ~; echo "$GREETING"');
    expect(back.stdout).toBe('v2\nnote.txt\nhello\n');
  } finally {
    await box.kill();
  }
  expect(sandboxProcesses(box.sandboxId)).toEqual([]);
}

describe.skipIf(!FRONT_BUILT)('a root daemon', () => {
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  const before = process.env.ABX_ENVD_IDLE_MS;

  beforeAll(async () => {
    process.env.ABX_ENVD_IDLE_MS = String(IDLE_MS);
    abx = await createAbxHome();
  });

  afterAll(async () => {
    if (before === undefined) delete process.env.ABX_ENVD_IDLE_MS;
    else process.env.ABX_ENVD_IDLE_MS = before;
    await abx?.close();
  });

  test('commands and files need no Node; a code context starts it, it sleeps, the front stays', async () => {
    await scenario(abx.home);
  }, 120_000);
  test('with every pid of its process limit taken, the front still answers: the bomb is killed through it', async () => {
    const file = join(abx.home, 'few-pids.yaml');
    writeFileSync(file, 'name: few-pids\nresources:\n  processes: 40\n');
    await Templates.build(file, { home: abx.home });
    const box = await Sandbox.create({ home: abx.home, template: 'few-pids' });
    try {
      // Forks until the limit refuses, then every process waits: no pid is left for a thread.
      const bomb = await box.commands.start(
        'python3 -c "import os, time\nwhile True:\n  try:\n    if os.fork() == 0: break\n  except OSError: break\ntime.sleep(120)"',
      );
      await sleep(1000);
      expect(await box.commands.kill(bomb.pid)).toBe(true);
      expect((await box.commands.run('echo alive')).stdout).toBe('alive\n');
    } finally {
      await box.kill();
    }
  }, 120_000);
});

describe.skipIf(!FRONT_BUILT)('a rootless daemon', () => {
  let daemon: RootlessDaemon;

  beforeAll(async () => {
    daemon = await startRootlessDaemon({ env: { ABX_ENVD_IDLE_MS: String(IDLE_MS) } });
  }, 300_000);

  afterAll(async () => {
    await daemon?.close();
  });

  test('the same as an unprivileged daemon, its home filled from its copy once', async () => {
    await scenario(daemon.home);
  }, 120_000);
});
