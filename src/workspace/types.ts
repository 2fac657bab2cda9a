/**
 * What a workspace's review is made of: the state of one entry on either side and one change.
 * See docs/workspaces.md.
 */

/** The kind of a non-directory entry (directories are not changes: git does not track them). */
export type EntryKind = 'file' | 'symlink' | 'fifo' | 'socket' | 'char-device' | 'block-device';

/** One side of a change: an entry as `changes()` found it (lstat, never following a link). */
export interface EntryState {
  kind: EntryKind;
  /** Permission bits with set-id and sticky (`st_mode & 0o7777`). */
  mode: number;
  /** Bytes of content; of a link, the length of its target. */
  size: number;
  /** SHA-256 (hex) of the content, or of a link's target. Files and links only. */
  sha256?: string;
  /** Git's blob id (SHA-1 of `blob <size>\0` + content), as the patch's `index` line needs. */
  oid?: string;
  /** A file with a NUL byte in its first 8000 bytes (git's rule). */
  binary?: boolean;
  /** A link's target, as text (never followed). */
  target?: string;
}

/**
 * How a path changed:
 * - `added`, `deleted`, `modified` (content, link target or mode, see the flags);
 * - `renamed`: a deleted and an added file with identical content (`from` → `path`);
 * - `typechange`: the same path, another kind (a file became a link, a link a FIFO…).
 */
export type ChangeStatus = 'added' | 'deleted' | 'modified' | 'renamed' | 'typechange';

/** One changed path between the base folder and the sandbox's view of it. */
export interface WorkspaceChange {
  status: ChangeStatus;
  /** Relative, `/`-separated; the new path of a rename. */
  path: string;
  /** A rename's old path. */
  from?: string;
  /** The base's entry (absent when added). Its `sha256` is what `apply()` expects to replace. */
  before?: EntryState;
  /** The view's entry (absent when deleted). Its `sha256` is what `apply()` writes. */
  after?: EntryState;
  /** The content or link target differs (always true for added, deleted and typechange). */
  contentChanged: boolean;
  /** The permission bits differ (a file on both sides). */
  modeChanged: boolean;
  /** Either side is a binary file. */
  binary: boolean;
}

/** The result of `changes()`: the two folders and what differs, sorted by path (bytewise). */
export interface WorkspaceChanges {
  /** The base folder (absolute): the host folder, the overlay's lower layer. */
  base: string;
  /** The sandbox's view (absolute): the merged overlay, or any folder to compare with. */
  view: string;
  entries: WorkspaceChange[];
}

/** Options of `changes()`. */
export interface ChangesOptions {
  /** Compare `.git` folders too (at any depth). Default false. */
  includeGit?: boolean;
  /**
   * The overlay's upper folder: only paths present in it can differ, so only it is walked
   * (whiteouts are deletions; a directory in it is compared name by name with the base).
   */
  upper?: string;
}
