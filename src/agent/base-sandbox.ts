import { editFile } from './edit.js';
import { executeRunner } from './execute-runner.js';
import { globFiles } from './glob.js';
import { grepFiles } from './grep.js';
import { deletePath, listDirectory } from './ls-delete.js';
import { executeWithOffload } from './offload.js';
import { readFile } from './read.js';
import type { ToolRunner } from './tool-runner.js';
import type {
  DeleteResult,
  EditOptions,
  EditResult,
  ExecuteOffloadResult,
  ExecuteOptions,
  ExecuteResponse,
  ExecuteWithOffloadOptions,
  FileDownloadResponse,
  FileUploadResponse,
  GlobOptions,
  GlobResult,
  GrepOptions,
  GrepResult,
  LsResult,
  ReadOptions,
  ReadResult,
  WriteResult,
} from './types.js';

/**
 * The file tools an agent framework gives a model (`ls`, `read_file`, `write_file`, `edit_file`,
 * `glob`, `grep`, `execute`), built on one abstract {@link execute}: any backend that can run a
 * shell command gets them all. The contract is that of LangChain deepagents' `BaseSandbox`, in
 * TypeScript form (camelCase, async, plain result objects).
 *
 * Subclasses supply {@link id}, {@link execute}, {@link uploadFiles} and {@link downloadFiles}.
 * A backend with a file service of its own may also override {@link toolRunner}: `Sandbox` runs
 * the tools in envd, with the same results and no process per call.
 *
 * **What the sandbox needs** (with the default {@link toolRunner}): POSIX `sh` and **Node.js**
 * (`node` on PATH, or set {@link interpreter}). read, edit, ls, grep, glob, delete and the
 * capture of {@link executeWithOffload} run as small node programs sent with each call; their
 * arguments travel as JSON on stdin, never as shell words. Without the interpreter these methods
 * return a clear error naming it. {@link write} only uses {@link uploadFiles}. A `Sandbox`
 * needs neither for its file tools; only {@link executeWithOffload}'s capture runs `node` there
 * (an image sandbox has envd's own, `/opt/abx/bin/node`, on its PATH).
 *
 * Failures of the operation (missing file, no match...) come back as `error` in the result;
 * failures of the backend itself (the sandbox is gone) throw.
 *
 * Relative paths are resolved against the backend's working directory; every path in a result
 * is absolute.
 */
export abstract class BaseSandbox {
  /** Identifies the sandbox (for logs and agent state). */
  abstract readonly id: string;

  /**
   * When true, {@link executeWithOffload} captures output at the source and leaves large output
   * in a file. Off by default: the wrapper needs the interpreter and a writable capture path.
   */
  enableCaptureOffload = false;

  /** The program the sandbox-side helpers run with; default `node` from PATH. */
  interpreter = 'node';

  /**
   * Where read, edit, ls, delete, grep and glob run their sandbox side. The default sends a small
   * {@link interpreter} program per call through {@link execute}; override it to answer the same
   * requests natively (see `ToolRunner`).
   */
  protected toolRunner(): ToolRunner {
    return executeRunner(this);
  }

  /**
   * Runs a shell command (`/bin/sh -c`) and waits for it: `{ output, exitCode, truncated }`, with
   * stdout and stderr combined. A non-zero exit is a result, not an error.
   */
  abstract execute(command: string, options?: ExecuteOptions): Promise<ExecuteResponse>;

  /**
   * Writes files (creating parent directories). One response per input, in input order; a file
   * that fails gets an `error` code and never makes the call throw.
   */
  abstract uploadFiles(files: [path: string, content: Uint8Array][]): Promise<FileUploadResponse[]>;

  /** Reads files. One response per input, in input order; failures are per-file error codes. */
  abstract downloadFiles(paths: string[]): Promise<FileDownloadResponse[]>;

