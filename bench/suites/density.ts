// `--only density` (bench/README.md, "Density on the default network"): how much memory each
// sandbox takes on the default network (`internet`) and on `none`, and what the network's parts
// cost (issue 50). `--density 150` creates 150 of each instead of 50.
import { spawnSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox, Templates } from 'abx-sandbox';
import { unmountUnder } from '../../src/providers/local/volumes.js';
import { ENVD_NODE_OPTIONS } from '../../src/providers/provider.js';
import {
  childMentioning,
  envdPidOf,
  memAvailable,
  meminfo,
  nodeEnvdPidOf,
  sandboxNetProcesses,
  settledMemAvailable,
} from '../measure.js';
import type { BenchReport } from '../runner.js';
import { ROOT } from '../runner.js';
import { round, summarize } from '../stats.js';

/** What one network's round measured, per sandbox unless said. */
export interface DensityRound {
  network: 'internet' | 'none';
  sandboxes: number;
  /** MemAvailable (and the per-CPU free lists) before the creates less after them, settled. */
  memAvailableDropMiB: number;
  /**
   * What the run's own memory cgroup grew by: the sandboxes, their networks, egress and the
   * daemon, kernel memory included; absent without one (see ownMemoryCgroup).
   */
  chargedMiB?: number;
  /** Of that, what is not page cache the kernel may drop: what MemAvailable would lose. */
  unreclaimableMiB?: number;
  /** Kernel slab and page tables grown (of the whole machine: other work shows too). */
  slabMiB: number;
  pageTablesMiB: number;
  /** The proportional set size of the sandbox's network processes (holder, forwarder). */
  netProcessesPssMiB: number;
  /** Those processes per sandbox (a shared forwarder counts once for all). */
  netProcesses: number;
  /** The egress service's PSS growth. */
  egressPssMiB: number;
  /**
   * envd's own memory, the mean over the sandboxes: its private pages (Private_Clean +
   * Private_Dirty, what it adds) and its PSS (with its share of the node binary's pages).
   */
  envdPrivateMiB: number;
  envdPssMiB: number;
  /**
   * envd's private pages after a busy spell ({@link BUSY_COMMANDS} commands with output, one
   * after another), the mean over {@link BUSY_SANDBOXES} of the sandboxes, read after the other
   * figures: what a sandbox that has worked keeps.
   */
  envdBusyPrivateMiB: number;
  /** p50 of a create (a batch of 10 at once, each timed alone). */
  createP50Ms: number;
  /**
   * Once every envd slept ({@link ENVD_IDLE_MS} idle, then a settle): the charge per sandbox less
   * page cache (the cgroup's; MemAvailable's drop without one), and the p50 of the first command
   * after the sleep (its wake) beside a command on an awake envd. The default network only.
   */
  asleep?: { chargedMiB: number; wakeP50Ms: number; awakeP50Ms: number };
}

export interface DensityFigures {
  rounds: DensityRound[];
  /** The p50 of an internet create less a `none` one: what the network's start adds. */
  netStartMs: number;
}

const MiB = 1024 * 1024;
const BATCH = 10;
const BUSY_SANDBOXES = 5;
const BUSY_COMMANDS = 100;
const PRIVATE_LINES = /^Private_(?:Clean|Dirty):\s+(\d+) kB$/gm;
/**
 * The bench daemon's ABX_ENVD_IDLE_MS: long enough that the awake figures (read within ~30 s of
 * the last command) see every envd, shorter than the default 60 s to keep the run short.
 */
const ENVD_IDLE_MS = 45_000;
/** Sandboxes whose wake is timed. */
const WAKE_SANDBOXES = 10;

/**
 * A memory cgroup of the run's own (cgroup v1's memory hierarchy, or v2 with the memory
 * controller): the bench moves itself in before its daemon starts, so the daemon, egress, every
 * sandbox (none has a memory limit, so none gets a memory cgroup of its own) and each sandbox's
 * network processes are charged there, kernel memory included: a figure other work on the
 * machine does not move, unlike MemAvailable. Undefined where there is none to make (not root).
 */
