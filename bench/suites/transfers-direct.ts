// `--only transfers-direct` (bench/README.md, "Transfers, round three"): the gateway's direct
// file transfers against envd's relay, interleaved in one run.
import { spawnSync } from 'node:child_process';
import {
  createReadStream,
  createWriteStream,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Sandbox } from 'abx-sandbox';
import { type BenchReport, HOME, ROOT } from '../runner.js';
import { median, round } from '../stats.js';

const MIB = 256;

/** CPU ms (user + system) of some processes, from /proc (those that ended meanwhile count 0). */
function cpuMs(pids: readonly number[]): number {
  let ticks = 0;
  for (const pid of pids) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks += Number(fields[11]) + Number(fields[12]);
    } catch {
      // ended
    }
  }
  return ticks * 10;
}

/** The daemon of `home` and the processes of sandbox `id` (bwrap's tree), by /proc. */
function processesOf(home: string, id: string): { daemon: number[]; sandbox: number[] } {
  const parents = new Map<number, number>();
  const daemon: number[] = [];
  let root: number | undefined;
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      parents.set(pid, Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
      const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      if (argv.some((arg) => arg.endsWith('dist/daemon.js'))) {
        const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
        if (env.includes(`ABX_HOME=${home}`)) daemon.push(pid);
      }
      const at = argv.indexOf('--hostname');
      if (argv[0]?.endsWith('bwrap') && at > 0 && argv[at + 1] === id) root = pid;
    } catch {
      // ended meanwhile
    }
  }
  const sandbox = root === undefined ? [] : [root];
  for (let grew = true; grew; ) {
    grew = false;
    for (const [child, parent] of parents) {
      if (sandbox.includes(parent) && !sandbox.includes(child)) {
        sandbox.push(child);
        grew = true;
      }
    }
  }
  return { daemon, sandbox };
}

interface Side {
  name: 'direct' | 'envd';
  home: string;
  box: Sandbox;
  share: { up: number[]; down: number[] };
  cpu: Record<'up' | 'down', { sdk: number[]; daemon: number[]; sandbox: number[] }>;
}

/**
 * 256 MiB up and down (a host file streamed into `files.write`, `files.read` as a stream piped
 * into `createWriteStream`, as `--only transfers` does) on two daemons at once: the bench's own
 * (direct transfers on) and one started with `ABX_DIRECT_FILES=0` (envd's relay), interleaved
 * round by round with `cp` of the same file, so that both see the same load. Each transfer's
 * share of `cp` is against that round's `cp`; CPU per process from /proc. Returns the medians.
 */
export async function transfersDirect(report: BenchReport): Promise<Record<string, number>> {
  report.log('transfers: direct against envd, interleaved');
  const dir = mkdtempSync(join(HOME, 'direct-'));
  const file = join(dir, 'data.bin');
  writeFileSync(file, Buffer.alloc(MIB * 1024 * 1024, 7));
  const envdHome = mkdtempSync(join(tmpdir(), 'abx-bench-envd-'));
  const sides: Side[] = [];
  try {
    const side = (name: Side['name'], home: string, box: Sandbox): Side => ({
      name,
      home,
      box,
      share: { up: [], down: [] },
      cpu: {
        up: { sdk: [], daemon: [], sandbox: [] },
        down: { sdk: [], daemon: [], sandbox: [] },
      },
    });
    sides.push(side('direct', HOME, await Sandbox.create({ home: HOME })));
    // The second daemon starts with the variable in its environment (the SDK starts it).
    process.env.ABX_DIRECT_FILES = '0';
    try {
      sides.push(side('envd', envdHome, await Sandbox.create({ home: envdHome })));
    } finally {
      delete process.env.ABX_DIRECT_FILES;
    }
    const rounds = report.quick ? 3 : 5;
    for (let round = 0; round < rounds; round++) {
      const started = performance.now();
      spawnSync('cp', [file, `${file}.copy`]);
      const cp = performance.now() - started;
      // Each round swaps which side goes first.
      const order = round % 2 === 0 ? sides : [...sides].reverse();
      for (const s of order) {
        const procs = processesOf(s.home, s.box.sandboxId);
        const measure = async (kind: 'up' | 'down', work: () => Promise<unknown>) => {
          const sdk0 = process.cpuUsage();
          const daemon0 = cpuMs(procs.daemon);
          const sandbox0 = cpuMs(procs.sandbox);
          const t0 = performance.now();
          await work();
          const wall = performance.now() - t0;
          const sdk = process.cpuUsage(sdk0);
          s.share[kind].push(cp / wall);
          s.cpu[kind].sdk.push((sdk.user + sdk.system) / 1000);
          s.cpu[kind].daemon.push(cpuMs(procs.daemon) - daemon0);
          s.cpu[kind].sandbox.push(cpuMs(procs.sandbox) - sandbox0);
        };
        await measure('up', () =>
          s.box.files.write(
            '/home/user/up.bin',
            createReadStream(file, { highWaterMark: 1 << 20 }),
          ),
        );
        await measure('down', async () =>
          pipeline(
            (await s.box.files.read('/home/user/up.bin', { format: 'stream' })) as Readable,
            createWriteStream(`${file}.down`),
          ),
        );
      }
    }
    const figures: Record<string, number> = {};
    for (const s of sides) {
      for (const kind of ['up', 'down'] as const) {
        figures[`${s.name} ${kind} share of cp`] = round(median(s.share[kind]), 3);
        for (const proc of ['sdk', 'daemon', 'sandbox'] as const) {
          figures[`${s.name} ${kind} cpu ms ${proc}`] = Math.round(median(s.cpu[kind][proc]));
        }
      }
      const f = (key: string) => figures[`${s.name} ${key}`];
      report.row(
        'transfers (direct / envd, interleaved)',
        `${MIB} MiB ${s.name}: share of cp up / down`,
        `${f('up share of cp')} / ${f('down share of cp')}`,
        `CPU ms SDK / daemon / sandbox: up ${f('up cpu ms sdk')} / ${f('up cpu ms daemon')} / ${f('up cpu ms sandbox')}, down ${f('down cpu ms sdk')} / ${f('down cpu ms daemon')} / ${f('down cpu ms sandbox')}`,
      );
    }
    report.results.transfersDirect = figures;
    return figures;
  } finally {
    for (const s of sides) await s.box.kill().catch(() => undefined);
    spawnSync(process.execPath, [join(ROOT, 'dist', 'cli.js'), 'daemon', 'stop'], {
      env: { ...process.env, ABX_HOME: envdHome },
    });
    rmSync(envdHome, { recursive: true, force: true });
    rmSync(dir, { recursive: true, force: true });
  }
}
