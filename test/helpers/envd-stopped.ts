import { readFileSync } from 'node:fs';
import { isEnvdCommandLine } from '../../src/providers/provider.js';
import { sandboxProcesses } from './abx-home.js';

/** The host pid of a local sandbox's envd (the user's, not root's). */
export function envdPid(sandboxId: string): number {
  const pid = sandboxProcesses(sandboxId).find((p) => {
    try {
      const argv = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
      return isEnvdCommandLine(argv) && argv.includes('/run/abx/envd.sock');
    } catch {
      return false;
    }
  });
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
