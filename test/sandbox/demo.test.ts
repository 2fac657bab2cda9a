import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;

beforeAll(async () => {
  abx = await createAbxHome();
}, 300_000);

afterAll(async () => {
  await abx?.close();
});

test('the README main job: a sandbox, the command server, a registered command, a result', () => {
  const result = spawnSync(process.execPath, [join(ROOT, 'samples', 'build', 'demo.js')], {
    cwd: ROOT,
    encoding: 'utf8',
    env: { ...process.env, ABX_HOME: abx.home },
    timeout: 120_000,
  });
  expect(result.stderr).toBe('');
  expect(result.status).toBe(0);
  const lines = result.stdout.split('\n');
  const step = (name: string) =>
    lines.find((line) => /^\[\s*[\d.]+ ms\] /.test(line) && line.includes(`] ${name}`));
  expect(step('build template')).toContain('data-tools (capabilities: shell, files, code, ports)');
  expect(step('create sandbox')).toMatch(/: i[a-z0-9]{15}$/);
  expect(step('start command server')).toMatch(
    /: http:\/\/127\.0\.0\.1:\d+\/sandboxes\/i[a-z0-9]{15}\/ports\/8080$/,
  );
  expect(step('call summarize (decorated)')).toContain(
    ': {"path":"people.csv","rows":7,"columns":["name","city"],"top":[{"value":"london","count":3},{"value":"new york","count":2}]}',
  );
  expect(step('call add × 100')).toContain(': last result 100');
  expect(step('run head (YAML)')).toContain(': "name,city\\nada,london\\ngrace,new york\\n"');
  expect(result.stdout).toMatch(
    /decorator summarize\(path: str, top: int = 10, column: str = "name"\)/,
  );
  expect(result.stdout).toMatch(/yaml +head\(path: str, lines: int = 5\)/);
  expect(step('kill sandbox')).toMatch(/^\[\s*[\d.]+ ms\] kill sandbox$/);
});
