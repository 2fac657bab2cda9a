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
  expect(lines).toContainEqual(
    expect.stringMatching(/^command server running at http:\/\/8080-i[a-z0-9]{15}\.localhost:\d+ /),
  );
  expect(lines).toContain(
    'summarize → {"path":"people.csv","rows":7,"columns":["name","city"],"top":[{"value":"london","count":3},{"value":"new york","count":2}]}',
  );
  expect(result.stdout).toContain('head (YAML command) →\nname,city\nada,london\ngrace,new york\n');
  expect(lines).toContainEqual(expect.stringMatching(/^sandbox killed \(\d+ ms\)$/));
});
