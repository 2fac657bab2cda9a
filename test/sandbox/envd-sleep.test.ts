import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, Templates } from '../../src/index.js';
import { isEnvdCommandLine } from '../../src/providers/provider.js';
import { attach } from '../compat/e2b/attach.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';
import { type RootlessDaemon, startRootlessDaemon } from '../helpers/rootless.js';

// envd sleeps when idle (docs/providers.md, "envd sleeps when idle"): with ABX_ENVD_IDLE_MS at
// 1500, a local sandbox's envd exits once nothing has used it for 1.5 s (plus the ≤ 5 s its
// last keep-alive connection lives), the sandbox stays running, and the next request wakes it.
// This file is the shell loop's, which envd sleeps under where the runtime has no front
// (ABX_ENVD_FRONT=0 here; envd-front.test.ts is the front's).

const IDLE_MS = 1500;
/** Idle time, the last keep-alive connection's 5 s, a check's second, and room on a busy host. */
const ASLEEP_WITHIN_MS = 15_000;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function cmdline(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
}

/** The sandbox's envd processes (not its sleep loop, whose script is the shell's). */
function envdPids(id: string): number[] {
  return sandboxProcesses(id).filter((pid) => isEnvdCommandLine(cmdline(pid)));
}

/** Waits until the sandbox's envd is gone while its processes (bwrap, the loop) stay. */
async function untilAsleep(id: string): Promise<void> {
  const deadline = Date.now() + ASLEEP_WITHIN_MS;
  while (envdPids(id).length > 0) {
    if (Date.now() > deadline)
      throw new Error(`envd of ${id} still runs after ${ASLEEP_WITHIN_MS} ms`);
    await sleep(100);
  }
  expect(sandboxProcesses(id).length).toBeGreaterThan(0);
}

