import { InvalidArgumentError, SandboxNotFoundError } from '../errors.js';
import {
  E2B_EVENT_TYPES,
  EVENT_TYPES,
  type EventFilter,
  isEventType,
  type SandboxEvent,
} from './events.js';
import type { Registry } from './registry.js';

/** Who reads events: a key (its id, null for the daemon's own) and whether it is an admin. */
export interface EventReader {
  keyId: string | null;
  admin: boolean;
}

/**
 * Whose events a caller reads, the one rule every reader follows (`/v1/events`, its stream, E2B's
 * `/events/sandboxes`, webhooks' fan-out): a key reads the events of its own sandboxes, an admin
 * key every sandbox's (undefined: no owner filter).
 */
export function eventOwner(reader: EventReader): string | null | undefined {
  return reader.admin ? undefined : reader.keyId;
}

/** A page of `/v1/events` at most this long (`limit`), and by default. */
export const MAX_EVENTS_PAGE = 1000;
export const DEFAULT_EVENTS_PAGE = 100;

/** The filter of a read, without its owner (the reader decides that). */
export type EventQuery = Omit<EventFilter, 'owner'>;

/** The events of sandboxes as their owners read them. */
export class EventService {
  constructor(private readonly registry: Registry) {}

  /**
   * The events `query` asks for, of the sandboxes `reader` may see. A sandbox named in the query
   * that is not the reader's (or that nobody knows) is SandboxNotFoundError, the same for both.
   */
  async list(reader: EventReader, query: EventQuery): Promise<SandboxEvent[]> {
    if (query.sandboxId !== undefined) await this.checkSandbox(reader, query.sandboxId);
    const owner = eventOwner(reader);
    return this.registry.listEvents({ ...query, ...(owner === undefined ? {} : { owner }) });
  }

  /**
   * Refuses a sandbox the reader may not read the events of, as one that does not exist: its row
   * names another owner, or it has no row (ended and forgotten) and no event of the reader's.
   */
  async checkSandbox(reader: EventReader, id: string): Promise<void> {
    const owner = eventOwner(reader);
    const row = await this.registry.getSandbox(id);
    if (row) {
      if (owner === undefined || row.owner === owner) return;
    } else {
      const known = await this.registry.listEvents({
        sandboxId: id,
        ...(owner === undefined ? {} : { owner }),
        limit: 1,
        order: 'asc',
      });
      if (known.length > 0) return;
    }
    throw new SandboxNotFoundError(`sandbox ${id} does not exist`);
  }

  /** The `seq` of the newest event the reader may read (0: none): where a follow from now starts. */
  async newestSeq(reader: EventReader): Promise<number> {
    const owner = eventOwner(reader);
    const [newest] = await this.registry.listEvents({
      ...(owner === undefined ? {} : { owner }),
      limit: 1,
      order: 'desc',
    });
    return newest?.seq ?? 0;
  }
}

/** A cursor (`seq`) given as `name`: a whole number, 0 or more. */
export function parseSeq(name: string, text: string | null): number | undefined {
  if (text === null || text === '') return undefined;
  const value = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(value)) {
    throw new InvalidArgumentError(
      `${name} must be an event's seq (a whole number, 0 or more), as the last page's cursor or the stream's id: gave '${text}'`,
    );
  }
  return value;
}

/** A time given as `name`: ms since the epoch, or an ISO 8601 time. */
export function parseTime(name: string, text: string | null): number | undefined {
  if (text === null || text === '') return undefined;
  if (/^\d+$/.test(text)) return Number(text);
  const at = Date.parse(text);
  if (Number.isNaN(at)) {
    throw new InvalidArgumentError(
      `${name} must be a time: milliseconds since the epoch or ISO 8601 (2026-01-02T03:04:05Z), not '${text}'`,
    );
  }
  return at;
}

/**
 * The event types of `values` (each repeated or a comma list), checked; empty: none asked.
 * `allowed` are the names a caller may ask for.
 */
