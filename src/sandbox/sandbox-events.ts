import type { ControlConnection } from '../installation/control-connection.js';
import type { JsonClient, Query } from '../installation/json-client.js';
import { daemonClient } from './http-client.js';
import { FOLLOW_IDLE_TIMEOUT_MS } from './sandbox-logs.js';

/**
 * A lifecycle event's type (docs/events.md): E2B's six, and abx's `failed` (a sandbox that did
 * not start) and `expiring` (its timeout is near).
 */
export type SandboxEventType =
  | 'sandbox.lifecycle.created'
  | 'sandbox.lifecycle.updated'
  | 'sandbox.lifecycle.paused'
  | 'sandbox.lifecycle.resumed'
  | 'sandbox.lifecycle.killed'
  | 'sandbox.lifecycle.checkpointed'
  | 'sandbox.lifecycle.failed'
  | 'sandbox.lifecycle.expiring';

/** One change of a sandbox's state, as the registry recorded it with the change. */
export interface SandboxLifecycleEvent {
  /** The order of events: a page's `cursor`, and where a follow resumes (`after`). */
  seq: number;
  /** A UUID: what to deduplicate on. */
  id: string;
  type: SandboxEventType;
  sandboxId: string;
  template: string;
  /** The API key id that owns the sandbox; null for the daemon's own key. */
  owner: string | null;
  /** When, ISO 8601. */
  at: string;
  /**
   * abx's detail: `created` `{ source: 'start'|'pool'|'fork', forkedFrom?, metadata, expiresAt }`;
   * `updated` `{ change: 'timeout', expiresAt }` or `{ change: 'network', network }`; `paused`
   * `{ kind: 'memory'|'disk', reason: 'api'|'timeout', expiresAt }`; `resumed` `{ kind,
   * expiresAt }`; `killed` `{ reason: 'api'|'expired'|'oom'|'dead'|'revoked'|'failed', state,
   * endReason }`; `checkpointed` `{ snapshot }`; `failed` `{ error }`; `expiring` `{ expiresAt,
   * leadMs, onTimeout }`.
   */
  data: Record<string, unknown>;
}

/** Which events to read: the key's sandboxes' (an admin key's: every sandbox's). */
export interface SandboxEventsOptions {
  /** One sandbox's (another key's: SandboxNotFoundError, as an unknown id). */
  sandboxId?: string;
  /** Only these types. */
  type?: SandboxEventType | readonly SandboxEventType[];
  /** Only events after this seq. */
  after?: number;
  /** A previous page's `cursor` (with the same `order`). */
  cursor?: number;
  /** By seq: `asc` (default, oldest first) or `desc`. */
  order?: 'asc' | 'desc';
  /** Events in one page, 1 to 1000 (default 100). */
  limit?: number;
  /** Only events at or after this time. */
  since?: Date | number;
  /** Only events before this time. */
  until?: Date | number;
}

/** One page of events; `cursor` is the next page's (`more`: the page was full). */
export interface SandboxEventPage {
  events: SandboxLifecycleEvent[];
  cursor: number | null;
  more: boolean;
}

const ms = (time: Date | number | undefined) =>
  time === undefined ? undefined : time instanceof Date ? time.getTime() : time;

const typesOf = (type: SandboxEventsOptions['type']) =>
  type === undefined ? undefined : [type].flat().join(',') || undefined;

/** The query of `GET /v1/events` for `options`. */
export function eventsQuery(options: SandboxEventsOptions): Query {
  return {
    sandbox: options.sandboxId,
    type: typesOf(options.type),
    after: options.after,
    cursor: options.cursor,
    order: options.order,
    limit: options.limit,
    since: ms(options.since),
    until: ms(options.until),
  };
}

/** One page of lifecycle events (see `Sandbox.events`). */
export function readSandboxEvents(
  client: JsonClient,
  options: SandboxEventsOptions = {},
): Promise<SandboxEventPage> {
  return client.json<SandboxEventPage>('GET', '/v1/events', { query: eventsQuery(options) });
}

/** What a follow reads: a sandbox's or every one's, of some types, after a seq. */
export interface FollowEventsOptions {
  sandboxId?: string;
  type?: SandboxEventType | readonly SandboxEventType[];
  /** Resume after this seq (the last event had); default: from now. */
  after?: number;
  signal?: AbortSignal;
}

/**
 * Lifecycle events as they are recorded (see `Sandbox.followEvents`): the daemon's event stream,
 * lifecycle events only, resumed from the last seq had when the connection drops (until
 * `signal` aborts); none is missed or repeated.
 */
export async function* followSandboxEvents(
  connection: ControlConnection,
  options: FollowEventsOptions = {},
): AsyncGenerator<SandboxLifecycleEvent> {
  // undici's body timeout is the longest silence: the stream sends a keep-alive every 15 s.
  const http = daemonClient(connection, FOLLOW_IDLE_TIMEOUT_MS);
  // From now: the newest seq there is, so a stream that drops before its first event resumes
  // from there too.
  let after = options.after;
  if (after === undefined) {
    const newest = await http.json<SandboxEventPage>('GET', '/v1/events', {
      query: eventsQuery({
        ...(options.sandboxId ? { sandboxId: options.sandboxId } : {}),
        ...(options.type ? { type: options.type } : {}),
        order: 'desc',
        limit: 1,
      }),
      ...(options.signal ? { signal: options.signal } : {}),
    });
    after = newest.events[0]?.seq ?? 0;
  }
  for (;;) {
    try {
      const response = await http.send('GET', '/v1/events', {
        query: {
          only: 'lifecycle',
          sandbox: options.sandboxId,
          type: typesOf(options.type),
          after,
        },
        headers: { accept: 'text/event-stream' },
        ...(options.signal ? { signal: options.signal } : {}),
      });
      for await (const event of serverSentEvents(response.body)) {
        if (event.event !== 'lifecycle') continue;
        const lifecycle = JSON.parse(event.data) as SandboxLifecycleEvent;
        after = lifecycle.seq;
        yield lifecycle;
      }
    } catch (error) {
      if (options.signal?.aborted) return;
      // A refusal (a 4xx: another key's sandbox) ends the follow; a dropped stream resumes.
      const status = (error as { status?: number }).status;
      if (status !== undefined && status < 500) throw error;
    }
    if (options.signal?.aborted) return;
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

/** The events of a `text/event-stream` body: `event` (default `message`) and `data` of each. */
async function* serverSentEvents(
  body: AsyncIterable<Buffer | string>,
): AsyncGenerator<{ event: string; data: string; id?: string }> {
  let buffer = '';
  for await (const chunk of body) {
    buffer += chunk.toString();
    for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = 'message';
      const data: string[] = [];
      let id: string | undefined;
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) event = line.slice(7);
        else if (line.startsWith('data: ')) data.push(line.slice(6));
        else if (line.startsWith('id: ')) id = line.slice(4);
      }
      if (data.length > 0) yield { event, data: data.join('\n'), ...(id ? { id } : {}) };
    }
  }
}