describe('a root daemon', () => {
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  const before = process.env.ABX_ENVD_IDLE_MS;
  const frontBefore = process.env.ABX_ENVD_FRONT;

  beforeAll(async () => {
    process.env.ABX_ENVD_IDLE_MS = String(IDLE_MS);
    process.env.ABX_ENVD_FRONT = '0';
    abx = await createAbxHome();
    // The base template has no ports capability: one that does, for the gateway's port request.
    const file = join(abx.home, 'sleep-ports.yaml');
    writeFileSync(file, 'name: sleep-ports\ncapabilities: [shell, files, code, ports]\n');
    await Templates.build(file, { home: abx.home });
  }, 120_000);

  afterAll(async () => {
    if (before === undefined) delete process.env.ABX_ENVD_IDLE_MS;
    else process.env.ABX_ENVD_IDLE_MS = before;
    if (frontBefore === undefined) delete process.env.ABX_ENVD_FRONT;
    else process.env.ABX_ENVD_FRONT = frontBefore;
    await abx?.close();
  });

  test('an idle envd sleeps, the sandbox stays running, and commands, files, ports and the e2b SDK wake it', async () => {
    const box = await Sandbox.create({ home: abx.home, template: 'sleep-ports' });
    try {
      await box.files.write('/home/user/kept.txt', 'before the sleep');
      // A server that is no child of envd (setsid): a port envd no longer forwards once asleep.
      await box.commands.run(
        `setsid node -e "require('http').createServer((q,r)=>r.end('pong')).listen(8080)" </dev/null >/dev/null 2>&1 &`,
      );
      await untilAsleep(box.sandboxId);
      expect((await box.getInfo()).state).toBe('running');
      expect(await box.isRunning()).toBe(true);

      const woke = Date.now();
      const result = await box.commands.run(
        'cat /home/user/kept.txt; echo; stat -c "%a %U %F" /run/abx/wake',
      );
      const wakeMs = Date.now() - woke;
      expect(result.stdout).toBe('before the sleep\n600 user fifo\n');
      expect(wakeMs).toBeLessThan(10_000);
      expect(envdPids(box.sandboxId)).toHaveLength(1);

      await untilAsleep(box.sandboxId);
      await box.files.write('/home/user/after.txt', 'written waking');
      expect(await box.files.read('/home/user/after.txt')).toBe('written waking');

      await untilAsleep(box.sandboxId);
      const answer = await fetch(box.getUrl(8080), {
        headers: { 'x-access-token': box.accessToken },
      });
      expect(`${answer.status} ${await answer.text()}`).toBe('200 pong');

      await untilAsleep(box.sandboxId);
      const gateway = new URL(box.getUrl(49983)).origin;
      const e2b = attach(gateway, box.sandboxId, box.accessToken);
      const ran = await e2b.commands.run('echo "$((6 * 7))"');
      expect(ran.stdout).toBe('42\n');
      expect(await e2b.files.read('/home/user/kept.txt')).toBe('before the sleep');
    } finally {
      await box.kill();
    }
  }, 90_000);

  test("the warm pool's sandbox stays awake while it waits, and sleeps once a create has claimed it", async () => {
    // The daemon's pool keeps one sandbox of each template a create asked for (ABX_WARM_POOL's
    // default); it holds a connection to that sandbox's envd until the claim.
    const first = await Sandbox.create({ home: abx.home });
    let claimed: Sandbox | undefined;
    try {
      let pooled: string | undefined;
      for (let i = 0; i < 300 && !pooled; i++) {
        pooled = (await Sandbox.list({ home: abx.home, state: 'pooled', template: 'base' }))[0]
          ?.sandboxId;
        if (!pooled) await sleep(100);
      }
      expect(pooled).toBeDefined();
      // The claimed one sleeps; the pooled one, idle as long, does not.
      await untilAsleep(first.sandboxId);
      await sleep(IDLE_MS + 1000);
      expect(envdPids(pooled as string)).toHaveLength(1);
      claimed = await Sandbox.create({ home: abx.home });
      expect(claimed.sandboxId).toBe(pooled);
      expect((await claimed.commands.run('echo claimed')).stdout).toBe('claimed\n');
      await untilAsleep(claimed.sandboxId);
    } finally {
      await first.kill();
      await claimed?.kill();
    }
  }, 90_000);

  test('process ids go on after a sleep: an id a client kept never names a later process', async () => {
    const box = await Sandbox.create({ home: abx.home });
    try {
      const ids: string[] = [];
      for (let i = 0; i < 3; i++) {
        const handle = await box.commands.start('true');
        await handle.wait();
        ids.push(handle.pid);
      }
      await untilAsleep(box.sandboxId);
      const later = await box.commands.start('sleep 30');
      expect(ids).not.toContain(later.pid);
      expect(Number(later.pid.replace(/\D/g, ''))).toBeGreaterThan(
        Math.max(...ids.map((id) => Number(id.replace(/\D/g, '')))),
      );
      // A stale id kills nothing: the new process runs on.
      for (const id of ids) expect(await box.commands.kill(id)).toBe(false);
      expect((await box.commands.list()).map((p) => p.pid)).toContain(later.pid);
      await later.kill();
    } finally {
      await box.kill();
    }
  }, 60_000);

  test('a background process, a code context and a watch keep envd awake', async () => {
    const [background, code, watched, control] = await Promise.all(
      [0, 1, 2, 3].map(() => Sandbox.create({ home: abx.home })),
    );
    const boxes = [background, code, watched, control] as Sandbox[];
    try {
      const handle = await (background as Sandbox).commands.start('sleep 60');
      await (code as Sandbox).createCodeContext({ language: 'javascript' });
      const events: string[] = [];
      const watch = await (watched as Sandbox).files.watch('/home/user', (event) => {
        events.push(event.name);
      });
      await untilAsleep((control as Sandbox).sandboxId);
      // The control slept; the others' envds still run, well past the idle time.
      await sleep(IDLE_MS + 1000);
      for (const box of [background, code, watched] as Sandbox[]) {
        expect(envdPids(box.sandboxId)).toHaveLength(1);
      }
      // The watch still reports (its envd never restarted).
      await (watched as Sandbox).files.write('/home/user/seen.txt', 'x');
      for (let i = 0; i < 50 && !events.includes('seen.txt'); i++) await sleep(100);
      expect(events).toContain('seen.txt');
      // Once the background process ends, its envd sleeps as well.
      await (background as Sandbox).commands.kill(handle.pid);
      await untilAsleep((background as Sandbox).sandboxId);
      await watch.stop();
      await untilAsleep((watched as Sandbox).sandboxId);
    } finally {
      await Promise.all(boxes.map((box) => box.kill()));
    }
  }, 90_000);

  test('hibernate and resume, fork and snapshot of a sleeping sandbox; a kill leaves nothing', async () => {
    const box = await Sandbox.create({ home: abx.home, envs: { KEPT: 'env-kept' } });
    try {
      await box.files.write('/home/user/kept.txt', 'kept');
      await untilAsleep(box.sandboxId);
      const [fork] = await box.fork();
      try {
        expect((await (fork as Sandbox).commands.run('cat /home/user/kept.txt')).stdout).toBe(
          'kept',
        );
      } finally {
        await (fork as Sandbox).kill();
      }
      await untilAsleep(box.sandboxId);
      const template = await box.snapshot({ name: `sleep-snap-${Date.now()}` });
      expect(template.name).toMatch(/^sleep-snap-/);
      await untilAsleep(box.sandboxId);
      expect(await box.pause({ memory: false })).toBe(true);
      expect(await box.resume()).toBe(true);
      const back = await box.commands.run('cat /home/user/kept.txt; echo " $KEPT"');
      expect(back.stdout).toBe('kept env-kept\n');
      await untilAsleep(box.sandboxId);
    } finally {
      await box.kill();
    }
    // Nothing of it is left: no process (its loop included) holds the FIFO or anything else.
    expect(sandboxProcesses(box.sandboxId)).toEqual([]);
  }, 120_000);

  test('a process of the sandbox that holds the wake FIFO or writes to it only wakes its own envd', async () => {
    const box = await Sandbox.create({ home: abx.home });
    try {
      // One steals wake lines (it reads the FIFO over and over); one writes garbage to it.
      await box.commands.run(
        'setsid sh -c "while :; do cat /run/abx/wake >/dev/null; done" </dev/null >/dev/null 2>&1 &',
      );
      await untilAsleep(box.sandboxId);
      // The gateway's direct file transfers find the sandbox's user from the loop while envd
      // sleeps (its first transfer), and leave envd asleep.
      await box.files.write('/home/user/direct.txt', 'direct');
      expect(await box.files.read('/home/user/direct.txt')).toBe('direct');
      expect(envdPids(box.sandboxId)).toEqual([]);
      expect((await box.commands.run('echo through')).stdout).toBe('through\n');
      await box.commands.run(
        'setsid sh -c "while :; do head -c 70000 /dev/urandom > /run/abx/wake; sleep 0.2; done" </dev/null >/dev/null 2>&1 &',
      );
      await sleep(IDLE_MS + 500);
      expect((await box.commands.run('echo still')).stdout).toBe('still\n');
      // The daemon and the host are untouched: the sandbox is still the one running.
      expect((await box.getInfo()).state).toBe('running');
    } finally {
      await box.kill();
    }
    expect(sandboxProcesses(box.sandboxId)).toEqual([]);
  }, 90_000);
});

