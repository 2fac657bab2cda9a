import { execFile, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { request } from 'undici';
import type { DaemonInfo } from '../../src/index.js';

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

/**
 * A git repository in a new folder of the temporary folder (`prefix` names it) holding `files`
 * (relative path → text; `.gitignore`d ones written, not committed), committed once on `main`.
 */
export function makeRepo(files: Record<string, string>, prefix = 'abx-ws-repo-'): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  git(dir, 'init', '-q', '-b', 'main');
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, path)), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
  git(dir, 'add', '-A');
  git(dir, 'commit', '-q', '-m', 'base');
  return dir;
}

/** What the daemon of `$ABX_HOME` `home` wrote of itself (its API's address). */
export function daemonInfoOf(home: string): DaemonInfo {
  return JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as DaemonInfo;
}

/**
 * A raw call of the API of the daemon of `home`, with `key` (default: the daemon's own key): its
 * status and JSON body (`{}` when empty).
 */
export async function daemonApi(
  home: string,
  method: string,
  path: string,
  body?: unknown,
  key?: string,
): Promise<{ status: number; body: Record<string, string> }> {
  const response = await request(`${daemonInfoOf(home).apiUrl}${path}`, {
    method: method as 'POST',
    headers: {
      authorization: `Bearer ${key ?? readFileSync(join(home, 'api-key'), 'utf8').trim()}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await response.body.text();
  return { status: response.statusCode, body: text ? JSON.parse(text) : {} };
}

/**
 * A call of the daemon's API (`url` + `path`) from a process of host uid `uid`: curl through
 * setpriv, with `key` as both `Authorization: Bearer` and E2B's `X-API-Key`. The answer's status
 * and text.
 */
export async function curlAs(
  uid: number,
  key: string,
  url: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<{ status: number; text: string }> {
  const { stdout } = await promisify(execFile)(
    'setpriv',
    [
      `--reuid=${uid}`,
      `--regid=${uid}`,
      '--clear-groups',
      'curl',
      '-sS',
      '--max-time',
      '60',
      '-X',
      method,
      '-H',
      `authorization: Bearer ${key}`,
      '-H',
      `x-api-key: ${key}`,
      ...(body === undefined
        ? []
        : ['-H', 'content-type: application/json', '--data-binary', JSON.stringify(body)]),
      '-w',
      '\n%{http_code}',
      `${url}${path}`,
    ],
    { timeout: 70_000 },
  );
  const at = stdout.lastIndexOf('\n');
  return { status: Number(stdout.slice(at + 1)), text: stdout.slice(0, at) };
}
