import { closeSync, openSync, readFileSync, readSync, type Stats, statSync } from 'node:fs';
import { StringDecoder } from 'node:string_decoder';
import {
  type HelperAnswer,
  type HelperPayload,
  type HelperProgram,
  type ProgramError,
  RESULT_MARK,
} from './protocol.js';

/** The `code` of a thrown error (errno name for fs errors), whatever was thrown. */
export function codeOf(e: unknown): unknown {
  return (e as { code?: unknown } | null | undefined)?.code;
}

/** An fs error as the answer code the host maps to a message. */
export function fsError(e: unknown): ProgramError {
  const code = codeOf(e);
  if (code === 'ENOENT' || code === 'ENOTDIR') return { error: 'file_not_found' };
  if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') {
    return { error: 'permission_denied' };
  }
  if (code === 'EISDIR') return { error: 'is_directory' };
  return { error: 'io_error', detail: String((e as { message?: unknown } | null)?.message || e) };
}

/** `stat` of a path, or the answer that says why it cannot be read. */
export function statOrError(path: string): { stats: Stats } | ProgramError {
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

/** The first `size` bytes of `file` (fewer if it is shorter). */
export function readPrefix(file: string, size: number): Buffer {
  const fd = openSync(file, 'r');
  try {
    const buf = Buffer.alloc(size);
    const got = readSync(fd, buf, 0, size, 0);
    return buf.subarray(0, got);
  } finally {
    closeSync(fd);
  }
}

export interface LineScan {
  /** `onLine` returned false. */
  stopped: boolean;
  /** Lines seen, the one that stopped the scan included. */
  lines: number;
}

/**
 * Streams `file` line by line (1-based `n`, a trailing `\r` dropped) without holding it whole;
 * stops when `onLine` returns false.
 */
export function eachLine(file: string, onLine: (text: string, n: number) => boolean): LineScan {
  const fd = openSync(file, 'r');
  const decoder = new StringDecoder('utf8');
  const buf = Buffer.alloc(65536);
  let rest = '';
  let n = 0;
  const emit = (text: string) => {
    n += 1;
    return onLine(text.endsWith('\r') ? text.slice(0, -1) : text, n);
  };
  try {
    for (;;) {
      const got = readSync(fd, buf, 0, buf.length, null);
      if (got === 0) break;
      const parts = (rest + decoder.write(buf.subarray(0, got))).split('\n');
      rest = parts.pop() ?? '';
      for (const part of parts) if (emit(part) === false) return { stopped: true, lines: n };
    }
    rest += decoder.end();
    if (rest.length > 0 && emit(rest) === false) return { stopped: true, lines: n };
    return { stopped: false, lines: n };
  } finally {
    closeSync(fd);
  }
}

function answer(value: unknown): void {
  process.stdout.write(`\n${RESULT_MARK}${JSON.stringify(value)}\n`);
}

/**
 * Runs a program's `main` on the JSON payload from stdin and prints its answer. A throw becomes
 * an answer too (`unexpected: true`), so the host always gets one.
 */
export function runProgram<N extends HelperProgram>(
  main: (payload: HelperPayload<N>) => HelperAnswer<N>,
): void {
  let input: HelperPayload<N> | undefined;
  try {
    input = JSON.parse(readFileSync(0, 'utf8'));
  } catch {
    input = undefined;
  }
  if (input === undefined) answer({ error: 'bad_payload' });
  else {
    try {
      answer(main(input));
    } catch (e) {
      answer(Object.assign({ unexpected: true }, fsError(e)));
    }
  }
}
