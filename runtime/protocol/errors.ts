/**
 * The errors of agent-sandbox, on both sides of the wire.
 *
 * One root, {@link SandboxError}. Every class names its wire `type` and its HTTP `status` once, as
 * static fields; {@link ERROR_CLASSES} lists them, so the table from wire type to class and to
 * status is derived, never written twice. A server answers with {@link errorResponse}; a client
 * turns the body back into the same class with {@link errorFromBody}. Nothing matches message
 * text: what a caller may branch on travels as `type`, `code` (an errno such as `EISDIR`, or a
 * short reason) and `problems` (one line per thing wrong with a request).
 *
 * Built-ins only (runtime/ imports nothing else).
 */

/** The JSON body of every error response: `{"error": message, "type": name, ...}`. */
export interface ErrorBody {
  /** What went wrong, for a person. */
  error: string;
  /** The error's class name, e.g. `ArgumentError`; a command's own exception keeps its name. */
  type: string;
  /** A machine-readable reason: an errno (`ENOENT`, `EISDIR`) or a short snake_case word. */
  code?: string;
  /** Every problem of a request, one per line (bad kwargs, bad fields). */
  problems?: string[];
  /** Extra fields of some types (`usage`, `available`, `stdout`, `allow`...). */
  [detail: string]: unknown;
}

export interface SandboxErrorOptions extends ErrorOptions {
  /** The HTTP status; defaults to the class's. */
  status?: number;
  /** The wire type; defaults to the class's (a remote error keeps the name its side sent). */
  type?: string;
  code?: string;
  problems?: readonly string[];
  /** Extra fields of the wire body. */
  details?: Record<string, unknown>;
}

/** Anything that went wrong with a sandbox, the daemon, a call into a sandbox or a definition. */
export class SandboxError extends Error {
  static readonly type: string = 'SandboxError';
  static readonly status: number = 500;

  /** The wire type: the class name, or the name the remote side sent for its own exception. */
  readonly type: string;
  /** The HTTP status that carries (or carried) the error. */
  readonly status: number;
  /** A machine-readable reason, when there is one (an errno such as `EISDIR`). */
  readonly code: string | undefined;
  /** Every problem of a bad request, one per line; empty otherwise. */
  readonly problems: readonly string[];
  /** Extra fields of the wire body. */
  readonly details: Readonly<Record<string, unknown>>;

  constructor(message: string, options: SandboxErrorOptions = {}) {
    super(message, 'cause' in options ? { cause: options.cause } : undefined);
    const cls = new.target as unknown as ErrorClass;
    this.name = cls.type;
    this.type = options.type ?? cls.type;
    this.status = options.status ?? cls.status;
    this.code = options.code;
    this.problems = options.problems ?? [];
    this.details = options.details ?? {};
  }

  /** The wire body of this error. */
  toBody(): ErrorBody {
    return {
      ...this.details,
      error: this.message,
      type: this.type,
      ...(this.code === undefined ? {} : { code: this.code }),
      ...(this.problems.length > 0 ? { problems: [...this.problems] } : {}),
    };
  }
}

/** A class of the hierarchy, as the wire table holds it. */
export type ErrorClass = (new (
  // biome-ignore lint/suspicious/noExplicitAny: subclasses take their own constructor arguments
  ...args: any[]
) => SandboxError) & { readonly type: string; readonly status: number };

const text = (value: unknown): string => (typeof value === 'string' ? value : '');

// ---------------------------------------------------------------- bad requests (4xx)

/** A request was malformed or its values invalid; the root of the 4xx request errors. */
export class InvalidArgumentError extends SandboxError {
  static override readonly type: string = 'InvalidArgumentError';
  static override readonly status: number = 400;
}

/** Malformed input the route cannot use: a bad query, a body that is not what it expects. */
export class BadRequestError extends InvalidArgumentError {
  static override readonly type: string = 'BadRequestError';
}

/** The request body is not valid JSON. */
export class InvalidJsonError extends InvalidArgumentError {
  static override readonly type: string = 'InvalidJsonError';
}

/** Problems listed in one ArgumentError; the rest are counted. */
export const MAX_PROBLEMS = 20;

/**
 * The kwargs of a call do not fit the command's arguments: `problems` lists every one (capped
 * at {@link MAX_PROBLEMS}), `usage` is the command's usage line. Client and server raise the same.
 */
export class ArgumentError extends InvalidArgumentError {
  static override readonly type: string = 'ArgumentError';

