/**
 * Workspaces, the core: what changed between a host folder and a sandbox's copy-on-write view
 * of it, as data and as a git patch, and applying it back. See docs/workspaces.md.
 */
export { type ApplyOptions, type ApplyResult, apply, DEFAULT_MAX_FILE_BYTES } from './apply.js';
export { changes } from './changes.js';
export {
  DEFAULT_MAX_TEXT_DIFF_BYTES,
  DEFAULT_TEXT_DIFF_TIMEOUT_MS,
  type DiffOptions,
  type DiffStatEntry,
  diff,
  type OmittedChange,
  type WorkspaceDiff,
} from './diff.js';
export {
  type Refusal,
  WorkspaceError,
  WorkspaceRefusedError,
  WorkspaceWriteError,
  type WriteRollback,
} from './errors.js';
export type {
  ChangeStatus,
  ChangesOptions,
  EntryKind,
  EntryState,
  WorkspaceChange,
  WorkspaceChanges,
} from './types.js';
