import { spawn } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { userInfo } from 'node:os';
import { join } from 'node:path';

/** The PATH the daemon starts sandboxes with (local provider): where it finds bwrap and friends. */
export const DAEMON_PATH = '/usr/sbin:/usr/bin:/sbin:/bin';
/** The PATH a sandbox's own processes search (envd's `python3`, the shell's commands). */
export const SANDBOX_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** What one probe did: its exit, its output, or why it did not run or did not end. */
export interface ProbeResult {
  ok: boolean;
  code: number | null;
  stdout: string;
  stderr: string;
  /** `ENOENT`, `EACCES`… when the program could not be started. */
  spawnError?: string;
  timedOut: boolean;
}

/**
 * Runs a program to its end with a clean environment and a hard deadline: on timeout its whole
 * process group is SIGKILLed and the probe answers at once, even if a grandchild still holds its
 * output open. A probe never hangs doctor.
 */
export function probe(
  file: string,
  args: readonly string[],
  options: {
    timeoutMs: number;
    env?: Record<string, string>;
    /** Extra descriptors from fd 3 on (bwrap's `--seccomp 3`). */
    fds?: number[];
    input?: string;
  },
): Promise<ProbeResult> {
  return new Promise((resolve) => {
    let stdout = '';
    let stderr = '';
    let settled = false;
    const done = (result: Omit<ProbeResult, 'stdout' | 'stderr'>) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve({ ...result, stdout: stdout.slice(0, 20_000), stderr: stderr.slice(0, 20_000) });
    };
    const child = spawn(file, args, {
      env: options.env ?? { PATH: DAEMON_PATH },
      stdio: ['pipe', 'pipe', 'pipe', ...(options.fds ?? [])],
      detached: true,
    });
    const timer = setTimeout(() => {
      try {
        if (child.pid) process.kill(-child.pid, 'SIGKILL');
      } catch {
        // ended meanwhile
      }
      child.stdout?.destroy();
      child.stderr?.destroy();
      done({ ok: false, code: null, timedOut: true });
    }, options.timeoutMs);
    child.stdout?.setEncoding('utf8').on('data', (d: string) => {
      stdout += d;
    });
    child.stderr?.setEncoding('utf8').on('data', (d: string) => {
      stderr += d;
    });
    child.stdin?.on('error', () => undefined);
    child.stdin?.end(options.input ?? '');
    child.on('error', (error: NodeJS.ErrnoException) =>
      done({ ok: false, code: null, spawnError: error.code ?? error.message, timedOut: false }),
    );
    child.on('close', (code) => done({ ok: code === 0, code, timedOut: false }));
  });
}

/** What went wrong in a probe, in one line: its stderr's last line, the spawn error, or the timeout. */
export function probeFailure(result: ProbeResult, what: string, timeoutMs: number): string {
  if (result.timedOut) return `${what} did not finish within ${timeoutMs / 1000} s`;
  if (result.spawnError) return `${what} could not start (${result.spawnError})`;
  const lines = `${result.stderr}\n${result.stdout}`
    .trim()
    .split('\n')
    .map((line) => line.trim())
    .filter(Boolean);
  return `${what} failed (exit ${result.code})${lines.length > 0 ? `: ${lines.slice(-3).join(' / ')}` : ''}`;
}

/** The first executable `name` in `path` (a PATH value), or undefined. */
export function findProgram(name: string, path: string): string | undefined {
  for (const dir of path.split(':')) {
    if (!dir) continue;
    const candidate = join(dir, name);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** What to do when the Docker engine's socket refuses this user. */
export function dockerGroupFix(): string {
  let name: string;
  try {
    name = userInfo().username;
  } catch {
    // a uid with no account
    name = String(process.getuid?.());
  }
  return `add this user to the docker group (usermod -aG docker ${name}, then log in again), or run it as root`;
}
