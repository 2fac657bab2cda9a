import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { SANDBOX_RUNTIME_DIR } from '../protocol/constants.js';
import {
  BadRequestError,
  CommandTimeoutError,
  commandTimeout,
  InvalidPathError,
  type SandboxError,
} from './errors.js';
import { type Identity, spawnIdentity } from './users.js';

/** The runtime's own shell (busybox), for images that have none (distroless). */
export const RUNTIME_SHELL = `${SANDBOX_RUNTIME_DIR}/bin/sh`;

/** The POSIX shell command lines run with: the image's /bin/sh, else the runtime's. */
export function posixShell(): string {
  return existsSync('/bin/sh') || !existsSync(RUNTIME_SHELL) ? '/bin/sh' : RUNTIME_SHELL;
}

/** What `runshell`, `/process/exec` and `/dev-tools/run` answer. */
export interface RunResult {
  stdout: string;
  stderr: string;
  exit_code: number | null;
}

/** Output beyond this per stream is dropped, so a chatty command cannot exhaust memory. */
const MAX_CAPTURE_BYTES = 32 * 1024 * 1024;

/**
 * Kills a child's whole process group: children are spawned `detached`, which makes each the
 * leader of its own group, so `sh -c 'sleep 100 & wait'` leaves no `sleep` behind.
 */
export function killGroup(child: ChildProcess, signal: NodeJS.Signals = 'SIGKILL'): void {
  if (child.pid === undefined) return;
  try {
    // Also after the leader exited: its group lives on while a member (`cmd &`) does.
    process.kill(-child.pid, signal);
  } catch {
    // ESRCH: the group is gone already.
  }
}

/** True while any process of the child's group lives, the leader or what it left (`cmd &`). */
export function groupAlive(child: ChildProcess): boolean {
  if (child.pid === undefined) return false;
  try {
    process.kill(-child.pid, 0);
    return true;
  } catch (error) {
    // EPERM: a member exists that this user may not signal.
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Why a spawn failed, said plainly: node reports a missing working directory as the program
 * being missing (`spawn /bin/sh ENOENT`).
 */
export function spawnFailure(error: Error, file: string, cwd: string | undefined): SandboxError {
  if (cwd !== undefined && !statSync(cwd, { throwIfNoEntry: false })?.isDirectory()) {
    return new InvalidPathError(`cwd ${cwd} is not an existing directory`);
  }
  return new BadRequestError(`cannot start ${file}: ${error.message}`);
}

let spawnObserver: ((child: ChildProcess, file: string) => void) | undefined;

/** Called with every process spawnGroup starts: envd logs them (envd/sandbox-log.ts). */
export function observeSpawns(observer: (child: ChildProcess, file: string) => void): void {
  spawnObserver = observer;
}

/** Spawns a program in its own process group with piped stdio. */
export function spawnGroup(
  file: string,
  args: readonly string[],
  options: { cwd?: string; env?: Record<string, string>; identity?: Identity },
): ChildProcess {
  const as = spawnIdentity(options.identity);
  const child = spawn(file, args, {
    cwd: options.cwd,
    env: { ...process.env, ...as.env, ...options.env },
    ...(as.uid === undefined ? {} : { uid: as.uid, gid: as.gid }),
    detached: true,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  spawnObserver?.(child, file);
  return child;
}

/**
 * Runs a program to completion and captures its output. Past `timeoutMs` the whole process
 * group is killed and a 504 {@link CommandTimeoutError} carries the output captured so far.
 */
export function runToCompletion(
  file: string,
  args: readonly string[],
  options: {
    cwd?: string;
    env?: Record<string, string>;
    identity?: Identity;
    timeoutMs: number;
    what: string;
  },
): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawnGroup(file, args, options);
    child.stdin?.end();
    const out: Record<'stdout' | 'stderr', Buffer[]> = { stdout: [], stderr: [] };
    const sizes = { stdout: 0, stderr: 0 };
    for (const name of ['stdout', 'stderr'] as const) {
      child[name]?.on('data', (chunk: Buffer) => {
        if (sizes[name] >= MAX_CAPTURE_BYTES) return;
        sizes[name] += chunk.length;
        out[name].push(chunk);
      });
    }
    const text = (name: 'stdout' | 'stderr') => Buffer.concat(out[name]).toString('utf8');
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup(child);
    }, options.timeoutMs);
    child.once('error', (error) => {
      clearTimeout(timer);
      reject(spawnFailure(error, file, options.cwd));
    });
    // 'close' (not 'exit') waits for the pipes to drain, so no output is lost.
    child.once('close', (code) => {
      clearTimeout(timer);
      const result = { stdout: text('stdout'), stderr: text('stderr'), exit_code: code };
      if (timedOut) {
        reject(commandTimeout(options.what, options.timeoutMs, result));
      } else resolve(result);
    });
  });
}
