import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { readmeBlock } from '../helpers/readme.js';
import { userProject } from '../helpers/user-project.js';

// The README's TypeScript examples, taken from README.md itself, each saved as one file of a
// user's project with the README's tsconfig, compiled with tsc and run with node against a real
// daemon: a README change that breaks one fails here.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let project: ReturnType<typeof userProject>;

beforeAll(async () => {
  abx = await createAbxHome();
  const tsconfig = JSON.parse(
    readmeBlock('json', 'Use it in your project', 'compilerOptions').code,
  ) as {
    compilerOptions: Record<string, unknown>;
  };
  project = userProject(tsconfig.compilerOptions, abx.home);
  // The first example builds the README's own `template.yaml` (name: data-tools, with ports).
  writeFileSync(
    join(project.dir, 'template.yaml'),
    readmeBlock('yaml', 'Use it in your project', 'name: data-tools').code,
  );
  project.addScript('first', readmeBlock('ts', 'Use it in your project').code);
  project.addScript('run-code', readmeBlock('ts', 'Run code').code);
  project.compile();
}, 300_000);

afterAll(async () => {
  await abx?.close();
  project?.remove();
});

/** Sandboxes a user would see running: the examples kill theirs with `await using`. */
const running = async () => Sandbox.list({ home: abx.home, autoStart: false });

describe('README examples', () => {
  test('the first example: 42 from the decorated command, a command run, nothing left running', async () => {
    const result = project.run('first');
    expect(result.stderr).toBe('');
    expect(result.status).toBe(0);
    const lines = result.stdout.split('\n');
    expect(lines[0]).toBe('42');
    expect(result.stdout).toMatch(/stdout: 'Linux [^']*\\n'/);
    expect(result.stdout).toContain('exitCode: 0');
    expect(await running()).toEqual([]);
  }, 240_000);

  test('runCode: the DataFrame, a PNG chart, an exception as data, a JavaScript context', async () => {
    const result = project.run('run-code');
    expect(result.stderr).toBe('');
    expect(result.status).toBe(0);
    expect(result.stdout).toMatch(/^ +city +people\n0 +Oslo +3\n1 +Lima +5\n/);
    expect(result.stdout.trimEnd().split('\n').slice(-2)).toEqual(['ZeroDivisionError', '42']);
    const png = readFileSync(join(project.dir, 'chart.png'));
    expect(png.subarray(0, 8)).toEqual(Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]));
    expect(await running()).toEqual([]);
  }, 240_000);
});
