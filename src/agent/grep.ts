import type { BaseSandbox } from './base-sandbox.js';
import { GLOB_SOURCE } from './glob.js';
import { isHelperError, runHelper } from './helper.js';
import type { GrepMatch, GrepOptions, GrepResult } from './types.js';

/**
 * A literal, case-sensitive substring search, sandbox side (no grep binary: names with `:` or
 * newlines stay intact and the output needs no parsing). A directory is walked in name order,
 * hidden entries included, symlinks not followed, files whose first 8 KiB hold a NUL byte skipped
 * as binary. A glob without `/` filters base names at any depth (like `grep --include`); with `/`
 * it selects paths relative to the search root (glob() rules).
 */
const GREP_PROGRAM = String.raw`
${GLOB_SOURCE}
function main(p) {
  const root = path.resolve(p.path);
  let st;
  try {
    st = fs.statSync(root);
  } catch (e) {
    return fsError(e);
  }
  const files = [];
  if (!st.isDirectory()) files.push(root);
  else if (p.glob && p.glob.includes('/')) {
    const patterns = expandBraces(p.glob, []);
    if (patterns.some(hasParentSegment)) return { error: 'invalid_pattern' };
    const seen = new Set();
    for (const pattern of patterns) {
      walkGlob(root, splitPattern(pattern.replace(/^\/+/, '')), (full) => {
        if (!seen.has(full)) { seen.add(full); files.push(full); }
      }, () => {});
    }
    files.sort();
  } else {
    const accept = p.glob ? expandBraces(p.glob, []).map((g) => segmentMatcher(g, false)) : [];
    const walk = (dir) => {
      let entries;
      try {
        entries = fs.readdirSync(dir, { withFileTypes: true });
      } catch (e) {
        return;
      }
      entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      for (const entry of entries) {
        const full = path.join(dir, entry.name);
        if (entry.isDirectory()) walk(full);
        else if (entry.isFile() && (accept.length === 0 || accept.some((m) => m(entry.name)))) files.push(full);
      }
    };
    walk(root);
  }
  const matches = [];
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
        matches.push({ path: file, line: n, text: text });
        return true;
      });
      if (scan.stopped) break;
    } catch (e) {
      // unreadable files are skipped, as grep -s does
    }
  }
  return { matches: matches, truncated: truncated };
}
`;

/** {@link BaseSandbox.grep}. */
export async function grepFiles(
  sandbox: BaseSandbox,
  pattern: string,
  options: GrepOptions = {},
): Promise<GrepResult> {
  const path = options.path ?? '.';
  const maxCount =
    options.maxCount === undefined ? null : Math.max(0, Math.floor(Number(options.maxCount) || 0));
  const outcome = await runHelper<{ matches: GrepMatch[]; truncated: boolean }>(
    sandbox,
    GREP_PROGRAM,
    { pattern, path, glob: options.glob ?? null, maxCount },
  );
  if (!outcome.ok) return { error: outcome.error, truncated: false };
  const answer: unknown = outcome.value;
  if (!isHelperError(answer)) return outcome.value;
  switch (answer.error) {
    case 'file_not_found':
      return { error: `Path '${path}' not found`, truncated: false };
    case 'permission_denied':
      return { error: `Permission denied searching '${path}'`, truncated: false };
    case 'invalid_pattern':
      return {
        error: `Glob '${options.glob}': invalid_pattern ('..' segments may not leave the search root)`,
        truncated: false,
      };
    default:
      return {
        error: `Error searching '${path}': ${answer.detail ?? answer.error}`,
        truncated: false,
      };
  }
}