  static of(command: string, all: readonly string[], usage: string): ArgumentError {
    // A hostile body with thousands of unknown names gets a short answer, not one line per name.
    const problems =
      all.length > MAX_PROBLEMS
        ? [...all.slice(0, MAX_PROBLEMS), `and ${all.length - MAX_PROBLEMS} more problems`]
        : all;
    return new ArgumentError(
      `invalid arguments for '${command}': ${problems.join('; ')}. Usage: ${usage}`,
      { problems, details: { command, usage } },
    );
  }

  /** The command (or route) that was called. */
  get command(): string {
    return text(this.details.command);
  }

  /** Its usage line: `train -a epochs=<int> [-a lr=<float, default 0.01>]`. */
  get usage(): string {
    return text(this.details.usage);
  }
}

/** A path argument is unusable (a NUL byte, empty). */
export class InvalidPathError extends InvalidArgumentError {
  static override readonly type: string = 'InvalidPathError';
}

/** A file operation the file system refused for a reason the caller can fix; `code` is the errno. */
export class FileOperationError extends InvalidArgumentError {
  static override readonly type: string = 'FileOperationError';
}

/** `files/edit` found the text to replace zero times, or more than once without `all`. */
export class EditMismatchError extends InvalidArgumentError {
  static override readonly type: string = 'EditMismatchError';
}

/** The path exists but not with this method; `allow` lists the methods it takes. */
export class MethodNotAllowedError extends InvalidArgumentError {
  static override readonly type: string = 'MethodNotAllowedError';
  static override readonly status: number = 405;

  get allow(): readonly string[] {
    const allow = this.details.allow;
    return Array.isArray(allow) ? allow.map(String) : [];
  }
}

/** The request body is larger than the server accepts. */
export class PayloadTooLargeError extends InvalidArgumentError {
  static override readonly type: string = 'PayloadTooLargeError';
  static override readonly status: number = 413;
}

/** A JSON route got a body declared as something else (form data, plain text...). */
export class UnsupportedMediaTypeError extends InvalidArgumentError {
  static override readonly type: string = 'UnsupportedMediaTypeError';
  static override readonly status: number = 415;
}

/** A code context's interpreter has died (killed, `os._exit`); restart the context to go on. */
export class ContextDeadError extends InvalidArgumentError {
  static override readonly type: string = 'ContextDeadError';
  static override readonly status: number = 409;
}

/** Missing or wrong API key, sandbox token or `Authorization: Bearer` token. */
export class AuthenticationError extends SandboxError {
  static override readonly type: string = 'AuthenticationError';
  static override readonly status: number = 401;
}

/**
 * A webhook delivery failed its check (`verifyWebhook`): no or a wrong signature, or a timestamp
 * outside the replay window. Answer the sender 401 and do not act on the body.
 */
export class WebhookVerificationError extends AuthenticationError {
  static override readonly type: string = 'WebhookVerificationError';
}

/** The file system inside the sandbox denied access (`code`: EACCES, EPERM, EROFS). */
export class PermissionDeniedError extends SandboxError {
  static override readonly type: string = 'PermissionDeniedError';
  static override readonly status: number = 403;
}

/** The sandbox's template does not allow this (e.g. reaching a port without `ports`). */
export class CapabilityError extends SandboxError {
  static override readonly type: string = 'CapabilityError';
  static override readonly status: number = 403;
}

/**
 * An API key reached its limit (`code` `limit_exceeded`: its most running sandboxes); ending one
 * of its sandboxes, or a key with a higher limit, lets the next create through.
 */
export class LimitExceededError extends SandboxError {
  static override readonly type: string = 'LimitExceededError';
  static override readonly status: number = 429;
}

/**
 * The sandbox is paused (`code` `paused`; or `already_paused` for a pause of a paused one):
 * resume it first (`sandbox.resume()`, `Sandbox.connect(id)`, `abx resume ID`).
 */
export class SandboxPausedError extends SandboxError {
  static override readonly type: string = 'SandboxPausedError';
  static override readonly status: number = 409;
}

/**
 * A volume's name is taken (`code` `volume_exists`), or it is mounted by live sandboxes and cannot
 * be removed (`code` `volume_in_use`, `users`: their ids): kill them first.
 */
export class VolumeConflictError extends SandboxError {
  static override readonly type: string = 'VolumeConflictError';
  static override readonly status: number = 409;
}

/**
 * A secret of that name exists already among the caller's key's secrets (`code` `secret_exists`):
 * update it, or remove it first.
 */
export class SecretConflictError extends SandboxError {
  static override readonly type: string = 'SecretConflictError';
  static override readonly status: number = 409;
}

/**
 * A template of that name exists and is not the caller's to replace (`code`
 * `template_name_taken`): another key's private template, which the caller may not see. Choose
 * another name.
 */
