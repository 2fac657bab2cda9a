import { EventEmitter } from 'node:events';
import { appendFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { PassThrough, type Readable } from 'node:stream';
import type { SandboxLogEntry } from '../../runtime/envd/sandbox-log.js';
import { InvalidArgumentError, LimitExceededError } from '../errors.js';
import { envMilliseconds } from '../util/env-ms.js';
import {
  LOG_MAX_LINES,
  type LogLine,
  type LogQuery,
  logJson,
  selectLines,
} from '../util/log-lines.js';
import { envdRequest } from './envd-request.js';

/** What is kept of each sandbox's log: the newest lines within both caps. */
export const LOG_MAX_BYTES = 1024 * 1024;
/** Logs followed at once, over all keys (each holds a connection and a check every second). */
const MAX_FOLLOWS = 200;
/** How often the daemon looks for running sandboxes whose log it does not read yet. */
const PASS_MS = 2000;
/** How long one read of envd's log waits for a line (envd holds it open), and its timeout. */
const WAIT_MS = 20_000;
const READ_TIMEOUT_MS = WAIT_MS + 10_000;

/** What the logs need of the daemon: its running sandboxes and the token of each. */
export interface LogSource {
  /** Running sandboxes: envd's socket, and root's envd's where the sandbox allows root. */
  running(): Promise<{ id: string; envdSocket: string; envdRootSocket?: string }[]>;
  controlToken(id: string): string;
}

/** A line as the file holds it: with where it was in envd's log (not shown to readers). */
interface StoredLine extends LogLine {
  boot?: string;
  seq?: number;
  /** `root`: a line of root's envd (a sandbox that allows root); none: the default envd's. */
  envd?: 'root';
}

/** Which of a sandbox's envds a log is read from. */
type Envd = 'user' | 'root';

interface Kept {
  lines: number;
  bytes: number;
}

/**
 * Each sandbox's log, read from its envd (`GET /logs`, held open until a line comes) while it
 * runs, kept in `dir/<id>.jsonl` after it ends: the newest {@link LOG_MAX_LINES} lines and
 * {@link LOG_MAX_BYTES} at most, a flood trimmed to the newest with a line saying how many went.
 * The daemon's own file, so what a sandbox prints never reaches the host's disk beyond the cap.
 */
export class SandboxLogs {
  private timer: NodeJS.Timeout | undefined;
  /**
   * Sandboxes whose envd is being read, with where in its log the reading is: by id, and by
   * `id#root` for root's envd.
   */
  private readonly reading = new Map<string, AbortController>();
  private readonly cursors = new Map<string, { boot: string; seq: number }>();
  private readonly kept = new Map<string, Kept>();
  private readonly emitter = new EventEmitter().setMaxListeners(0);
  private stopped = false;
  private follows = 0;

  constructor(
    private readonly dir: string,
    private readonly source: LogSource,
    private readonly maxLines = envCount('ABX_SANDBOX_LOG_LINES', LOG_MAX_LINES),
    private readonly maxBytes = LOG_MAX_BYTES,
    private readonly passMs = envMilliseconds('ABX_SANDBOX_LOG_PASS_MS', PASS_MS, 100),
  ) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  }

  start(): void {
    this.timer ??= setInterval(() => void this.pass().catch(() => undefined), this.passMs);
    void this.pass().catch(() => undefined);
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
    for (const reading of this.reading.values()) reading.abort();
    this.reading.clear();
  }

  /** Starts reading the log of each running sandbox not read yet. */
  async pass(): Promise<void> {
    for (const { id, envdSocket, envdRootSocket } of await this.source.running()) {
      this.read1(id, 'user', envdSocket);
      if (envdRootSocket) this.read1(id, 'root', envdRootSocket);
    }
  }

  /** Starts reading one envd's log of a sandbox, unless it is read already. */
  private read1(id: string, envd: Envd, socket: string): void {
    const key = envd === 'root' ? `${id}#root` : id;
    if (this.stopped || this.reading.has(key)) return;
    const abort = new AbortController();
    this.reading.set(key, abort);
    void this.follow(id, envd, key, socket, abort.signal).finally(() => {
      if (this.reading.get(key) === abort) this.reading.delete(key);
    });
  }

  /**
   * Reads one of a sandbox's envd logs until envd goes (the next pass reads it again if it
   * runs). Root's lines are marked (`fields.user: root`), and kept in the same log.
   */
  private async follow(
    id: string,
    envd: Envd,
    key: string,
    socket: string,
    signal: AbortSignal,
  ): Promise<void> {
    while (!signal.aborted) {
      const cursor = this.cursors.get(key) ?? this.storedCursor(id, envd);
      let answer: {
        status: number;
        body: { boot?: string; entries?: SandboxLogEntry[]; dropped?: number };
      };
      try {
        // A new boot (a hibernated sandbox woken) starts its seq over: read it from the start.
        answer = await envdRequest(
          socket,
          this.source.controlToken(id),
          'GET',
          `/logs?after=${cursor?.seq ?? 0}&wait=${WAIT_MS}`,
          undefined,
          READ_TIMEOUT_MS,
          signal,
        );
      } catch {
        return;
      }
      const { boot, entries = [], dropped = 0 } = answer.body;
      if (answer.status !== 200 || typeof boot !== 'string') return;
      if (cursor && cursor.boot !== boot) {
        this.cursors.set(key, { boot, seq: 0 });
        continue;
      }
      // Each line keeps where it was in envd's log, so a daemon started again goes on from there.
      const lines: StoredLine[] = entries.map(({ seq, at, level, message, fields }) => ({
        at,
        level,
        message,
        fields: envd === 'root' ? { ...fields, user: 'root' } : fields,
        boot,
        seq,
        ...(envd === 'root' ? { envd } : {}),
      }));
      if (dropped > 0) {
        const at = (entries[0]?.at ?? Date.now()) - 1;
        lines.unshift(droppedLine(dropped, 'before the daemon read them (envd keeps 10000)', at));
      }
      if (lines.length > 0) this.append(id, lines);
      this.cursors.set(key, { boot, seq: entries.at(-1)?.seq ?? cursor?.seq ?? 0 });
    }
  }

  /**
   * Where the kept log of a sandbox ends in one envd's log: the boot and seq of the newest line
   * read from that envd.
   */
  private storedCursor(id: string, envd: Envd): { boot: string; seq: number } | undefined {
    const lines = this.read(id) as StoredLine[];
    for (let i = lines.length - 1; i >= 0; i--) {
      const line = lines[i] as StoredLine;
      if ((line.envd ?? 'user') !== envd) continue;
      if (typeof line.boot === 'string' && typeof line.seq === 'number') {
        return { boot: line.boot, seq: line.seq };
      }
    }
    return undefined;
  }

  /** Adds lines to a sandbox's log, trimming it to the newest within the caps. */
  append(id: string, lines: LogLine[]): void {
    const file = this.file(id);
    const text = lines.map((line) => `${JSON.stringify(line)}\n`).join('');
    appendFileSync(file, text, { mode: 0o600 });
    const kept = this.keptOf(id);
    kept.lines += lines.length;
    kept.bytes += Buffer.byteLength(text);
    if (kept.lines > this.maxLines || kept.bytes > this.maxBytes) this.trim(id);
    for (const line of lines) this.emitter.emit(id, line);
  }

  /** The lines kept of a sandbox's log, oldest first (none: an empty list). */
  read(id: string): LogLine[] {
    let text: string;
    try {
      text = readFileSync(this.file(id), 'utf8');
    } catch {
      return [];
    }
    const lines: LogLine[] = [];
    for (const raw of text.split('\n')) {
      if (!raw) continue;
      try {
        lines.push(JSON.parse(raw) as LogLine);
      } catch {
        // A line cut by a crash mid-write.
      }
    }
    return lines;
  }

  /**
   * Calls `listener` with each line added from now on, until the returned function is called; at
   * most {@link MAX_FOLLOWS} at once (LimitExceededError, 429, past that).
   */
  subscribe(id: string, listener: (line: LogLine) => void): () => void {
    if (this.follows >= MAX_FOLLOWS) {
      throw new LimitExceededError(
        `too many logs followed at once (${MAX_FOLLOWS} on this daemon): stop some follows, or read without follow`,
      );
    }
    this.follows++;
    this.emitter.on(id, listener);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.follows--;
      this.emitter.off(id, listener);
    };
  }

  /** Forgets a sandbox's log (its record is gone). */
  remove(id: string): void {
    for (const key of [id, `${id}#root`]) {
      this.reading.get(key)?.abort();
      this.cursors.delete(key);
    }
    this.kept.delete(id);
    rmSync(this.file(id), { force: true });
  }

  private file(id: string): string {
    if (!/^[\w-]+$/.test(id))
      throw new InvalidArgumentError(`${JSON.stringify(id)} is not a sandbox id`);
    return join(this.dir, `${id}.jsonl`);
  }

  private keptOf(id: string): Kept {
    let kept = this.kept.get(id);
    if (!kept) {
      let text = '';
      try {
        text = readFileSync(this.file(id), 'utf8');
      } catch {}
      kept = { lines: text.split('\n').length - 1, bytes: Buffer.byteLength(text) };
      this.kept.set(id, kept);
    }
    return kept;
  }

  /**
   * Keeps the newest lines: down to 3/4 of each cap, so a flood rewrites the file once per
   * quarter of it, not once per line; the first line then says how many went in all.
   */
  private trim(id: string): void {
    const all = this.read(id);
    const marker = all[0]?.fields.abxDropped;
    const before = marker === undefined ? 0 : Number(marker);
    const body = marker === undefined ? all : all.slice(1);
    const lineBudget = Math.floor((this.maxLines * 3) / 4) - 1;
    const byteBudget = Math.floor((this.maxBytes * 3) / 4);
    let keep = 0;
    let bytes = 0;
    for (let i = body.length - 1; i >= 0 && keep < lineBudget; i--) {
      const size = Buffer.byteLength(JSON.stringify(body[i])) + 1;
      if (bytes + size > byteBudget) break;
      bytes += size;
      keep++;
    }
    const dropped = before + body.length - keep;
    const newestDropped = body[body.length - keep - 1]?.at ?? all[0]?.at ?? Date.now();
    const lines = [
      droppedLine(
        dropped,
        `to keep the newest ${this.maxLines} lines and ${this.maxBytes} bytes`,
        newestDropped,
      ),
      ...body.slice(body.length - keep),
    ];
    const text = lines.map((line) => `${JSON.stringify(line)}\n`).join('');
    writeFileSync(this.file(id), text, { mode: 0o600 });
    this.kept.set(id, { lines: lines.length, bytes: Buffer.byteLength(text) });
  }
}

