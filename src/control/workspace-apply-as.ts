/**
 * A workspace's apply written as a user, never as root (docs/workspaces.md, "Applying"). The
 * daemon checks everything first (as root: it reads the sandbox's view), copies what will be
 * written into a staging folder only that user may read, and runs the core's `apply()` in a
 * process of that user (dist/workspace-apply.cjs, `node -e`), which writes the host folder with
 * that user's rights only. So a user who swaps a folder of the host folder for a link while the
 * apply runs (the sandbox is frozen, the user's other processes are not) redirects writes only
 * to where that user could write anyway.
 */
import { execFile, spawn } from 'node:child_process';
import { chownSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { packageInfo } from '../util/package-info.js';
import {
  type ApplyOptions,
  type ApplyResult,
  type WorkspaceChanges,
  WorkspaceError,
  WorkspaceRefusedError,
  WorkspaceWriteError,
} from '../workspace/index.js';
import { setprivIds } from './workspace-access.js';

const execFileAsync = promisify(execFile);

/** How long a user's apply may take (its writes); then it is killed and the apply fails. */
export const APPLY_AS_USER_TIMEOUT_MS = 10 * 60_000;

let program: string | undefined;

/** The bundled apply program's text (read once). */
function applyProgram(): string {
  if (program === undefined) {
    const file = join(packageInfo().root, 'dist', 'workspace-apply.cjs');
    if (!existsSync(file)) {
      throw new Error(`${file} is missing: build the package first (npm run build)`);
    }
    program = readFileSync(file, 'utf8');
  }
  return program;
}

/**
 * Applies `found` (checked already: `planned` is its dry run's result) as host uid `uid`. The
 * sandbox's view must not change meanwhile (the caller holds it frozen).
 */
export async function applyAsUser(
  uid: number,
  found: WorkspaceChanges,
  planned: ApplyResult,
  options: ApplyOptions,
): Promise<ApplyResult> {
  const ids = await setprivIds(uid);
  const gid = Number(ids[1]?.replace('--regid=', ''));
  const stage = mkdtempSync(join(tmpdir(), 'abx-apply-'));
  try {
    // Only what will be written, with its folders (their modes too: apply makes missing ones
    // as the view's). Every folder on these paths was checked to be one (no link) in the view.
    const view = join(stage, 'view');
    mkdirSync(view, { mode: 0o700 });
    const paths = planned.applied.filter((c) => c.status !== 'deleted').map((c) => c.path);
    for (let i = 0; i < paths.length; i += 500) {
      await execFileAsync('cp', ['-a', '--parents', '--', ...paths.slice(i, i + 500), view], {
        cwd: found.view,
        maxBuffer: 16 * 1024 * 1024,
      });
    }
    await execFileAsync('chown', ['-hR', `${uid}:${gid}`, stage]);
    chownSync(stage, uid, gid);
    const answer = await runAs(ids, JSON.stringify({ changes: { ...found, view }, options }));
    if ('result' in answer) return answer.result;
    const { name, message, refusals } = answer.error;
    if (name === 'WorkspaceRefusedError' && refusals) throw new WorkspaceRefusedError(refusals);
    const failed = writeErrorOf(answer.error, uid);
    if (failed) throw failed;
    throw new WorkspaceError(`${message} (written as uid ${uid})`);
  } finally {
    rmSync(stage, { recursive: true, force: true });
  }
}

interface AnswerError {
  name: string;
  message: string;
  refusals?: ConstructorParameters<typeof WorkspaceRefusedError>[0];
  /** A WorkspaceWriteError's fields and its cause's message (workspace/apply-main.ts). */
  path?: string;
  written?: string[];
  rolledBack?: boolean;
  notRestored?: string[];
  undone?: string[];
  cause?: string;
}

type Answer = { result: ApplyResult } | { error: AnswerError };

const strings = (v: unknown): string[] =>
  Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : [];

/** The user's process's WorkspaceWriteError as one of this process (its rollback kept). */
function writeErrorOf(e: AnswerError, uid: number): WorkspaceWriteError | undefined {
  if (e.name !== 'WorkspaceWriteError' || typeof e.path !== 'string') return undefined;
  return new WorkspaceWriteError(
    e.path,
    strings(e.written),
    new Error(`${e.cause ?? e.message} (written as uid ${uid})`),
    {
      rolledBack: e.rolledBack === true,
      notRestored: strings(e.notRestored),
      undone: strings(e.undone),
    },
  );
}

function runAs(ids: string[], input: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      'setpriv',
      [...ids, '--inh-caps=-all', '--', process.execPath, '-e', applyProgram()],
      {
        cwd: '/',
        env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin', LC_ALL: 'C' },
        stdio: ['pipe', 'pipe', 'pipe'],
        timeout: APPLY_AS_USER_TIMEOUT_MS,
        killSignal: 'SIGKILL',
      },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => {
      stdout += chunk.toString('utf8');
    });
    child.stderr.on('data', (chunk: Buffer) => {
      if (stderr.length < 8192) stderr += chunk.toString('utf8');
    });
    child.on('error', reject);
    child.on('close', (code, signal) => {
      try {
        resolve(JSON.parse(stdout.trim().split('\n').at(-1) ?? '') as Answer);
      } catch {
        reject(
          new WorkspaceError(
            `the apply as the folder's user ended (${signal ? `signal ${signal}${signal === 'SIGKILL' ? `, after ${APPLY_AS_USER_TIMEOUT_MS / 60_000} min at most` : ''}` : `exit ${code}`}) without an answer, so without a rollback: what it wrote stays, and the old entries it set aside are in the host folder as .abx-apply-<random>.<name>.bak (its temporary files .abx-apply-<random>); the next apply refuses until they are put back or removed (docs/workspaces.md, "Applying")${stderr ? `: ${stderr.trim().slice(0, 2000)}` : ''}`,
          ),
        );
      }
    });
    child.stdin.end(input);
  });
}
