// `--only cli` (bench/README.md).
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { goal, log, ms, ROOT, results, row, scale } from '../runner.js';
import { round, type Summary, summarize } from '../stats.js';

/**
 * How long `abx` takes to start, as a person at a terminal feels it: `abx --version` and
 * `abx list` (the daemon running, a sandbox listed) against `node -e 0`, the floor of any Node
 * program, each run the same number of times, interleaved so that a change in the machine's load
 * touches all three alike.
 */
export async function cliStart() {
  log('abx start time');
  const cli = join(ROOT, 'dist', 'cli.js');
  const programs: Record<string, string[]> = {
    node: ['-e', '0'],
    version: [cli, '--version'],
    list: [cli, 'list'],
  };
  const samples: Record<string, number[]> = { node: [], version: [], list: [] };
  const rounds = scale(15, 5);
  for (let i = 0; i < rounds + 2; i++) {
    for (const [name, args] of Object.entries(programs)) {
      const started = performance.now();
      const run = spawnSync(process.execPath, args, { env: process.env, encoding: 'utf8' });
      const elapsed = performance.now() - started;
      if (run.status !== 0) throw new Error(`${name} exited ${run.status}: ${run.stderr}`);
      // The first two rounds warm the file cache (and Node's compile cache, where it has one).
      if (i >= 2) samples[name]?.push(elapsed);
    }
  }
  const [node, version, list] = [samples.node, samples.version, samples.list].map((s) =>
    summarize(s ?? []),
  ) as [Summary, Summary, Summary];
  results.cliStart = { node, version, list };
  goal(
    'cliVersionVsNodeRatio',
    'abx --version vs node -e 0',
    version.p50 / node.p50,
    '×',
    2,
    false,
  );
  goal('cliListVsNodeRatio', 'abx list vs node -e 0', list.p50 / node.p50, '×', 2, false);
  row('11 abx start', 'node -e 0 (the floor)', ms(node));
  row(
    '11 abx start',
    'abx --version',
    ms(version),
    `${round(version.p50 / node.p50, 2)}× node; goal ≤ 2×`,
  );
  row(
    '11 abx start',
    'abx list (daemon running)',
    ms(list),
    `${round(list.p50 / node.p50, 2)}× node; goal ≤ 2×`,
  );
}
