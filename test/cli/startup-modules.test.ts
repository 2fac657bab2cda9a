import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { CLI, runProgram } from './abx.js';

// What `abx list` and `abx --version` load (bench "abx start" times them against `node -e 0`).
// The ESM build takes Node's built-ins with process.getBuiltinModule (tsup.config.ts): an
// `import` of node:http made a facade that read its lazy getters, which loaded Node's internal
// undici with tls, http2, zlib and worker_threads; node:crypto's loaded all of WebCrypto.

/** Node's internal modules a command loaded, besides those `node -e 0` loads. */
async function loaded(home: string, args: string[]): Promise<{ modules: string[]; out: string }> {
  const hook = join(home, 'module-list.cjs');
  const list = join(home, `modules-${args[0]}.json`);
  writeFileSync(
    hook,
    `process.on('exit', () => require('node:fs').writeFileSync(${JSON.stringify(list)}, JSON.stringify(process.moduleLoadList)));`,
  );
  const floor = await runProgram(process.execPath, ['-r', hook, '-e', '0'], {
    env: { ABX_HOME: home },
  });
  expect(floor.code).toBe(0);
  const base = new Set(JSON.parse(readFileSync(list, 'utf8')));
  const run = await runProgram(process.execPath, ['-r', hook, CLI, ...args], {
    env: { ABX_HOME: home, NO_COLOR: '1' },
  });
  expect(run.stderr).toBe('');
  expect(run.code).toBe(0);
  const all = JSON.parse(readFileSync(list, 'utf8')) as string[];
  return {
    modules: all
      .filter((name) => !base.has(name) && name.startsWith('NativeModule '))
      .map((name) => name.slice('NativeModule '.length)),
    out: run.stdout,
  };
}

describe('what abx loads to start', () => {
  let abx: Awaited<ReturnType<typeof createAbxHome>>;

  beforeAll(async () => {
    abx = await createAbxHome();
    await startDaemon(abx.home);
  }, 120_000);

  afterAll(async () => {
    await abx?.close();
  }, 120_000);

  test('abx list (daemon running): node:http and node:net, not undici, TLS, HTTP/2, zlib, workers or crypto', async () => {
    const { modules, out } = await loaded(abx.home, ['list']);
    expect(out).toBe('ID  TEMPLATE  STATE  AGE  EXPIRES\n');
    expect(modules).toContain('http');
    for (const heavy of [
      'internal/deps/undici/undici',
      'tls',
      'http2',
      'zlib',
      'worker_threads',
      'crypto',
      'internal/crypto/webcrypto',
      'internal/fs/promises',
      'perf_hooks',
    ]) {
      expect(modules, heavy).not.toContain(heavy);
    }
  }, 60_000);

  test('abx --version: commander alone, no node:http (commander itself takes child_process)', async () => {
    const { modules, out } = await loaded(abx.home, ['--version']);
    expect(out).toMatch(/^\d+\.\d+\.\d+/);
    expect(modules).toContain('child_process');
    for (const heavy of ['http', 'internal/deps/undici/undici', 'crypto']) {
      expect(modules, heavy).not.toContain(heavy);
    }
  }, 60_000);
});
