// `--only lifecycle`, `--only server-start` (bench/README.md).
import { Sandbox } from 'abx-sandbox';
import { BenchCommands } from '../commands.js';
import { poolRefilled, poolSize } from '../measure.js';
import { goal, log, ms, results, row, scale } from '../runner.js';
import { round, type Summary, summarize } from '../stats.js';

export async function lifecycle(template: string) {
  log('sandbox create → first command → kill');
  // Warm: the pool refilled (its sandbox started, its idle processes ready) before each create,
  // as a script that creates now and then finds it. The floor beside it: a command on the sandbox
  // just made, the same call without the create.
  const created: number[] = [];
  const floor: number[] = [];
  const killed: number[] = [];
  for (let i = 0; i < scale(30, 10); i++) {
    await poolRefilled(template);
    const t0 = performance.now();
    const sandbox = await Sandbox.create({ template });
    await sandbox.commands.run('true');
    created.push(performance.now() - t0);
    const t1 = performance.now();
    await sandbox.commands.run('true');
    floor.push(performance.now() - t1);
    const t2 = performance.now();
    await sandbox.kill();
    killed.push(performance.now() - t2);
  }
  // Back to back: each create right after the last one's kill, faster than the pool refills.
  const backToBack: number[] = [];
  for (let i = 0; i < scale(30, 10); i++) {
    const t0 = performance.now();
    const sandbox = await Sandbox.create({ template });
    await sandbox.commands.run('true');
    backToBack.push(performance.now() - t0);
    await sandbox.kill();
  }
  /** 20 creates at once, each with its first command; the wall time and each one's. */
  const burst = async () => {
    const t = performance.now();
    const many = await Promise.all(
      Array.from({ length: 20 }, async () => {
        const t0 = performance.now();
        const sandbox = await Sandbox.create({ template });
        await sandbox.commands.run('true');
        return { sandbox, ms: performance.now() - t0 };
      }),
    );
    const wall = performance.now() - t;
    await Promise.all(many.map(({ sandbox }) => sandbox.kill()));
    return { wall, each: summarize(many.map((m) => m.ms)) };
  };
  // The first burst finds the pool a sequential stream of creates left (one or two sandboxes);
  // the second one comes after the pool grew to the first (up to ABX_WARM_POOL) and refilled.
  const first = await burst();
  const pool = await poolSize(template);
  const again = await burst();
  const wall = first.wall;
  results.lifecycle = {
    createToFirstCommand: summarize(created),
    commandOnRunning: summarize(floor),
    createToFirstCommandBackToBack: summarize(backToBack),
    kill: summarize(killed),
    concurrent20: { wallMs: round(wall, 1), each: first.each },
    concurrent20Again: { wallMs: round(again.wall, 1), each: again.each, pooledBefore: pool },
  };
  const floorP50 = summarize(floor).p50;
  goal(
    'createToFirstCommandP50Ms',
    'create → first command done p50 (warm pool)',
    summarize(created).p50,
    'ms',
    floorP50 + 10,
    false,
    { value: floorP50, unit: 'ms', what: "`commands.run('true')` on a running sandbox" },
  );
  goal('concurrent20WallMs', '20 creates at once, wall', wall, 'ms', 1000, false);
  row(
    '4 lifecycle',
    'create → first command done (pool refilled before each)',
    ms(summarize(created)),
    `goal p50 ≤ ${round(floorP50 + 10, 1)} ms (a command on a running sandbox + 10 ms)`,
  );
  row('4 lifecycle', "commands.run('true') on the sandbox just made", ms(summarize(floor)));
  row(
    '4 lifecycle',
    'create → first command done, back to back (the pool drains)',
    ms(summarize(backToBack)),
  );
  row('4 lifecycle', 'kill', ms(summarize(killed)));
  row(
    '4 lifecycle',
    '20 creates at once',
    `${round(wall, 0)} ms wall, each ${ms(first.each)}`,
    'goal wall ≤ 1000 ms',
  );
  row(
    '4 lifecycle',
    '20 creates at once, again',
    `${round(again.wall, 0)} ms wall, each ${ms(again.each)}`,
    `${pool} waited in the pool (it grows to a burst, up to ABX_WARM_POOL)`,
  );
}

