import { SandboxError } from '../errors.js';

/**
 * Why a tool call failed. {@link SandboxTool.invoke} rejects with this and nothing else, so an
 * agent loop catches one class and hands `{ error, type }` back to the model.
 */
export class ToolCallError extends SandboxError {
  static override readonly type: string = 'ToolCallError';

  /** The tool that was called. */
  readonly tool: string;

  /**
   * `type` says what kind of failure, as a class name: `ArgumentError` (the arguments do not fit
   * the schema; nothing ran), `FileOperationError` (a file tool reported a failure, e.g. a missing
   * file), or the type the sandbox side reported (`RangeError` thrown by a decorated command,
   * `SandboxNotFoundError` when the sandbox is gone, ...).
   */
  constructor(tool: string, type: string, message: string, options?: ErrorOptions) {
    const cause = options?.cause;
    super(message, {
      ...options,
      type,
      ...(cause instanceof SandboxError
        ? {
            status: cause.status,
            ...(cause.code === undefined ? {} : { code: cause.code }),
            problems: cause.problems,
          }
        : {}),
    });
    this.tool = tool;
  }

  /** The error in the command server's wire shape, ready to show a model. */
  toJSON(): { error: string; type: string } {
    return { error: this.message, type: this.type };
  }
}

/**
 * Turns whatever a tool body threw into a {@link ToolCallError}: the wire type of a
 * {@link SandboxError} (the remote class when the sandbox reported one), else the class name.
 */
export function toToolCallError(tool: string, error: unknown): ToolCallError {
  if (error instanceof ToolCallError) return error;
  if (error instanceof SandboxError) {
    return new ToolCallError(tool, error.type, error.message, { cause: error });
  }
  if (error instanceof Error)
    return new ToolCallError(tool, error.name, error.message, { cause: error });
  return new ToolCallError(tool, 'Error', String(error), { cause: error });
}
