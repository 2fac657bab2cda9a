import { randomBytes } from 'node:crypto';
import { createWriteStream, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { fsError, InvalidPathError } from './errors.js';

/** Buffer of streamed file writes and reads: fewer, larger system calls for large files. */
export const STREAM_BUFFER_BYTES = 4 * 1024 * 1024;

/**
 * A path argument resolved against the server's working directory. The server runs inside the
 * sandbox, so any path the sandbox user can reach is fair; what is refused is a path that cannot
 * be meant: empty, or with a NUL byte (which the OS would cut short).
 */
export function safePath(path: string, name = 'path'): string {
  if (path === '') throw new InvalidPathError(`${name} is empty; give a file path`);
  if (path.includes('\0')) {
    throw new InvalidPathError(`${name} contains a NUL byte, which no file name can hold`);
  }
  return resolve(path);
}

/**
 * Files up to this size are written (and read) with synchronous calls: five thread-pool round
 * trips (mkdir, open, write, close, rename) cost far more than the system calls themselves, and
 * a new regular file of a few KiB on the sandbox's own disk never blocks for long. Nothing that
 * could block indefinitely (a FIFO, a device) is ever opened this way.
 */
export const SMALL_FILE_BYTES = 64 * 1024;

const tempNameFor = (path: string) =>
  join(dirname(path), `.${basename(path)}.${randomBytes(6).toString('hex')}.tmp`);

/**
 * Called with the temporary file once it is whole, before it is renamed into place (its inode is
 * the one that will be at the path): envd notes its identity there, where no other process can
 * have replaced it yet. Throwing cancels the write.
 */
export type BeforeRename = (temp: string) => void;

/** {@link writeAtomic} of a small buffer, without the thread pool (see {@link SMALL_FILE_BYTES}). */
export function writeSmallAtomic(
  path: string,
  content: Buffer,
  beforeRename?: BeforeRename,
): number {
  const temp = tempNameFor(path);
  try {
    mkdirSync(dirname(path), { recursive: true });
    // `wx`: a new file of our own, never an existing FIFO or device that could block the open.
    writeFileSync(temp, content, { flag: 'wx' });
    beforeRename?.(temp);
    renameSync(temp, path);
    return content.length;
  } catch (error) {
    try {
      rmSync(temp, { force: true });
    } catch {
      // ENOTDIR when a parent is a file: the write's own error is the one to report.
    }
    throw fsError(error, `write ${path}`);
  }
}

/**
 * Writes a file so that a reader never sees half of it: into a temporary file next to the target
 * (same file system, so the rename is atomic), then renamed over it. Parents are created.
 */
export async function writeAtomic(
  path: string,
  content: Buffer | AsyncIterable<Buffer>,
  beforeRename?: BeforeRename,
): Promise<number> {
  if (Buffer.isBuffer(content) && content.length <= SMALL_FILE_BYTES) {
    return writeSmallAtomic(path, content, beforeRename);
  }
  const temp = tempNameFor(path);
  let size = 0;
  try {
    await mkdir(dirname(path), { recursive: true });
    if (Buffer.isBuffer(content)) {
      await writeFile(temp, content, { flag: 'wx' });
      size = content.length;
    } else {
      const counted = async function* () {
        for await (const chunk of content) {
          size += chunk.length;
          yield chunk;
        }
      };
      // A large buffer lets chunks that arrive while a write is in flight go out as one writev,
      // instead of one write (and one wait for `drain`) per 64 KiB socket read.
      await pipeline(
        counted,
        createWriteStream(temp, { flags: 'wx', highWaterMark: STREAM_BUFFER_BYTES }),
      );
    }
    beforeRename?.(temp);
    await rename(temp, path);
    return size;
  } catch (error) {
    // When a parent is a file, removing the temp file fails too (ENOTDIR): report the write's
    // own error, not the cleanup's.
    await rm(temp, { force: true }).catch(() => undefined);
    throw fsError(error, `write ${path}`);
  }
}

/** Runs a file operation and turns its fs errors into request errors that name the action. */
export async function fsAction<T>(action: string, work: () => Promise<T>): Promise<T> {
  try {
    return await work();
  } catch (error) {
    throw fsError(error, action);
  }
}
