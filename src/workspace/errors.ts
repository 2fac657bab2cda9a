/** The root of the workspace errors: every failure of `changes()`, `diff()` or `apply()`. */
export class WorkspaceError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'WorkspaceError';
  }
}

/** Why `apply()` refused one path. */
export interface Refusal {
  path: string;
  reason: string;
}

/**
 * `apply()` refused: every refused path with its reason, found before anything was written
 * (nothing was). `conflicts` are the refusals that `force` would lift.
 */
export class WorkspaceRefusedError extends WorkspaceError {
  readonly refusals: Refusal[];
  constructor(refusals: Refusal[]) {
    const shown = refusals
      .slice(0, 20)
      .map((r) => `${r.path}: ${r.reason}`)
      .join('; ');
    const more = refusals.length > 20 ? `; and ${refusals.length - 20} more` : '';
    super(`apply refused ${refusals.length} path(s), nothing was written: ${shown}${more}`);
    this.name = 'WorkspaceRefusedError';
    this.refusals = refusals;
  }
}

/** `apply()` validated everything but failed while writing: `written` lists what was done. */
export class WorkspaceWriteError extends WorkspaceError {
  readonly path: string;
  readonly written: string[];
  constructor(path: string, written: string[], cause: unknown) {
    const why = cause instanceof Error ? cause.message : String(cause);
    super(
      `apply failed at ${path} after writing ${written.length} path(s) (${written.join(', ') || 'none'}): ${why}`,
      { cause },
    );
    this.name = 'WorkspaceWriteError';
    this.path = path;
    this.written = written;
  }
}
