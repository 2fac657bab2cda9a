import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { lstat, mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { constants } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { BaseSandbox } from './base-sandbox.js';
import { perFile } from './per-file.js';
import type {
  ExecuteOptions,
  ExecuteResponse,
  FileDownloadResponse,
  FileOperationError,
  FileUploadResponse,
} from './types.js';

/** Options of {@link LocalShellSandbox}. */
export interface LocalShellSandboxOptions {
  /** The folder commands run in and relative paths resolve against; created if missing. */
  root: string;
  /** Default: `local-` and random hex. */
  id?: string;
  /** Default timeout of {@link LocalShellSandbox.execute}; default 60 s, 0 for none. */
  timeoutMs?: number;
  /** Output beyond this many bytes is dropped and `truncated` set; default 16 MiB. */
  maxOutputBytes?: number;
  /** Environment of commands; default this process's. */
  env?: NodeJS.ProcessEnv;
}

/** Exit code reported for a command killed by its timeout (as GNU `timeout` does). */
export const TIMEOUT_EXIT_CODE = 124;

function errorCode(error: unknown): FileOperationError | undefined {
  switch ((error as NodeJS.ErrnoException).code) {
    case 'ENOENT':
    case 'ENOTDIR':
      return 'file_not_found';
    case 'EACCES':
    case 'EPERM':
    case 'EROFS':
      return 'permission_denied';
    case 'EISDIR':
      return 'is_directory';
    case 'EEXIST':
    case 'ENAMETOOLONG':
    case 'EINVAL':
      return 'invalid_path';
    default:
      return undefined;
  }
}

/**
 * A {@link BaseSandbox} on this machine: `/bin/sh` run in a root folder. **Not isolated**: commands
 * and absolute paths reach the whole host with this process's rights. Meant for tests and local
 * use; use {@link Sandbox} for untrusted work.
 *
 * @example
 * const box = new LocalShellSandbox({ root: '/tmp/work' });
 * await box.write('notes.txt', 'hello\n');
 * console.log(await box.read('notes.txt'));
 */
export class LocalShellSandbox extends BaseSandbox {
  readonly id: string;
  /** Absolute path of the root folder. */
  readonly root: string;
  private readonly timeoutMs: number;
  private readonly maxOutputBytes: number;
  private readonly env: NodeJS.ProcessEnv | undefined;

  constructor(options: LocalShellSandboxOptions) {
    super();
    this.root = resolve(options.root);
    mkdirSync(this.root, { recursive: true });
    this.id = options.id ?? `local-${randomBytes(6).toString('hex')}`;
    this.timeoutMs = options.timeoutMs ?? 60_000;
    this.maxOutputBytes = options.maxOutputBytes ?? 16 * 1024 * 1024;
    this.env = options.env;
  }

  /**
   * Runs `command` with `/bin/sh -c` in the root folder, in its own process group; a timeout
   * kills the whole group and gives exit code 124 with a note at the end of the output.
   */
  execute(command: string, options: ExecuteOptions = {}): Promise<ExecuteResponse> {
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    return new Promise((resolvePromise, reject) => {
      const child = spawn('/bin/sh', ['-c', command], {
        cwd: this.root,
        env: this.env ?? process.env,
        stdio: ['ignore', 'pipe', 'pipe'],
        detached: true,
      });
      const chunks: Buffer[] = [];
      let size = 0;
      let truncated = false;
      let timedOut = false;
      const collect = (chunk: Buffer) => {
        if (size >= this.maxOutputBytes) {
          truncated = true;
          return;
        }
        const room = this.maxOutputBytes - size;
        if (chunk.length > room) truncated = true;
        const kept = chunk.length > room ? chunk.subarray(0, room) : chunk;
        chunks.push(kept);
        size += kept.length;
      };
      child.stdout.on('data', collect);
      child.stderr.on('data', collect);
      const timer =
        timeoutMs > 0
          ? setTimeout(() => {
              timedOut = true;
              killGroup(child.pid);
            }, timeoutMs)
          : undefined;
      child.on('error', (error) => {
        clearTimeout(timer);
        reject(error);
      });
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        let output = Buffer.concat(chunks).toString('utf8');
        if (timedOut) {
          output += `${output && !output.endsWith('\n') ? '\n' : ''}Error: command timed out after ${timeoutMs} ms`;
          resolvePromise({ output, exitCode: TIMEOUT_EXIT_CODE, truncated });
          return;
        }
        const exitCode = code ?? (signal ? 128 + signalNumber(signal) : null);
        resolvePromise({ output, exitCode, truncated });
      });
    });
  }

  /** Writes each file atomically (temp file + rename), creating parents. */
  async uploadFiles(files: [string, Uint8Array][]): Promise<FileUploadResponse[]> {
    return perFile(
      files,
      ([path]) => path,
      (path) => ({ path, error: 'invalid_path' }),
      async ([, content], path): Promise<FileUploadResponse> => {
        const target = resolve(this.root, path);
        const temp = join(
          dirname(target),
          `.${basename(target)}.${randomBytes(6).toString('hex')}.tmp`,
        );
        try {
          const existing = await lstat(target).catch(() => undefined);
          if (existing?.isDirectory()) return { path, error: 'is_directory' };
          await mkdir(dirname(target), { recursive: true });
          await writeFile(temp, content, { flag: 'wx' });
          await rename(temp, target);
          return { path, error: null };
        } catch (error) {
          await rm(temp, { force: true }).catch(() => undefined);
          // ENOENT/ENOTDIR here mean a parent is not a directory: the path cannot name a file.
          const code = errorCode(error);
          return {
            path,
            error: code === 'file_not_found' || code === undefined ? 'invalid_path' : code,
          };
        }
      },
    );
  }

  async downloadFiles(paths: string[]): Promise<FileDownloadResponse[]> {
    return perFile(
      paths,
      (path) => path,
      (path) => ({ path, content: null, error: 'invalid_path' }),
      async (path): Promise<FileDownloadResponse> => {
        try {
          const content = new Uint8Array(await readFile(resolve(this.root, path)));
          return { path, content, error: null };
        } catch (error) {
          return { path, content: null, error: errorCode(error) ?? 'invalid_path' };
        }
      },
    );
  }
}

function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

function signalNumber(signal: NodeJS.Signals): number {
  return constants.signals[signal] ?? 0;
}
