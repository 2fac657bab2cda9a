import { CommanderError } from 'commander';
import { paint } from './style.js';

/** Exit codes of `abx`; `exec` and `run` of shell commands exit with the command's own. */
export const EXIT = { ok: 0, error: 1, usage: 2 } as const;

/** The command line is wrong in a way commander cannot see (exit 2). */
export class UsageError extends Error {
  constructor(
    message: string,
    /** What to run for help, e.g. `abx cp --help`. */
    readonly help?: string,
  ) {
    super(message);
    this.name = 'UsageError';
  }
}

/**
 * Ends `abx` with a given code and no message: the command already said what it had to (its own
 * output, for `exec`), and its exit code is the result.
 */
export class ExitCode extends Error {
  constructor(readonly code: number) {
    super(`exit ${code}`);
    this.name = 'ExitCode';
  }
}

/** Errors that mean "the request was wrong", whoever noticed: exit 2, like commander's own. */
const USAGE_ERRORS = new Set(['UsageError', 'ArgumentError']);

type Failure = Error & { remoteType?: string; usage?: string; help?: string };

/** What to do next, by kind of error; the first that applies wins. */
const HINTS: readonly ((error: Failure) => string | undefined)[] = [
  (e) => (e instanceof UsageError && e.help ? `see \`${e.help}\`` : undefined),
  (e) => (e.name === 'ArgumentError' && e.usage ? `usage: abx run ID ${e.usage}` : undefined),
  (e) =>
    /^sandbox \S+ (does not exist|is not running|stopped)/.test(e.message)
      ? '`abx list --all` shows your sandboxes and how they ended'
      : undefined,
  (e) =>
    e.name === 'CommandNotFoundError'
      ? '`abx commands ID` lists the commands of a sandbox'
      : undefined,
  (e) =>
    e.name === 'CapabilityError'
      ? "add it to the template's `capabilities` and run `abx template build` again"
      : undefined,
  (e) =>
    e.name === 'CommandTimeoutError'
      ? 'give it more time with --timeout, e.g. --timeout 10m'
      : undefined,
  (e) =>
    /the abx daemon could not be reached|daemon did not/.test(e.message)
      ? '`abx daemon status` and `abx daemon logs` tell what the daemon is doing'
      : undefined,
];

/** Prints an error the way `abx` reports them and returns the exit code. */
export function reportError(error: unknown, stream = process.stderr): number {
  if (error instanceof ExitCode) return error.code;
  if (error instanceof CommanderError) {
    // commander has already printed the message (or the help/version text).
    return error.exitCode === 0 ? EXIT.ok : EXIT.usage;
  }
  const err = error instanceof Error ? error : new Error(String(error));
  stream.write(`${paint('red', 'abx:', stream)} ${err.name}: ${err.message}\n`);
  const hint = HINTS.map((find) => find(err)).find((h) => h !== undefined);
  if (hint) stream.write(`${paint('dim', 'hint:', stream)} ${hint}\n`);
  return USAGE_ERRORS.has(err.name) ? EXIT.usage : EXIT.error;
}
