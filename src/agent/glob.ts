import type { BaseSandbox } from './base-sandbox.js';
import { isHelperError, runHelper } from './helper.js';
import type { FileInfo, GlobOptions, GlobResult } from './types.js';

/** glob() returns at most this many files (and sets `truncated`). */
export const GLOB_MAX_RESULTS = 1000;
/** glob() stops walking after this long (and sets `truncated`). */
export const GLOB_TIME_BUDGET_MS = 20_000;

/**
 * Glob matching for the helper programs (glob, and grep's `glob` filter), sandbox side:
 * - `{a,b}` expands first (nested too), then the pattern is matched segment by segment;
 * - `*`, `?`, `[abc]`, `[!x]` within a segment; `**` as a whole segment spans directories;
 * - wildcards do not match a leading `.` (as in shells and Python's glob), so `**` does not enter
 *   dot-directories unless a segment names them (`.github/**`);
 * - symlinked directories are not entered by `**` (no cycles).
 * `walkGlob` calls `found(absPath, stat)` for each regular file and throws STOP when told to.
 */
export const GLOB_SOURCE = String.raw`
const STOP = {};
function expandBraces(pattern, out) {
  let depth = 0;
  let open = -1;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === '\\') { i++; continue; }
    if (c === '{') { if (depth++ === 0) open = i; }
    else if (c === '}' && depth > 0 && --depth === 0) {
      const body = pattern.slice(open + 1, i);
      const options = [];
      let level = 0;
      let start = 0;
      for (let j = 0; j < body.length; j++) {
        if (body[j] === '\\') { j++; continue; }
        if (body[j] === '{') level++;
        else if (body[j] === '}') level--;
        else if (body[j] === ',' && level === 0) { options.push(body.slice(start, j)); start = j + 1; }
      }
      options.push(body.slice(start));
      if (options.length < 2) continue;
      for (const o of options) {
        if (out.length > 256) return out;
        expandBraces(pattern.slice(0, open) + o + pattern.slice(i + 1), out);
      }
      return out;
    }
  }
  out.push(pattern);
  return out;
}
function escapeRe(c) {
  return c.replace(/[.*+?^$(){}|[\]\\\/-]/g, '\\$&');
}
function segmentRegExp(seg) {
  let re = '';
  for (let i = 0; i < seg.length; i++) {
    const c = seg[i];
    if (c === '*') re += '[^/]*';
    else if (c === '?') re += '[^/]';
    else if (c === '\\' && i + 1 < seg.length) re += escapeRe(seg[++i]);
    else if (c === '[') {
      let j = i + 1;
      if (seg[j] === '!' || seg[j] === '^') j++;
      if (seg[j] === ']') j++;
      while (j < seg.length && seg[j] !== ']') j++;
      if (j >= seg.length) { re += '\\['; continue; }
      let body = seg.slice(i + 1, j);
      if (body[0] === '!' || body[0] === '^') body = '^' + body.slice(1);
      re += '[' + body.replace(/\\/g, '\\\\') + ']';
      i = j;
    } else re += escapeRe(c);
  }
  return new RegExp('^' + re + '$');
}
function hasMagic(seg) {
  return /[*?[\\]/.test(seg);
}
function segmentMatcher(seg, dotRule) {
  const re = segmentRegExp(seg);
  const dotOk = !dotRule || seg[0] === '.';
  return (name) => (dotOk || name[0] !== '.') && re.test(name);
}
function splitPattern(pattern) {
  return pattern.split('/').filter((s) => s !== '' && s !== '.');
}
function hasParentSegment(pattern) {
  return pattern.split(/[\\/]/).some((s) => s === '..');
}
function statOr(full) {
  try {
    return fs.statSync(full);
  } catch (e) {
    return undefined;
  }
}
function walkGlob(root, segs, found, tick) {
  const matchers = segs.map((s) => (s === '**' ? null : segmentMatcher(s, true)));
  const list = (dir) => {
    tick();
    try {
      return fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    } catch (e) {
      return [];
    }
  };
  const visit = (dir, i) => {
    const last = i === segs.length - 1;
    if (segs[i] === '**') {
      if (!last) visit(dir, i + 1);
      for (const entry of list(dir)) {
        if (entry.name[0] === '.') continue;
        const full = path.join(dir, entry.name);
        if (entry.isDirectory()) visit(full, i);
        else if (last) {
          const st = statOr(full);
          if (st && st.isFile()) found(full, st);
        }
      }
      return;
    }
    if (!hasMagic(segs[i])) {
      const full = path.join(dir, segs[i]);
      const st = statOr(full);
      if (!st) return;
      if (last) { if (st.isFile()) found(full, st); }
      else if (st.isDirectory()) visit(full, i + 1);
      return;
    }
    for (const entry of list(dir)) {
      if (!matchers[i](entry.name)) continue;
      const full = path.join(dir, entry.name);
      const st = statOr(full);
      if (!st) continue;
      if (last) { if (st.isFile()) found(full, st); }
      else if (st.isDirectory()) visit(full, i + 1);
    }
  };
  if (segs.length > 0) visit(root, 0);
}
`;

const GLOB_PROGRAM = String.raw`
${GLOB_SOURCE}
function main(p) {
  const root = path.resolve(p.path);
  let st;
  try {
    st = fs.statSync(root);
  } catch (e) {
    return fsError(e);
  }
  if (!st.isDirectory()) return { error: 'not_a_directory' };
  const patterns = expandBraces(p.pattern, []);
  if (patterns.some(hasParentSegment)) return { error: 'invalid_pattern' };
  const files = new Map();
  const deadline = Date.now() + p.budgetMs;
  let truncated = false;
  const tick = () => {
    if (Date.now() > deadline) { truncated = true; throw STOP; }
  };
  try {
    for (const pattern of patterns) {
      const rel = pattern.replace(/^\/+/, '');
      const segs = splitPattern(rel.includes('/') ? rel : '**/' + rel);
      walkGlob(root, segs, (full, s) => {
        if (files.has(full)) return;
        if (files.size >= p.maxResults) { truncated = true; throw STOP; }
        files.set(full, { path: full, isDir: false, size: s.size, modifiedAt: s.mtime.toISOString() });
      }, tick);
    }
  } catch (e) {
    if (e !== STOP) throw e;
  }
  const matches = Array.from(files.values()).sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  return { matches: matches, truncated: truncated };
}
`;

/** {@link BaseSandbox.glob}. */
export async function globFiles(
  sandbox: BaseSandbox,
  pattern: string,
  options: GlobOptions = {},
): Promise<GlobResult> {
  const path = options.path ?? '.';
  const outcome = await runHelper<{ matches: FileInfo[]; truncated: boolean }>(
    sandbox,
    GLOB_PROGRAM,
    { pattern, path, maxResults: GLOB_MAX_RESULTS, budgetMs: GLOB_TIME_BUDGET_MS },
  );
  if (!outcome.ok) return { error: outcome.error, truncated: false };
  const answer: unknown = outcome.value;
  if (!isHelperError(answer)) return outcome.value;
  switch (answer.error) {
    case 'invalid_pattern':
      return {
        error: `Pattern '${pattern}': invalid_pattern ('..' segments may not leave the search root)`,
        truncated: false,
      };
    case 'file_not_found':
      return { error: `Path '${path}' not found`, truncated: false };
    case 'not_a_directory':
      return { error: `Path '${path}' is not a directory`, truncated: false };
    case 'permission_denied':
      return { error: `Permission denied searching '${path}'`, truncated: false };
    default:
      return {
        error: `Error globbing in '${path}': ${answer.detail ?? answer.error}`,
        truncated: false,
      };
  }
}