export class TemplateConflictError extends SandboxError {
  static override readonly type: string = 'TemplateConflictError';
  static override readonly status: number = 409;
}

/**
 * A template names the Node line its sandboxes need (`runtime: { node }`), and this
 * installation's sandboxes of it run another: the message says which Node is there, where it
 * comes from, and how to get the one needed (`needed`, `found` in the error).
 */
export class NodeLineError extends SandboxError {
  static override readonly type: string = 'NodeLineError';
  static override readonly status: number = 409;
}

// ---------------------------------------------------------------- not found (404)

/** No sandbox, template, command, process or file of that name (or it is gone). */
export class NotFoundError extends SandboxError {
  static override readonly type: string = 'NotFoundError';
  static override readonly status: number = 404;
}

/**
 * The route belongs to a route group the command server was started without (`--groups`). The
 * wire keeps its historical name; it is not about template capabilities.
 */
export class CapabilityDisabledError extends NotFoundError {
  static override readonly type: string = 'CapabilityDisabledError';
}

/** The sandbox does not exist, or no longer runs (the message says how it ended). */
export class SandboxNotFoundError extends NotFoundError {
  static override readonly type: string = 'SandboxNotFoundError';
}

/** No volume of that name (among the caller's). */
export class VolumeNotFoundError extends NotFoundError {
  static override readonly type: string = 'VolumeNotFoundError';
}

/** No secret of that name or id among the caller's (another key's secret answers the same). */
export class SecretNotFoundError extends NotFoundError {
  static override readonly type: string = 'SecretNotFoundError';
}

/** No webhook of that id among the caller's (another key's webhook answers the same). */
export class WebhookNotFoundError extends NotFoundError {
  static override readonly type: string = 'WebhookNotFoundError';
}

/** No template of that name. */
export class TemplateNotFoundError extends NotFoundError {
  static override readonly type: string = 'TemplateNotFoundError';
}

/** No command of that name; `available` lists the names that exist. */
export class CommandNotFoundError extends NotFoundError {
  static override readonly type: string = 'CommandNotFoundError';

  static of(name: string, available: readonly string[]): CommandNotFoundError {
    return new CommandNotFoundError(
      `no command '${name}' in this sandbox; ${
        available.length > 0
          ? `available: ${available.join(', ')}`
          : 'it has none (define custom_commands in template.yaml or start the command server with decorated classes)'
      }`,
      { details: { command: name, available: [...available] } },
    );
  }

  get available(): readonly string[] {
    const available = this.details.available;
    return Array.isArray(available) ? available.map(String) : [];
  }
}

/** No command server runs in the sandbox on that port (start one with `server.start`). */
export class ServerNotRunningError extends NotFoundError {
  static override readonly type: string = 'ServerNotRunningError';
}

/** No route of the server has this path. */
export class RouteNotFoundError extends NotFoundError {
  static override readonly type: string = 'RouteNotFoundError';
}

// ---------------------------------------------------------------- timeouts

/** A call or command ran past its timeout; the work was stopped. */
export class TimeoutError extends SandboxError {
  static override readonly type: string = 'TimeoutError';
  static override readonly status: number = 504;
}

/** The request body did not arrive in time (a stalled or trickling client). */
export class RequestTimeoutError extends TimeoutError {
  static override readonly type: string = 'RequestTimeoutError';
  static override readonly status: number = 408;
}

/** What a shell command produced, as {@link CommandExitError} and {@link CommandTimeoutError} keep it. */
export interface CommandResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  /** Set when the command was stopped (timeout, kill). */
  error?: string;
}

/** The command result a body or error carries (`exitCode`, or the server's `exit_code`). */
function resultOf(details: Readonly<Record<string, unknown>>): CommandResult {
  const code = details.exitCode ?? details.exit_code;
  return {
    stdout: text(details.stdout),
    stderr: text(details.stderr),
    exitCode: typeof code === 'number' ? code : -1,
    ...(typeof details.reason === 'string' ? { error: details.reason } : {}),
  };
}

/**
 * A command ran past its timeout and its whole process group was killed; the output captured
 * until then is {@link CommandTimeoutError.result}.
 */
export class CommandTimeoutError extends TimeoutError {
  static override readonly type: string = 'CommandTimeoutError';

  static of(message: string, result: CommandResult): CommandTimeoutError {
    const { error, ...rest } = result;
    return new CommandTimeoutError(message, {
      details: { ...rest, ...(error === undefined ? {} : { reason: error }) },
    });
  }

