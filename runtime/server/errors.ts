/**
 * The command server's and envd's errors: the classes of the protocol (runtime/protocol/errors.ts,
 * one table of wire types and statuses for both sides) and the messages the server words the same
 * way in several places. Every error answers with `{"error", "type", ...}` and its class's status.
 */
import {
  CommandTimeoutError,
  FileOperationError,
  NotFoundError,
  PayloadTooLargeError,
  PermissionDeniedError,
  RequestTimeoutError,
  SandboxError,
  ToolUnavailableError,
} from '../protocol/errors.js';

export {
  ArgumentError,
  AuthenticationError,
  BadRequestError,
  BrowserUnavailableError,
  CapabilityDisabledError,
  CommandNotFoundError,
  CommandTimeoutError,
  EditMismatchError,
  errorResponse,
  FileOperationError,
  InvalidJsonError,
  InvalidPathError,
  ManifestError,
  MethodNotAllowedError,
  NotFoundError,
  PayloadTooLargeError,
  PermissionDeniedError,
  RequestTimeoutError,
  RouteNotFoundError,
  SandboxError,
  SerializationError,
  ServerStoppingError,
  ToolUnavailableError,
  UnsupportedMediaTypeError,
} from '../protocol/errors.js';

/** The request body is larger than `limit` bytes. */
export function payloadTooLarge(limit: number): PayloadTooLargeError {
  return new PayloadTooLargeError(
    `request body is larger than the limit of ${limit} bytes; send less or start the server with a larger --body-limit`,
  );
}

/** The request body did not arrive within `ms`. */
export function requestTimeout(ms: number): RequestTimeoutError {
  return new RequestTimeoutError(`the request body did not arrive within ${ms} ms`);
}

/** `what` ran past `ms`; `output` (stdout, stderr, exit_code) is what it printed until then. */
export function commandTimeout(
  what: string,
  ms: number,
  output?: Record<string, unknown>,
): CommandTimeoutError {
  return new CommandTimeoutError(`${what} ran past its timeout of ${ms} ms and was stopped`, {
    ...(output ? { details: output } : {}),
  });
}

/** A program a route needs is not installed in the sandbox. */
export function toolUnavailable(program: string, purpose: string): ToolUnavailableError {
  return new ToolUnavailableError(
    `${program} is not installed, so ${purpose} is not available; add it to the sandbox template`,
  );
}

const FS_ERRORS: Record<
  string,
  new (
    message: string,
    options: { code: string; cause: Error },
  ) => SandboxError
> = {
  ENOENT: NotFoundError,
  EACCES: PermissionDeniedError,
  EPERM: PermissionDeniedError,
  EROFS: PermissionDeniedError,
};

/**
 * Turns a node fs error into a request error that says which path and what went wrong, with the
 * errno as `code` (so a client branches on `ENOENT` or `EISDIR`, never on the message).
 */
export function fsError(error: unknown, action: string): unknown {
  const e = error as NodeJS.ErrnoException;
  if (!(e instanceof Error) || typeof e.code !== 'string' || error instanceof SandboxError) {
    return error;
  }
  const ErrorClass = FS_ERRORS[e.code] ?? FileOperationError;
  return new ErrorClass(`cannot ${action}: ${e.message}`, { code: e.code, cause: e });
}
