import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import {
  envdIdleMs,
  imageHasShell,
  isEnvdLoop,
  sleepingEnvd,
} from '../../src/providers/local/envd-sleep.js';
import { envdArguments, isEnvdCommandLine } from '../../src/providers/provider.js';

// The local provider's command line for a sleeping envd, and where it applies (no sandbox: the
// sandboxes themselves are test/sandbox/envd-sleep.test.ts).

const envd = ['/opt/abx/node', ...envdArguments('/run/abx/token', { template: 'base' })];

describe('sleepingEnvd', () => {
  test('wraps envd in the loop, its tokens on stdin, with --idle-exit-ms', () => {
    const argv = sleepingEnvd(envd, 1500);
    expect(argv.slice(0, 2)).toEqual(['/bin/sh', '-c']);
    expect(argv[3]).toBe('abx-envd');
    expect(isEnvdLoop(argv)).toBe(true);
    const inner = argv.slice(4);
    expect(isEnvdCommandLine(inner)).toBe(true);
    expect(inner[inner.indexOf('--token-file') + 1]).toBe('-');
    expect(inner.slice(-2)).toEqual(['--idle-exit-ms', '1500']);
    // One line: a listing of the sandbox's processes shows the loop as one.
    expect(argv[2]).not.toContain('\n');
    // It makes the wake FIFO itself, before it reads the tokens and starts envd.
    expect(argv[2]).toMatch(/^mkfifo -m 600 \/run\/abx\/wake 2>\/dev\/null; \{ IFS= read/);
    // The loop of a sandbox an older daemon started (it made the FIFO itself) is still envd's.
    const older = [
      ...argv.slice(0, 2),
      (argv[2] as string).replace(/^mkfifo [^;]*; /, ''),
      ...argv.slice(3),
    ];
    expect(isEnvdLoop(older)).toBe(true);
    expect(isEnvdLoop([...argv.slice(0, 2), `${argv[2]} `, ...argv.slice(3)])).toBe(false);
  });

  test('0 leaves envd as it is; a command line without the token file is refused', () => {
    expect(sleepingEnvd(envd, 0)).toEqual(envd);
    expect(() => sleepingEnvd(['/opt/abx/node', '/opt/abx/envd.cjs'], 1000)).toThrow(
      /no --token-file \/run\/abx\/token/,
    );
  });

  test('ABX_ENVD_IDLE_MS: 60 s by default, 0 turns it off, anything else is refused by name', () => {
    expect(envdIdleMs({})).toBe(60_000);
    expect(envdIdleMs({ ABX_ENVD_IDLE_MS: '0' })).toBe(0);
    expect(envdIdleMs({ ABX_ENVD_IDLE_MS: '1500' })).toBe(1500);
    expect(() => envdIdleMs({ ABX_ENVD_IDLE_MS: 'soon' })).toThrow(/ABX_ENVD_IDLE_MS/);
  });
});

describe('imageHasShell', () => {
  const dir = mkdtempSync(join(tmpdir(), 'abx-shell-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  function rootfs(name: string): string {
    const root = join(dir, name);
    mkdirSync(join(root, 'usr', 'bin'), { recursive: true });
    return root;
  }

  function executable(path: string): void {
    writeFileSync(path, '#!\n');
    chmodSync(path, 0o755);
  }

  test('a /bin/sh file, or one reached by relative and absolute links inside the image', async () => {
    const plain = rootfs('plain');
    mkdirSync(join(plain, 'bin'));
    executable(join(plain, 'bin', 'sh'));
    expect(await imageHasShell(plain)).toBe(true);

    // Debian's merged /usr: /bin -> usr/bin, sh -> dash; busybox's absolute link.
    const merged = rootfs('merged');
    symlinkSync('usr/bin', join(merged, 'bin'));
    executable(join(merged, 'usr', 'bin', 'dash'));
    symlinkSync('dash', join(merged, 'usr', 'bin', 'sh'));
    expect(await imageHasShell(merged)).toBe(true);
    const busybox = rootfs('busybox');
    mkdirSync(join(busybox, 'bin'));
    executable(join(busybox, 'bin', 'busybox'));
    symlinkSync('/bin/busybox', join(busybox, 'bin', 'sh'));
    expect(await imageHasShell(busybox)).toBe(true);
  });

  test('none, a link out of the image, a loop of links or a file that cannot run: no shell', async () => {
    expect(await imageHasShell(rootfs('empty'))).toBe(false);
    // An absolute link is the image's own path, never the host's /bin/sh.
    const outside = rootfs('outside');
    mkdirSync(join(outside, 'bin'));
    symlinkSync('/usr/bin/nothing-here', join(outside, 'bin', 'sh'));
    expect(await imageHasShell(outside)).toBe(false);
    const loop = rootfs('loop');
    mkdirSync(join(loop, 'bin'));
    symlinkSync('sh2', join(loop, 'bin', 'sh'));
    symlinkSync('sh', join(loop, 'bin', 'sh2'));
    expect(await imageHasShell(loop)).toBe(false);
    const plainFile = rootfs('noexec');
    mkdirSync(join(plainFile, 'bin'));
    writeFileSync(join(plainFile, 'bin', 'sh'), '');
    expect(await imageHasShell(plainFile)).toBe(false);
  });
});
