import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect } from 'vitest';
import { test } from './plane.js';

describe('adoption after a daemon restart', () => {
  test('live sandboxes are adopted, dead ones marked and cleaned, orphans swept', async ({
    open,
  }) => {
    // The previous daemon: three sandboxes and a spare one, then it "crashes" (no close).
    const before = open({ warmPool: 1 });
    const alive = (await before.sandboxes.create({ metadata: { keep: 'yes' } })).record;
    const dies = (await before.sandboxes.create({})).record;
    const killed = (await before.sandboxes.create({})).record;
    await before.sandboxes.kill(killed.id);
    await before.sandboxes.refill('base');
    const pooled = (await before.sandboxes.list({ state: 'pooled' })).map((r) => r.id);
    expect(pooled).toHaveLength(1);
    const spare = pooled[0] as string;

    // While no daemon runs: one sandbox is OOM-killed, and one was started but never recorded.
    await before.provider.die(dies.id, 'oom');
    const orphan = await before.provider.plantOrphan(before.sandboxesDir, 'iorphan000000001');
    const killsBefore = before.provider.killed.length;

    // The next daemon: same registry file, same host.
    const after = open({ after: before, warmPool: 1 });
    const result = await after.sandboxes.adopt();

    expect(result).toEqual({ adopted: [alive.id], dead: [dies.id], orphans: [orphan.id] });
    // The adopted one runs on, as it was.
    expect(await after.sandboxes.get(alive.id)).toMatchObject({
      state: 'running',
      metadata: { keep: 'yes' },
    });
    expect(after.provider.isAlive(alive.handle)).toBe(true);
    expect(existsSync(join(after.sandboxesDir, alive.id))).toBe(true);
    // The dead one is recorded with its cause, its folder removed.
    expect(await after.sandboxes.get(dies.id)).toMatchObject({ state: 'dead', endReason: 'oom' });
    expect(existsSync(join(after.sandboxesDir, dies.id))).toBe(false);
    // The killed one stays as it was.
    expect(await after.sandboxes.get(killed.id)).toMatchObject({ state: 'killed' });
    // The previous daemon's spare sandbox may be of an older build: killed, row and folder gone.
    expect(await after.registry.getSandbox(spare)).toBeUndefined();
    expect(after.provider.isAlive(before.provider.sandbox(spare).handle)).toBe(false);
    expect(existsSync(join(after.sandboxesDir, spare))).toBe(false);
    // The orphan is killed and its folder removed.
    expect(orphan.alive).toBe(false);
    expect(existsSync(join(after.sandboxesDir, orphan.id))).toBe(false);
    // The sweep was told which sandboxes run (the adopted one only), in this installation.
    expect(after.provider.sweeps.at(-1)).toEqual({
      sandboxesDir: after.sandboxesDir,
      running: [alive.id],
    });
    // Adoption killed the spare, the orphan and what the dead one left; never the live one.
    expect(after.provider.killed.slice(killsBefore).sort()).toEqual(
      [spare, dies.id, orphan.id].sort(),
    );
    expect(after.provider.aliveIds()).toEqual([alive.id]);

    // The new daemon manages the adopted sandbox like its own.
    expect(await after.sandboxes.kill(alive.id)).toBe(true);
    expect(after.provider.isAlive(alive.handle)).toBe(false);
  });

  test('an adoption with nothing left behind finds nothing', async ({ open }) => {
    const plane = open({ warmPool: 1 });
    expect(await plane.sandboxes.adopt()).toEqual({ adopted: [], dead: [], orphans: [] });
    expect(plane.provider.kills).toBe(0);
    expect(plane.provider.sweeps).toEqual([{ sandboxesDir: plane.sandboxesDir, running: [] }]);
  });
});
