import { close, open, read, write } from 'node:fs';
import { Readable } from 'node:stream';
import { promisify } from 'node:util';
import {
  ARCHIVE_SIZE_HEADER,
  LOCAL_FILE_HEADER,
  LOCAL_FILE_UNAVAILABLE,
} from '../../runtime/protocol/constants.js';
import {
  checkMetadata,
  MetadataError,
  metadataHeaders,
} from '../../runtime/protocol/file-metadata.js';
import { BadRequestError, NotFoundError, SandboxNotFoundError } from '../errors.js';
import type { HttpClient } from './http-client.js';
import { type WatchEvent, WatchHandle, type WatchOptions } from './watch-handle.js';

/** A directory entry or a stat result. */
export interface EntryInfo {
  name: string;
  path: string;
  type: 'file' | 'directory' | 'symlink' | 'other';
  size: number;
  mode: string;
  mtime: string;
  /** A symlink's destination, as an absolute path (resolved where the link leads somewhere). */
  target?: string;
  /**
   * The file's user metadata, given by the write that made it (`write(path, data, { metadata })`);
   * absent when it has none. Keys are lowercase.
   */
  metadata?: Record<string, string>;
}

/** Options of {@link Filesystem.write}. */
export interface WriteOptions {
  /**
   * User metadata for the file (E2B's `metadata`): keys are HTTP tokens (letters, digits and
   * ``!#$%&'*+-.^_`|~``, kept lowercased), values printable ASCII, at most 4096 bytes a file. It
   * stays with the file through renames and goes when the file is deleted; the file's next write
   * replaces it (a write without metadata clears it). Checked before anything is sent.
   */
  metadata?: Record<string, string>;
}

/** Something that can be written to a file. */
export type WriteData = string | Uint8Array | ArrayBuffer | Blob | ReadableStream | Readable;

/** One file of a multi-file write. */
export interface WriteEntry {
  path: string;
  data: WriteData;
}

function toBody(data: WriteData): string | Uint8Array | Readable {
  if (typeof data === 'string' || data instanceof Uint8Array || data instanceof Readable)
    return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (data instanceof Blob) return Readable.fromWeb(data.stream() as never);
  return Readable.fromWeb(data as never);
}

/** Files up to this total go in one batch request; larger sets stream one request per file. */
const BATCH_LIMIT_BYTES = 16 * 1024 * 1024;

/** The batch-request form of `files` when they are all in memory and small enough together. */
function batchable(files: WriteEntry[]) {
  let total = 0;
  const batch: { path: string; content: string; encoding: 'base64' }[] = [];
  for (const { path, data } of files) {
    let bytes: Uint8Array;
    if (typeof data === 'string') bytes = Buffer.from(data);
    else if (data instanceof Uint8Array) bytes = data;
    else if (data instanceof ArrayBuffer) bytes = new Uint8Array(data);
    else return undefined;
    total += bytes.length;
    if (total > BATCH_LIMIT_BYTES) return undefined;
    batch.push({ path, content: Buffer.from(bytes).toString('base64'), encoding: 'base64' });
  }
  return batch.length > 0 ? batch : undefined;
}

/**
 * A response body read whole, into one buffer of the announced length when there is one (one copy
 * per chunk: undici's `arrayBuffer()` took about twice the CPU on a 256 MiB file), else joined at
 * the end.
 */
async function readWhole(body: Readable, length: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let out = Number.isSafeInteger(length) && length >= 0 ? Buffer.allocUnsafe(length) : undefined;
  let at = 0;
  for await (const chunk of body as AsyncIterable<Buffer>) {
    if (out && at + chunk.length > out.length) {
      // More than announced: keep what came, in order, and join it at the end.
      chunks.push(out.subarray(0, at));
      out = undefined;
    }
    if (out) chunk.copy(out, at);
    else chunks.push(chunk);
    at += chunk.length;
  }
  if (out) return at === out.length ? out : out.subarray(0, at);
  return Buffer.concat(chunks, at);
}

const openFd = promisify(open);
const closeFd = promisify(close);
const readFd = promisify(read);
const writeFd = promisify(write);

/**
 * A file's bytes from an open descriptor, 1 MiB at a time. Not an fs stream: destroying one
 * (as an HTTP client does with a body it sent) closes the descriptor, which belongs to the caller.
 */
async function* fdChunks(fd: number): AsyncGenerator<Buffer> {
  for (let position = 0; ; ) {
    const { bytesRead, buffer } = await readFd(
      fd,
      Buffer.allocUnsafe(1 << 20),
      0,
      1 << 20,
      position,
    );
    if (bytesRead === 0) return;
    position += bytesRead;
    yield buffer.subarray(0, bytesRead);
  }
}

