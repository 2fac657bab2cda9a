/**
 * Errors of sandboxes and the control plane. One root, {@link SandboxError}; the daemon sends
 * `{ error, type }` bodies and {@link sandboxErrorFromBody} turns them back into these classes.
 */

/** Anything that went wrong with a sandbox, the daemon or a call into a sandbox. */
export class SandboxError extends Error {
  /** The HTTP status that carries (or carried) the error. */
  readonly status: number | undefined;
  /** The error class name the remote side reported (`type` of the error body), if any. */
  readonly remoteType: string | undefined;

  constructor(message: string, options?: SandboxErrorOptions) {
    super(message, options);
    this.name = 'SandboxError';
    this.status = options?.status;
    this.remoteType = options?.remoteType;
  }
}

export interface SandboxErrorOptions extends ErrorOptions {
  status?: number;
  remoteType?: string;
}

/** No sandbox, template, process or file of that name (or it is gone). */
export class NotFoundError extends SandboxError {
  constructor(message: string, options?: SandboxErrorOptions) {
    super(message, { status: 404, ...options });
    this.name = 'NotFoundError';
  }
}

/** A call or command ran past its timeout; the work was stopped. */
export class TimeoutError extends SandboxError {
  constructor(message: string, options?: SandboxErrorOptions) {
    super(message, { status: 504, ...options });
    this.name = 'TimeoutError';
  }
}

/** Missing or wrong API key or sandbox token. */
export class AuthenticationError extends SandboxError {
  constructor(message: string, options?: SandboxErrorOptions) {
    super(message, { status: 401, ...options });
    this.name = 'AuthenticationError';
  }
}

/** The sandbox's template does not allow this (e.g. reaching a port without `ports`). */
export class CapabilityError extends SandboxError {
  constructor(message: string, options?: SandboxErrorOptions) {
    super(message, { status: 403, ...options });
    this.name = 'CapabilityError';
  }
}

/** A request was malformed or its values invalid. */
export class InvalidArgumentError extends SandboxError {
  constructor(message: string, options?: SandboxErrorOptions) {
    super(message, { status: 400, ...options });
    this.name = 'InvalidArgumentError';
  }
}

/** A sandbox could not be started; the message carries the tail of its log. */
export class SandboxStartError extends SandboxError {
  constructor(message: string, options?: SandboxErrorOptions) {
    super(message, { status: 500, ...options });
    this.name = 'SandboxStartError';
  }
}

/** The result of a command that exited non-zero. */
export interface CommandResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  /** Set when the command was stopped (timeout, kill). */
  error?: string;
}

/** A command exited with a non-zero code; the result is attached. */
export class CommandExitError extends SandboxError {
  readonly result: CommandResult;

  constructor(result: CommandResult) {
    super(
      `command exited with code ${result.exitCode}${result.stderr ? `: ${result.stderr.trim().slice(-500)}` : ''}`,
    );
    this.name = 'CommandExitError';
    this.result = result;
  }

  get stdout(): string {
    return this.result.stdout;
  }

  get stderr(): string {
    return this.result.stderr;
  }

  get exitCode(): number {
    return this.result.exitCode;
  }
}

/**
 * A command ran past its timeout and its whole process group was killed; the output captured
 * until then is attached as {@link CommandTimeoutError.result}.
 */
export class CommandTimeoutError extends TimeoutError {
  readonly result: CommandResult;

  constructor(message: string, result: CommandResult) {
    super(message);
    this.name = 'CommandTimeoutError';
    this.result = result;
  }

  get stdout(): string {
    return this.result.stdout;
  }

  get stderr(): string {
    return this.result.stderr;
  }
}

type ErrorClass = new (message: string, options?: SandboxErrorOptions) => SandboxError;

/** Remote `type` names → local classes; unknown names fall back by status. */
const BY_TYPE: Record<string, ErrorClass> = {
  NotFoundError,
  SandboxNotFoundError: NotFoundError,
  TemplateNotFoundError: NotFoundError,
  TimeoutError,
  AuthenticationError,
  CapabilityError,
  CapabilityDisabledError: CapabilityError,
  InvalidArgumentError,
  ArgumentError: InvalidArgumentError,
  BadRequestError: InvalidArgumentError,
  SandboxStartError,
};

const BY_STATUS: Record<number, ErrorClass> = {
  400: InvalidArgumentError,
  401: AuthenticationError,
  403: CapabilityError,
  404: NotFoundError,
  408: TimeoutError,
  504: TimeoutError,
};

/** Turns an error body `{ error, type }` (and its status) into the matching error class. */
export function sandboxErrorFromBody(status: number, body: unknown): SandboxError {
  const { error, type } = (typeof body === 'object' && body !== null ? body : {}) as {
    error?: unknown;
    type?: unknown;
  };
  const message = typeof error === 'string' ? error : `request failed with status ${status}`;
  const ErrorType =
    (typeof type === 'string' ? BY_TYPE[type] : undefined) ?? BY_STATUS[status] ?? SandboxError;
  return new ErrorType(message, {
    status,
    ...(typeof type === 'string' ? { remoteType: type } : {}),
  });
}

/** No custom command of that name; the message lists the names that exist. */
export class CommandNotFoundError extends NotFoundError {
  readonly available: readonly string[];

  constructor(name: string, available: readonly string[]) {
    super(
      `no custom command '${name}' in this sandbox; ${
        available.length > 0
          ? `available: ${available.join(', ')}`
          : 'it has none (define custom_commands in template.yaml or start the command server with decorated classes)'
      }`,
    );
    this.name = 'CommandNotFoundError';
    this.available = available;
  }
}

/**
 * A call to the command server failed inside the sandbox: bad arguments (400), the command threw
 * (500), ran past its timeout (504)... `type` is the remote error class name.
 */
export class ServerCommandError extends SandboxError {
  readonly type: string;

  constructor(message: string, options: SandboxErrorOptions & { type: string }) {
    super(message, { ...options, remoteType: options.type });
    this.name = 'ServerCommandError';
    this.type = options.type;
  }
}
