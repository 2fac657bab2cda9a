import { printJson, printLine } from './output.js';
import { colourEnabled, paint } from './style.js';

/** `missing`: not installed at all; `failed`: there, but a real probe of it failed. */
export type CheckStatus = 'ok' | 'warning' | 'missing' | 'failed';

/** One line of `abx doctor`. */
export interface Check {
  /** What was checked: `bubblewrap`, `user namespaces`, `cgroups`… */
  name: string;
  status: CheckStatus;
  /**
   * True when the provider cannot run sandboxes without it: a `missing` or `failed` required
   * check makes doctor exit 1. Optional features (code contexts, the browser group, image
   * templates, rootless disk quotas) never do.
   */
  required: boolean;
  /** What the probe found: versions, paths, or what went wrong. */
  found: string;
  /** What to do about it, for anything not ok. */
  fix?: string;
  /** The same findings as data, for `--json` (e.g. which Node each kind of sandbox runs, and why). */
  details?: Record<string, unknown>;
}

/** What `abx doctor` (local or docker) prints; `--json` prints it as it is. */
export interface DoctorReport {
  provider: 'local' | 'docker';
  /**
   * The mode the daemon would run in: root (a host uid per sandbox) or rootless; for docker, how
   * the engine runs (absent when it did not answer).
   */
  mode?: 'root' | 'rootless';
  /** True when the provider can run sandboxes here (no required check failed). */
  ready: boolean;
  checks: Check[];
}

export function reportOf(
  provider: DoctorReport['provider'],
  mode: DoctorReport['mode'] | undefined,
  checks: Check[],
): DoctorReport {
  // An optional feature that is missing or broken is a warning: only required checks fail.
  const lines = checks.map((c) =>
    c.required || c.status === 'ok' ? c : { ...c, status: 'warning' as const },
  );
  const ready = lines.every((c) => c.status === 'ok' || c.status === 'warning');
  return { provider, ...(mode ? { mode } : {}), ready, checks: lines };
}

const LOOK = {
  ok: { symbol: '✓', colour: 'green' },
  warning: { symbol: '!', colour: 'yellow' },
  missing: { symbol: '✗', colour: 'red' },
  failed: { symbol: '✗', colour: 'red' },
} as const;

const MODE_TEXT = {
  root: 'root mode (each sandbox runs as a host uid of its own)',
  rootless: 'rootless mode (sandboxes run as the daemon’s uid)',
} as const;

/**
 * Prints the report for people: one line per check with its status, what was found and, under
 * anything not ok, the fix; then whether sandboxes can run. Symbols and colour only on a terminal.
 */
export function printReport(report: DoctorReport, json: boolean): void {
  if (json) {
    printJson(report);
    return;
  }
  const tty = colourEnabled();
  const width = Math.max(...report.checks.map((c) => c.name.length));
  const provider =
    report.provider === 'docker'
      ? `docker provider${report.mode ? ` (${report.mode === 'root' ? 'an engine run as root' : 'a rootless engine'})` : ''}`
      : `local provider (bubblewrap), ${MODE_TEXT[report.mode ?? 'rootless']}`;
  printLine(paint('bold', `abx doctor: ${provider}`));
  const indent = ' '.repeat((tty ? 2 : 9) + width + 2);
  for (const check of report.checks) {
    const look = LOOK[check.status];
    const status = tty ? paint(look.colour, look.symbol) : check.status.padEnd(8);
    printLine(`${status} ${check.name.padEnd(width)}  ${check.found}`);
    if (check.fix && check.status !== 'ok') printLine(`${indent}fix: ${check.fix}`);
  }
  const failed = report.checks.filter((c) => c.status === 'missing' || c.status === 'failed');
  const warnings = report.checks.filter((c) => c.status !== 'ok' && !failed.includes(c)).length;
  const tail = warnings > 0 ? ` (${warnings} warning${warnings === 1 ? '' : 's'})` : '';
  printLine(
    report.ready
      ? paint('green', `sandboxes can run here with the ${report.provider} provider${tail}`)
      : paint(
          'red',
          `sandboxes cannot run here with the ${report.provider} provider: fix ${failed.map((c) => c.name).join(', ')}${tail}`,
        ),
  );
}
