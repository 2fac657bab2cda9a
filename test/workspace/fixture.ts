import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { lstatSync, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';

export const GIT_ENV = {
  ...process.env,
  GIT_AUTHOR_NAME: 'test',
  GIT_AUTHOR_EMAIL: 'test@example.invalid',
  GIT_COMMITTER_NAME: 'test',
  GIT_COMMITTER_EMAIL: 'test@example.invalid',
  GIT_CONFIG_NOSYSTEM: '1',
  HOME: '/nonexistent',
};

/** Runs git in `cwd` and returns its output (throws with git's stderr on failure). */
export function git(cwd: string, ...args: string[]): string {
  return execFileSync('git', args, {
    cwd,
    env: GIT_ENV,
    encoding: 'utf8',
    stdio: ['pipe', 'pipe', 'pipe'],
  });
}

/** The git tree id of a folder's working tree (everything but `.git`, as git sees it). */
export function treeOf(dir: string): string {
  git(dir, 'add', '-A');
  return git(dir, 'write-tree').trim();
}

/** Every entry under a folder with its kind, mode and content hash: to prove nothing changed. */
export function snapshot(dir: string, rel = ''): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of readdirSync(join(dir, rel)).sort()) {
    const p = rel === '' ? name : `${rel}/${name}`;
    const st = lstatSync(join(dir, p));
    const mode = (st.mode & 0o7777).toString(8);
    if (st.isDirectory()) {
      out[p] = `dir ${mode}`;
      Object.assign(out, snapshot(dir, p));
    } else if (st.isSymbolicLink()) out[p] = `link ${readlinkSync(join(dir, p))}`;
    else if (st.isFile()) {
      out[p] = `file ${mode} ${createHash('sha256')
        .update(readFileSync(join(dir, p)))
        .digest('hex')}`;
    } else out[p] = `other ${st.mode.toString(8)} ${st.mtimeMs}`;
  }
  return out;
}
