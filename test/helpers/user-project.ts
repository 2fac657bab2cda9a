import { type SpawnSyncReturns, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'vitest';
import { ROOT } from './build.js';

/**
 * A user's own TypeScript project in a temporary folder: `"type": "module"`, this checkout linked
 * as `node_modules/agent-sandbox` (as `npm install <this checkout>` would), `@types/node`, and the
 * given compiler options. Scripts go in `src/`, `compile()` runs the project's tsc into `dist/`,
 * `run(name)` runs `dist/<name>.js` with node against `home`'s daemon.
 */
export function userProject(compilerOptions: Record<string, unknown>, home: string) {
  const dir = mkdtempSync(join(tmpdir(), 'abx-user-project-'));
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ type: 'module', private: true }));
  writeFileSync(
    join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { ...compilerOptions, outDir: 'dist', rootDir: 'src' },
      include: ['src'],
    }),
  );
  mkdirSync(join(dir, 'node_modules'));
  symlinkSync(ROOT, join(dir, 'node_modules', 'abx-sandbox'));
  symlinkSync(join(ROOT, 'node_modules', '@types'), join(dir, 'node_modules', '@types'));
  mkdirSync(join(dir, 'src'));
  return {
    dir,
    /** Writes `src/<name>.ts`. */
    addScript(name: string, code: string): void {
      writeFileSync(join(dir, 'src', `${name}.ts`), code);
    },
    /** Compiles every script with tsc; expects no diagnostics. */
    compile(): void {
      const tsc = spawnSync(
        process.execPath,
        [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', dir],
        { encoding: 'utf8', timeout: 180_000 },
      );
      expect(tsc.stdout + tsc.stderr).toBe('');
    },
    /** Runs a compiled script in the project's folder, as the user would: `node dist/<name>.js`. */
    run(name: string): SpawnSyncReturns<string> {
      return spawnSync(process.execPath, [join(dir, 'dist', `${name}.js`)], {
        cwd: dir,
        encoding: 'utf8',
        env: { ...process.env, ABX_HOME: home },
        timeout: 180_000,
      });
    },
    remove(): void {
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