  /**
   * Reads a page of a file on the sandbox side: lines `offset` (0-based) to `offset + limit`,
   * CRLF turned into LF, no line numbers (add them with `formatContentWithLineNumbers`). An
   * empty file gives a reminder text; media files and files whose first 8 KiB are not UTF-8 come
   * back whole as base64 (at most 500 KiB). A page is capped near 500 KiB, with a note saying
   * how to continue.
   */
  read(path: string, options: ReadOptions = {}): Promise<ReadResult> {
    return readFile(this.toolRunner(), path, options);
  }

  /** Creates or overwrites a file with exactly `content` (UTF-8), creating parent directories. */
  async write(path: string, content: string): Promise<WriteResult> {
    const [response] = await this.uploadFiles([[path, new TextEncoder().encode(content)]]);
    if (!response) return { error: `Error: writing '${path}' got no response from the backend` };
    if (response.error) return { error: writeError(path, response.error) };
    return { path };
  }

  /**
   * Replaces `oldString` with `newString` in a file, on the sandbox side. It must occur exactly
   * once unless `replaceAll`; otherwise the file is left unchanged and `error` says why.
   */
  edit(
    path: string,
    oldString: string,
    newString: string,
    options: EditOptions = {},
  ): Promise<EditResult> {
    return editFile(this.toolRunner(), path, oldString, newString, options);
  }

  /** Deletes a file, a symlink (even a broken one) or a whole directory tree. */
  delete(path: string): Promise<DeleteResult> {
    return deletePath(this.toolRunner(), path);
  }

  /** The entries of a directory, one level, hidden ones included. */
  ls(path: string): Promise<LsResult> {
    return listDirectory(this.toolRunner(), path);
  }

  /**
   * Lines containing `pattern` (a literal, case-sensitive substring, not a regex) in a file or
   * under a directory, optionally only in the files {@link glob} would find there with `glob`.
   * A directory is walked in name order, not into `/proc`, `/sys`, `/dev` or `/run`, and each
   * file searched as it is found. Stops at `maxCount` matches or after 20 s (`timeBudgetMs`),
   * answering what it found with `truncated: true`.
   */
  grep(pattern: string, options: GrepOptions = {}): Promise<GrepResult> {
    return grepFiles(this.toolRunner(), pattern, options);
  }

  /**
   * Regular files matching a glob (`*`, `?`, `**`, `[!x]`, `{a,b}`), sorted, absolute. A pattern
   * without `/` matches base names at any depth, dot-directories and dot-files included (like
   * `grep --include`); with `/` it matches paths relative to `path`, and there wildcards do not
   * match a leading `.` unless the segment names it (`.github/*.yml`). At most 1000 results and
   * 20 s of walking (`timeBudgetMs`; `truncated` says when either cut it short), never into
   * `/proc`, `/sys`, `/dev` or `/run`. Options: `includeDirs`
   * (directories too), `relative` (paths relative to `path`), `style: 'path'` (fast-glob's
   * rules with `dot: true`, as deepagents JS), see {@link GlobOptions}.
   */
  glob(pattern: string, options: GlobOptions = {}): Promise<GlobResult> {
    return globFiles(this.toolRunner(), pattern, options);
  }

  /**
   * Runs a command whose output may be large. With {@link enableCaptureOffload} false it is
   * just {@link execute} (`offloaded: false`). When true, output up to `maxInlineBytes` comes back
   * whole and leaves no file; larger output stays at `capturePath` and only a preview (first and
   * last lines, and how many were left out) comes back. Capture stops at `maxCaptureBytes`
   * (`truncated`) without stopping the command; the exit code is the command's own.
   */
  executeWithOffload(
    command: string,
    options: ExecuteWithOffloadOptions,
  ): Promise<ExecuteOffloadResult> {
    return executeWithOffload(this, command, options);
  }
}

function writeError(path: string, code: string): string {
  switch (code) {
    case 'is_directory':
      return `Error: '${path}' is a directory; cannot write a file there`;
    case 'permission_denied':
      return `Error: Permission denied writing '${path}'`;
    case 'invalid_path':
      return `Error: Invalid path '${path}'`;
    default:
      return `Error: Failed to write file '${path}': ${code}`;
  }
}
