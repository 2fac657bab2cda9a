import { lstatSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fsError, statOrError } from './fs.js';
import type { PathRequest, ToolAnswer } from './protocol.js';

/** One level, hidden entries included, sorted by name; symlinks are described, not followed. */
export async function lsTool(p: PathRequest): Promise<ToolAnswer<'ls'>> {
  const dir = resolve(p.path);
  const found = statOrError(dir);
  if ('error' in found) return found;
  if (!found.stats.isDirectory()) return { error: 'not_a_directory' };
  let names: string[];
  try {
    names = readdirSync(dir).sort();
  } catch (e) {
    return fsError(e);
  }
  return {
    entries: names.map((name) => {
      const full = join(dir, name);
      try {
        const s = lstatSync(full);
        return {
          path: full,
          isDir: s.isDirectory(),
          size: s.size,
          modifiedAt: s.mtime.toISOString(),
        };
      } catch {
        return { path: full, isDir: false };
      }
    }),
  };
}
