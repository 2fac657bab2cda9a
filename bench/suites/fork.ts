// `--only fork` (bench/README.md).
import { Sandbox, type SandboxCreateOptions } from 'abx-sandbox';
import { log, ms, results, row, scale } from '../runner.js';
import { round, summarize } from '../stats.js';

/**
 * Fork (issue 29): `sandbox.fork()` → first command done in the fork, of a sandbox with 100 MiB
 * of random bytes in its home (nothing for a sparse copy to skip) and of one with an empty home,
 * against create → first command of the same template (the warm pool serves it: what a user
 * gets), one of each per round so noise falls on all alike. Each fork and sandbox is killed
 * after its round, off the clock.
 */
export async function fork(template: string) {
  log('fork → first command, 100 MiB home and empty, against create');
  const full = await Sandbox.create({ template });
  const empty = await Sandbox.create({ template });
  try {
    await full.commands.run('head -c 100M /dev/urandom > ~/data.bin && sync');
    const times = {
      full: [] as number[],
      empty: [] as number[],
      create: [] as number[],
      cold: [] as number[],
    };
    const createOnce = async (into: number[], options: SandboxCreateOptions) => {
      const t0 = performance.now();
      const box = await Sandbox.create({ template, ...options });
      await box.commands.run('true');
      into.push(performance.now() - t0);
      await box.kill();
    };
    const forkOnce = async (source: Sandbox, into: number[]) => {
      const t0 = performance.now();
      const [box] = await source.fork();
      await box?.commands.run('true');
      into.push(performance.now() - t0);
      await box?.kill();
    };
    for (let i = 0; i < scale(20, 5); i++) {
      await forkOnce(full, times.full);
      await forkOnce(empty, times.empty);
      await createOnce(times.create, {});
      // A network policy of its own: the pool cannot serve it, the sandbox starts afresh (as a
      // fork does), on the internet network the template gives too.
      await createOnce(times.cold, { network: { allowOut: [], denyOut: [] } });
    }
    const [f, e, c] = [summarize(times.full), summarize(times.empty), summarize(times.create)];
    const cold = summarize(times.cold);
    results.fork = { home100MiB: f, emptyHome: e, create: c, coldCreate: cold };
    results.forkP50Ms = round(f.p50, 1);
    row(
      '12 fork',
      'fork → first command, 100 MiB in home',
      ms(f),
      `${round(f.p50 / c.p50, 1)}× create p50`,
    );
    row(
      '12 fork',
      'fork → first command, empty home',
      ms(e),
      `${round(e.p50 / c.p50, 1)}× create p50`,
    );
    row('12 fork', 'create → first command (same rounds)', ms(c), 'the warm pool serves creates');
    row(
      '12 fork',
      'cold create → first command (same rounds)',
      ms(cold),
      `started afresh, as a fork is; fork of 100 MiB = ${round(f.p50 / cold.p50, 1)}× this`,
    );
  } finally {
    await full.kill();
    await empty.kill();
  }
}
