import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createAbxHome } from '../helpers/abx-home.js';
import { outputLines, readmeBlock, runSession } from '../helpers/readme.js';

// The README's workspace session (issue 47), typed into bash in a git repository of the user's
// own: each command's output is what the README shows, and afterwards the repository holds
// exactly the agent's two changes. Workspaces are mounted by a root daemon.
const root = process.getuid?.() === 0;

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let repo: string;

const git = (...args: string[]) =>
  spawnSync('git', ['-C', repo, ...args], { encoding: 'utf8' }).stdout;

beforeAll(async () => {
  if (!root) return;
  abx = await createAbxHome();
  repo = mkdtempSync(join(tmpdir(), 'abx-readme-repo-'));
  writeFileSync(join(repo, 'hello.txt'), 'Hello, world\n');
  git('init', '-q');
  git('add', '.');
  git('-c', 'user.name=t', '-c', 'user.email=t@example.invalid', 'commit', '-qm', 'init');
}, 300_000);

afterAll(async () => {
  await abx?.close();
  if (repo) rmSync(repo, { recursive: true, force: true });
});

test.skipIf(!root)(
  "the README's workspace session gives what it shows",
  () => {
    const block = readmeBlock('console', 'Workspaces');
    const run = runSession(block, repo, { ABX_HOME: abx?.home ?? '' });
    expect(run.stderr).toBe('');
    expect(run.outputs).toHaveLength(4);
    run.steps.forEach((step, i) => {
      const shown = step.output.map((line) => line.trimEnd());
      expect(outputLines(run.outputs[i]), `README line ${block.line}: $ ${step.command}`).toEqual(
        shown,
      );
    });
    // The host repository now holds the agent's edits, and only them.
    expect(readFileSync(join(repo, 'hello.txt'), 'utf8')).toBe('Hi, world\n');
    expect(readFileSync(join(repo, 'notes.txt'), 'utf8')).toBe('new\n');
    expect(git('status', '--short')).toBe(' M hello.txt\n?? notes.txt\n');
  },
  300_000,
);
