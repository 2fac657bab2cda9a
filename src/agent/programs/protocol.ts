/**
 * What the host and the sandbox-side programs agree on: program names, marks, limits and the
 * shapes of payloads and answers. Imported by both sides, so it holds no code that runs.
 *
 * A program gets its payload as one JSON line on stdin and prints `\n${RESULT_MARK}<json>\n`
 * (capture, which filters a command's output, speaks its own line protocol instead).
 */

/** The programs built into `dist/agent/<name>.cjs`, each from `src/agent/programs/<name>.ts`. */
export const PROGRAM_NAMES = ['read', 'edit', 'ls', 'delete', 'grep', 'glob', 'capture'] as const;
export type ProgramName = (typeof PROGRAM_NAMES)[number];
/** The programs that answer through {@link RESULT_MARK}; capture filters output instead. */
export type HelperProgram = keyof HelperPrograms;

/** Marks the line that carries a program's JSON answer, so stray output around it is ignored. */
export const RESULT_MARK = '__ABX_AGENT_RESULT__';

/** Text of a read page is capped near this many bytes. */
export const MAX_OUTPUT_BYTES = 512_000; // 500 KiB; a literal, so bundles that do not use it drop it
/** Binary (base64) content is refused above this many bytes. */
export const MAX_BINARY_BYTES = 512_000;
/** What reading an empty file returns, so a model does not take it for a failed read. */
export const EMPTY_CONTENT_WARNING = 'System reminder: File exists but has empty contents';

/** First line of capture's output: `<mark> <offloaded 0|1> <capped 0|1>`. */
export const CAPTURE_META_MARK = '__ABX_OFFLOAD__';
/** The preview of offloaded output: at most this many lines and bytes from each end. */
export const PREVIEW_HEAD_LINES = 5;
export const PREVIEW_TAIL_LINES = 5;
export const PREVIEW_HEAD_BYTES = 2000;
export const PREVIEW_TAIL_BYTES = 2000;

/** A failure a program reports: a code, and for `io_error` the system's message. */
export interface ProgramError {
  error: string;
  detail?: string;
  [key: string]: unknown;
}

export interface ReadPayload {
  path: string;
  offset: number;
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

/** `old`/`new` inline as base64, or in uploaded files that the program removes. */
export type EditPayload = { path: string; replaceAll: boolean } & (
  | { old: string; new: string; oldFile?: undefined; newFile?: undefined }
  | { oldFile: string; newFile: string }
);

export interface EditDone {
  count: number;
}

export interface PathPayload {
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

export interface GrepPayload {
  pattern: string;
  path: string;
  glob: string | null;
  maxCount: number | null;
}

export interface GrepDone {
  matches: { path: string; line: number; text: string }[];
  truncated: boolean;
}

export interface GlobPayload {
  pattern: string;
  path: string;
  maxResults: number;
  budgetMs: number;
}

export interface GlobDone {
  matches: FileEntry[];
  truncated: boolean;
}

/** Each helper program's payload and the answer it gives when it succeeds. */
export interface HelperPrograms {
  read: { payload: ReadPayload; answer: ReadPage };
  edit: { payload: EditPayload; answer: EditDone };
  ls: { payload: PathPayload; answer: LsDone };
  delete: { payload: PathPayload; answer: DeleteDone };
  grep: { payload: GrepPayload; answer: GrepDone };
  glob: { payload: GlobPayload; answer: GlobDone };
}
export type HelperPayload<N extends HelperProgram> = HelperPrograms[N]['payload'];
export type HelperAnswer<N extends HelperProgram> = HelperPrograms[N]['answer'] | ProgramError;
