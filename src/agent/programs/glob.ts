import { resolve } from 'node:path';
import { expandBraces, hasParentSegment, STOP, splitPattern, walkGlob } from './glob-match.js';
import { runProgram, statOrError } from './prelude.js';
import type { FileEntry, GlobDone, GlobPayload, ProgramError } from './protocol.js';

/** A pattern without `/` matches base names at any depth; stops at `maxResults` or the budget. */
function main(p: GlobPayload): GlobDone | ProgramError {
  const root = resolve(p.path);
  const found = statOrError(root);
  if ('error' in found) return found;
  const st = found.stats;
  if (!st.isDirectory()) return { error: 'not_a_directory' };
  const patterns = expandBraces(p.pattern, []);
  if (patterns.some(hasParentSegment)) return { error: 'invalid_pattern' };
  const files = new Map<string, FileEntry>();
  const deadline = Date.now() + p.budgetMs;
  let truncated = false;
  const tick = () => {
    if (Date.now() > deadline) {
      truncated = true;
      throw STOP;
    }
  };
  try {
    for (const pattern of patterns) {
      const rel = pattern.replace(/^\/+/, '');
      const segs = splitPattern(rel.includes('/') ? rel : `**/${rel}`);
      walkGlob(
        root,
        segs,
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
        tick,
      );
    }
  } catch (e) {
    if (e !== STOP) throw e;
  }
  const matches = Array.from(files.values()).sort((a, b) =>
    a.path < b.path ? -1 : a.path > b.path ? 1 : 0,
  );
  return { matches, truncated };
}

runProgram<'glob'>(main);
