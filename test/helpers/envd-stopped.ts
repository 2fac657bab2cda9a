import { readFileSync } from 'node:fs';
import { isEnvdFront } from '../../src/providers/local/envd-sleep.js';
import { isEnvdCommandLine } from '../../src/providers/provider.js';
import { sandboxProcesses } from './abx-home.js';

/**
 * The host pid of a local sandbox's envd (the user's, not root's): its front where it has one
 * (every request passes it: stopped, nothing reaches Node's envd either); else Node's envd, or
 * while it sleeps when idle, the shell loop that would start it again (stopped, it cannot:
 * docs/providers.md).
 */
export function envdPid(sandboxId: string): number {
  const argvs = sandboxProcesses(sandboxId).map((p): [number, string[]] => {
    try {
      return [p, readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0')];
    } catch {
      return [p, []];
    }
  });
  const pid =
    argvs.find(([, argv]) => isEnvdFront(argv))?.[0] ??
    argvs.find(([, argv]) => isEnvdCommandLine(argv) && argv.includes('/run/abx/envd.sock'))?.[0] ??
    argvs.find(([, argv]) => argv[3] === 'abx-envd')?.[0];
  if (!pid) throw new Error(`no envd process for ${sandboxId}`);
  return pid;
}

/**
 * Runs `work` with the sandbox's envd stopped (SIGSTOP), continuing it even when `work` fails:
 * what completes meanwhile did not go through envd.
 */
export async function withEnvdStopped<T>(sandboxId: string, work: () => Promise<T>): Promise<T> {
  const pid = envdPid(sandboxId);
  process.kill(pid, 'SIGSTOP');
  try {
    return await work();
  } finally {
    process.kill(pid, 'SIGCONT');
  }
}
