import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { mkdir, open, rename, rm, writeFile } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { fsError, InvalidPathError } from './errors.js';
import { randomBytes } from './file-tools/random.js';

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
      size = await writeChunks(temp, content);
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

/** Chunks are gathered to at least this many bytes before a write starts. */
const COALESCE_BYTES = 1024 * 1024;

/**
 * Writes what `content` yields to a new file `temp` (`wx`): the chunks (64 KiB socket reads) are
 * gathered into one `writev` of 1 to 4 MiB while the previous one is in flight, with no stream
 * or generator between the body and the file. At most two batches are held. Resolves with the
 * bytes written.
 */
async function writeChunks(temp: string, content: AsyncIterable<Buffer>): Promise<number> {
  const handle = await open(temp, 'wx');
  let size = 0;
  let inFlight: Promise<void> | undefined;
  /** The first failed write's error, thrown at the next chunk (never left unhandled). */
  let failed: { error: unknown } | undefined;
  let batch: Buffer[] = [];
  let batchBytes = 0;
  const start = () => {
    const buffers = batch;
    batch = [];
    batchBytes = 0;
    const settled = () => {
      if (inFlight === written) inFlight = undefined;
    };
    const written: Promise<void> = handle.writev(buffers).then(settled, (error: unknown) => {
      failed ??= { error };
      settled();
    });
    inFlight = written;
  };
  try {
    for await (const chunk of content) {
      if (failed) throw failed.error;
      size += chunk.length;
      batch.push(chunk);
      batchBytes += chunk.length;
      if (batchBytes >= STREAM_BUFFER_BYTES && inFlight) await inFlight;
      if (batchBytes >= COALESCE_BYTES && !inFlight) start();
    }
    if (inFlight) await inFlight;
    if (batch.length > 0) start();
    if (inFlight) await inFlight;
    if (failed) throw failed.error;
    return size;
  } finally {
    // A body that failed half way: the write in flight ends before the file is closed.
    if (inFlight) await inFlight;
    await handle.close();
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
