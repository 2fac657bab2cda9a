import { basename } from 'node:path';
import type { Readable } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';
import { BadRequestError } from '../server/errors.js';
import { randomUUID } from '../server/file-tools/random.js';
import { defineGroup } from '../server/route-group.js';

/** A line's level, as E2B's `LogLevel`. */
export type SandboxLogLevel = 'debug' | 'info' | 'warn' | 'error';

/** One line of a sandbox's log: `seq` counts from 1 within one envd's life (`boot`). */
export interface SandboxLogEntry {
  seq: number;
  /** Milliseconds since the epoch. */
  at: number;
  level: SandboxLogLevel;
  message: string;
  fields: Record<string, string>;
}

/** The newest lines envd keeps until the daemon has read them. */
export const ENVD_LOG_MAX_LINES = 10_000;
export const ENVD_LOG_MAX_BYTES = 1024 * 1024;
/** A line longer than this is cut (a program printing without newlines). */
export const LOG_LINE_MAX_BYTES = 16 * 1024;
/** The longest a `GET /logs?wait=` holds the request when there is nothing new. */
const MAX_WAIT_MS = 30_000;

/**
 * envd's log of the sandbox: its own lines, the processes it starts and ends, and what a
 * template's start command prints (`pipe`). Kept in memory, the newest {@link ENVD_LOG_MAX_LINES}
 * lines or {@link ENVD_LOG_MAX_BYTES}; the daemon reads it over `GET /logs` and keeps its own copy.
 * Never given a token, an environment or a command's arguments: only a program's name.
 */
export class SandboxLog {
  /** Changes when envd starts again (a hibernated sandbox woken): `seq` starts over. */
  readonly boot = randomUUID();
  private entries: SandboxLogEntry[] = [];
  private bytes = 0;
  private next = 1;
  private waiters = new Set<() => void>();
  /** Called with each line as it is written (envd under its front sends them on: main.ts). */
  tap: ((entry: SandboxLogEntry) => void) | undefined;

  write(level: SandboxLogLevel, message: string, fields: Record<string, string> = {}): void {
    const text =
      Buffer.byteLength(message) > LOG_LINE_MAX_BYTES
        ? `${Buffer.from(message).subarray(0, LOG_LINE_MAX_BYTES).toString('utf8')}…`
        : message;
    const entry: SandboxLogEntry = {
      seq: this.next++,
      at: Date.now(),
      level,
      message: text,
      fields,
    };
    this.entries.push(entry);
    this.tap?.(entry);
    this.bytes += Buffer.byteLength(text);
    while (
      this.entries.length > ENVD_LOG_MAX_LINES ||
      (this.bytes > ENVD_LOG_MAX_BYTES && this.entries.length > 1)
    ) {
      this.bytes -= Buffer.byteLength((this.entries.shift() as SandboxLogEntry).message);
    }
    const waiters = [...this.waiters];
    this.waiters.clear();
    for (const wake of waiters) wake();
  }

  /**
   * Each line of `stream` as an entry of `level` (stdout `info`, stderr `error`). Reads its
   * chunks as they are (Buffers), so other readers of the stream see them unchanged.
   */
  pipe(stream: Readable, level: SandboxLogLevel, fields: Record<string, string> = {}): void {
    const decoder = new StringDecoder('utf8');
    let rest = '';
    const take = (text: string) => {
      const lines = (rest + text).split('\n');
      rest = lines.pop() ?? '';
      if (rest.length > LOG_LINE_MAX_BYTES) {
        lines.push(rest);
        rest = '';
      }
      for (const line of lines) this.write(level, line.replace(/\r$/, ''), fields);
    };
    stream.on('data', (chunk: Buffer | string) =>
      take(typeof chunk === 'string' ? chunk : decoder.write(chunk)),
    );
    stream.on('end', () => {
      take(decoder.end());
      if (rest) this.write(level, rest, fields);
    });
  }

  /**
   * The entries after `after`, and how many newer than `after` were dropped before they were
   * read. With `waitMs`, waits that long for one when there is none yet.
   */
  async since(after: number, waitMs = 0): Promise<{ entries: SandboxLogEntry[]; dropped: number }> {
    if (waitMs > 0 && (this.entries.at(-1)?.seq ?? 0) <= after) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          this.waiters.delete(wake);
          resolve();
        }, waitMs);
        const wake = () => {
          clearTimeout(timer);
          resolve();
        };
        this.waiters.add(wake);
      });
    }
    const entries = this.entries.filter((entry) => entry.seq > after);
    const first = entries[0]?.seq ?? this.next;
    return { entries, dropped: Math.max(0, first - after - 1) };
  }
}

/** The sandbox's log, one per envd. */
export const sandboxLog = new SandboxLog();

/**
 * A process envd started, in the log: its program's name and pid when it starts, its exit code
 * or signal when it ends (`warn` unless it exited 0). Its arguments are left out: they may hold
 * what the caller would not have logged.
 */
export function logProcess(
  child: {
    pid?: number | undefined;
    once(event: 'close', listener: (code: number | null, signal: string | null) => void): unknown;
  },
  file: string,
  log: SandboxLog = sandboxLog,
): void {
  if (child.pid === undefined) return;
  const fields = { pid: String(child.pid), cmd: basename(file) };
  log.write('info', `process ${fields.cmd} started`, fields);
  child.once('close', (code, signal) => {
    const how = signal ? `killed by ${signal}` : `exited with code ${code}`;
    log.write(code === 0 ? 'info' : 'warn', `process ${fields.cmd} ${how}`, {
      ...fields,
      ...(signal ? { signal } : { exitCode: String(code) }),
    });
  });
}

/**
 * A process's output in the log, a line an entry: stdout `info`, stderr `error` (a template's
 * start command, as E2B logs one).
 */
export function logOutput(
  child: { pid?: number | undefined; stdout: Readable | null; stderr: Readable | null },
  log: SandboxLog = sandboxLog,
): void {
  const fields = { pid: String(child.pid), source: 'start' };
  log.write('info', 'start command started', fields);
  if (child.stdout) log.pipe(child.stdout, 'info', fields);
  if (child.stderr) log.pipe(child.stderr, 'error', fields);
}

/**
 * `GET /logs?after=SEQ&wait=MS`: the entries after `after` (default 0: all kept), waiting up to
 * `wait` ms (at most 30 000) for one when there is none yet; `{ boot, entries, dropped }`.
 */
export function logsGroup(log: SandboxLog = sandboxLog) {
  return defineGroup('LOGS', '/logs', 'the sandbox’s log', [
    {
      method: 'GET',
      path: '/logs',
      summary:
        "The sandbox's log after `after` (a seq), waiting up to `wait` ms (≤ 30000) for a line: { boot, entries: [{ seq, at, level, message, fields }], dropped }.",
      handler: async ({ query }) => {
        const number = (name: string, max: number) => {
          const raw = query.get(name) ?? '0';
          const value = Number(raw);
          if (!/^\d+$/.test(raw) || value > max) {
            throw new BadRequestError(
              `${name} must be a whole number from 0 to ${max}, not ${raw}`,
            );
          }
          return value;
        };
        const after = number('after', Number.MAX_SAFE_INTEGER);
        const wait = number('wait', MAX_WAIT_MS);
        return { boot: log.boot, ...(await log.since(after, wait)) };
      },
    },
  ]);
}