  get result(): CommandResult {
    return resultOf(this.details);
  }

  get stdout(): string {
    return this.result.stdout;
  }

  get stderr(): string {
    return this.result.stderr;
  }
}

// ---------------------------------------------------------------- unavailable (5xx)

/** Something the request needs is not there or not answering; retrying later may help. */
export class UnavailableError extends SandboxError {
  static override readonly type: string = 'UnavailableError';
  static override readonly status: number = 503;
}

/** No headless Chromium in the sandbox. */
export class BrowserUnavailableError extends UnavailableError {
  static override readonly type: string = 'BrowserUnavailableError';
}

/** A program a route needs (`script`, `git`, `python3`) is not installed in the sandbox. */
export class ToolUnavailableError extends UnavailableError {
  static override readonly type: string = 'ToolUnavailableError';
}

/** The server is stopping and takes no new work. */
export class ServerStoppingError extends UnavailableError {
  static override readonly type: string = 'ServerStoppingError';
}

/** The abx daemon cannot be reached, or did not start. */
export class DaemonUnavailableError extends UnavailableError {
  static override readonly type: string = 'DaemonUnavailableError';
}

/** The gateway could not reach the sandbox's port (nothing listens, or the sandbox stopped). */
export class UpstreamError extends UnavailableError {
  static override readonly type: string = 'UpstreamError';
  static override readonly status: number = 502;
}

// ---------------------------------------------------------------- failures (500)

/** A sandbox could not be started; the message carries the tail of its log. */
export class SandboxStartError extends SandboxError {
  static override readonly type: string = 'SandboxStartError';
}

/**
 * A template's build failed at one step: `step` (its index), `command`, `exitCode` and the end
 * of its `output` are in the error; the template is left as it was before the build.
 */
export class TemplateBuildError extends SandboxError {
  static override readonly type: string = 'TemplateBuildError';
  static override readonly status: number = 422;

  get step(): number {
    return typeof this.details.step === 'number' ? this.details.step : -1;
  }

  get exitCode(): number | undefined {
    return typeof this.details.exitCode === 'number' ? this.details.exitCode : undefined;
  }

  get output(): string {
    return text(this.details.output);
  }
}

/** A command returned a value that JSON cannot represent (a cycle, a BigInt). */
export class SerializationError extends SandboxError {
  static override readonly type: string = 'SerializationError';
}

/**
 * A command of the command server threw: `type` is its own exception's class name (`RangeError`,
 * `ValueError`...), `status` what the server answered.
 */
export class ServerCommandError extends SandboxError {
  static override readonly type: string = 'ServerCommandError';
}

/** A command bundle given to the command server is not a manifest it can serve. */
export class ManifestError extends SandboxError {
  static override readonly type: string = 'ManifestError';
}

/** An archive could not be extracted: it is malformed or unsafe, or the disk refused a write. */
export class ArchiveError extends SandboxError {
  static override readonly type: string = 'ArchiveError';
  static override readonly status: number = 502;
}

/** A shell command exited with a non-zero code; {@link CommandExitError.result} holds its output. */
export class CommandExitError extends SandboxError {
  static override readonly type: string = 'CommandExitError';

  static of(result: CommandResult): CommandExitError {
    const { error, ...rest } = result;
    return new CommandExitError(
      `command exited with code ${result.exitCode}${result.stderr ? `: ${result.stderr.trim().slice(-500)}` : ''}`,
      { details: { ...rest, ...(error === undefined ? {} : { reason: error }) } },
    );
  }

