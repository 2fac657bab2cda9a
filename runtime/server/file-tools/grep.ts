import { resolve } from 'node:path';
import { eachLine, pacer, statOrError } from './fs.js';
import { globAlternatives, STOP, walkMatches, walkTree } from './glob-match.js';
import { type GrepDone, type GrepRequest, SEARCH_BUDGET_MS, type ToolAnswer } from './protocol.js';

/**
 * A literal, case-sensitive substring search (no grep binary: names with `:` or newlines stay
 * intact and the output needs no parsing). A directory is searched in name order, depth first,
 * hidden entries included, symlinks not followed, `/proc`, `/sys`, `/dev` and `/run` not entered
 * (glob-match.ts); with `glob`, exactly the files the glob tool would find there, in path order.
 * Files are searched as the walk finds them, so a search stopped early has the first ones'
 * matches. Files whose first 8 KiB hold a NUL byte are skipped as binary, unreadable ones
 * silently (as `grep -s` does).
 *
 * It stops early, with `truncated: true`, at `maxCount` matches (when one more exists) or when
 * `budgetMs` have passed (walking and reading included; a budget of 0 stops at once).
 */
export async function grepTool(p: GrepRequest): Promise<ToolAnswer<'grep'>> {
  const root = resolve(p.path);
  const found = statOrError(root);
  if ('error' in found) return found;
  const alternatives = p.glob ? globAlternatives(p.glob) : undefined;
  if (p.glob && !alternatives) return { error: 'invalid_pattern' };
  const started = Date.now();
  const budget = p.budgetMs ?? SEARCH_BUDGET_MS;
  const pace = pacer();
  let truncated = false;
  // Between directories, files and chunks of a file: past the budget, the search ends here.
  const tick = () => {
    if (Date.now() - started >= budget) {
      truncated = true;
      throw STOP;
    }
    return pace();
  };
  const matches: GrepDone['matches'] = [];
  const cap = p.maxCount;
  const buffer = Buffer.allocUnsafe(65536);
  const search = async (file: string): Promise<void> => {
    const onLine = (text: string, n: number) => {
      if (!text.includes(p.pattern)) return true;
      if (cap !== null && matches.length >= cap) {
        truncated = true;
        return false;
      }
      matches.push({ path: file, line: n, text });
      return true;
    };
    let stopped = false;
    try {
      stopped = (await eachLine(file, tick, onLine, { skipBinary: true, buffer })).stopped;
    } catch (e) {
      if (e === STOP) throw e;
      // unreadable files are skipped, as grep -s does
    }
    if (stopped) throw STOP;
    await tick();
  };
  try {
    if (!found.stats.isDirectory()) await search(root);
    else if (alternatives) {
      const seen = new Set<string>();
      await walkMatches(root, alternatives, (full) => seen.add(full), tick);
      for (const file of Array.from(seen).sort()) await search(file);
    } else {
      await walkTree(root, (full, entry) => (entry.isFile() ? search(full) : undefined), tick);
    }
  } catch (e) {
    if (e !== STOP) throw e;
  }
  return { matches, truncated };
}
