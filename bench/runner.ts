// The shared runner of `npm run bench`: the flags, the results and the table every suite writes
// to, and the processes to stop at the end. Each suite is a module of bench/suites/ (or bench/),
// called from bench/run.ts under its `--only` name.
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { cpus, freemem, release, tmpdir, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { round, type Summary } from './stats.js';

export const QUICK = process.argv.includes('--quick');
/** `--only hops,transfers`: run just these sections (names as in main()), for working on one. */
const onlyArg = process.argv.indexOf('--only');
export const ONLY =
  onlyArg >= 0 ? new Set((process.argv[onlyArg + 1] ?? '').split(',')) : undefined;
export const runs = (section: string) => !ONLY || ONLY.has(section);
// bench/build/bench/runner.js: the package is three folders up.
export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
export const HOME = mkdtempSync(join(tmpdir(), 'abx-bench-'));
process.env.ABX_HOME = HOME;
export const scale = (full: number, quick: number) => (QUICK ? quick : full);
/**
 * Calls of each kind made before the E2B figures are sampled (see `e2b`): `run` (a login shell,
 * about 25 ms a call), and the others (a millisecond or two).
 */
export const E2B_WARM = { run: scale(150, 30), other: scale(1000, 60) };

export const results: Record<string, unknown> = {
  startedAt: new Date().toISOString(),
  quick: QUICK,
  machine: {
    cpu: cpus()[0]?.model,
    cores: cpus().length,
    memoryGiB: round(totalmem() / 1024 ** 3, 1),
    freeMemoryGiB: round(freemem() / 1024 ** 3, 1),
    kernel: release(),
    node: process.version,
  },
};
export const table: string[][] = [];
export const row = (benchmark: string, figure: string, value: string, note = '') =>
  table.push([benchmark, figure, value, note]);
export const ms = (s: Summary) => `p50 ${round(s.p50, 3)} ms · p99 ${round(s.p99, 3)} ms`;

/**
 * What a figure is measured against in the same run (issue 49): the bare process spawn under
 * `commands.run`, `cp` under a transfer, bare `node:http` under the gateway. Written to
 * results.json beside its figure as `<key>Floor`, printed in the goals table.
 */
export interface Floor {
  value: number;
  unit: string;
  what: string;
}

/**
 * The headline figures, each under a stable key of results.json (top level) with its goal:
 * `atLeast` or `atMost` the target, and the floor it was measured against when it has one.
 * Printed as a table of their own after the run.
 */
interface Goal {
  key: string;
  figure: string;
  value: number;
  unit: string;
  target: number;
  atLeast: boolean;
  floor?: Floor;
}
export const goals: Goal[] = [];
export function goal(
  key: string,
  figure: string,
  value: number,
  unit: string,
  target: number,
  atLeast: boolean,
  floor?: Floor,
) {
  // Ratios (no unit) keep a third decimal.
  const rounded = round(value, unit === '' ? 3 : 2);
  const target2 = round(target, 2);
  const measured = floor ? { ...floor, value: round(floor.value, 2) } : undefined;
  goals.push({ key, figure, value: rounded, unit, target: target2, atLeast, floor: measured });
  results[key] = rounded;
  if (measured) results[`${key}Floor`] = measured.value;
}
export const met = (g: Goal) => (g.atLeast ? g.value >= g.target : g.value <= g.target);
const benchStarted = performance.now();
export const log = (text: string) =>
  process.stderr.write(
    `bench [${Math.round((performance.now() - benchStarted) / 1000)}s]: ${text}\n`,
  );

export const children: ChildProcess[] = [];

/** What a suite gets to report with: the flags and writers above, for suites that take them. */
export interface BenchReport {
  quick: boolean;
  log(text: string): void;
  row(benchmark: string, figure: string, value: string, note?: string): void;
  goal(
    key: string,
    figure: string,
    value: number,
    unit: string,
    target: number,
    atLeast: boolean,
    floor?: Floor,
  ): void;
  results: Record<string, unknown>;
}
export const report: BenchReport = { quick: QUICK, log, row, goal, results };
