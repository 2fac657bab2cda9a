import { readFileSync } from 'node:fs';

/**
 * The start time of a process (field 22 of /proc/PID/stat, in clock ticks since boot), or
 * `undefined` when no such process exists. Together with the pid it names one process for good:
 * a pid reused later has another start time.
 */
export function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (fields[0] === 'Z') return undefined;
    return fields[19];
  } catch {
    return undefined;
  }
}

/** True when `pid` runs and started at `startTime`. */
export function isSameProcess(pid: number, startTime: string): boolean {
  return processStartTime(pid) === startTime;
}
