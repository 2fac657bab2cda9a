import type { Stats } from 'node:fs';
import { relative, resolve } from 'node:path';
import { pacer, statOrError } from './fs.js';
import { globAlternatives, pathPattern, STOP, walkMatches, walkPathMatches } from './glob-match.js';
import type { FileEntry, GlobRequest, ToolAnswer } from './protocol.js';

/**
 * Entries matching a glob, sorted by path: regular files (directories too with `includeDirs`),
 * by the `reference` rules (glob-match.ts) or the `path` style; paths absolute or, with
 * `relative`, relative to the search root. Stops at `maxResults` or once `budgetMs` have passed
 * (`truncated: true`). `/proc`, `/sys`, `/dev` and `/run` are not walked into (glob-match.ts).
 */
export async function globTool(p: GlobRequest): Promise<ToolAnswer<'glob'>> {
  const root = resolve(p.path);
  const found = statOrError(root);
  if ('error' in found) return found;
  if (!found.stats.isDirectory()) return { error: 'not_a_directory' };
  const style = p.style ?? 'reference';
  const alternatives = style === 'reference' ? globAlternatives(p.pattern) : undefined;
  const byPath = style === 'path' ? pathPattern(p.pattern) : undefined;
  if (!alternatives && !byPath) return { error: 'invalid_pattern' };
  const entries = new Map<string, FileEntry>();
  const started = Date.now();
  const pace = pacer();
  let truncated = false;
  const dirs = p.includeDirs === true;
  const add = (full: string, s: Stats): void => {
    if (entries.has(full) || (!dirs && s.isDirectory())) return;
    if (entries.size >= p.maxResults) {
      truncated = true;
      throw STOP;
    }
    entries.set(full, {
      path: p.relative ? relative(root, full) : full,
      isDir: s.isDirectory(),
      size: s.size,
      modifiedAt: s.mtime.toISOString(),
    });
  };
  const tick = () => {
    if (Date.now() - started >= p.budgetMs) {
      truncated = true;
      throw STOP;
    }
    return pace();
  };
  try {
    if (byPath) await walkPathMatches(root, byPath, add, tick);
    else await walkMatches(root, alternatives as string[], add, tick, dirs);
  } catch (e) {
    if (e !== STOP) throw e;
  }
  const matches = Array.from(entries.values()).sort((a, b) =>
    a.path < b.path ? -1 : a.path > b.path ? 1 : 0,
  );
  return { matches, truncated };
}