  get result(): CommandResult {
    return resultOf(this.details);
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

/** A command, template or decorator is defined wrongly; raised when it is loaded. */
export class CommandDefinitionError extends InvalidArgumentError {
  static override readonly type: string = 'CommandDefinitionError';
}

/** A `template.yaml` cannot be read, parsed or validated. `location` is `file:line:column`. */
export class TemplateError extends CommandDefinitionError {
  static override readonly type: string = 'TemplateError';

  constructor(message: string, location?: string, options?: ErrorOptions) {
    super(location ? `${location}: ${message}` : message, {
      ...options,
      ...(location ? { details: { location } } : {}),
    });
  }

  get location(): string | undefined {
    const location = this.details.location;
    return typeof location === 'string' ? location : undefined;
  }
}

/** The same command name is defined in two places of one template. */
export class DuplicateCommandError extends CommandDefinitionError {
  static override readonly type: string = 'DuplicateCommandError';

  constructor(template: string, command: string, places: [string, string]) {
    super(
      `command '${command}' is defined twice in template '${template}': at ${places[0]} and at ${places[1]}; rename or remove one of them`,
      { details: { command, places } },
    );
  }

  get command(): string {
    return String(this.details.command);
  }

  get places(): [string, string] {
    return this.details.places as [string, string];
  }
}

/**
 * Every class of the hierarchy. The wire table ({@link errorClassOf}) is built from this list;
 * a test checks that every type a server of this package can send is in it.
 */
export const ERROR_CLASSES: readonly ErrorClass[] = [
  SandboxError,
  InvalidArgumentError,
  BadRequestError,
  InvalidJsonError,
  ArgumentError,
  InvalidPathError,
  FileOperationError,
  EditMismatchError,
  MethodNotAllowedError,
  PayloadTooLargeError,
  UnsupportedMediaTypeError,
  ContextDeadError,
  SandboxPausedError,
  VolumeConflictError,
  SecretConflictError,
  TemplateConflictError,
  NodeLineError,
  AuthenticationError,
  WebhookVerificationError,
  PermissionDeniedError,
  CapabilityError,
  LimitExceededError,
  CapabilityDisabledError,
  NotFoundError,
  SandboxNotFoundError,
  TemplateNotFoundError,
  VolumeNotFoundError,
  SecretNotFoundError,
  WebhookNotFoundError,
  CommandNotFoundError,
  RouteNotFoundError,
  ServerNotRunningError,
  TimeoutError,
  RequestTimeoutError,
  CommandTimeoutError,
  UnavailableError,
  BrowserUnavailableError,
  ToolUnavailableError,
  ServerStoppingError,
  DaemonUnavailableError,
  UpstreamError,
  SandboxStartError,
  TemplateBuildError,
  SerializationError,
  ServerCommandError,
  ManifestError,
  ArchiveError,
  CommandExitError,
  CommandDefinitionError,
  TemplateError,
  DuplicateCommandError,
];

const BY_TYPE = new Map<string, ErrorClass>(ERROR_CLASSES.map((cls) => [cls.type, cls]));

/** The class of a wire type, if it is one of ours. */
export function errorClassOf(type: string): ErrorClass | undefined {
  return BY_TYPE.get(type);
}

/** The class for a status when the type is not ours (a proxy's page, a command's own error). */
function classOfStatus(status: number): ErrorClass {
  if (status === 401) return AuthenticationError;
  if (status === 403) return PermissionDeniedError;
  if (status === 404) return NotFoundError;
  if (status === 429) return LimitExceededError;
  if (status === 408 || status === 504) return TimeoutError;
  if (status === 502) return UpstreamError;
  if (status === 503) return UnavailableError;
  if (status >= 400 && status < 500) return InvalidArgumentError;
  return SandboxError;
}

/**
 * Turns an error response (status and parsed body) into the class its `type` names, keeping
 * `type`, `code`, `problems` and the other fields. A type that is not ours (a command's own
 * `RangeError`) becomes `fallback` when given, else the class of its status; `type` keeps the
 * remote name either way.
 */
export function errorFromBody(status: number, body: unknown, fallback?: ErrorClass): SandboxError {
  const fields =
    typeof body === 'object' && body !== null && !Array.isArray(body)
      ? (body as Record<string, unknown>)
      : {};
  const { error, type, code, problems, ...details } = fields;
  const message = typeof error === 'string' ? error : `request failed with status ${status}`;
  const remoteType = typeof type === 'string' && type !== '' ? type : undefined;
  const known = remoteType === undefined ? undefined : BY_TYPE.get(remoteType);
  const cls = known ?? (remoteType !== undefined ? fallback : undefined) ?? classOfStatus(status);
  const options: SandboxErrorOptions = {
    status,
    type: remoteType ?? cls.type,
    ...(typeof code === 'string' ? { code } : {}),
    ...(Array.isArray(problems) ? { problems: problems.map(String) } : {}),
    details,
  };
  // The base constructor only: a subclass's own constructor arguments are not on the wire, and
  // everything its getters need is in `details`.
  return Reflect.construct(SandboxError, [message, options], cls as unknown as typeof SandboxError);
}

/** The status and body of an error response, whatever was thrown. */
export function errorResponse(error: unknown): { status: number; body: ErrorBody } {
  if (error instanceof SandboxError) return { status: error.status, body: error.toBody() };
  if (error instanceof Error) {
    // A command's own exception: its class name is the type a caller can branch on.
    const type = error.constructor?.name || error.name || 'Error';
    return { status: 500, body: { error: error.message, type } };
  }
  return {
    status: 500,
    body: { error: `a non-Error was thrown: ${error}`, type: 'NonErrorThrown' },
  };
}
