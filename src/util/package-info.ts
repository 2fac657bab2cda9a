import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * This package's own package.json. Found by walking up from this module, because the module sits
 * at a different depth in `src/` (tests) than in `dist/` (bundled chunks).
 */
export function packageInfo(): { name: string; version: string; root: string } {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const file = join(dir, 'package.json');
    if (existsSync(file)) {
      const json = JSON.parse(readFileSync(file, 'utf8'));
      if (json.name === 'abx-sandbox') return { name: json.name, version: json.version, root: dir };
    }
    const parent = dirname(dir);
    if (parent === dir) throw new Error('agent-sandbox: cannot find its own package.json');
    dir = parent;
  }
}
