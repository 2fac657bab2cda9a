import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { stopDaemon } from '../../src/installation/daemon-connection.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;

beforeAll(async () => {
  // Read by the daemon the SDK starts for this file: a maximum above the bursts below.
  process.env.ABX_WARM_POOL = '6';
  abx = await createAbxHome();
  home = abx.home;
}, 300_000);

afterAll(async () => {
  await abx?.close();
  delete process.env.ABX_WARM_POOL;
});

/** The pooled sandboxes' ids once there are `n` of them (refills run in the background). */
async function pooledOnce(n: number): Promise<string[]> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const pooled = (await Sandbox.list({ home, state: 'pooled' })).map((s) => s.sandboxId);
    if (pooled.length === n) return pooled.sort();
    if (Date.now() > deadline) throw new Error(`the pool holds ${pooled.length}, not ${n}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe('the warm pool on real sandboxes', () => {
  test('a burst grows the pool to its size, the next burst takes it, a stopping daemon kills it', async () => {
    const burst = (envs: (i: number) => Record<string, string>) =>
      Promise.all(Array.from({ length: 4 }, (_, i) => Sandbox.create({ home, envs: envs(i) })));

    const first = await burst(() => ({}));
    try {
      const ids = new Set(first.map((box) => box.sandboxId));
      expect(ids.size).toBe(4);
      for (const box of first) {
        expect((await box.commands.run('echo $ABX_SANDBOX_ID')).stdout).toBe(`${box.sandboxId}\n`);
      }
    } finally {
      await Promise.all(first.map((box) => box.kill()));
    }

    // Four were wanted at once: four wait now (not the maximum, six), listed only by state.
    const pooled = await pooledOnce(4);
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect((await Sandbox.list({ home, state: 'pooled' })).map((s) => s.sandboxId).sort()).toEqual(
      pooled,
    );
    const listed = (await Sandbox.list({ home })).map((s) => s.sandboxId);
    expect(listed.filter((id) => pooled.includes(id))).toEqual([]);

    const next = await burst((i) => ({ N: String(i) }));
    try {
      expect(next.map((box) => box.sandboxId).sort()).toEqual(pooled);
      for (const [i, box] of next.entries()) {
        expect((await box.commands.run('echo "$N"')).stdout).toBe(`${i}\n`);
        expect((await box.getInfo()).state).toBe('running');
      }
    } finally {
      await Promise.all(next.map((box) => box.kill()));
    }

    // The pool fills again; stopping the daemon kills every pooled sandbox, folder and processes.
    const spares = await pooledOnce(4);
    expect(await stopDaemon(home)).toBe(true);
    for (const id of spares) {
      expect(sandboxProcesses(id)).toEqual([]);
      expect(existsSync(join(home, 'sandboxes', id))).toBe(false);
    }
  }, 180_000);
});
