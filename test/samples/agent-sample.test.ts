import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;

beforeAll(async () => {
  abx = await createAbxHome();
}, 300_000);

afterAll(async () => {
  await abx?.close();
});

test('samples/agent: a scripted model drives the sandbox tools offline, errors come back as data', async () => {
  const result = spawnSync(
    process.execPath,
    [join(ROOT, 'samples', 'build', 'agent', 'agent-loop.js')],
    {
      cwd: ROOT,
      encoding: 'utf8',
      env: { ...process.env, ABX_HOME: abx.home },
      timeout: 120_000,
    },
  );
  expect(result.stderr).toBe('');
  expect(result.status).toBe(0);
  const lines = result.stdout.trim().split('\n');
  expect(lines[0]).toBe(
    'tools: count_lines, head, summarize, add, run_code, ls, read_file, write_file, edit_file, glob, grep, execute',
  );
  expect(lines.find((line) => line.startsWith('run_code '))).toMatch(
    /-> \{"stdout":"","stderr":"","results":\[\{"isMainResult":true,"text":"2"\}\],"error":null,/,
  );
  expect(lines).toContain(
    'count_lines {"path":"people.csv"} -> {"stdout":"4\\n","stderr":"","exitCode":0}',
  );
  expect(lines).toContain(
    'read_file {"file_path":"missing.csv"} -> {"error":"File \'missing.csv\' not found","type":"FileOperationError"}',
  );
  expect(lines.at(-1)).toBe('answer: Most people live in london (2 of them), of 2 cities.');
  // The sample kills its sandbox on the way out.
  expect(await Sandbox.list({ home: abx.home, state: 'running' })).toEqual([]);
});