/**
 * `server.start()` (issue 31): a restart of the same classes on a running sandbox, one a second
 * (envd has its next idle process ready by then); a bundle new to the sandbox on one fresh from the
 * warm pool, whose idle process waits for it; and create → start → first call answered, the
 * whole of what a script does first, with the pool warm (refilled, idle processes ready, between
 * rounds). Beside them
 * the same new-bundle start on a sandbox that has no idle process (a network policy of its own:
 * not from the pool), so the first start runs Node afresh as every start did before.
 */
export async function serverStart(sandbox: Sandbox, template: string) {
  log('server.start');
  const pause = () => new Promise((resolve) => setTimeout(resolve, 1000));
  const warm: number[] = [];
  for (let i = 0; i < scale(10, 3) + 1; i++) {
    await pause();
    const t0 = performance.now();
    await sandbox.server.start({ commands: [BenchCommands], restart: true });
    if (i > 0) warm.push(performance.now() - t0);
  }
  const newBundle: number[] = [];
  const firstCall: number[] = [];
  const cold: number[] = [];
  const prestarted: boolean[] = [];
  for (let i = 0; i < scale(15, 4); i++) {
    await poolRefilled(template);
    const t0 = performance.now();
    const box = await Sandbox.create({ template });
    const t1 = performance.now();
    await box.server.start({ commands: [BenchCommands] });
    const t2 = performance.now();
    await box.server.call('add', { x: i });
    const t3 = performance.now();
    newBundle.push(t2 - t1);
    firstCall.push(t3 - t0);
    const state = JSON.parse(await box.files.read('/home/user/.abx/server/server-8080.json'));
    prestarted.push(state.prestarted === true);
    await box.kill();
    const plain = await Sandbox.create({ template, network: { allowOut: [], denyOut: [] } });
    try {
      await plain.commands.run('true');
      const t4 = performance.now();
      await plain.server.start({ commands: [BenchCommands] });
      cold.push(performance.now() - t4);
    } finally {
      await plain.kill();
    }
  }
  const [w, n, f, c] = [warm, newBundle, firstCall, cold].map(summarize) as Summary[];
  results.serverStart = {
    restartSameBundle: w,
    newBundlePooled: n,
    createToFirstCall: f,
    newBundleNoIdleProcess: c,
    startsInIdleProcess: prestarted.filter(Boolean).length,
    starts: prestarted.length,
  };
  goal(
    'serverStartWarmP50Ms',
    'server.start() p50, restart of the same classes (1 s apart)',
    w.p50,
    'ms',
    150,
    false,
  );
  goal(
    'serverStartNewBundleP50Ms',
    'server.start() p50, classes new to a sandbox from the warm pool',
    n.p50,
    'ms',
    50,
    false,
  );
  goal(
    'createToFirstCallP50Ms',
    'Sandbox.create() → server.start() → first call answered p50 (warm pool)',
    f.p50,
    'ms',
    60,
    false,
  );
  row('5 server.start', 'restart, same classes (1 s apart)', ms(w), 'goal p50 ≤ 150 ms');
  row(
    '5 server.start',
    'new bundle, sandbox from the pool',
    ms(n),
    `goal p50 ≤ 50 ms; ${prestarted.filter(Boolean).length} of ${prestarted.length} in the idle process`,
  );
  row('5 server.start', 'create → start → first call answered', ms(f), 'goal p50 ≤ 60 ms');
  row(
    '5 server.start',
    'new bundle, sandbox with no idle process (not from the pool)',
    ms(c),
    `Node started afresh: ${round(c.p50 / n.p50, 1)}× the pooled start`,
  );
}
