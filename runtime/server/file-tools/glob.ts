import { resolve } from 'node:path';
import { pacer, statOrError } from './fs.js';
import { globAlternatives, STOP, walkMatches } from './glob-match.js';
import type { FileEntry, GlobRequest, ToolAnswer } from './protocol.js';

/** Regular files matching a glob (glob-match.ts), sorted; stops at `maxResults` or the budget. */
export async function globTool(p: GlobRequest): Promise<ToolAnswer<'glob'>> {
  const root = resolve(p.path);
  const found = statOrError(root);
  if ('error' in found) return found;
  if (!found.stats.isDirectory()) return { error: 'not_a_directory' };
  const alternatives = globAlternatives(p.pattern);
  if (!alternatives) return { error: 'invalid_pattern' };
  const files = new Map<string, FileEntry>();
  const deadline = Date.now() + p.budgetMs;
  const pace = pacer();
  let truncated = false;
  try {
    await walkMatches(
      root,
      alternatives,
      (full, s) => {
        if (files.has(full)) return;
        if (files.size >= p.maxResults) {
          truncated = true;
          throw STOP;
        }
        files.set(full, {
          path: full,
          isDir: false,
          size: s.size,
          modifiedAt: s.mtime.toISOString(),
        });
      },
      () => {
        if (Date.now() > deadline) {
          truncated = true;
          throw STOP;
        }
        return pace();
      },
    );
  } catch (e) {
    if (e !== STOP) throw e;
  }
  const matches = Array.from(files.values()).sort((a, b) =>
    a.path < b.path ? -1 : a.path > b.path ? 1 : 0,
  );
  return { matches, truncated };
}
