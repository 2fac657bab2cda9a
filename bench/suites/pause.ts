// `--only pause` (bench/README.md).
import { spawn } from 'node:child_process';
import { Sandbox } from 'abx-sandbox';
import {
  hostBusyShare,
  memAvailable,
  meminfo,
  poolSize,
  sandboxesCpuShare,
  settledMemAvailable,
} from '../measure.js';
import { children, goal, log, ms, results, row, scale } from '../runner.js';
import { round, type Summary, summarize } from '../stats.js';

/**
 * Pause and resume (docs/lifecycle.md): a freeze and its resume, a hibernate and the resume to
 * the first command after it against a cold create (no warm pool: the same network, started
 * afresh) to its first command; then 20 busy sandboxes frozen (the host's CPU they used) and 20
 * holding 64 MiB each hibernated (the host's MemAvailable they give back).
 */
export async function pauses(template: string) {
  log('pause, resume, hibernate');
  const rounds = scale(20, 5);
  const frozen: number[] = [];
  const thawed: number[] = [];
  const hibernated: number[] = [];
  const woken: number[] = [];
  const cold: number[] = [];
  const box = await Sandbox.create({ template, timeoutMs: 1_800_000 });
  try {
    await box.commands.start('i=0; while :; do i=$((i+1)); sleep 0.05; done');
    await box.files.write('kept.txt', 'kept');
    for (let i = 0; i < rounds; i++) {
      let t = performance.now();
      await box.pause();
      frozen.push(performance.now() - t);
      t = performance.now();
      await box.resume();
      thawed.push(performance.now() - t);
      t = performance.now();
      await box.pause({ memory: false });
      hibernated.push(performance.now() - t);
      t = performance.now();
      await box.resume();
      await box.commands.run('true');
      woken.push(performance.now() - t);
      // A cold create of the same network, interleaved so noise falls on both alike.
      t = performance.now();
      const fresh = await Sandbox.create({ template, network: { allowOut: [], denyOut: [] } });
      await fresh.commands.run('true');
      cold.push(performance.now() - t);
      await fresh.kill();
    }
  } finally {
    await box.kill();
  }
  const [pause, resume, hibernate, wake, coldCreate] = [
    frozen,
    thawed,
    hibernated,
    woken,
    cold,
  ].map(summarize) as [Summary, Summary, Summary, Summary, Summary];

  // 20 sandboxes, each a busy loop: the host's CPU with them running, then frozen. Started
  // afresh (a network of their own), so that no pool refill runs on the host meanwhile.
  const afresh = () =>
    Sandbox.create({ template, timeoutMs: 1_800_000, network: { allowOut: [], denyOut: [] } });
  const many = await Promise.all(Array.from({ length: 20 }, afresh));
  let busyRunning = 0;
  let busyFrozen = 0;
  let ownRunning = 0;
  let ownFrozen = 0;
  let memRecovered = 0;
  let memRecoveredAtOneSecond = 0;
  let memAfterOneSecond = 0;
  let memSettleMs = 0;
  let memRecoveredByPlainProcesses = 0;
  let anonRecovered = 0;
  let heldMiB = 0;
  try {
    await Promise.all(many.map((s) => s.commands.start('while :; do :; done')));
    // The pool's refills after 20 creates are done first: they would count as the host's.
    await poolSize(template);
    const ids = many.map((s) => s.sandboxId);
    [ownRunning, busyRunning] = await Promise.all([
      sandboxesCpuShare(ids, 2000),
      hostBusyShare(2000),
    ]);
    await Promise.all(many.map((s) => s.pause()));
    [ownFrozen, busyFrozen] = await Promise.all([
      sandboxesCpuShare(ids, 2000),
      hostBusyShare(2000),
    ]);
    await Promise.all(many.map((s) => s.kill()));
    // 20 holding 64 MiB each, once all hold it (a marker file says so): then hibernated.
    const holders = await Promise.all(Array.from({ length: 20 }, afresh));
    many.splice(0, many.length, ...holders);
    await poolSize(template);
    const before = memAvailable();
    const anonBefore = meminfo('AnonPages');
    await Promise.all(
      holders.map(async (s) => {
        await s.commands.start(
          `python3 -c "b = bytearray(64 << 20); open('/tmp/held', 'w').write('1'); import time; time.sleep(3600)"`,
        );
        await s.commands.run('while [ ! -f /tmp/held ]; do sleep 0.05; done', {
          timeoutMs: 60_000,
        });
      }),
    );
    const holding = memAvailable();
    const anonHolding = meminfo('AnonPages');
    await Promise.all(holders.map((s) => s.pause({ memory: false })));
    const settled = await settledMemAvailable(before - holding);
    memSettleMs = settled.ms;
    memAfterOneSecond = settled.atOneSecond;
    const after = settled.value;
    anonRecovered = (anonHolding - meminfo('AnonPages')) / Math.max(1, anonHolding - anonBefore);
    heldMiB = (before - holding) / 1024 ** 2;
    memRecovered = (after - holding) / Math.max(1, before - holding);
    memRecoveredAtOneSecond = (memAfterOneSecond - holding) / Math.max(1, before - holding);
    // The baseline of the same run: 20 plain host processes holding 64 MiB each, killed. What
    // this VM gives back to MemAvailable for them is what it can give back for any process.
    await Promise.all(many.map((s) => s.kill()));
    many.splice(0);
    const hostBefore = memAvailable();
    const plain = Array.from({ length: 20 }, () =>
      spawn(
        'python3',
        ['-c', 'b = bytearray(64 << 20); print(1, flush=True); import time; time.sleep(600)'],
        {
          stdio: ['ignore', 'pipe', 'ignore'],
        },
      ),
    );
    children.push(...plain);
    await Promise.all(
      plain.map((child) => new Promise((resolve) => child.stdout?.once('data', resolve))),
    );
    const hostHolding = memAvailable();
    for (const child of plain) child.kill('SIGKILL');
    const hostSettled = await settledMemAvailable(hostBefore - hostHolding);
    memRecoveredByPlainProcesses =
      (hostSettled.value - hostHolding) / Math.max(1, hostBefore - hostHolding);
  } finally {
    await Promise.all(many.map((s) => s.kill()));
  }
  results.pauses = {
    pause,
    resume,
    hibernate,
    resumeFromHibernateToFirstCommand: wake,
    coldCreateToFirstCommand: coldCreate,
    hostCpuBusy20Running: round(busyRunning, 3),
    hostCpuBusy20Frozen: round(busyFrozen, 3),
    sandboxesCpu20Running: round(ownRunning, 3),
    sandboxesCpu20Frozen: round(ownFrozen, 3),
    memHeldBy20MiB: round(heldMiB, 0),
    memRecoveredByHibernate20: round(memRecovered, 3),
    memRecoveredByHibernate20AtOneSecond: round(memRecoveredAtOneSecond, 3),
    memSettleMs: round(memSettleMs, 0),
    memRecoveredByKilling20PlainProcesses: round(memRecoveredByPlainProcesses, 3),
    anonRecoveredByHibernate20: round(anonRecovered, 3),
  };
  goal(
    'resumeFromHibernateToFirstCommandP50Ms',
    'resume from hibernate → first command p50 (goal: ≤ a cold create → first command, same run)',
    wake.p50,
    'ms',
    round(coldCreate.p50, 1),
    false,
  );
  goal(
    'hibernate20MemRecoveredShare',
    'MemAvailable and per-CPU free pages given back by hibernating 20 sandboxes holding 64 MiB each (share)',
    memRecovered,
    '',
    0.9,
    true,
  );
  results.pauseP50Ms = round(pause.p50, 2);
  results.resumeP50Ms = round(resume.p50, 2);
  results.hibernateP50Ms = round(hibernate.p50, 2);
  row('13 pause', 'pause (freeze)', ms(pause));
  row('13 pause', 'resume (thaw)', ms(resume));
  row('13 pause', 'hibernate', ms(hibernate), 'the processes end, the disk stays');
  row('13 pause', 'resume from hibernate → first command', ms(wake), 'goal p50 ≤ a cold create');
  row('13 pause', 'cold create → first command (same network, no pool)', ms(coldCreate));
  row(
    '13 pause',
    "CPU of 20 sandboxes' busy loops: running → frozen",
    `${round(ownRunning * 100, 1)}% → ${round(ownFrozen * 100, 1)}% of the host's cores`,
    `their own processes, 2 s each; the whole host (the daemon, other load): ${round(busyRunning * 100, 1)}% → ${round(busyFrozen * 100, 1)}%`,
  );
  row(
    '13 pause',
    'MemAvailable (+ per-CPU free lists) given back by hibernating 20 sandboxes',
    `${round(memRecovered * 100, 1)}% of ${round(heldMiB, 0)} MiB`,
    `goal ≥ 90%; 20 plain host processes of 64 MiB killed give back ${round(memRecoveredByPlainProcesses * 100, 1)}% (${round(memRecovered / Math.max(0.001, memRecoveredByPlainProcesses), 2)}× that); once it stopped growing (${round(memSettleMs / 1000, 1)} s; ${round(memRecoveredAtOneSecond * 100, 1)}% after 1 s); the processes' memory (AnonPages) given back: ${round(anonRecovered * 100, 1)}%`,
  );
}
