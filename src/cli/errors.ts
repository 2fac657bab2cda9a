import { CommanderError } from 'commander';
import {
  ArgumentError,
  CapabilityError,
  CommandNotFoundError,
  CommandTimeoutError,
  DaemonUnavailableError,
  LimitExceededError,
  SandboxNotFoundError,
  ServerNotRunningError,
} from '../errors.js';
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

/** What to do next, by class of error; the first that applies wins. */
const HINTS: readonly [new (...args: never[]) => Error, (error: never) => string | undefined][] = [
  [UsageError, (e: UsageError) => (e.help ? `see \`${e.help}\`` : undefined)],
  [ArgumentError, (e: ArgumentError) => (e.usage ? `usage: abx run ID ${e.usage}` : undefined)],
  [SandboxNotFoundError, () => '`abx list --all` shows your sandboxes and how they ended'],
  [CommandNotFoundError, () => '`abx commands ID` lists the commands of a sandbox'],
  [ServerNotRunningError, () => '`abx server start ID --module FILE` starts one'],
  [
    CapabilityError,
    () => "add it to the template's `capabilities` and run `abx template build` again",
  ],
  [CommandTimeoutError, () => 'give it more time with --timeout, e.g. --timeout 10m'],
  [LimitExceededError, () => '`abx list` shows the sandboxes running under this key'],
  [
    DaemonUnavailableError,
    () =>
      process.env.ABX_API_URL
        ? `check that ABX_API_URL (--api-url) ${process.env.ABX_API_URL} is right and reachable from this host`
        : '`abx daemon status` and `abx daemon logs` tell what the daemon is doing',
  ],
];

/** The hint for an error, if its class has one. */
export function hintFor(error: Error): string | undefined {
  for (const [cls, hint] of HINTS) {
    if (error instanceof cls) return hint(error as never);
  }
  return undefined;
}

/** Prints an error the way `abx` reports them and returns the exit code. */
export function reportError(error: unknown, stream = process.stderr): number {
  if (error instanceof ExitCode) return error.code;
  if (error instanceof CommanderError) {
    // commander has already printed the message (or the help/version text).
    return error.exitCode === 0 ? EXIT.ok : EXIT.usage;
  }
  const err = error instanceof Error ? error : new Error(String(error));
  stream.write(`${paint('red', 'abx:', stream)} ${err.name}: ${err.message}\n`);
  const hint = hintFor(err);
  if (hint) stream.write(`${paint('dim', 'hint:', stream)} ${hint}\n`);
  // The request was wrong, whoever noticed: exit 2, like commander's own.
  return err instanceof UsageError || err instanceof ArgumentError ? EXIT.usage : EXIT.error;
}
