/**
 * BaseSandbox's file tools as the sandbox side runs them: the requests, the answers and the
 * limits that the host (src/agent) and the two runners agree on. The runners are the programs
 * sent with `execute()` (src/agent/programs, one `node -e` per call) and the FILE_OPS routes
 * `POST /files/tools/{tool}` (envd and the command server), and both call the same functions of
 * this folder. Types and literal constants only, so it adds nothing to a bundle.
 *
 * A tool's failure (a missing file, no match...) is an answer too, `{ error: code }`, which the
 * host words into the message a model reads.
 */

/** The tools, each in `runtime/server/file-tools/<name>.ts`. */
export const TOOL_NAMES = ['read', 'edit', 'ls', 'delete', 'grep', 'glob'] as const;
export type ToolName = (typeof TOOL_NAMES)[number];

/** Text of a read page is capped near this many bytes. */
export const MAX_OUTPUT_BYTES = 512_000; // 500 KiB; a literal, so bundles that do not use it drop it
/** Binary (base64) content is refused above this many bytes. */
export const MAX_BINARY_BYTES = 512_000;
/** What reading an empty file returns, so a model does not take it for a failed read. */
export const EMPTY_CONTENT_WARNING = 'System reminder: File exists but has empty contents';

/** A failure a tool reports: a code, and for `io_error` the system's message. */
export interface ToolError {
  error: string;
  detail?: string;
  [key: string]: unknown;
}

export interface ReadRequest {
  path: string;
  /** 0-based first line. */
  offset: number;
  /** Lines wanted; 0 reads nothing. */
  limit: number;
  /** Read as base64 whatever the bytes (images, audio...). */
  media: boolean;
}

export interface ReadPage {
  content: string;
  encoding: 'utf-8' | 'base64';
  totalLines?: number;
  startLine?: number;
  endLine?: number;
  nextOffset?: number | null;
  noLinesRequested?: boolean;
}

/** `old` and `new` are base64 of their UTF-8 bytes, so any text travels intact. */
export interface EditRequest {
  path: string;
  replaceAll: boolean;
  old: string;
  new: string;
}

export interface EditDone {
  count: number;
}

export interface PathRequest {
  path: string;
}

export interface FileEntry {
  path: string;
  isDir: boolean;
  size?: number;
  modifiedAt?: string;
}

export interface LsDone {
  entries: FileEntry[];
}

export interface DeleteDone {
  deleted: true;
}

/** How long grep and glob search when a request names no `budgetMs`. */
export const SEARCH_BUDGET_MS = 20_000;

export interface GrepRequest {
  pattern: string;
  path: string;
  glob: string | null;
  maxCount: number | null;
  /** Stop (`truncated`) once this many milliseconds have passed; default {@link SEARCH_BUDGET_MS}. */
  budgetMs?: number;
}

export interface GrepDone {
  matches: { path: string; line: number; text: string }[];
  truncated: boolean;
}

export interface GlobRequest {
  pattern: string;
  path: string;
  maxResults: number;
  /** Stop (`truncated`) once this many milliseconds have passed; 0 stops at once. */
  budgetMs: number;
  /**
   * `reference` (the default): deepagents' Python reference rules (glob-match.ts); `path`: the
   * pattern against the whole relative path, wildcards matching dot-names (fast-glob, `dot: true`).
   */
  style?: GlobStyle;
  /** Directories that match are answers too (default only regular files). */
  includeDirs?: boolean;
  /** Each answer's `path` relative to the search root (default absolute). */
  relative?: boolean;
}

export const GLOB_STYLES = ['reference', 'path'] as const;
export type GlobStyle = (typeof GLOB_STYLES)[number];

export interface GlobDone {
  matches: FileEntry[];
  truncated: boolean;
}

/** Each tool's request and the answer it gives when it succeeds. */
export interface Tools {
  read: { request: ReadRequest; answer: ReadPage };
  edit: { request: EditRequest; answer: EditDone };
  ls: { request: PathRequest; answer: LsDone };
  delete: { request: PathRequest; answer: DeleteDone };
  grep: { request: GrepRequest; answer: GrepDone };
  glob: { request: GlobRequest; answer: GlobDone };
}
export type ToolRequest<N extends ToolName> = Tools[N]['request'];
export type ToolAnswer<N extends ToolName> = Tools[N]['answer'] | ToolError;
