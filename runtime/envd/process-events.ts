import type { OutputEncoding, StreamName, StreamOffsets } from '../protocol/wire.js';
import type { OutputLog } from '../server/output-log.js';
import type { ManagedProcess } from '../server/process-table.js';

/** The two streams of a process, in the order each round of events lists them. */
export const STREAMS: readonly StreamName[] = ['stdout', 'stderr'];

/** Largest `data` of one output event, so one event never holds a whole log. */
const EVENT_BYTES = 64 * 1024;

/** A silent follow stream sends `{"keepalive":true}` this often, so a client can tell a dead peer. */
export const KEEPALIVE_MS = 5_000;

/**
 * Length of `data` without a UTF-8 sequence cut short at its end: events carry text, and a
 * character split across two reads would otherwise turn into two replacement characters.
 */
export function completeUtf8Length(data: Buffer): number {
  for (let i = data.length - 1; i >= Math.max(0, data.length - 4); i--) {
    const byte = data[i] as number;
    if ((byte & 0xc0) === 0x80) continue;
    const size = byte >= 0xf8 ? 1 : byte >= 0xf0 ? 4 : byte >= 0xe0 ? 3 : byte >= 0xc0 ? 2 : 1;
    return i + size > data.length ? i : data.length;
  }
  return data.length;
}

const line = (event: unknown) => `${JSON.stringify(event)}\n`;

/** The reason waitForOutput releases the losing waiter with (made once: see route-table.ts). */
const SETTLED = new DOMException('another stream had output first', 'AbortError');

/** Resolves when either log passes the offset seen, a log closes, `ms` pass or `closed` aborts. */
async function waitForOutput(
  logs: readonly OutputLog[],
  seen: readonly number[],
  ms: number,
  closed: AbortSignal,
): Promise<void> {
  const settled = new AbortController();
  const signal = AbortSignal.any([closed, settled.signal]);
  try {
    await Promise.race(logs.map((log, i) => log.waitPast(seen[i] ?? 0, ms, signal)));
  } finally {
    // Releases the waiter that did not win.
    settled.abort(SETTLED);
  }
}

/**
 * A process's events as NDJSON lines: output of each stream from the given offsets, then (once
 * the process has exited and everything was sent) `exit`. With `follow` the lines keep coming as
 * the process writes; without, they stop at the output there is now.
 *
 * - `{"stream":"stdout","data":"…","offset":0,"next":6}`: `data` starts at byte `offset`;
 *   resume from `next`. With `output: 'base64'`, `data` is the bytes as read, base64-encoded,
 *   and the event says `"encoding":"base64"`: nothing is held back or replaced.
 * - `{"stream":"stderr","dropped":N,"offset":O}`: the N bytes before O are gone (the log keeps the
 *   newest bytes only); output goes on from O.
 * - `{"keepalive":true}` while a followed process is silent.
 * - `{"exit":{"code":0,"signal":null,"timed_out":false}}`, always the last line.
 */
export async function* processEvents(
  entry: ManagedProcess,
  from: StreamOffsets,
  options: { follow: boolean; closed: AbortSignal; output?: OutputEncoding },
): AsyncGenerator<string> {
  const base64 = options.output === 'base64';
  const at = { ...from };
  const logs = STREAMS.map((name) => entry[name]);
  while (!options.closed.aborted) {
    const seen: number[] = [];
    for (const name of STREAMS) {
      const log = entry[name];
      if (at[name] < log.start) {
        yield line({ stream: name, dropped: log.start - at[name], offset: log.start });
        at[name] = log.start;
      }
      while (true) {
        const { data, offset } = log.read(at[name], EVENT_BYTES);
        const last = log.done && offset + data.length === log.end;
        const size = last || base64 ? data.length : completeUtf8Length(data);
        if (size === 0) break;
        at[name] = offset + size;
        yield line(
          base64
            ? {
                stream: name,
                data: data.toString('base64'),
                encoding: 'base64',
                offset,
                next: at[name],
              }
            : {
                stream: name,
                data: data.subarray(0, size).toString('utf8'),
                offset,
                next: at[name],
              },
        );
      }
      seen.push(log.end);
    }
    if (logs.every((log, i) => log.done && at[STREAMS[i] as StreamName] >= log.end)) {
      yield line({
        exit: { code: entry.exitCode, signal: entry.signal, timed_out: entry.timedOut },
      });
      return;
    }
    if (!options.follow) return;
    await waitForOutput(logs, seen, KEEPALIVE_MS, options.closed);
    const silent = logs.every((log, i) => !log.done && log.end === seen[i]);
    if (silent && !options.closed.aborted) yield line({ keepalive: true });
  }
}
