// `--only deepagents` (bench/README.md, item 15): deepagents' grep and glob over the whole sandbox.
import { DEEPAGENTS_SEARCH_BUDGET_MS, deepAgentsBackend, Sandbox } from 'abx-sandbox';
import type { BenchReport } from '../runner.js';
import { median, round } from '../stats.js';

/** What run.ts hands a section: its table, its goals and its results.json. */
/**
 * `grep(text, '/')` and `glob('**\/*.py', '/')` through `deepAgentsBackend(sandbox)` (no options:
 * real paths, deepagents' default search path `/`) on a `base` sandbox: the whole system image,
 * `/usr` included. Each call is timed end to end (the adapter, the SDK, envd's walk); the median
 * of N runs (one of each per round, after one untimed round) is the figure, with its slowest run
 * and whether the answer was cut at a bound (`truncated`: grep's time budget, glob's 1000 results
 * or the budget). The goal (issue 31): each answers within 3 s.
 */
export async function deepagentsSearch(report: BenchReport): Promise<void> {
  report.log('deepagents grep and glob over /');
  const sandbox = await Sandbox.create({ template: 'base' });
  try {
    const backend = deepAgentsBackend(sandbox);
    const home = (await sandbox.execute('pwd')).output.trim();
    await backend.write(`${home}/project/app/search_me.py`, 'print("abx-bench-needle")\n');
    const runs = report.quick ? 3 : 9;
    const grep = { ms: [] as number[], truncated: 0, matches: 0 };
    const glob = { ms: [] as number[], truncated: 0, files: 0 };
    // A pattern nothing matches: the whole walk of / (names only), the glob's worst case.
    const walk = { ms: [] as number[], truncated: 0 };
    for (let round = 0; round <= runs; round++) {
      let started = performance.now();
      const found = await backend.grep('abx-bench-needle', '/');
      const grepMs = performance.now() - started;
      if ('error' in found) throw new Error(`grep over /: ${found.error}`);
      started = performance.now();
      const listed = await backend.glob('**/*.py', '/');
      const globMs = performance.now() - started;
      if ('error' in listed) throw new Error(`glob over /: ${listed.error}`);
      started = performance.now();
      const none = await backend.glob('**/*.abx-no-such-extension', '/');
      const walkMs = performance.now() - started;
      if ('error' in none) throw new Error(`glob over /: ${none.error}`);
      if (round === 0) continue; // untimed: the first walk also fills the kernel's caches
      grep.ms.push(grepMs);
      grep.truncated += found.truncated ? 1 : 0;
      grep.matches = found.matches.length;
      glob.ms.push(globMs);
      glob.truncated += listed.truncated ? 1 : 0;
      glob.files = listed.files.length;
      walk.ms.push(walkMs);
      walk.truncated += none.truncated ? 1 : 0;
    }
    const figure = (ms: number[]) =>
      `median ${round(median(ms), 0)} ms · slowest ${round(Math.max(...ms), 0)} ms (n=${ms.length})`;
    report.results.deepagentsSearch = {
      budgetMs: DEEPAGENTS_SEARCH_BUDGET_MS,
      grep: {
        ms: grep.ms.map((v) => round(v, 1)),
        truncatedRuns: grep.truncated,
        matches: grep.matches,
      },
      glob: {
        ms: glob.ms.map((v) => round(v, 1)),
        truncatedRuns: glob.truncated,
        files: glob.files,
      },
      globNoMatch: { ms: walk.ms.map((v) => round(v, 1)), truncatedRuns: walk.truncated },
    };
    report.row(
      '15 deepagents',
      "grep('abx-bench-needle', '/') on base",
      figure(grep.ms),
      `${grep.matches} match(es); truncated in ${grep.truncated}/${runs} (time budget ${DEEPAGENTS_SEARCH_BUDGET_MS} ms)`,
    );
    report.row(
      '15 deepagents',
      "glob('**/*.py', '/') on base",
      figure(glob.ms),
      `${glob.files} files; truncated in ${glob.truncated}/${runs} (1000 results or the time budget)`,
    );
    report.row(
      '15 deepagents',
      "glob('**/*.abx-no-such-extension', '/') on base",
      figure(walk.ms),
      `the whole walk of /; truncated in ${walk.truncated}/${runs} (by the time budget)`,
    );
    report.goal(
      'deepagentsGrepRootMedianMs',
      "deepagents grep(text, '/') on base",
      median(grep.ms),
      'ms',
      3000,
      false,
    );
    report.goal(
      'deepagentsGlobRootMedianMs',
      "deepagents glob('**/*.py', '/') on base",
      median(glob.ms),
      'ms',
      3000,
      false,
    );
  } finally {
    await sandbox.kill();
  }
}