/** Writes a stream's bytes to an open descriptor from its start; resolves with how many. */
async function writeAll(source: Readable, fd: number): Promise<number> {
  let position = 0;
  for await (const chunk of source as AsyncIterable<Buffer>) {
    for (let at = 0; at < chunk.length; ) {
      const { bytesWritten } = await writeFd(fd, chunk, at, chunk.length - at, position);
      at += bytesWritten;
      position += bytesWritten;
    }
  }
  return position;
}

/** Files of a sandbox, through its envd. Paths are relative to the workdir unless absolute. */
export class Filesystem {
  constructor(private readonly envd: HttpClient) {}

  /** A file's content as text (UTF-8), or bytes with `{ format: 'bytes' }`, or a stream. */
  read(path: string): Promise<string>;
  read(path: string, options: { format: 'text' }): Promise<string>;
  read(path: string, options: { format: 'bytes' }): Promise<Uint8Array>;
  read(path: string, options: { format: 'stream' }): Promise<Readable>;
  async read(
    path: string,
    options: { format?: 'text' | 'bytes' | 'stream' } = {},
  ): Promise<string | Uint8Array | Readable> {
    const response = await this.envd.send('GET', '/files/read', { query: { path } });
    if (options.format === 'stream') return response.body;
    const bytes = await readWhole(response.body, Number(response.headers['content-length']));
    return options.format === 'bytes'
      ? new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length)
      : bytes.toString('utf8');
  }

  /**
   * Writes a file (parents are created; the write is atomic: readers see the old or the new
   * content, never half). Streams are sent as they come, never held whole in memory. Several
   * files at once: `write([{ path, data }, ...])`. `metadata` is kept with each file written
   * (see {@link WriteOptions}).
   */
  write(path: string, data: WriteData, options?: WriteOptions): Promise<EntryInfo>;
  write(files: WriteEntry[], options?: WriteOptions): Promise<EntryInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    dataOrOptions?: WriteData | WriteOptions,
    maybeOptions?: WriteOptions,
  ) {
    const many = Array.isArray(pathOrFiles);
    const options = (many ? dataOrOptions : maybeOptions) as WriteOptions | undefined;
    const metadata = options?.metadata;
    if (metadata) {
      try {
        checkMetadata(
          Object.fromEntries(Object.entries(metadata).map(([k, v]) => [k.toLowerCase(), v])),
        );
      } catch (error) {
        if (error instanceof MetadataError)
          throw new BadRequestError(`invalid metadata: ${error.message}`);
        throw error;
      }
    }
    const withMetadata = metadata !== undefined && Object.keys(metadata).length > 0;
    if (Array.isArray(pathOrFiles)) {
      // The batch route carries no metadata: with some, each file is its own write.
      const batch = withMetadata ? undefined : batchable(pathOrFiles);
      if (batch) {
        const { files } = await this.envd.json<{ files: Omit<EntryInfo, 'name'>[] }>(
          'POST',
          '/files/batch',
          { body: { files: batch } },
        );
        return files.map((info) => ({ name: info.path.split('/').pop() ?? info.path, ...info }));
      }
      const results: EntryInfo[] = [];
      for (const file of pathOrFiles) {
        results.push(await this.writeOne(file.path, file.data, metadata));
      }
      return results;
    }
    return this.writeOne(pathOrFiles, (dataOrOptions as WriteData | undefined) ?? '', metadata);
  }

  private async writeOne(
    path: string,
    data: WriteData,
    metadata?: Record<string, string>,
  ): Promise<EntryInfo> {
    const info = await this.envd.json<Omit<EntryInfo, 'name'>>('PUT', '/files/write', {
      query: { path },
      body: toBody(data),
      raw: true,
      headers: { 'content-type': 'application/octet-stream', ...metadataHeaders(metadata) },
    });
    return { name: info.path.split('/').pop() ?? info.path, ...info };
  }

  /**
   * Uploads a file of this machine to `path` in the sandbox (parents created, atomic as
   * {@link write}). With a daemon on this host's loopback and an absolute `path`, the gateway
   * copies the file itself by descriptor (the file stays open here; nothing crosses a socket: at
   * the disk's speed, docs/envd-api.md); elsewhere, or when the gateway cannot (another provider,
   * root's files, a path envd must make), its bytes are sent as {@link write} sends a stream.
   */
  async upload(localPath: string, path: string): Promise<EntryInfo> {
    const fd = await openFd(localPath, 'r');
    try {
      if (this.envd.loopback && path.startsWith('/')) {
        try {
          const info = await this.envd.json<Omit<EntryInfo, 'name'>>('PUT', '/files/write', {
            query: { path },
            headers: { [LOCAL_FILE_HEADER]: `${process.pid}/${fd}` },
          });
          return { name: info.path.split('/').pop() ?? info.path, ...info };
        } catch (error) {
          if ((error as { code?: string }).code !== LOCAL_FILE_UNAVAILABLE) throw error;
        }
      }
      return await this.writeOne(path, Readable.from(fdChunks(fd)));
    } finally {
      await closeFd(fd);
    }
  }

  /**
   * Downloads the sandbox's `path` into a file of this machine (created or truncated). With a
   * daemon on this host's loopback and an absolute `path`, the gateway writes the file itself by
   * descriptor (see {@link upload}); else the bytes are streamed into it. Resolves with the bytes.
   */
  async download(path: string, localPath: string): Promise<{ path: string; size: number }> {
    const fd = await openFd(localPath, 'w');
    try {
      if (this.envd.loopback && path.startsWith('/')) {
        try {
          return await this.envd.json<{ path: string; size: number }>('GET', '/files/read', {
            query: { path },
            headers: { [LOCAL_FILE_HEADER]: `${process.pid}/${fd}` },
          });
        } catch (error) {
          if ((error as { code?: string }).code !== LOCAL_FILE_UNAVAILABLE) throw error;
        }
      }
      const size = await writeAll((await this.read(path, { format: 'stream' })) as Readable, fd);
      return { path, size };
    } finally {
      await closeFd(fd);
    }
  }

  /**
   * The tree under a sandbox directory as a tar stream, packed by envd as it is read (no archive
   * file in the sandbox): directories, regular files and symbolic links, with their modes. The
   * bytes come from the sandbox, so treat them as hostile: `abx cp` extracts them with a checking
   * extractor (set-user-ID bits dropped; devices, hard links, `..` and absolute names refused).
   * `estimatedBytes` is the archive's size as the sandbox announced it, for progress only.
   */
  async readArchive(path: string): Promise<{ stream: Readable; estimatedBytes?: number }> {
    const response = await this.envd.send('GET', '/files/archive', { query: { path } });
    const announced = Number(response.headers[ARCHIVE_SIZE_HEADER]);
    return Number.isSafeInteger(announced) && announced >= 0
      ? { stream: response.body, estimatedBytes: announced }
      : { stream: response.body };
  }

  /**
   * Unpacks a tar stream into a sandbox directory (created if missing) with the sandbox's `tar`;
   * the stream goes straight to it, never through a file. Resolves with the bytes sent.
   */
  async writeArchive(path: string, tar: Readable): Promise<{ path: string; size: number }> {
    return this.envd.json<{ path: string; size: number }>('PUT', '/files/archive', {
      query: { path },
      body: tar,
      raw: true,
      headers: { 'content-type': 'application/x-tar' },
    });
  }

  /** Entries of a directory. */
  async list(path = '.'): Promise<EntryInfo[]> {
    const { entries } = await this.envd.json<{ entries: EntryInfo[] }>('GET', '/files/list', {
      query: { path },
    });
    return entries;
  }

  /** Type, size, mode and mtime of a path. */
  async stat(path: string): Promise<EntryInfo> {
    const info = await this.envd.json<Omit<EntryInfo, 'name'>>('GET', '/files/stat', {
      query: { path },
    });
    return { name: info.path.split('/').pop() ?? info.path, ...info };
  }

  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (error) {
      // The file (or process) is missing; a sandbox that is gone is an error.
      if (error instanceof NotFoundError && !(error instanceof SandboxNotFoundError)) return false;
      throw error;
    }
  }

  /** Creates a directory and its parents; an existing one is fine. */
  async makeDir(path: string): Promise<void> {
    await this.envd.json('POST', '/files/mkdir', { body: { path } });
  }

  /** Removes a file or a directory tree. */
  async remove(path: string): Promise<void> {
    await this.envd.json('POST', '/files/delete', { body: { path, recursive: true } });
  }

  /**
   * Watches a directory: `onEvent` gets each change below it (create, write, remove, rename,
   * chmod; `name` relative to it) until {@link WatchHandle.stop}. A missing directory is a
   * NotFoundError, a file an error saying so (docs/envd-api.md, WATCH).
   */
  watch(
    path: string,
    onEvent: (event: WatchEvent) => void | Promise<void>,
    options: WatchOptions = {},
  ): Promise<WatchHandle> {
    return WatchHandle.open(this.envd, path, onEvent, options);
  }

  /** Renames a file or directory; refuses to replace one unless `overwrite`. */
  async rename(from: string, to: string, options: { overwrite?: boolean } = {}): Promise<void> {
    await this.envd.json('POST', '/files/move', {
      body: { from, to, overwrite: options.overwrite ?? false },
    });
  }
}
