/**
 * E2B's sandbox logs on abx's (docs/logs.md): `GET /sandboxes/{sandboxID}/logs`
 * (`start`, `limit`; `{ logs: [{timestamp, line}], logEntries: [{timestamp, level, message,
 * fields}] }`) and `GET /v2/sandboxes/{sandboxID}/logs` (`cursor`, `direction`, `level`, `limit`,
 * `search`; `{ logs: [{timestamp, level, message, fields}] }`). A killed sandbox's log is served
 * as long as its record; another key's sandbox answers 404 as an unknown id.
 */
import { SandboxNotFoundError } from '../../errors.js';
import { logJson, parseLogQuery, selectLines } from '../../util/log-lines.js';
import type { E2bBackend, E2bCaller } from './backend.js';

/** What a log route gets: the caller, its path's parameters and its query. */
export interface LogCall {
  params: Record<string, string>;
  query: URLSearchParams;
  caller: E2bCaller;
  backend: E2bBackend;
}

/** The caller's sandbox's kept lines, ended ones included; 404 for another key's, as unknown. */
async function linesOf(call: LogCall) {
  const id = call.params.id as string;
  const row = await call.backend.get(id);
  if (!row || (!call.caller.admin && row.owner !== call.caller.keyId)) {
    throw new SandboxNotFoundError(`sandbox ${id} not found: it does not exist`);
  }
  return call.backend.logs(id);
}

/** E2B's deprecated v1 logs: `start` (ms) and `limit`, oldest first; both shapes at once. */
export async function sandboxLogsV1(call: LogCall): Promise<{ status: number; body: unknown }> {
  const query = parseLogQuery(call.query);
  const lines = selectLines(await linesOf(call), {
    ...(query.start === undefined ? {} : { start: query.start }),
    ...(query.limit === undefined ? {} : { limit: query.limit }),
  });
  const entries = lines.map(logJson);
  return {
    status: 200,
    body: {
      logs: entries.map(({ timestamp, message }) => ({ timestamp, line: message })),
      logEntries: entries,
    },
  };
}

/**
 * E2B's v2 logs: `cursor` (ms), `direction`, `level` (and above), `search`, `limit`. The cursor is
 * where a page starts: forward, the oldest time a line may have; backward (newest first), the
 * newest, so the oldest time of one page is the next page's cursor.
 */
export async function sandboxLogsV2(call: LogCall): Promise<{ status: number; body: unknown }> {
  const { start: cursor, ...query } = parseLogQuery(call.query, 'cursor');
  const bounds =
    cursor === undefined
      ? {}
      : query.direction === 'backward'
        ? { end: cursor }
        : { start: cursor };
  const lines = selectLines(await linesOf(call), { ...query, ...bounds });
  return { status: 200, body: { logs: lines.map(logJson) } };
}
