import {
  parseArgPairs,
  usage,
  validateKwargs as validate,
} from '../../runtime/protocol/arguments.js';
import type { CustomCommand, Kwargs } from './custom-command.js';

/**
 * The command model's side of the one kwargs validator (runtime/protocol/arguments.ts), which the
 * command server runs on every request too: same rules, same messages, same `ArgumentError`.
 */

/** One line of usage: `train -a epochs=<int> [-a lr=<float, default 0.01>]`. */
export function commandUsage(command: CustomCommand): string {
  return usage(command.name, command.args);
}

/**
 * Parses `key=value` words (the CLI's `-a key=value`) into typed kwargs. `int` takes `42` but not
 * `4.2`; `float` takes `4.2` and `1e3`; `bool` takes true/false/yes/no/1/0 in any case; a value
 * may itself contain `=`. Defaults are applied. Every problem is reported in one
 * `ArgumentError`: bad values, unknown names (with a suggestion), repeats, missing names.
 */
export function parseCommandArgs(command: CustomCommand, pairs: readonly string[]): Kwargs {
  return parseArgPairs(command.name, command.args, pairs) as Kwargs;
}

/**
 * Validates JSON kwargs (an SDK call, a request body) with strict JSON types: no `"42"` for an
 * int, no `1` for a bool. Defaults are applied; every problem is reported at once.
 */
export function validateKwargs(command: CustomCommand, kwargs: unknown): Kwargs {
  return validate(command.name, command.args, kwargs) as Kwargs;
}
