import {
  closeSync,
  constants,
  openSync,
  readFileSync,
  readSync,
  type Stats,
  statSync,
} from 'node:fs';
import { StringDecoder } from 'node:string_decoder';
import type { ToolError } from './protocol.js';

/*
 * What the file tools share. This folder runs in envd and in `node -e` programs on whatever node
 * the sandbox has (14.14 or later): node built-ins and ES2020 only (the programs' tsconfig
 * type-checks it so). The tools use synchronous fs calls, an order of magnitude faster than
 * fs/promises over many small files (each promise call is a thread-pool round trip), and
 * {@link pacer} hands the event loop back every few milliseconds, so a long walk in envd does not
 * hold up its other requests.
 */

/** The `code` of a thrown error (errno name for fs errors), whatever was thrown. */
export function codeOf(e: unknown): unknown {
  return (e as { code?: unknown } | null | undefined)?.code;
}

/** An fs error as the answer code the host maps to a message. */
export function fsError(e: unknown): ToolError {
  const code = codeOf(e);
  if (code === 'ENOENT' || code === 'ENOTDIR') return { error: 'file_not_found' };
  if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') {
    return { error: 'permission_denied' };
  }
  if (code === 'EISDIR') return { error: 'is_directory' };
  return { error: 'io_error', detail: String((e as { message?: unknown } | null)?.message || e) };
}

/** Runs a tool; a throw becomes an answer too (`unexpected: true`): the caller always gets one. */
export async function answerOf<T>(work: () => Promise<T>): Promise<T | ToolError> {
  try {
    return await work();
  } catch (e) {
    return Object.assign({ unexpected: true }, fsError(e));
  }
}

/** `stat` of a path, or the answer that says why it cannot be read. */
export function statOrError(path: string): { stats: Stats } | ToolError {
  try {
    return { stats: statSync(path) };
  } catch (e) {
    return fsError(e);
  }
}

/** Whether `buf` is valid UTF-8, allowing a character cut at its end. */
export function isUtf8Prefix(buf: Uint8Array): boolean {
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(buf, { stream: true });
    return true;
  } catch {
    return false;
  }
}

/**
 * Opens a file for reading without ever blocking: a path swapped for a FIFO after its stat
 * would otherwise stall the opener (in envd, every request) until a writer came.
 */
export function openForRead(file: string): number {
  return openSync(file, constants.O_RDONLY | constants.O_NONBLOCK);
}

/** The whole content of `file`, opened with {@link openForRead}. */
export function readWhole(file: string): Buffer {
  const fd = openForRead(file);
  try {
    return readFileSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** The first `size` bytes of `file` (fewer if it is shorter). */
export function readPrefix(file: string, size: number): Buffer {
  const fd = openForRead(file);
  try {
    const buf = Buffer.allocUnsafe(size);
    const got = readSync(fd, buf, 0, size, 0);
    return buf.subarray(0, got);
  } finally {
    closeSync(fd);
  }
}

/** What a tool awaits between pieces of work: usually nothing, now and then one event-loop turn. */
export type Pace = () => Promise<void>;

/** A {@link Pace} that yields one turn (setImmediate) once `sliceMs` of work have passed. */
export function pacer(sliceMs = 10): Pace {
  let since = Date.now();
  const turn = (resolve: () => void) =>
    setImmediate(() => {
      since = Date.now();
      resolve();
    });
  return () => (Date.now() - since < sliceMs ? Promise.resolve() : new Promise<void>(turn));
}

export interface LineScan {
  /** `onLine` returned false. */
  stopped: boolean;
  /** Lines seen, the one that stopped the scan included. */
  lines: number;
  /** The scan did not start: `skipBinary` was set and the first 8 KiB hold a NUL byte. */
  binary?: boolean;
}

export interface LineScanOptions {
  /** Skip a file whose first 8 KiB hold a NUL byte (one open instead of a probe and a scan). */
  skipBinary?: boolean;
  /** The read buffer, to reuse one across many files; 64 KiB by default. */
  buffer?: Buffer;
}

/** Where {@link eachLine} looks for a NUL byte with `skipBinary`. */
const BINARY_PROBE_BYTES = 8192;

/**
 * Streams `file` line by line (1-based `n`, a trailing `\r` dropped) without holding it whole;
 * stops when `onLine` returns false.
 */
export async function eachLine(
  file: string,
  pace: Pace,
  onLine: (text: string, n: number) => boolean,
  options: LineScanOptions = {},
): Promise<LineScan> {
  const fd = openForRead(file);
  const decoder = new StringDecoder('utf8');
  const buf = options.buffer ?? Buffer.allocUnsafe(65536);
  let rest = '';
  let n = 0;
  let first = true;
  const emit = (text: string) => {
    n += 1;
    return onLine(text.endsWith('\r') ? text.slice(0, -1) : text, n);
  };
  try {
    for (;;) {
      const got = readSync(fd, buf, 0, buf.length, null);
      if (first && options.skipBinary) {
        if (buf.subarray(0, Math.min(got, BINARY_PROBE_BYTES)).includes(0)) {
          return { stopped: false, lines: 0, binary: true };
        }
      }
      first = false;
      if (got === 0) break;
      const parts = (rest + decoder.write(buf.subarray(0, got))).split('\n');
      rest = parts.pop() ?? '';
      for (const part of parts) if (emit(part) === false) return { stopped: true, lines: n };
      await pace();
    }
    rest += decoder.end();
    if (rest.length > 0 && emit(rest) === false) return { stopped: true, lines: n };
    return { stopped: false, lines: n };
  } finally {
    closeSync(fd);
  }
}
