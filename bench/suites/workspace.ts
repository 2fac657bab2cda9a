// `--only workspace` (bench/README.md, item 16): what mounting a workspace costs a create (issue 47).
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox, type SandboxCreateOptions } from 'abx-sandbox';
import type { BenchReport } from '../runner.js';
import { round, type Summary, summarize } from '../stats.js';

/**
 * A tree of `files` files (`bytes` in all, in folders of 100) on the host; returns its folder.
 * The contents are pseudo-random (no file is a hole or compresses to nothing).
 */
function makeTree(root: string, files: number, bytes: number): void {
  const each = Math.floor(bytes / files);
  const chunk = Buffer.alloc(each);
  let seed = 1;
  for (let i = 0; i < files; i++) {
    const folder = join(root, `d${Math.floor(i / 100)}`);
    if (i % 100 === 0) mkdirSync(folder, { recursive: true });
    for (let b = 0; b < each; b += 4) {
      seed = (seed * 1103515245 + 12345) >>> 0;
      chunk.writeUInt32LE(seed, Math.min(b, each - 4));
    }
    writeFileSync(join(folder, `f${i}.txt`), chunk);
  }
}

/**
 * Cold create → first command in `ls` of the workspace, with a workspace of a 1 GiB,
 * 100 000-file tree (`--quick`: 100 MiB, 10 000 files) and without one (the same command in the
 * home), one of each per round; both with a network policy of their own, so neither comes from
 * the warm pool. Against them: `cp -a` of the same tree on the same disk (the upload a sandbox
 * without workspaces would need is slower still: the tree crosses envd). Needs a root daemon with
 * the local provider (workspaces are mounted there); otherwise the section says so and is skipped.
 */
export async function workspaceMount(report: BenchReport, template: string): Promise<void> {
  const files = report.quick ? 10_000 : 100_000;
  const bytes = report.quick ? 100 * 2 ** 20 : 2 ** 30;
  if (process.getuid?.() !== 0) {
    report.log('workspace: skipped (workspaces are mounted by a root daemon)');
    return;
  }
  report.log(`workspace: a tree of ${files} files, ${bytes / 2 ** 20} MiB, mounted at create`);
  const scratch = mkdtempSync(join(tmpdir(), 'abx-bench-ws-'));
  try {
    const tree = join(scratch, 'tree');
    mkdirSync(tree);
    makeTree(tree, files, bytes);
    spawnSync('sync');
    const times = { mounted: [] as number[], empty: [] as number[], cp: [] as number[] };
    const policy: SandboxCreateOptions = { network: { allowOut: [], denyOut: [] } };
    const createOnce = async (into: number[], options: SandboxCreateOptions, command: string) => {
      const t0 = performance.now();
      const box = await Sandbox.create({ template, ...policy, ...options });
      try {
        const listed = await box.commands.run(command);
        if (listed.exitCode !== 0) throw new Error(`${command}: ${listed.stderr}`);
        into.push(performance.now() - t0);
      } finally {
        await box.kill();
      }
    };
    const cpOnce = () => {
      const copy = join(scratch, 'copy');
      const t0 = performance.now();
      const done = spawnSync('cp', ['-a', tree, copy]);
      if (done.status !== 0) throw new Error(`cp -a: ${done.stderr}`);
      spawnSync('sync');
      times.cp.push(performance.now() - t0);
      rmSync(copy, { recursive: true, force: true });
    };
    const rounds = report.quick ? 3 : 7;
    for (let i = 0; i <= rounds; i++) {
      const warmup = i === 0; // untimed: the first walk also fills the kernel's caches
      const mounted = warmup ? [] : times.mounted;
      const empty = warmup ? [] : times.empty;
      await createOnce(mounted, { workspace: { from: tree } }, 'ls ~/workspace/d0 > /dev/null');
      await createOnce(empty, {}, 'ls ~ > /dev/null');
      if (!warmup && i <= (report.quick ? 2 : 3)) cpOnce();
    }
    const [m, e, c]: Summary[] = [
      summarize(times.mounted),
      summarize(times.empty),
      summarize(times.cp),
    ];
    report.results.workspace = { files, bytes, mounted: m, empty: e, cpA: c };
    report.results.workspaceMountVsEmptyRatio = round(m.p50 / e.p50, 2);
    report.results.workspaceCpVsMountRatio = round(c.p50 / m.p50, 1);
    const size = `${files} files, ${bytes / 2 ** 20} MiB`;
    report.row(
      '16 workspace',
      `create with a workspace (${size}) → first command`,
      `p50 ${round(m.p50, 1)} ms`,
      `${round(m.p50 / e.p50, 2)}× an empty sandbox's create`,
    );
    report.row(
      '16 workspace',
      'create without one → first command (same rounds)',
      `p50 ${round(e.p50, 1)} ms`,
      'cold: a network policy of its own, as above',
    );
    report.row(
      '16 workspace',
      `cp -a of the same tree (+ sync)`,
      `median ${round(c.p50, 0)} ms`,
      `${round(c.p50 / m.p50, 1)}× the create with a workspace`,
    );
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}
