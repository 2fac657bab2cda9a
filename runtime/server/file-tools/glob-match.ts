import { type Dirent, readdirSync, type Stats, statSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Glob matching for the glob tool and grep's `glob` filter, one rule for both:
 * - `{a,b}` expands first (nested too), and each alternative is matched on its own;
 * - `*`, `?`, `[abc]`, `[!x]` within a segment; `**` as a whole segment spans directories;
 * - an alternative without `/` matches base names at any depth, dot-directories included, and
 *   its wildcards match a leading `.` too (as `grep --include` and `fnmatch` do);
 * - an alternative with `/` is matched segment by segment from the root; there wildcards do
 *   not match a leading `.` (as in shells and Python's glob), so `**` does not enter
 *   dot-directories unless a segment names them (`.github/**`);
 * - symlinked directories are never entered (no cycles); a symlink to a file counts as a file;
 * - the kernel's virtual file systems (`/proc`, `/sys`, `/dev`, `/run`) are never walked into,
 *   whatever the style: a search of `/` looks at files, not at process tables and devices
 *   (asked for by name, as the search root, they are searched).
 */

/** Never walked into (a root may be one): the kernel's virtual file systems. */
export const PRUNED: ReadonlySet<string> = new Set(['/proc', '/sys', '/dev', '/run']);

/** Thrown by a walk callback to end the walk; the caller catches it. */
export const STOP = {};

/** Called before each directory is listed; may throw {@link STOP}. */
export type Tick = () => Promise<void> | void;

/** Every brace alternative of `pattern`, appended to `out` (stops growing past 256). */
export function expandBraces(pattern: string, out: string[]): string[] {
  let depth = 0;
  let open = -1;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === '\\') {
      i++;
      continue;
    }
    if (c === '{') {
      if (depth++ === 0) open = i;
    } else if (c === '}' && depth > 0 && --depth === 0) {
      const body = pattern.slice(open + 1, i);
      const options: string[] = [];
      let level = 0;
      let start = 0;
      for (let j = 0; j < body.length; j++) {
        if (body[j] === '\\') {
          j++;
          continue;
        }
        if (body[j] === '{') level++;
        else if (body[j] === '}') level--;
        else if (body[j] === ',' && level === 0) {
          options.push(body.slice(start, j));
          start = j + 1;
        }
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

function escapeRe(c: string): string {
  return c.replace(/[.*+?^$(){}|[\]\\/-]/g, '\\$&');
}

function segmentRegExp(seg: string): RegExp {
  let re = '';
  for (let i = 0; i < seg.length; i++) {
    const c = seg[i] as string;
    if (c === '*') re += '[^/]*';
    else if (c === '?') re += '[^/]';
    else if (c === '\\' && i + 1 < seg.length) re += escapeRe(seg[++i] as string);
    else if (c === '[') {
      let j = i + 1;
      if (seg[j] === '!' || seg[j] === '^') j++;
      if (seg[j] === ']') j++;
      while (j < seg.length && seg[j] !== ']') j++;
      if (j >= seg.length) {
        re += '\\[';
        continue;
      }
      let body = seg.slice(i + 1, j);
      if (body[0] === '!' || body[0] === '^') body = `^${body.slice(1)}`;
      re += `[${body.replace(/\\/g, '\\\\')}]`;
      i = j;
    } else re += escapeRe(c);
  }
  return new RegExp(`^${re}$`);
}

function hasMagic(seg: string): boolean {
  return /[*?[\\]/.test(seg);
}

/** A test for one name against one segment; with `dotRule`, wildcards skip dot-names. */
export function segmentMatcher(seg: string, dotRule: boolean): (name: string) => boolean {
  const re = segmentRegExp(seg);
  const dotOk = !dotRule || seg[0] === '.';
  return (name) => (dotOk || name[0] !== '.') && re.test(name);
}

export function splitPattern(pattern: string): string[] {
  return pattern.split('/').filter((s) => s !== '' && s !== '.');
}

export function hasParentSegment(pattern: string): boolean {
  return pattern.split(/[\\/]/).some((s) => s === '..');
}

function statOr(full: string): Stats | undefined {
  try {
    return statSync(full);
  } catch {
    return undefined;
  }
}

/** `dir/name` for a name read from `dir` (path.join's normalizing is not needed, and costs). */
function child(dir: string, name: string): string {
  return dir.endsWith('/') ? dir + name : `${dir}/${name}`;
}

function byName(a: Dirent, b: Dirent): number {
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
}

async function list(dir: string, tick: Tick): Promise<Dirent[]> {
  await tick();
  try {
    return readdirSync(dir, { withFileTypes: true }).sort(byName);
  } catch {
    return [];
  }
}

/**
 * Every entry under `root` that is not a directory (with `dirs`, directories too, before their
 * contents), depth first in name order, hidden ones included; `visit(fullPath, entry)` may throw
 * {@link STOP}, and when it returns a promise the walk waits for it. Symlinked directories and
 * {@link PRUNED} ones are not entered; unreadable directories are skipped.
 */
export async function walkTree(
  root: string,
  visit: (full: string, entry: Dirent) => void | Promise<void>,
  tick: Tick,
  dirs = false,
): Promise<void> {
  for (const entry of await list(root, tick)) {
    const full = child(root, entry.name);
    if (entry.isDirectory()) {
      if (dirs) {
        const waiting = visit(full, entry);
        if (waiting) await waiting;
      }
      if (!PRUNED.has(full)) await walkTree(full, visit, tick, dirs);
    } else {
      const waiting = visit(full, entry);
      if (waiting) await waiting;
    }
  }
}

/**
 * Walks `root` along the pattern segments `segs`, calling `found(absPath, stat)` for each
 * regular file (with `dirs`, each directory too) that matches (it may throw {@link STOP}).
 */
export async function walkGlob(
  root: string,
  segs: string[],
  found: (full: string, st: Stats) => void,
  tick: Tick,
  dirs = false,
): Promise<void> {
  const wanted = (st: Stats | undefined): st is Stats =>
    st !== undefined && (st.isFile() || (dirs && st.isDirectory()));
  const matchers = segs.map((s) => (s === '**' ? null : segmentMatcher(s, true)));
  const visit = async (dir: string, i: number): Promise<void> => {
    const seg = segs[i] as string;
    const last = i === segs.length - 1;
    if (seg === '**') {
      if (!last) await visit(dir, i + 1);
      for (const entry of await list(dir, tick)) {
        if (entry.name[0] === '.') continue;
        const full = child(dir, entry.name);
        if (entry.isDirectory()) {
          if (last && dirs) {
            const st = statOr(full);
            if (wanted(st)) found(full, st);
          }
          if (!PRUNED.has(full)) await visit(full, i);
        } else if (last) {
          const st = statOr(full);
          if (wanted(st)) found(full, st);
        }
      }
      return;
    }
    if (!hasMagic(seg)) {
      const full = join(dir, seg);
      const st = statOr(full);
      if (!st) return;
      if (last) {
        if (wanted(st)) found(full, st);
      } else if (st.isDirectory()) await visit(full, i + 1);
      return;
    }
    const matches = matchers[i] as (name: string) => boolean;
    for (const entry of await list(dir, tick)) {
      if (!matches(entry.name)) continue;
      const full = child(dir, entry.name);
      const st = statOr(full);
      if (!st) continue;
      if (last) {
        if (wanted(st)) found(full, st);
      } else if (st.isDirectory() && !PRUNED.has(full)) await visit(full, i + 1);
    }
  };
  if (segs.length > 0) await visit(root, 0);
}

/**
 * The brace alternatives of a glob, or undefined when one has a `..` segment (a glob may not
 * leave its root).
 */
export function globAlternatives(pattern: string): string[] | undefined {
  const alternatives = expandBraces(pattern, []);
  return alternatives.some(hasParentSegment) ? undefined : alternatives;
}

/**
 * Calls `found(absPath, stat)` for every regular file (with `dirs`, every directory too) under
 * `root` that one of `alternatives` (from {@link globAlternatives}) matches, by the rules at the
 * top of this file; an entry that several match is found once per alternative (the caller keeps
 * a set).
 */
export async function walkMatches(
  root: string,
  alternatives: string[],
  found: (full: string, st: Stats) => void,
  tick: Tick,
  dirs = false,
): Promise<void> {
  const byName: ((name: string) => boolean)[] = [];
  for (const alternative of alternatives) {
    const rel = alternative.replace(/^\/+/, '');
    if (rel.includes('/')) await walkGlob(root, splitPattern(rel), found, tick, dirs);
    else byName.push(segmentMatcher(rel, false));
  }
  if (byName.length === 0) return;
  await walkTree(
    root,
    (full, entry) => {
      if (!byName.some((matches) => matches(entry.name))) return;
      const st = statOr(full);
      if (st && (st.isFile() || (dirs && st.isDirectory()))) found(full, st);
    },
    tick,
    dirs,
  );
}

/**
 * The `path` style of glob (fast-glob with `dot: true`, as deepagents JS's filesystem backend):
 * each brace alternative is matched against the whole path relative to the root; `*` and `?`
 * stay within a name and match a leading `.`; `**` spans directories (`**\/` also none);
 * `[a-z]`/`[!x]` are classes. A leading `/` or `./` and trailing `/` are dropped. `maxDepth`: how
 * many segments a match can have (undefined with `**`). Undefined when an alternative has `..` or
 * a class is invalid.
 */
export function pathPattern(pattern: string): { re: RegExp; maxDepth?: number } | undefined {
  const trimmed = pattern.replace(/^(\.?\/)+/, '').replace(/\/+$/, '');
  const alternatives = globAlternatives(trimmed);
  if (!alternatives) return undefined;
  let maxDepth: number | undefined = 0;
  const sources = alternatives.map((alternative) => {
    if (alternative.includes('**')) maxDepth = undefined;
    else if (maxDepth !== undefined) maxDepth = Math.max(maxDepth, alternative.split('/').length);
    return pathRegExpSource(alternative);
  });
  let re: RegExp;
  try {
    re = new RegExp(`^(?:${sources.join('|')})$`);
  } catch {
    return undefined; // a class such as [z-a]
  }
  return maxDepth === undefined ? { re } : { re, maxDepth };
}

function pathRegExpSource(pattern: string): string {
  let out = '';
  for (let i = 0; i < pattern.length; ) {
    const c = pattern[i] as string;
    if (c === '*') {
      if (pattern[i + 1] === '*') {
        i += 2;
        if (pattern[i] === '/') {
          out += '(?:.*/)?';
          i++;
        } else out += '.*';
      } else {
        out += '[^/]*';
        i++;
      }
    } else if (c === '?') {
      out += '[^/]';
      i++;
    } else if (c === '\\' && i + 1 < pattern.length) {
      out += escapeRe(pattern[i + 1] as string);
      i += 2;
    } else if (c === '[') {
      // `]` right after `[` (or `[!`) belongs to the class.
      const first = pattern[i + 1] === '!' || pattern[i + 1] === '^' ? i + 2 : i + 1;
      const end = pattern.indexOf(']', first + 1);
      if (end < 0) {
        out += '\\[';
        i++;
        continue;
      }
      const body = pattern.slice(first, end).replace(/[\\\]^[]/g, '\\$&');
      out += `[${first === i + 2 ? '^' : ''}${body}]`;
      i = end + 1;
    } else {
      out += escapeRe(c);
      i++;
    }
  }
  return out;
}

/**
 * Breadth first under `root` (not into symlinked directories or {@link PRUNED}), calling
 * `found(absPath, stat)` for every entry, directories included, whose path relative to
 * `root` matches `pattern` (from {@link pathPattern}); `found` may throw {@link STOP}.
 */
export async function walkPathMatches(
  root: string,
  pattern: { re: RegExp; maxDepth?: number },
  found: (full: string, st: Stats) => void,
  tick: Tick,
): Promise<void> {
  const queue: [dir: string, rel: string, depth: number][] = [[root, '', 0]];
  for (let i = 0; i < queue.length; i++) {
    const [dir, rel, depth] = queue[i] as [string, string, number];
    for (const entry of await list(dir, tick)) {
      const full = child(dir, entry.name);
      const path = rel ? `${rel}/${entry.name}` : entry.name;
      if (pattern.re.test(path)) {
        const st = statOr(full);
        if (st) found(full, st);
      }
      const deeper = pattern.maxDepth === undefined || depth + 1 < pattern.maxDepth;
      if (entry.isDirectory() && deeper && !PRUNED.has(full)) queue.push([full, path, depth + 1]);
    }
  }
}
