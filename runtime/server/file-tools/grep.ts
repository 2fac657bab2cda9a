import { resolve } from 'node:path';
import { eachLine, pacer, statOrError } from './fs.js';
import { globAlternatives, walkMatches, walkTree } from './glob-match.js';
import type { GrepDone, GrepRequest, ToolAnswer } from './protocol.js';

/**
 * A literal, case-sensitive substring search (no grep binary: names with `:` or newlines stay
 * intact and the output needs no parsing). A directory is searched in name order, hidden
 * entries included, symlinks not followed; with `glob`, exactly the files the glob tool would
 * find there (glob-match.ts), in path order. Files whose first 8 KiB hold a NUL byte are
 * skipped as binary, unreadable ones silently (as `grep -s` does).
 */
export async function grepTool(p: GrepRequest): Promise<ToolAnswer<'grep'>> {
  const root = resolve(p.path);
  const found = statOrError(root);
  if ('error' in found) return found;
  const pace = pacer();
  const files: string[] = [];
  if (!found.stats.isDirectory()) files.push(root);
  else if (p.glob) {
    const alternatives = globAlternatives(p.glob);
    if (!alternatives) return { error: 'invalid_pattern' };
    const seen = new Set<string>();
    await walkMatches(root, alternatives, (full) => seen.add(full), pace);
    files.push(...Array.from(seen).sort());
  } else {
    await walkTree(
      root,
      (full, entry) => {
        if (entry.isFile()) files.push(full);
      },
      pace,
    );
  }
  const matches: GrepDone['matches'] = [];
  const cap = p.maxCount;
  const buffer = Buffer.allocUnsafe(65536);
  let truncated = false;
  for (const file of files) {
    try {
      const onLine = (text: string, n: number) => {
        if (!text.includes(p.pattern)) return true;
        if (cap !== null && matches.length >= cap) {
          truncated = true;
          return false;
        }
        matches.push({ path: file, line: n, text });
        return true;
      };
      const scan = await eachLine(file, pace, onLine, { skipBinary: true, buffer });
      if (scan.stopped) break;
    } catch {
      // unreadable files are skipped, as grep -s does
    }
    await pace();
  }
  return { matches, truncated };
}
