import { type Dirent, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import {
  expandBraces,
  hasParentSegment,
  segmentMatcher,
  splitPattern,
  walkGlob,
} from './glob-match.js';
import { eachLine, readPrefix, runProgram, statOrError } from './prelude.js';
import type { GrepDone, GrepPayload, ProgramError } from './protocol.js';

/**
 * A literal, case-sensitive substring search (no grep binary: names with `:` or newlines stay
 * intact and the output needs no parsing). A directory is walked in name order, hidden entries
 * included, symlinks not followed, files whose first 8 KiB hold a NUL byte skipped as binary. A
 * glob without `/` filters base names at any depth (like `grep --include`); with `/` it selects
 * paths relative to the search root (glob() rules).
 */
function main(p: GrepPayload): GrepDone | ProgramError {
  const root = resolve(p.path);
  const found = statOrError(root);
  if ('error' in found) return found;
  const st = found.stats;
  const files: string[] = [];
  if (!st.isDirectory()) files.push(root);
  else if (p.glob?.includes('/')) {
    const patterns = expandBraces(p.glob, []);
    if (patterns.some(hasParentSegment)) return { error: 'invalid_pattern' };
    const seen = new Set<string>();
    for (const pattern of patterns) {
      walkGlob(
        root,
        splitPattern(pattern.replace(/^\/+/, '')),
        (full) => {
          if (!seen.has(full)) {
            seen.add(full);
            files.push(full);
          }
        },
        () => {},
      );
    }
    files.sort();
  } else {
    const accept = p.glob ? expandBraces(p.glob, []).map((g) => segmentMatcher(g, false)) : [];
    const walk = (dir: string): void => {
      let entries: Dirent[];
      try {
        entries = readdirSync(dir, { withFileTypes: true });
      } catch {
        return;
      }
      entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      for (const entry of entries) {
        const full = join(dir, entry.name);
        if (entry.isDirectory()) walk(full);
        else if (entry.isFile() && (accept.length === 0 || accept.some((m) => m(entry.name)))) {
          files.push(full);
        }
      }
    };
    walk(root);
  }
  const matches: GrepDone['matches'] = [];
  const cap = p.maxCount;
  let truncated = false;
  for (const file of files) {
    try {
      if (readPrefix(file, 8192).includes(0)) continue;
      const scan = eachLine(file, (text, n) => {
        if (!text.includes(p.pattern)) return true;
        if (cap !== null && matches.length >= cap) {
          truncated = true;
          return false;
        }
        matches.push({ path: file, line: n, text });
        return true;
      });
      if (scan.stopped) break;
    } catch {
      // unreadable files are skipped, as grep -s does
    }
  }
  return { matches, truncated };
}

runProgram<'grep'>(main);
