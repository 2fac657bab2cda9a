import type { ControlConnection } from '../installation/control-connection.js';
import type { JsonClient, Query } from '../installation/json-client.js';
import type { SandboxLogLevel } from '../util/log-lines.js';
import { ndjsonLines } from '../util/ndjson.js';
import { daemonClient } from './http-client.js';

export type { SandboxLogLevel };

/**
 * A line of a sandbox's log: envd's own lines, the processes it starts and ends, and what a
 * template's start command prints (stdout `info`, stderr `error`).
 */
export interface SandboxLogLine {
  /** When it was written (ISO 8601). */
  timestamp: string;
  level: SandboxLogLevel;
  message: string;
  /** `pid`, `cmd`, `exitCode`…; `abxDropped` on the line that stands for trimmed ones. */
  fields: Record<string, string>;
}

/** Which lines of a log to read. */
export interface SandboxLogsOptions {
  /** Lines written at or after this (a Date or ms since the epoch). */
  start?: Date | number;
  /** This level and above. */
  level?: SandboxLogLevel;
  /** Lines whose message holds this (case-sensitive). */
  search?: string;
  /** `forward` (default): oldest first; `backward`: newest first. */
  direction?: 'forward' | 'backward';
  /** The first this many (1 to 10 000) in that order. */
  limit?: number;
}

/** A followed log with no line (nor keep-alive) for this long has lost its daemon. */
export const FOLLOW_IDLE_TIMEOUT_MS = 45_000;

const logsPath = (id: string) => `/v1/sandboxes/${encodeURIComponent(id)}/logs`;

function logsQuery(options: SandboxLogsOptions): Query {
  return {
    start: options.start === undefined ? undefined : Math.round(Number(options.start)),
    level: options.level,
    search: options.search,
    direction: options.direction,
    limit: options.limit,
  };
}

/** A sandbox's log, running or ended (see `Sandbox.logs`). */
export async function readSandboxLogs(
  client: JsonClient,
  sandboxId: string,
  options: SandboxLogsOptions = {},
): Promise<SandboxLogLine[]> {
  const { logs } = await client.json<{ logs: SandboxLogLine[] }>('GET', logsPath(sandboxId), {
    query: logsQuery(options),
  });
  return logs;
}

/**
 * The lines of a sandbox's log as they come (see `Sandbox.followLogs`): ends when the sandbox
 * ends, or when `signal` aborts.
 */
export async function* followSandboxLogs(
  connection: ControlConnection,
  sandboxId: string,
  options: Omit<SandboxLogsOptions, 'direction'> & { signal?: AbortSignal } = {},
): AsyncGenerator<SandboxLogLine> {
  // undici's body timeout is the longest silence: the daemon sends a keep-alive line every 15 s.
  const http = daemonClient(connection, FOLLOW_IDLE_TIMEOUT_MS);
  const response = await http.send('GET', logsPath(sandboxId), {
    query: { ...logsQuery(options), follow: 1 },
    ...(options.signal ? { signal: options.signal } : {}),
  });
  try {
    for await (const event of ndjsonLines<{ log?: SandboxLogLine }>(response.body)) {
      if (event.log) yield event.log;
    }
  } catch (error) {
    if (!options.signal?.aborted) throw error;
  }
}
