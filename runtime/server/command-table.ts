import {
  ARG_TYPES as ARG_TYPES_OF_COMMANDS,
  type ArgSpec,
  COMMAND_NAME_PATTERN,
  validateKwargs,
} from '../protocol/arguments.js';
import type { CommandDescription } from '../protocol/wire.js';
import {
  CommandNotFoundError,
  commandTimeout,
  SerializationError,
  ServerStoppingError,
} from './errors.js';
import { Reply } from './http.js';

/** A command's implementation: gets validated kwargs with defaults applied; may be async. */
export type CommandHandler = (kwargs: Record<string, unknown>) => unknown;

/** A command as the server holds it. */
export interface RegisteredCommand {
  name: string;
  description: string;
  args: ArgSpec[];
  /** Milliseconds; `undefined` takes the server default, `0` means the handler times itself. */
  timeoutMs?: number;
  handler: CommandHandler;
}

const ARG_TYPES: readonly string[] = [...ARG_TYPES_OF_COMMANDS, 'env'];

/** Why an argument schema cannot be served, or `undefined` when it can. */
function schemaProblem(args: readonly ArgSpec[]): string | undefined {
  for (const [i, arg] of args.entries()) {
    if (typeof arg?.name !== 'string' || !ARG_TYPES.includes(arg.type)) {
      return `args[${i}] needs a string name and a type of str, int, float or bool`;
    }
    if (typeof arg.required !== 'boolean')
      return `args[${i}] (${arg.name}) needs required: true or false`;
  }
  return undefined;
}

/** The commands a server serves: registration, discovery, and calls with validation and timeout. */
export class CommandTable {
  private readonly commands = new Map<string, RegisteredCommand>();
  private stopping = false;

  constructor(private readonly defaultTimeoutMs: number) {}

  register(command: RegisteredCommand): void {
    if (!COMMAND_NAME_PATTERN.test(command.name)) {
      throw new Error(
        `command name ${JSON.stringify(command.name)} must start with a letter or _ and contain only letters, digits, _ and -`,
      );
    }
    const problem = schemaProblem(command.args);
    if (problem) throw new Error(`command '${command.name}': ${problem}`);
    if (this.commands.has(command.name)) {
      throw new Error(
        `command '${command.name}' is registered twice; command names must be unique (upload, download and runshell are built in)`,
      );
    }
    this.commands.set(command.name, command);
  }

  /** Refuses new calls from now on (calls in flight go on). */
  refuseNewCalls(): void {
    this.stopping = true;
  }

  get(name: string): RegisteredCommand {
    const command = this.commands.get(name);
    if (!command) throw CommandNotFoundError.of(name, [...this.commands.keys()]);
    return command;
  }

  describe(name: string): CommandDescription {
    const { description, args } = this.get(name);
    return {
      name,
      description,
      args: args.map((arg) => ({
        ...arg,
        type: arg.type === 'env' || arg.type === 'argv' ? 'str' : arg.type,
      })),
    };
  }

  list(): CommandDescription[] {
    return [...this.commands.keys()].map((name) => this.describe(name));
  }

  /**
   * Validates kwargs, runs the command within its timeout and answers `{"result": ...}`,
   * serialized here so that an unserializable result is a `SerializationError`, not a broken
   * response.
   */
  async call(name: string, kwargs: unknown): Promise<Reply> {
    if (this.stopping) {
      throw new ServerStoppingError('the server is shutting down; retry against a new server');
    }
    const command = this.get(name);
    const valid = validateKwargs(name, command.args, kwargs);
    const timeoutMs = command.timeoutMs ?? this.defaultTimeoutMs;
    // A synchronous handler's answer is used as is (a timer could never fire while it runs, and
    // a timer plus a race per call is a measurable share of a trivial call); a sync throw
    // rejects this call like an async one.
    const returned = command.handler(valid);
    const result = isThenable(returned)
      ? await withTimeout(Promise.resolve(returned), timeoutMs, `command '${name}'`)
      : returned;
    let text: string;
    try {
      text = JSON.stringify({ result: result === undefined ? null : result });
    } catch (error) {
      throw new SerializationError(
        `the result of '${name}' cannot be serialized to JSON (${(error as Error).message ?? error}); return plain data`,
        { cause: error },
      );
    }
    return new Reply(200, text, { 'content-type': 'application/json; charset=utf-8' });
  }
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (
    (typeof value === 'object' || typeof value === 'function') &&
    value !== null &&
    typeof (value as { then?: unknown }).then === 'function'
  );
}

function withTimeout<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  if (ms <= 0) return work;
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(commandTimeout(what, ms)), ms);
  });
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}
