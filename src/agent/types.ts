/** Result types of {@link BaseSandbox}: plain objects, the shapes of deepagents' protocol. */

/** What {@link BaseSandbox.execute} gives back. */
export interface ExecuteResponse {
  /** stdout and stderr combined, in the order they arrived. */
  output: string;
  /** The command's exit code (128 + n when killed by signal n, 124 on timeout); `null` = unknown. */
  exitCode: number | null;
  /** True when the backend dropped part of the output (it is not complete). */
  truncated: boolean;
}

/** Options of {@link BaseSandbox.execute}. */
export interface ExecuteOptions {
  /** Kill the command after this long; default: the backend's own default. */
  timeoutMs?: number;
}

/** Why one file of {@link BaseSandbox.uploadFiles} / {@link BaseSandbox.downloadFiles} failed. */
export type FileOperationError =
  | 'file_not_found'
  | 'permission_denied'
  | 'is_directory'
  | 'invalid_path';

/** The outcome of uploading one file; `error` is `null` on success. */
export interface FileUploadResponse {
  path: string;
  error: FileOperationError | null;
}

/** The outcome of downloading one file: its bytes, or `error`. */
export interface FileDownloadResponse {
  path: string;
  content: Uint8Array | null;
  error: FileOperationError | null;
}

/** File content as returned by {@link BaseSandbox.read}. */
export interface FileData {
  /** Text, or the file's bytes in base64 (see `encoding`). */
  content: string;
  encoding: 'utf-8' | 'base64';
}

/** Options of {@link BaseSandbox.read}. */
export interface ReadOptions {
  /** 0-based line to start at; default 0. Negative values count as 0. */
  offset?: number;
  /** Lines to return; default 2000. Negative values count as 0. */
  limit?: number;
}

/** What {@link BaseSandbox.read} gives back: `error`, or `fileData` and where the page lies. */
export interface ReadResult {
  error?: string;
  /**
   * What went wrong, as a code to branch on (`error` is the text for a model): `file_not_found`,
   * `not_a_directory`, `multiple` (edit: several occurrences, see `occurrences`)...
   */
  errorCode?: string;
  fileData?: FileData;
  /** Lines in the file; absent for binary content and for files too large to count cheaply. */
  totalLines?: number;
  /** 1-based first line of the page. */
  startLine?: number;
  /** 1-based last line of the page. */
  endLine?: number;
  /** The `offset` of the next page; `null` at the end of the file. */
  nextOffset?: number | null;
  /** Set when `limit` was 0: nothing was read. */
  noLinesRequested?: boolean;
}

/** What {@link BaseSandbox.write} gives back. */
export interface WriteResult {
  error?: string;
  path?: string;
}

/** Options of {@link BaseSandbox.edit}. */
export interface EditOptions {
  /** Replace every occurrence; default false (more than one is then an error). */
  replaceAll?: boolean;
}

/** What {@link BaseSandbox.edit} gives back. */
export interface EditResult {
  error?: string;
  /**
   * What went wrong, as a code to branch on (`error` is the text for a model): `file_not_found`,
   * `not_a_directory`, `multiple` (edit: several occurrences, see `occurrences`)...
   */
  errorCode?: string;
  path?: string;
  /** How many occurrences were replaced; with `errorCode` `multiple`, how many there are. */
  occurrences?: number;
}

/** What {@link BaseSandbox.delete} gives back. */
export interface DeleteResult {
  error?: string;
  /**
   * What went wrong, as a code to branch on (`error` is the text for a model): `file_not_found`,
   * `not_a_directory`, `multiple` (edit: several occurrences, see `occurrences`)...
   */
  errorCode?: string;
  path?: string;
}

/** A file or directory as {@link BaseSandbox.ls} and {@link BaseSandbox.glob} describe it. */
export interface FileInfo {
  /** Absolute path, without a trailing `/` (from glob with `relative`, relative to its `path`). */
  path: string;
  isDir: boolean;
  /** Size in bytes. */
  size?: number;
  /** Last modification, ISO 8601. */
  modifiedAt?: string;
}

