import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SandboxError } from '../errors.js';
import { packageInfo } from '../util/package-info.js';
import type { ProgramName } from './programs/protocol.js';

const cache = new Map<ProgramName, string>();

/**
 * The text of a sandbox-side program, as the build bundled it from `src/agent/programs/`
 * (`dist/agent/<name>.cjs`, self-contained CommonJS for `node -e`). Read once, then cached; the
 * same file serves the sources under vitest and the bundles in `dist/`.
 */
export function programSource(name: ProgramName): string {
  let text = cache.get(name);
  if (text === undefined) {
    const file = join(packageInfo().root, 'dist', 'agent', `${name}.cjs`);
    if (!existsSync(file)) {
      throw new SandboxError(`${file} is missing: build the package first (npm run build)`);
    }
    text = readFileSync(file, 'utf8');
    cache.set(name, text);
  }
  return text;
}
