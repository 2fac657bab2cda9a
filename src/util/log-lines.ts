/**
 * A sandbox's log lines as abx's API and E2B's face select and show them (the daemon keeps them:
 * src/control/sandbox-logs.ts).
 */
import type { SandboxLogLevel } from '../../runtime/envd/sandbox-log.js';
import { InvalidArgumentError } from '../errors.js';

export type { SandboxLogLevel };

/** The most lines kept of one sandbox's log. */
export const LOG_MAX_LINES = 10_000;

/** A line of a sandbox's log as the daemon keeps and serves it. */
export interface LogLine {
  /** Milliseconds since the epoch. */
  at: number;
  level: SandboxLogLevel;
  message: string;
  fields: Record<string, string>;
}

export const LEVELS: readonly SandboxLogLevel[] = ['debug', 'info', 'warn', 'error'];

/** A log query as /v1 and E2B's face send it, checked. */
export interface LogQuery {
  start?: number;
  /** The newest time a line may have (ms since the epoch, included). */
  end?: number;
  level?: SandboxLogLevel;
  search?: string;
  direction?: 'forward' | 'backward';
  limit?: number;
}

/**
 * Reads `start`/`cursor` (ms since the epoch), `level`, `search`, `direction` and `limit` (1 to
 * 10000) from a query; InvalidArgumentError naming the parameter for a bad one.
 */
export function parseLogQuery(query: URLSearchParams, startName = 'start'): LogQuery {
  const out: LogQuery = {};
  const whole = (name: string, min: number, max: number): number | undefined => {
    const raw = query.get(name);
    if (raw === null || raw === '') return undefined;
    const value = Number(raw);
    if (!/^\d+$/.test(raw) || value < min || value > max) {
      throw new InvalidArgumentError(
        `${name} must be a whole number from ${min} to ${max}, not ${JSON.stringify(raw)}`,
      );
    }
    return value;
  };
  const start = whole(startName, 0, Number.MAX_SAFE_INTEGER);
  if (start !== undefined) out.start = start;
  const limit = whole('limit', 1, LOG_MAX_LINES);
  if (limit !== undefined) out.limit = limit;
  const level = query.get('level');
  if (level !== null && level !== '') {
    if (!LEVELS.includes(level as SandboxLogLevel)) {
      throw new InvalidArgumentError(
        `level must be one of ${LEVELS.join(', ')} (that level and above), not ${JSON.stringify(level)}`,
      );
    }
    out.level = level as SandboxLogLevel;
  }
  const direction = query.get('direction');
  if (direction !== null && direction !== '') {
    if (direction !== 'forward' && direction !== 'backward') {
      throw new InvalidArgumentError(
        `direction must be forward (oldest first) or backward (newest first), not ${JSON.stringify(direction)}`,
      );
    }
    out.direction = direction;
  }
  const search = query.get('search');
  if (search !== null && search !== '') out.search = search;
  return out;
}

/** A line as abx's API shows it (and E2B's `SandboxLogEntry`): the time in ISO 8601. */
export function logJson(line: LogLine) {
  return {
    timestamp: new Date(line.at).toISOString(),
    level: line.level,
    message: line.message,
    fields: line.fields,
  };
}

/**
 * The lines of a log a query asks for: `start` (ms since the epoch, included), `level` (that
 * level and above), `search` (a case-sensitive substring of the message), `direction` (forward:
 * oldest first; backward: newest first) and `limit` (the first that many in that order).
 */
export function selectLines(lines: LogLine[], query: LogQuery): LogLine[] {
  const min = query.level ? LEVELS.indexOf(query.level) : 0;
  const { search } = query;
  let chosen = lines.filter(
    ({ at, level, message: text }) =>
      (query.start === undefined || at >= query.start) &&
      (query.end === undefined || at <= query.end) &&
      LEVELS.indexOf(level) >= min &&
      // A log line's text, searched as the caller asked: not an error's message.
      (search === undefined || text.includes(search)),
  );
  if (query.direction === 'backward') chosen = chosen.reverse();
  return query.limit === undefined ? chosen : chosen.slice(0, query.limit);
}