function ownMemoryCgroup():
  | { usage(): number; unreclaimable(): number; leave(): void }
  | undefined {
  const v1 = '/sys/fs/cgroup/memory';
  const [base, usageFile] = existsSync(join(v1, 'memory.usage_in_bytes'))
    ? [v1, 'memory.usage_in_bytes']
    : ['/sys/fs/cgroup', 'memory.current'];
  const dir = join(base, `abx-bench-density-${process.pid}`);
  const from = readFileSync('/proc/self/cgroup', 'utf8')
    .split('\n')
    .map((line) => line.split(':'))
    .find(([, controllers]) =>
      base === v1 ? controllers?.split(',').includes('memory') : controllers === '',
    )?.[2];
  try {
    mkdirSync(dir);
    if (!existsSync(join(dir, usageFile))) throw new Error('no memory controller');
    writeFileSync(join(dir, 'cgroup.procs'), String(process.pid));
  } catch {
    rmdirQuietly(dir);
    return undefined;
  }
  const stat = (key: string) =>
    Number(
      new RegExp(`^${key} (\\d+)$`, 'm').exec(
        readFileSync(join(dir, 'memory.stat'), 'utf8'),
      )?.[1] ?? 0,
    );
  return {
    usage: () => Number(readFileSync(join(dir, usageFile), 'utf8')),
    // Page cache the kernel may drop (what MemAvailable counts as available): shmem is not in it.
    unreclaimable: () =>
      Number(readFileSync(join(dir, usageFile), 'utf8')) -
      stat('active_file') -
      stat('inactive_file'),
    leave: () => {
      try {
        if (from !== undefined)
          writeFileSync(join(base, from, 'cgroup.procs'), String(process.pid));
      } catch {
        // stays: the folder below is then left too
      }
      rmdirQuietly(dir);
    },
  };
}

function rmdirQuietly(dir: string): void {
  try {
    rmdirSync(dir);
  } catch {
    // not made, or still holds a process
  }
}

function pssKiB(pid: number): number {
  return rollupKiB(pid, /^Pss:\s+(\d+) kB$/gm);
}

/** The sum of one or more lines of a process's smaps_rollup, KiB (0 once it ended). */
function rollupKiB(pid: number, lines: RegExp): number {
  try {
    const rollup = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
    return [...rollup.matchAll(lines)].reduce((sum, match) => sum + Number(match[1]), 0);
  } catch {
    return 0;
  }
}

/** envd's private pages after {@link BUSY_COMMANDS} commands with output, the mean, MiB. */
async function busyEnvdMiB(boxes: Sandbox[]): Promise<number> {
  for (const box of boxes) {
    for (let i = 0; i < BUSY_COMMANDS; i++) await box.commands.run('seq 1 2000');
  }
  await new Promise((resolve) => setTimeout(resolve, 3000));
  const kib = boxes.map((box) => rollupKiB(envdPidOf(box.sandboxId), PRIVATE_LINES));
  return round(kib.reduce((sum, k) => sum + k, 0) / 1024 / boxes.length, 2);
}

/** Whether the sandbox's Node envd runs (it sleeps once idle: docs/providers.md). */
function envdRuns(sandboxId: string): boolean {
  return nodeEnvdPidOf(sandboxId) !== undefined;
}

