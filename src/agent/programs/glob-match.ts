import { type Dirent, readdirSync, type Stats, statSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Glob matching for the glob program and grep's `glob` filter:
 * - `{a,b}` expands first (nested too), then the pattern is matched segment by segment;
 * - `*`, `?`, `[abc]`, `[!x]` within a segment; `**` as a whole segment spans directories;
 * - wildcards do not match a leading `.` (as in shells and Python's glob), so `**` does not enter
 *   dot-directories unless a segment names them (`.github/**`);
 * - symlinked directories are not entered by `**` (no cycles).
 */

/** Thrown by a `walkGlob` callback to end the walk; the caller catches it. */
export const STOP = {};

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

function byName(a: Dirent, b: Dirent): number {
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
}

/**
 * Walks `root` along the pattern segments `segs`, calling `found(absPath, stat)` for each
 * regular file that matches, and `tick()` before each directory it lists (both may throw STOP).
 */
export function walkGlob(
  root: string,
  segs: string[],
  found: (full: string, st: Stats) => void,
  tick: () => void,
): void {
  const matchers = segs.map((s) => (s === '**' ? null : segmentMatcher(s, true)));
  const list = (dir: string): Dirent[] => {
    tick();
    try {
      return readdirSync(dir, { withFileTypes: true }).sort(byName);
    } catch {
      return [];
    }
  };
  const visit = (dir: string, i: number): void => {
    const seg = segs[i] as string;
    const last = i === segs.length - 1;
    if (seg === '**') {
      if (!last) visit(dir, i + 1);
      for (const entry of list(dir)) {
        if (entry.name[0] === '.') continue;
        const full = join(dir, entry.name);
        if (entry.isDirectory()) visit(full, i);
        else if (last) {
          const st = statOr(full);
          if (st?.isFile()) found(full, st);
        }
      }
      return;
    }
    if (!hasMagic(seg)) {
      const full = join(dir, seg);
      const st = statOr(full);
      if (!st) return;
      if (last) {
        if (st.isFile()) found(full, st);
      } else if (st.isDirectory()) visit(full, i + 1);
      return;
    }
    const matches = matchers[i] as (name: string) => boolean;
    for (const entry of list(dir)) {
      if (!matches(entry.name)) continue;
      const full = join(dir, entry.name);
      const st = statOr(full);
      if (!st) continue;
      if (last) {
        if (st.isFile()) found(full, st);
      } else if (st.isDirectory()) visit(full, i + 1);
    }
  };
  if (segs.length > 0) visit(root, 0);
}