/**
 * The line that stands for lines the log no longer has, at the time of the newest of them (so
 * the log stays in time order and a `start` bound treats it as one of them).
 */
function droppedLine(count: number, why: string, at: number): LogLine {
  return {
    at,
    level: 'warn',
    message: `abx: ${count} earlier log lines were dropped ${why}`,
    fields: { abxDropped: String(count) },
  };
}

function envCount(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 10) {
    throw new InvalidArgumentError(
      `${name} must be a whole number of lines, 10 or more, not ${raw}`,
    );
  }
  return value;
}

/** How often a followed log with nothing new sends `{"keepalive":{}}`. */
export const FOLLOW_KEEPALIVE_MS = 15_000;
/** How often a follow looks whether its sandbox has ended. */
const FOLLOW_CHECK_MS = 1000;

/**
 * A followed log as NDJSON: `{"log":…}` for each kept line the query selects, then each new one
 * as it comes; `{"keepalive":{}}` after {@link FOLLOW_KEEPALIVE_MS} without one; `{"end":{state}}`
 * and the end once the sandbox is neither running nor paused. Ends early when `signal` aborts.
 */
export function followLog(
  logs: SandboxLogs,
  id: string,
  query: LogQuery,
  stateOf: () => Promise<string | undefined>,
  signal: AbortSignal,
): Readable {
  const out = new PassThrough();
  let finished = false;
  const write = (value: unknown) => {
    if (!finished) out.write(`${JSON.stringify(value)}\n`);
  };
  const selected = (line: LogLine) =>
    selectLines([line], { ...query, limit: undefined }).length > 0;
  let lastWrite = Date.now();
  const unsubscribe = logs.subscribe(id, (line) => {
    if (selected(line)) {
      write({ log: logJson(line) });
      lastWrite = Date.now();
    }
  });
  for (const line of selectLines(logs.read(id), query)) write({ log: logJson(line) });
  const finish = (state?: string) => {
    if (finished) return;
    if (state !== undefined) write({ end: { state } });
    finished = true;
    clearInterval(timer);
    unsubscribe();
    out.end();
  };
  let checking = false;
  const timer = setInterval(() => {
    if (Date.now() - lastWrite >= FOLLOW_KEEPALIVE_MS) {
      write({ keepalive: {} });
      lastWrite = Date.now();
    }
    if (checking) return;
    checking = true;
    stateOf()
      .then((state) => {
        if (state !== 'running' && state !== 'paused') finish(state ?? 'gone');
      })
      .catch(() => undefined)
      .finally(() => {
        checking = false;
      });
  }, FOLLOW_CHECK_MS);
  signal.addEventListener('abort', () => finish(), { once: true });
  out.on('close', () => finish());
  return out;
}
