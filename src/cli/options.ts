import { type Command, InvalidArgumentError } from 'commander';
import { MAX_SANDBOX_TIMEOUT_MS } from '../../runtime/protocol/constants.js';
import { parseDuration } from '../util/duration.js';

/** Parses `30s`, `10m`, `1h` (or bare seconds) to milliseconds; commander reports a bad one. */
export function durationArg(value: string): number {
  const ms = parseDuration(value);
  if (ms === undefined) {
    throw new InvalidArgumentError('expected a duration such as 30s, 10m or 1h.');
  }
  return ms;
}

/** `--user` of a command in a sandbox: `root` (where its template allows root) or `user`. */
export function sandboxUserArg(value: string): 'root' | 'user' {
  if (value !== 'root' && value !== 'user') {
    throw new InvalidArgumentError(
      'a sandbox has two users: root (where its template has allow_root: true) and user (the default).',
    );
  }
  return value;
}

/** A sandbox's lifetime (`--timeout` of create, `abx timeout`): a duration of at most 24 h. */
export function lifetimeArg(value: string): number {
  const ms = durationArg(value);
  if (ms < 1 || ms > MAX_SANDBOX_TIMEOUT_MS) {
    throw new InvalidArgumentError(
      `a sandbox lives at most 24h (and at least 1ms): give a duration such as 30m or 24h, not ${value}.`,
    );
  }
  return ms;
}

/** Parses a TCP port. */
export function portArg(value: string): number {
  const port = Number(value);
  if (!/^\d+$/.test(value) || port < 1 || port > 65535) {
    throw new InvalidArgumentError('expected a TCP port (1-65535).');
  }
  return port;
}

/** Collects a repeatable option into a list. */
export function collect(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

/** Collects a repeatable `K=V` option into a record (the value may itself contain `=`). */
export function collectPairs(
  value: string,
  previous: Record<string, string> = {},
): Record<string, string> {
  const eq = value.indexOf('=');
  if (eq <= 0) throw new InvalidArgumentError('expected KEY=VALUE.');
  return { ...previous, [value.slice(0, eq)]: value.slice(eq + 1) };
}

/** Adds the examples shown at the end of `--help`: every command has at least one. */
export function withExamples(command: Command, ...examples: string[]): Command {
  const title = examples.length === 1 ? 'Example' : 'Examples';
  return command.addHelpText('after', `\n${title}:\n${examples.map((e) => `  ${e}`).join('\n')}`);
}
