import { mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { outputLines, readmeBlock, runSession, sessionSteps } from '../helpers/readme.js';

// The README's CLI session, taken from README.md and typed into bash one command after another,
// as a person would: each command's output must be what the README shows, up to what differs from
// one run to the next (the sandbox id, ports, ages).

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let cwd: string;

beforeAll(async () => {
  abx = await createAbxHome();
  // A folder of the user's own, where the session's relative paths (samples/...) resolve.
  cwd = mkdtempSync(join(tmpdir(), 'abx-readme-session-'));
  symlinkSync(join(ROOT, 'samples'), join(cwd, 'samples'));
}, 300_000);

afterAll(async () => {
  await abx?.close();
  if (cwd) rmSync(cwd, { recursive: true, force: true });
});

/** The README's example sandbox id (the first `i...` id its session shows). */
function exampleId(text: string): string {
  const id = /\b(i[a-z0-9]{15})\b/.exec(text)?.[1];
  if (!id) throw new Error('the README session shows no sandbox id');
  return id;
}

/** What may differ between two runs of the same session, made equal; runs of spaces as one. */
function normalize(line: string, id: string, exampleSandbox: string): string {
  return line
    .replaceAll(id, exampleSandbox)
    .replace(/(localhost|127\.0\.0\.1)(:\d+)/g, '$1:PORT')
    .replace(/\b\d+s\b/g, 'Ns')
    .replace(/\bin \d+m\b/g, 'in Nm')
    .replace(/ +/g, ' ')
    .trimEnd();
}

test("the README's CLI session gives the output the README shows", async () => {
  const block = readmeBlock('console', 'CLI');
  const steps = sessionSteps(block);
  expect(steps.length).toBeGreaterThan(5);
  const exampleSandbox = exampleId(block.code);
  const run = runSession(block, cwd, { ABX_HOME: abx.home });
  expect(run.stderr).toBe('');
  const { outputs } = run;
  expect(outputs).toHaveLength(steps.length);
  // This run's sandbox: the first id the session printed (`abx list` shows it).
  const id = /\b(i[a-z0-9]{15})\b/.exec(run.stdout)?.[1] ?? '';
  expect(id).not.toBe('');
  steps.forEach((step, i) => {
    // A terminal session (`abx shell`) shows its prompt, not output the README could show: its
    // stdin ended at once and it left, which the next steps' output needs.
    if (/#.*\binteractive\b/.test(step.command)) return;
    const shown = step.output.map((line) => normalize(line, id, exampleSandbox));
    const got = outputLines(outputs[i]).map((line) => normalize(line, id, exampleSandbox));
    expect(got, `README line ${block.line}: $ ${step.command}`).toEqual(shown);
  });
}, 300_000);
