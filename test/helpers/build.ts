import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

export const ROOT = join(import.meta.dirname, '..', '..');

/**
 * Makes sure `dist/` and the compiled samples exist. `npm test` builds before vitest runs; this
 * covers running a single test file by hand.
 */
export function ensureBuilt(): void {
  const outputs = [
    'dist/index.js',
    'dist/index.cjs',
    'dist/cli.js',
    'dist/agent/read.cjs',
    'samples/build/list-commands.js',
  ];
  if (outputs.every((file) => existsSync(join(ROOT, file)))) return;
  execFileSync('npm', ['run', 'build'], { cwd: ROOT, stdio: 'pipe', timeout: 300_000 });
}