export function parseTypes(
  name: string,
  values: string[],
  allowed: readonly string[] = EVENT_TYPES,
): string[] {
  const types = values.flatMap((value) => value.split(',')).filter((type) => type !== '');
  for (const type of types) {
    if (!isEventType(type) || !allowed.includes(type)) {
      throw new InvalidArgumentError(
        `${name} '${type}' is not an event type: give one or more of ${allowed.join(', ')}`,
      );
    }
  }
  return [...new Set(types)];
}

/** A page size given as `name`: a whole number from 1 to `max`, `fallback` when absent. */
export function parseLimit(name: string, text: string | null, fallback: number, max: number) {
  if (text === null || text === '') return fallback;
  const value = Number(text);
  if (!/^\d+$/.test(text) || value < 1 || value > max) {
    throw new InvalidArgumentError(
      `${name} must be a whole number from 1 to ${max}, not '${text}'`,
    );
  }
  return value;
}

/**
 * `GET /v1/events`' query as a read: `limit` (1-1000, default 100), `order` (`asc`, the default,
 * or `desc`, by seq), `cursor` (the last page's: events after it in `asc`, before it in `desc`),
 * `after` (events after this seq, either order), `sandbox`, `type` (repeated or a comma list),
 * `since` and `until` (ms since the epoch or ISO 8601; `since` included, `until` not).
 */
export function nativeEventQuery(query: URLSearchParams): EventQuery {
  const order = query.get('order') ?? 'asc';
  if (order !== 'asc' && order !== 'desc') {
    throw new InvalidArgumentError(`order must be asc or desc (by seq), not '${order}'`);
  }
  const limit = parseLimit('limit', query.get('limit'), DEFAULT_EVENTS_PAGE, MAX_EVENTS_PAGE);
  const cursor = parseSeq('cursor', query.get('cursor'));
  const after = parseSeq('after', query.get('after'));
  const since = parseTime('since', query.get('since'));
  const until = parseTime('until', query.get('until'));
  if (since !== undefined && until !== undefined && since > until) {
    throw new InvalidArgumentError(
      `since (${new Date(since).toISOString()}) is after until (${new Date(until).toISOString()}): give since <= until`,
    );
  }
  const types = parseTypes('type', query.getAll('type'));
  const sandbox = query.get('sandbox');
  let afterSeq = after;
  let beforeSeq: number | undefined;
  if (cursor !== undefined) {
    if (order === 'asc') afterSeq = Math.max(afterSeq ?? 0, cursor);
    else beforeSeq = cursor;
  }
  return {
    limit,
    order,
    ...(afterSeq === undefined ? {} : { afterSeq }),
    ...(beforeSeq === undefined ? {} : { beforeSeq }),
    ...(since === undefined ? {} : { since }),
    ...(until === undefined ? {} : { until }),
    ...(types.length > 0 ? { types } : {}),
    ...(sandbox ? { sandboxId: sandbox } : {}),
  };
}

/** An event as `/v1/events`, its stream, the SDK and the CLI show it. */
export function eventJson(event: SandboxEvent) {
  return {
    seq: event.seq,
    id: event.id,
    type: event.type,
    sandboxId: event.sandboxId,
    template: event.template,
    owner: event.owner,
    at: new Date(event.at).toISOString(),
    data: event.data,
  };
}

/** A page of `/v1/events`: the events, the cursor for the next page and whether there may be more. */
export function eventPage(events: SandboxEvent[], query: EventQuery) {
  const last = events.at(-1);
  return {
    events: events.map(eventJson),
    cursor: last ? last.seq : null,
    more: events.length === query.limit,
  };
}

/**
 * The types an E2B `/events/sandboxes` read asks for (`types`, each repeated), checked; none:
 * E2B's six, so abx's own types are shown there only when asked for by name.
 */
export function e2bEventTypes(values: string[]): string[] {
  const types = parseTypes('types', values);
  return types.length > 0 ? types : [...E2B_EVENT_TYPES];
}
