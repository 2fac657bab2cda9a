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

/** What the host folder holds after a {@link WorkspaceWriteError}. */
export interface WriteRollback {
  /** Every step undone: the host folder is as it was before the apply. */
  rolledBack: boolean;
  /** Paths the undo could not put back (or a temporary file or backup it could not remove). */
  notRestored: string[];
  /** Each undo step, in the order done. */
  undone: string[];
}

/**
 * `apply()` validated everything but failed while writing (a full disk, a folder it may not
 * write), at `path`. It then undid what it had done: with `rolledBack` the host folder is as it
 * was and `written` is empty; otherwise `notRestored` names what the undo could not put back and
 * `written` the changes written before the failure.
 */
export class WorkspaceWriteError extends WorkspaceError {
  readonly path: string;
  readonly written: string[];
  readonly rolledBack: boolean;
  readonly notRestored: string[];
  readonly undone: string[];
  constructor(
    path: string,
    written: string[],
    cause: unknown,
    rollback: WriteRollback = { rolledBack: false, notRestored: [], undone: [] },
  ) {
    const why = cause instanceof Error ? cause.message : String(cause);
    const list = (paths: string[]) =>
      paths.slice(0, 20).join(', ') + (paths.length > 20 ? `, and ${paths.length - 20} more` : '');
    super(
      rollback.rolledBack
        ? `apply failed at ${path} and was rolled back: the host folder is as it was, nothing written: ${why}`
        : `apply failed at ${path} after writing ${written.length} path(s) (${list(written) || 'none'}); ${rollback.notRestored.length > 0 ? `the rollback could not restore ${rollback.notRestored.length} path(s) (${list(rollback.notRestored)})` : 'nothing was rolled back'}: ${why}`,
      { cause },
    );
    this.name = 'WorkspaceWriteError';
    this.path = path;
    this.written = written;
    this.rolledBack = rollback.rolledBack;
    this.notRestored = rollback.notRestored;
    this.undone = rollback.undone;
  }
}