/** See {@link DensityRound.asleep}. */
async function asleepFigures(
  boxes: Sandbox[],
  count: number,
  before: { available: number; unreclaimable: number },
  cgroup: ReturnType<typeof ownMemoryCgroup>,
): Promise<NonNullable<DensityRound['asleep']>> {
  const timed = boxes.slice(0, WAKE_SANDBOXES);
  const awakeMs: number[] = [];
  for (const box of timed) {
    const t0 = performance.now();
    await box.commands.run('true');
    awakeMs.push(performance.now() - t0);
  }
  const deadline = Date.now() + ENVD_IDLE_MS + 60_000;
  while (boxes.some((box) => envdRuns(box.sandboxId))) {
    if (Date.now() > deadline) throw new Error('bench: envds still run well past their idle time');
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  const after = await settledMemAvailable(0);
  const chargedMiB =
    cgroup === undefined
      ? round((before.available - after.value) / count / MiB, 2)
      : round((cgroup.unreclaimable() - before.unreclaimable) / count / MiB, 2);
  const wakeMs: number[] = [];
  for (const box of timed) {
    const t0 = performance.now();
    await box.commands.run('true');
    wakeMs.push(performance.now() - t0);
  }
  return {
    chargedMiB,
    wakeP50Ms: round(summarize(wakeMs).p50, 1),
    awakeP50Ms: round(summarize(awakeMs).p50, 1),
  };
}

/** The pid of the egress service of `home`'s daemon (none before its first internet sandbox). */
function egressPid(home: string): number | undefined {
  const { pid } = JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as { pid: number };
  return childMentioning(pid, 'egress.js');
}

async function round1(
  report: BenchReport,
  home: string,
  network: 'internet' | 'none',
  count: number,
  cgroup: ReturnType<typeof ownMemoryCgroup>,
): Promise<DensityRound> {
  const template = network === 'none' ? 'density-none' : undefined;
  const egressBefore = pssKiB(egressPid(home) ?? 0);
  const before = {
    available: (await settledMemAvailable(0)).value,
    charged: cgroup?.usage() ?? 0,
    unreclaimable: cgroup?.unreclaimable() ?? 0,
    slab: meminfo('Slab'),
    pageTables: meminfo('PageTables'),
  };
  const boxes: Sandbox[] = [];
  const createMs: number[] = [];
  try {
    for (let i = 0; i < count; i += BATCH) {
      const batch = await Promise.all(
        Array.from({ length: Math.min(BATCH, count - i) }, async () => {
          const t0 = performance.now();
          const box = await Sandbox.create({ home, ...(template ? { template } : {}) });
          createMs.push(performance.now() - t0);
          return box;
        }),
      );
      boxes.push(...batch);
    }
    // Every one answers a command before the reading.
    for (const box of boxes) await box.commands.run('true');
    const held = before.available - memAvailable();
    const after = await settledMemAvailable(held);
    const charged = cgroup?.usage();
    const unreclaimable = cgroup?.unreclaimable() ?? 0;
    const netPids = boxes.flatMap((box) => sandboxNetProcesses(box.sandboxId));
    const envds = boxes.map((box) => envdPidOf(box.sandboxId));
    const envdMiB = (lines: RegExp) =>
      round(envds.reduce((sum, pid) => sum + rollupKiB(pid, lines), 0) / 1024 / count, 2);
    const egressAfter = pssKiB(egressPid(home) ?? 0);
    const result: DensityRound = {
      network,
      sandboxes: count,
      memAvailableDropMiB: round((before.available - after.value) / count / MiB, 2),
      ...(charged !== undefined
        ? {
            chargedMiB: round((charged - before.charged) / count / MiB, 2),
            unreclaimableMiB: round((unreclaimable - before.unreclaimable) / count / MiB, 2),
          }
        : {}),
      slabMiB: round((meminfo('Slab') - before.slab) / count / MiB, 3),
      pageTablesMiB: round((meminfo('PageTables') - before.pageTables) / count / MiB, 3),
      netProcessesPssMiB: round(
        netPids.reduce((sum, pid) => sum + pssKiB(pid), 0) / 1024 / count,
        3,
      ),
      netProcesses: round(netPids.length / count, 2),
      egressPssMiB: round((egressAfter - egressBefore) / 1024 / count, 3),
      envdPrivateMiB: envdMiB(PRIVATE_LINES),
      envdPssMiB: envdMiB(/^Pss:\s+(\d+) kB$/gm),
      envdBusyPrivateMiB: await busyEnvdMiB(boxes.slice(0, BUSY_SANDBOXES)),
      createP50Ms: round(summarize(createMs).p50, 1),
    };
    // Both networks: the goal's figure with `none`'s of the same run beside it.
    result.asleep = await asleepFigures(boxes, count, before, cgroup);
    report.log(`density ${network} ×${count}: ${JSON.stringify(result)}`);
    return result;
  } finally {
    await Promise.all(boxes.map((box) => box.kill().catch(() => undefined)));
  }
}

/**
 * A daemon of its own (its own `$ABX_HOME`, warm pool off so that no spare is counted): `count`
 * sandboxes on the default network (`internet`, no lists), created 10 at once, each answering a
 * command, then MemAvailable settled as the other memory figures are; then the same on a
 * template with `network: none`. Beside the drop per sandbox (the whole machine's: other work
 * shows in it), what the network's parts take: the PSS of its processes, the egress service's
 * growth, slab and page tables.
 */
export async function density(report: BenchReport, count = 50): Promise<DensityFigures> {
  report.log(`density (${count} sandboxes a network)`);
  const home = mkdtempSync(join(tmpdir(), 'abx-bench-density-'));
  const saved = process.env.ABX_WARM_POOL;
  const savedIdle = process.env.ABX_ENVD_IDLE_MS;
  process.env.ABX_WARM_POOL = '0';
  process.env.ABX_ENVD_IDLE_MS = String(ENVD_IDLE_MS);
  const cgroup = ownMemoryCgroup();
  try {
    const file = join(home, 'density-none.yaml');
    writeFileSync(file, 'name: density-none\nnetwork: none\n');
    await Templates.build(file, { home });
    // Untimed: starts the daemon and egress, and warms what a first create warms.
    for (const template of ['density-none', undefined]) {
      const box = await Sandbox.create({ home, ...(template ? { template } : {}) });
      await box.kill();
    }
    const rounds = [
      await round1(report, home, 'internet', count, cgroup),
      await round1(report, home, 'none', count, cgroup),
    ];
    const [internet, none] = rounds as [DensityRound, DensityRound];
    const figures: DensityFigures = {
      rounds,
      netStartMs: round(internet.createP50Ms - none.createP50Ms, 1),
    };
    report.results.density = figures;
    report.row(
      '19 density',
      `MemAvailable drop per sandbox, ${count} on internet / none`,
      `${internet.memAvailableDropMiB} / ${none.memAvailableDropMiB} MiB`,
      'goal internet ≤ 10 MiB',
    );
    if (internet.chargedMiB !== undefined && none.chargedMiB !== undefined) {
      report.row(
        '19 density',
        `charged to the run's memory cgroup per sandbox (less page cache), internet / none`,
        `${internet.chargedMiB} (${internet.unreclaimableMiB}) / ${none.chargedMiB} (${none.unreclaimableMiB}) MiB`,
        `the network's share: ${round(internet.chargedMiB - none.chargedMiB, 2)} MiB (other work on the machine does not move it)`,
      );
    }
    report.row(
      '19 density',
      'network parts per sandbox: processes PSS / egress growth / slab',
      `${internet.netProcessesPssMiB} / ${internet.egressPssMiB} / ${round(internet.slabMiB - none.slabMiB, 3)} MiB`,
      `${internet.netProcesses} processes a sandbox; slab beside none's`,
    );
    report.row(
      '19 density',
      "envd's private pages / PSS per sandbox, internet / none; private after a busy spell",
      `${internet.envdPrivateMiB} / ${internet.envdPssMiB} MiB, ${none.envdPrivateMiB} / ${none.envdPssMiB} MiB; ${internet.envdBusyPrivateMiB} MiB`,
      `busy: ${BUSY_COMMANDS} commands in each of ${BUSY_SANDBOXES}; envd starts with ${ENVD_NODE_OPTIONS.join(' ') || 'no Node options'}`,
    );
    report.row(
      '19 density',
      'create p50, internet / none (10 at once)',
      `${internet.createP50Ms} / ${none.createP50Ms} ms`,
      `the network's start: ${figures.netStartMs} ms`,
    );
    if (internet.asleep) {
      report.row(
        '19 density',
        `once envd slept: memory per sandbox (${charged0(internet)}), internet${none.asleep ? ' / none' : ''}; first command after the sleep / awake, p50`,
        `${internet.asleep.chargedMiB}${none.asleep ? ` / ${none.asleep.chargedMiB}` : ''} MiB; ${internet.asleep.wakeP50Ms} / ${internet.asleep.awakeP50Ms} ms`,
        `envd idle ${ENVD_IDLE_MS} ms here (ABX_ENVD_IDLE_MS; 60 s by default); wake timed on ${WAKE_SANDBOXES}`,
      );
      report.goal(
        `densityInternetAsleepMiB${count}`,
        `memory per sandbox once its envd slept, ${count} on the default network`,
        internet.asleep.chargedMiB,
        'MiB',
        10,
        false,
      );
    }
    // The cgroup's figure where there is one: MemAvailable moves with the machine's other work.
    const charged = internet.unreclaimableMiB;
    report.goal(
      `densityInternetMiB${count}`,
      charged === undefined
        ? `MemAvailable drop per sandbox, ${count} on the default network`
        : `memory per sandbox (its cgroup's charge less page cache), ${count} on the default network`,
      charged ?? internet.memAvailableDropMiB,
      'MiB',
      10,
      false,
    );
    return figures;
  } finally {
    if (saved === undefined) delete process.env.ABX_WARM_POOL;
    else process.env.ABX_WARM_POOL = saved;
    if (savedIdle === undefined) delete process.env.ABX_ENVD_IDLE_MS;
    else process.env.ABX_ENVD_IDLE_MS = savedIdle;
    spawnSync(process.execPath, [join(ROOT, 'dist', 'cli.js'), 'daemon', 'stop'], {
      env: { ...process.env, ABX_HOME: home },
    });
    await unmountUnder(home).catch(() => undefined);
    rmSync(home, { recursive: true, force: true });
    cgroup?.leave();
  }
}

/** What the asleep figure is: the cgroup's charge less page cache, or MemAvailable's drop. */
function charged0(round: DensityRound): string {
  return round.unreclaimableMiB === undefined
    ? 'MemAvailable drop'
    : "the run's cgroup's charge less page cache";
}

/** `--density N`: how many sandboxes a network (default 50). */
export function densityCount(argv = process.argv): number {
  const at = argv.indexOf('--density');
  const count = at >= 0 ? Number(argv[at + 1]) : 50;
  if (!Number.isInteger(count) || count < 1)
    throw new Error(`--density takes a number of sandboxes (such as 150), not '${argv[at + 1]}'`);
  return count;
}
