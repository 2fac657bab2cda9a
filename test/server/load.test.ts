import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { build } from 'tsup';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { commandRegistry, describeCommand, listCommands } from '../../src/index.js';
import { CounterCommands } from '../fixtures/counter-commands.js';
import { killLeftovers, ROOT, type RunningServer, startServer } from './harness.js';

let bundle: string;
let server: RunningServer;

let outDir: string;

beforeAll(async () => {
  outDir = mkdtempSync(join(tmpdir(), 'abx-bundle-'));
  // As a user would build it: tsup (swc, for decorator metadata) into one CommonJS file that
  // needs no node_modules. cjsInterop makes the default export `module.exports`.
  await build({
    config: false,
    entry: { commands: join(ROOT, 'test', 'fixtures', 'counter-bundle.ts') },
    tsconfig: join(ROOT, 'tsconfig.json'),
    format: ['cjs'],
    cjsInterop: true,
    splitting: true,
    shims: true,
    platform: 'node',
    target: 'node20',
    noExternal: [/.*/],
    outDir,
    dts: false,
    sourcemap: false,
    silent: true,
  });
  bundle = join(outDir, 'commands.cjs');
  server = await startServer(['--load', bundle]);
});
afterAll(async () => {
  await killLeftovers();
  rmSync(outDir, { recursive: true, force: true });
});

describe('--load of a bundle built from decorated classes', () => {
  test('GET /commands shows exactly the schema listCommands gives on the client', async () => {
    // test/setup.ts empties the registry before each test; the class registers again here.
    commandRegistry().registerClass(CounterCommands);
    const expected = listCommands('server-test').map(describeCommand);
    expect(expected.map((c) => c.name)).toEqual(['add', 'increment', 'greet']);
    // Decorator metadata survived the bundle: `x: number` is float, `@int by` is int.
    expect(expected[0]?.args[0]).toEqual({ name: 'x', type: 'float', required: true });

    const { json } = await server.call('/commands');
    const served = json.commands.filter((c: { name: string }) =>
      expected.some((e) => e.name === c.name),
    );
    expect(served).toEqual(expected);
  });

  test('calls reach the methods, with defaults, on one instance whose state persists', async () => {
    const add = await server.call('/commands/add', { body: { x: 1.5 } });
    expect(add.json).toEqual({ result: 3.5 });
    const counts: number[] = [];
    for (let i = 0; i < 3; i++) {
      counts.push((await server.call('/commands/increment', { body: {} })).json.result);
    }
    expect(counts).toEqual([1, 2, 3]);
    const greet = await server.call('/commands/greet', { body: { name: 'ada', shout: true } });
    expect(greet.json).toEqual({ result: 'HELLO ADA' });
  });

  test('kwargs are validated against the decorated signature', async () => {
    const answer = await server.call('/commands/increment', { body: { by: 0.5 } });
    expect(answer.status).toBe(400);
    expect(answer.json.problems).toEqual(['by must be an integer, not number 0.5']);
  });
});
