import { spawnSync } from 'node:child_process';
import { describe, expect, test } from 'vitest';
import {
  ENVD_NODE_OPTIONS,
  envdArguments,
  isEnvdCommandLine,
  nodeScriptAt,
} from '../../src/providers/provider.js';

// envd starts with Node options of its own (issue 50); whoever reads its command line from /proc
// finds its script after them.

describe("envd's Node options", () => {
  test('every provider starts envd with them before its script, and readers find the script', () => {
    const argv = ['/opt/abx/bin/node', ...envdArguments('/run/abx/token', { template: 'base' })];
    expect(argv.slice(1, 1 + ENVD_NODE_OPTIONS.length)).toEqual(ENVD_NODE_OPTIONS);
    expect(argv[nodeScriptAt(argv)]).toBe('/opt/abx/envd.cjs');
    expect(argv[nodeScriptAt(argv) + 1]).toBe('--socket');
    expect(isEnvdCommandLine(argv)).toBe(true);
    // A command line from before the options, as a sandbox started by an older daemon has it.
    expect(isEnvdCommandLine(['/usr/bin/node', '/opt/abx/envd.cjs', '--socket', 'x'])).toBe(true);
  });

  test('root.cjs, the command server, a shell and another folder’s envd.cjs are not envd', () => {
    const rootLine = [
      '/opt/abx/bin/node',
      ...ENVD_NODE_OPTIONS,
      '/opt/abx/root.cjs',
      '/opt/abx/bin/node',
      ...envdArguments('/run/abx/token', {}),
    ];
    expect(rootLine[nodeScriptAt(rootLine)]).toBe('/opt/abx/root.cjs');
    expect(isEnvdCommandLine(rootLine)).toBe(false);
    const server = ['node', '/opt/abx/server.cjs', '--prestart'];
    expect(nodeScriptAt(server)).toBe(1);
    expect(isEnvdCommandLine(server)).toBe(false);
    expect(isEnvdCommandLine(['/bin/sh', '-c', 'node /opt/abx/envd.cjs'])).toBe(false);
    expect(isEnvdCommandLine(['node', '/home/user/envd.cjs', '--socket', 'x'])).toBe(false);
    // /proc/PID/cmdline ends in a NUL: the split's last element is empty; a kernel thread's is empty.
    expect(nodeScriptAt(['node', '--max-semi-space-size=1', ''])).toBe(-1);
    expect(nodeScriptAt([''])).toBe(-1);
  });

  test('this Node takes the options and keeps its young generation at 1 MiB a semi-space', () => {
    // Objects that live a while, as a busy envd's requests make them: V8 grows the young
    // generation for them (to 64 MiB here without the options), then the new space's size.
    const script = `
      const keep = new Array(20000);
      for (let i = 0; i < 2000000; i++) keep[i % 20000] = { i, s: 'x'.repeat(i % 64) };
      const space = require('v8').getHeapSpaceStatistics().find((s) => s.space_name === 'new_space');
      process.stdout.write(JSON.stringify({ size: space.space_size, argv: process.execArgv }));`;
    const run = (options: readonly string[]) => {
      const result = spawnSync(process.execPath, [...options, '-e', script], {
        encoding: 'utf8',
        timeout: 30_000,
      });
      expect(result.status, result.stderr).toBe(0);
      return JSON.parse(result.stdout) as { size: number; argv: string[] };
    };
    const envd = run(ENVD_NODE_OPTIONS);
    expect(envd.argv.slice(0, ENVD_NODE_OPTIONS.length)).toEqual(ENVD_NODE_OPTIONS);
    // New space is two semi-spaces of 1 MiB.
    expect(envd.size).toBeLessThanOrEqual(2 * 1024 * 1024);
    expect(run([]).size).toBeGreaterThanOrEqual(8 * 1024 * 1024);
  });
});
