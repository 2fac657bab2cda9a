/**
 * Request errors of the command server. Every one answers with the wire shape
 * `{"error": message, "type": name, ...details}` and the status that {@link STATUS_BY_TYPE} maps
 * its name to; an error that is not a {@link ServerError} (a command threw) answers 500 with its
 * class name as `type`.
 */

/** The root of the server's request errors. `details` are extra fields of the response body. */
export class ServerError extends Error {
  readonly details: Record<string, unknown>;

  constructor(message: string, details: Record<string, unknown> = {}, options?: ErrorOptions) {
    super(message, options);
    this.name = 'ServerError';
    this.details = details;
  }
}

/** Malformed JSON, a body that is not what the route expects, or a bad query parameter. */
export class BadRequestError extends ServerError {
  constructor(message: string, details?: Record<string, unknown>) {
    super(message, details);
    this.name = 'BadRequestError';
  }
}

/** The request body is not valid JSON. */
export class InvalidJsonError extends ServerError {
  constructor(message: string) {
    super(message);
    this.name = 'InvalidJsonError';
  }
}

/** Problems listed in one ArgumentError; the rest are counted. Client and server agree. */
const MAX_PROBLEMS = 20;

/** The kwargs of a call do not fit the command's arguments; `problems` lists every one. */
export class ArgumentError extends ServerError {
  constructor(command: string, all: readonly string[], usage: string) {
    // A hostile body with thousands of unknown names gets a short answer, not one line per name.
    const problems =
      all.length > MAX_PROBLEMS
        ? [...all.slice(0, MAX_PROBLEMS), `and ${all.length - MAX_PROBLEMS} more problems`]
        : all;
    super(`invalid arguments for '${command}': ${problems.join('; ')}. Usage: ${usage}`, {
      problems,
    });
    this.name = 'ArgumentError';
  }
}

/** A path argument is unusable (a NUL byte, empty). */
export class InvalidPathError extends ServerError {
  constructor(message: string) {
    super(message);
    this.name = 'InvalidPathError';
  }
}

/** A file operation the file system refused for a reason the caller can fix. */
export class FileOperationError extends ServerError {
  constructor(message: string, code: string | undefined, options?: ErrorOptions) {
    super(message, code ? { code } : {}, options);
    this.name = 'FileOperationError';
  }
}

/** `files/edit` found the text to replace zero times, or more than once without `all`. */
export class EditMismatchError extends ServerError {
  constructor(message: string) {
    super(message);
    this.name = 'EditMismatchError';
  }
}

/** Missing or wrong `Authorization: Bearer <token>`. */
export class AuthenticationError extends ServerError {
  constructor() {
    super('missing or wrong token: send the header "Authorization: Bearer <token>"');
    this.name = 'AuthenticationError';
  }
}

/** The file system denied access. */
export class PermissionDeniedError extends ServerError {
  constructor(message: string, options?: ErrorOptions) {
    super(message, {}, options);
    this.name = 'PermissionDeniedError';
  }
}

/** No route has this path. */
export class RouteNotFoundError extends ServerError {
  constructor(method: string, path: string) {
    super(`no route ${method} ${path}; GET /capabilities lists the routes of this server`);
    this.name = 'RouteNotFoundError';
  }
}

/** No command of this name is registered. */
export class CommandNotFoundError extends ServerError {
  constructor(name: string, known: readonly string[]) {
    super(`unknown command '${name}'; known commands: ${known.join(', ') || '(none)'}`);
    this.name = 'CommandNotFoundError';
  }
}

/** A process, terminal or file that the request names does not exist. */
export class NotFoundError extends ServerError {
  constructor(message: string, options?: ErrorOptions) {
    super(message, {}, options);
    this.name = 'NotFoundError';
  }
}

/** The route belongs to a capability group this server was started without. */
export class CapabilityDisabledError extends ServerError {
  constructor(group: string) {
    super(
      `capability group ${group} is disabled on this server; start it with --groups including ${group.toLowerCase()}`,
    );
    this.name = 'CapabilityDisabledError';
  }
}

/** The path exists but not with this method. */
export class MethodNotAllowedError extends ServerError {
  readonly allow: readonly string[];

  constructor(method: string, path: string, allow: readonly string[]) {
    super(`${method} is not allowed on ${path}; use ${allow.join(' or ')}`);
    this.name = 'MethodNotAllowedError';
    this.allow = allow;
  }
}

/** The request body did not arrive in time (a stalled or trickling client). */
export class RequestTimeoutError extends ServerError {
  constructor(ms: number) {
    super(`the request body did not arrive within ${ms} ms`);
    this.name = 'RequestTimeoutError';
  }
}