describe('a rootless daemon', () => {
  let daemon: RootlessDaemon;

  beforeAll(async () => {
    daemon = await startRootlessDaemon({
      env: { ABX_ENVD_IDLE_MS: String(IDLE_MS), ABX_ENVD_FRONT: '0' },
    });
  }, 300_000);

  afterAll(async () => {
    await daemon?.close();
  });

  test('a woken envd keeps the home (a resumed sandbox is not refilled from its copy)', async () => {
    const box = await Sandbox.create({ home: daemon.home, envs: { KEPT: 'yes' } });
    try {
      await box.commands.run('echo v1 > ~/a.txt; echo b > ~/b.txt');
      await untilAsleep(box.sandboxId);
      expect(await box.pause({ memory: false })).toBe(true);
      expect(await box.resume()).toBe(true);
      // The resumed envd filled the home from the hibernate's copy, once: changes after it stay
      // through a sleep and a wake.
      await box.commands.run('echo v2 > ~/a.txt; rm ~/b.txt');
      await untilAsleep(box.sandboxId);
      const back = await box.commands.run('cat ~/a.txt; ls ~; echo "$KEPT"');
      expect(back.stdout).toBe('v2\na.txt\nyes\n');
    } finally {
      await box.kill();
    }
    expect(sandboxProcesses(box.sandboxId)).toEqual([]);
  }, 120_000);
});