/** What {@link BaseSandbox.ls} gives back. */
export interface LsResult {
  error?: string;
  /**
   * What went wrong, as a code to branch on (`error` is the text for a model): `file_not_found`,
   * `not_a_directory`, `multiple` (edit: several occurrences, see `occurrences`)...
   */
  errorCode?: string;
  entries?: FileInfo[];
}

/** One line that {@link BaseSandbox.grep} found. */
export interface GrepMatch {
  /** Absolute path of the file. */
  path: string;
  /** 1-based line number. */
  line: number;
  /** The line, without its line ending. */
  text: string;
}

/** Options of {@link BaseSandbox.grep}. */
export interface GrepOptions {
  /** File or directory to search; default the working directory. */
  path?: string;
  /** Only the files `glob()` would find with this pattern: without `/`, base names at any depth. */
  glob?: string;
  /** At most this many matches. */
  maxCount?: number;
  /**
   * Stop searching after this many milliseconds (walking and reading), with what was found so
   * far and `truncated: true`; default 20 000.
   */
  timeBudgetMs?: number;
}

/** What {@link BaseSandbox.grep} gives back. */
export interface GrepResult {
  error?: string;
  /**
   * What went wrong, as a code to branch on (`error` is the text for a model): `file_not_found`,
   * `not_a_directory`, `multiple` (edit: several occurrences, see `occurrences`)...
   */
  errorCode?: string;
  matches?: GrepMatch[];
  /**
   * True when the search stopped early: `maxCount` cut off matches that existed, or the time
   * budget ran out.
   */
  truncated: boolean;
}

/** Options of {@link BaseSandbox.glob}. */
export interface GlobOptions {
  /** Directory the pattern is relative to; default the working directory. */
  path?: string;
  /**
   * How the pattern matches. `reference` (the default), as deepagents' Python reference: a
   * pattern without `/` matches base names at any depth (dot-directories included); one with `/`
   * is matched from `path` segment by segment, and there wildcards skip dot-names. `path`, as
   * fast-glob with `dot: true` (deepagents JS's filesystem backend): the pattern is matched
   * against the whole path relative to `path`, so `*.py` is the top level only and wildcards
   * match dot-names. In both, `/proc`, `/sys`, `/dev` and `/run` are never walked into.
   */
  style?: 'reference' | 'path';
  /** Directories that match are results too (default only regular files). */
  includeDirs?: boolean;
  /** Each match's `path` relative to `path` (default absolute). */
  relative?: boolean;
  /**
   * Stop walking after this many milliseconds, with what was found so far and `truncated:
   * true`; default 20 000.
   */
  timeBudgetMs?: number;
}

/** What {@link BaseSandbox.glob} gives back. */
export interface GlobResult {
  error?: string;
  /**
   * What went wrong, as a code to branch on (`error` is the text for a model): `file_not_found`,
   * `not_a_directory`, `multiple` (edit: several occurrences, see `occurrences`)...
   */
  errorCode?: string;
  matches?: FileInfo[];
  /** True when the result count or time bound stopped the search early. */
  truncated: boolean;
}

/** Options of {@link BaseSandbox.executeWithOffload}. */
export interface ExecuteWithOffloadOptions {
  /** Where large output is kept in the sandbox. */
  capturePath: string;
  /** Output up to this many bytes comes back whole; more is offloaded. */
  maxInlineBytes: number;
  /** Capture stops after this many bytes (the command keeps running); default 10 MiB. */
  maxCaptureBytes?: number;
  timeoutMs?: number;
}

/** What {@link BaseSandbox.executeWithOffload} gives back. */
export interface ExecuteOffloadResult {
  /** True when the output was left at `capturePath` and `response.output` is a preview. */
  offloaded: boolean;
  response: ExecuteResponse;
}