/** The request body is larger than the server accepts. */
/** A JSON route got a body declared as something else (form data, plain text...). */
export class UnsupportedMediaTypeError extends ServerError {
  constructor(contentType: string) {
    super(
      `the body is declared as ${JSON.stringify(contentType)}; send JSON with Content-Type: application/json`,
    );
    this.name = 'UnsupportedMediaTypeError';
  }
}

export class PayloadTooLargeError extends ServerError {
  constructor(limit: number) {
    super(
      `request body is larger than the limit of ${limit} bytes; send less or start the server with a larger --body-limit`,
    );
    this.name = 'PayloadTooLargeError';
  }
}

/** A command returned a value that JSON cannot represent (a cycle, a BigInt). */
export class SerializationError extends ServerError {
  constructor(command: string, options?: ErrorOptions) {
    super(
      `the result of '${command}' cannot be serialized to JSON (${String((options?.cause as Error)?.message ?? options?.cause)}); return plain data`,
      {},
      options,
    );
    this.name = 'SerializationError';
  }
}

/** A command, shell command or snippet ran past its timeout; `details` hold partial output. */
export class CommandTimeoutError extends ServerError {
  constructor(what: string, ms: number, details?: Record<string, unknown>) {
    super(`${what} ran past its timeout of ${ms} ms and was stopped`, details);
    this.name = 'CommandTimeoutError';
  }
}

/** No headless Chromium on this machine. */
export class BrowserUnavailableError extends ServerError {
  constructor(path: string) {
    super(
      `no headless browser is available: ${path} does not exist; install chromium in the sandbox template to use /browser routes`,
    );
    this.name = 'BrowserUnavailableError';
  }
}

/** A program a route needs (`script`, `git`, `python3`) is not installed in the sandbox. */
export class ToolUnavailableError extends ServerError {
  constructor(program: string, purpose: string) {
    super(
      `${program} is not installed, so ${purpose} is not available; add it to the sandbox template`,
    );
    this.name = 'ToolUnavailableError';
  }
}

/** The server is stopping and takes no new work. */
export class ServerStoppingError extends ServerError {
  constructor() {
    super('the server is shutting down; retry against a new server');
    this.name = 'ServerStoppingError';
  }
}

/** A command bundle given to `--load` is not a manifest this server can serve. */
export class ManifestError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'ManifestError';
  }
}

/** HTTP status of each error type; anything unlisted is a 500. */
export const STATUS_BY_TYPE: Readonly<Record<string, number>> = {
  BadRequestError: 400,
  InvalidJsonError: 400,
  ArgumentError: 400,
  InvalidPathError: 400,
  FileOperationError: 400,
  EditMismatchError: 400,
  AuthenticationError: 401,
  PermissionDeniedError: 403,
  RouteNotFoundError: 404,
  CommandNotFoundError: 404,
  NotFoundError: 404,
  CapabilityDisabledError: 404,
  MethodNotAllowedError: 405,
  RequestTimeoutError: 408,
  PayloadTooLargeError: 413,
  UnsupportedMediaTypeError: 415,
  SerializationError: 500,
  BrowserUnavailableError: 503,
  ToolUnavailableError: 503,
  ServerStoppingError: 503,
  CommandTimeoutError: 504,
};

/** The response of an error: status and the `{error, type}` body. */
export function errorResponse(error: unknown): { status: number; body: Record<string, unknown> } {
  if (error instanceof ServerError) {
    return {
      status: STATUS_BY_TYPE[error.name] ?? 500,
      body: { error: error.message, type: error.name, ...error.details },
    };
  }
  const type =
    error instanceof Error ? error.constructor?.name || error.name || 'Error' : 'NonErrorThrown';
  const message = error instanceof Error ? error.message : `a non-Error was thrown: ${error}`;
  // Errors of other hierarchies (the control plane's SandboxError) carry their own status.
  const status = (error as { status?: unknown } | undefined)?.status;
  if (typeof status === 'number' && status >= 400 && status <= 599) {
    return { status, body: { error: message, type: (error as Error).name || type } };
  }
  return { status: 500, body: { error: message, type } };
}

const FS_ERRORS: Record<string, (message: string, cause: Error) => ServerError> = {
  ENOENT: (m, cause) => new NotFoundError(m, { cause }),
  EACCES: (m, cause) => new PermissionDeniedError(m, { cause }),
  EPERM: (m, cause) => new PermissionDeniedError(m, { cause }),
};

/** Turns a node fs error into a request error that says which path and what went wrong. */
export function fsError(error: unknown, action: string): unknown {
  const e = error as NodeJS.ErrnoException;
  if (!(e instanceof Error) || typeof e.code !== 'string' || error instanceof ServerError) {
    return error;
  }
  const message = `cannot ${action}: ${e.message}`;
  return FS_ERRORS[e.code]?.(message, e) ?? new FileOperationError(message, e.code, { cause: e });
}
