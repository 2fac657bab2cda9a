import { CommanderError } from 'commander';
import {
  ArgumentError,
  BadRequestError,
  CapabilityError,
  CommandNotFoundError,
  CommandTimeoutError,
  DaemonUnavailableError,
  InvalidArgumentError,
  InvalidJsonError,
  InvalidPathError,
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
  return isUsage(err) ? EXIT.usage : EXIT.error;
}

/**
 * The request was wrong, whoever noticed (commander, abx, or the control plane answering 400 to
 * a bad value: a volume path, a network entry, a template name's form): exit 2, like commander's
 * own. The 400s that describe a file or a sandbox's state rather than the command line
 * (FileOperationError, EditMismatchError, ContextDeadError, a bad template file's
 * CommandDefinitionError) stay errors (exit 1).
 */
export function isUsage(error: Error): boolean {
  return (
    error instanceof UsageError ||
    error instanceof ArgumentError ||
    error instanceof BadRequestError ||
    error instanceof InvalidJsonError ||
    error instanceof InvalidPathError ||
    error.constructor === InvalidArgumentError
  );
}

/** What `abx --help` says of exit codes. */
export const EXIT_CODES_HELP = `Exit codes:
  0    done
  1    an error (the daemon unreachable, a sandbox not found, a build that failed, ...)
  2    usage: a wrong command line, or a value the control plane refused as wrong input
       (InvalidArgumentError, BadRequestError, InvalidPathError, ArgumentError: a bad volume
       mount, network entry, duration, or command argument)
  N    exec, shell and run of shell commands exit with the command's own code (124: exec
       --timeout stopped it)
  141  the reader of abx's output went away (abx list | head -1)`;
