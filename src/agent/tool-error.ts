/**
 * Why a tool call failed. {@link SandboxTool.invoke} rejects with this and nothing else, so an
 * agent loop catches one class and hands `{ error, type }` back to the model.
 */
export class ToolCallError extends Error {
  /** The tool that was called. */
  readonly tool: string;
  /**
   * What kind of failure, as a class name: `ArgumentError` (the arguments do not fit the schema;
   * nothing ran), `FileOperationError` (a file tool reported a failure, e.g. a missing file), or
   * the type the sandbox side reported (`RangeError` thrown by a decorated command,
   * `NotFoundError` when the sandbox is gone, ...).
   */
  readonly type: string;

  constructor(tool: string, type: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'ToolCallError';
    this.tool = tool;
    this.type = type;
  }

  /** The error in the command server's wire shape, ready to show a model. */
  toJSON(): { error: string; type: string } {
    return { error: this.message, type: this.type };
  }
}

/**
 * Turns whatever a tool body threw into a {@link ToolCallError}: the remote error class when the
 * sandbox reported one (`remoteType`), else the local class name.
 */
export function toToolCallError(tool: string, error: unknown): ToolCallError {
  if (error instanceof ToolCallError) return error;
  if (error instanceof Error) {
    const remote = (error as { remoteType?: unknown }).remoteType;
    const type = typeof remote === 'string' ? remote : error.name;
    return new ToolCallError(tool, type, error.message, { cause: error });
  }
  return new ToolCallError(tool, 'Error', String(error), { cause: error });
}
