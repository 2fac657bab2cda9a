import { createHash } from 'node:crypto';
import {
  copyFileSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import {
  CONTRACT_COMMANDS,
  eventually,
  failToStart,
  killLeftovers,
  startServer,
} from '../server/harness.js';

const dirs: string[] = [];

afterEach(async () => {
  await killLeftovers();
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'abx-bundle-load-'));
  dirs.push(dir);
  return dir;
}

const sha256 = (text: string | Buffer) => createHash('sha256').update(text).digest('hex');

/** The contract commands copied into a folder of their own (code caches are written beside). */
function bundleCopy(): { file: string; digest: string; dir: string } {
  const dir = tempDir();
  const file = join(dir, 'commands.cjs');
  copyFileSync(CONTRACT_COMMANDS, file);
  return { file, dir, digest: sha256(readFileSync(file)) };
}

describe('server --load-sha256', () => {
  test('a verified bundle is served, and a V8 code cache is kept beside it for the next start', async () => {
    const { file, dir, digest } = bundleCopy();
    const first = await startServer(['--load', file, '--load-sha256', digest]);
    expect((await first.call('/commands/count', { body: {} })).json).toEqual({ result: 1 });
    await eventually(() => readdirSync(dir).some((name) => name.endsWith('.v8cache')));
    first.child.kill('SIGTERM');
    await first.exited;

    // Started again from the same bytes: loaded through the cache, a fresh module all the same.
    const again = await startServer(['--load', file, '--load-sha256', digest]);
    expect((await again.call('/commands/count', { body: {} })).json).toEqual({ result: 1 });
    expect((await again.call('/commands/echo', { body: { text: 'hi' } })).json.result.text).toBe(
      'hi',
    );
  });

  test('a bundle with other bytes, or none, exits 3 before loading anything', async () => {
    const { file, digest } = bundleCopy();
    writeFileSync(file, 'module.exports = { version: 1, template: "t", commands: [] };');
    const changed = await failToStart(['--load', file, '--load-sha256', digest]);
    expect(changed.code).toBe(3);
    expect(changed.stderr).toContain(`does not have the expected SHA-256 ${digest}`);
    const missing = await failToStart(['--load', `${file}.gone`, '--load-sha256', digest]);
    expect(missing.code).toBe(3);
    expect(missing.stderr).toContain('cannot read');
  });

  test('one digest per --load, else a usage error', async () => {
    const { file, digest } = bundleCopy();
    const { code, stderr } = await failToStart([
      '--load',
      file,
      '--load',
      file,
      '--load-sha256',
      digest,
    ]);
    expect(code).toBe(2);
    expect(stderr).toContain('--load-sha256 goes once per --load');
  });

  test('a verified bundle that throws at import fails as an unverified one does', async () => {
    const dir = tempDir();
    const file = join(dir, 'throws.cjs');
    const code = "throw new Error('boom at import');";
    writeFileSync(file, code);
    const verified = await failToStart(['--load', file, '--load-sha256', sha256(code)]);
    const plain = await failToStart(['--load', file]);
    expect(verified.code).toBe(2);
    expect(verified.stderr).toContain(`cannot load ${file}: boom at import`);
    expect(verified).toEqual(plain);
    expect(existsSync(`${file}.${process.version}.v8cache`)).toBe(false);
  });
});
