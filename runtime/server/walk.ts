import { readdir } from 'node:fs/promises';
import { join, relative } from 'node:path';

/** Stops a walk over a huge tree from running unbounded. */
const MAX_VISITED = 200_000;

/**
 * The files and directories under `root`, breadth first, as paths relative to it. Symbolic links
 * are listed but not followed, so a link cycle cannot loop.
 */
export async function* walk(root: string): AsyncGenerator<{ path: string; dir: boolean }> {
  const queue = [root];
  let visited = 0;
  for (let dir = queue.shift(); dir !== undefined; dir = queue.shift()) {
    let entries: import('node:fs').Dirent[];
    try {
      entries = await readdir(dir, { withFileTypes: true });
    } catch {
      continue; // unreadable directories are skipped, as `find` does
    }
    for (const entry of entries) {
      if (++visited > MAX_VISITED) return;
      const full = join(dir, entry.name);
      if (entry.isDirectory()) queue.push(full);
      yield { path: relative(root, full), dir: entry.isDirectory() };
    }
  }
}

/** A glob (`**`, `*`, `?`, `{a,b}`) as a regular expression over `/`-separated relative paths. */
export function globToRegExp(glob: string): RegExp {
  let source = '';
  let braces = 0;
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i] as string;
    if (c === '*' && glob[i + 1] === '*') {
      const slash = glob[i + 2] === '/';
      source += slash ? '(?:.*/)?' : '.*';
      i += slash ? 2 : 1;
    } else if (c === '*') source += '[^/]*';
    else if (c === '?') source += '[^/]';
    else if (c === '{') {
      source += '(?:';
      braces++;
    } else if (c === '}' && braces > 0) {
      source += ')';
      braces--;
    } else if (c === ',' && braces > 0) source += '|';
    else source += c.replace(/[.+^$()|[\]\\{}]/g, '\\$&');
  }
  return new RegExp(`^${source}${')'.repeat(braces)}$`);
}
