/**
 * `GET /v2/sandboxes` and `GET /sandboxes`: the query E2B's SDK sends (`metadata`, `state`,
 * `limit`, `nextToken`, `order`) and its paging, where the next page's token travels in the
 * `X-Next-Token` header and no header means the last page.
 */
import { InvalidArgumentError } from '../../errors.js';
import type { E2bListedState } from './backend.js';

/** E2B's page size: 100 by default and at most. */
export const MAX_PAGE = 100;

export interface ListQuery {
  metadata: Record<string, string>;
  /** The states asked for (`state=running,paused`); both when the query names none. */
  states: E2bListedState[];
  limit: number;
  order: 'asc' | 'desc';
  /** Where the page starts: after this sandbox in the order. */
  after: { createdAt: number; id: string } | undefined;
  /** `startedAfter`: only sandboxes started at or after this time (ms since the epoch). */
  startedAfter: number | undefined;
  /** `template`: only sandboxes of this template. */
  template: string | undefined;
}

const STATES: readonly E2bListedState[] = ['running', 'paused'];

/**
 * `metadata` is one parameter holding `k=v&k2=v2`, each key and value percent-encoded before the
 * pairs were joined (what the SDK's URLSearchParams of encoded pairs gives): decoded twice.
 */
function parseMetadata(value: string | null): Record<string, string> {
  const pairs: [string, string][] = [];
  if (!value) return {};
  for (const [key, item] of new URLSearchParams(value)) {
    try {
      pairs.push([decodeURIComponent(key), decodeURIComponent(item)]);
    } catch {
      throw new InvalidArgumentError(
        `metadata holds ${JSON.stringify(`${key}=${item}`)}, which is not valid percent-encoding; send metadata=<urlencoded key=value&…>`,
      );
    }
  }
  // fromEntries makes every key an own property, `__proto__` included (an assignment would not).
  return Object.fromEntries(pairs);
}

export function parseListQuery(query: URLSearchParams): ListQuery {
  const states = query
    .getAll('state')
    .flatMap((value) => value.split(','))
    .filter(Boolean);
  for (const state of states) {
    if (!STATES.includes(state as E2bListedState)) {
      throw new InvalidArgumentError(
        `state must be running or paused (comma-separated), not ${JSON.stringify(state)}`,
      );
    }
  }
  const limitText = query.get('limit');
  const limit = limitText === null ? MAX_PAGE : Number(limitText);
  if (
    !/^\d+$/.test(limitText ?? '0') ||
    !Number.isInteger(limit) ||
    limit < 1 ||
    limit > MAX_PAGE
  ) {
    throw new InvalidArgumentError(
      `limit must be a whole number from 1 to ${MAX_PAGE}, not ${JSON.stringify(limitText)}`,
    );
  }
  const order = query.get('order') ?? 'desc';
  if (order !== 'asc' && order !== 'desc') {
    throw new InvalidArgumentError(`order must be asc or desc, not ${JSON.stringify(order)}`);
  }
  const token = query.get('nextToken');
  const startedText = query.get('startedAfter');
  const startedAfter = startedText === null ? undefined : Date.parse(startedText);
  if (startedAfter !== undefined && !Number.isFinite(startedAfter)) {
    throw new InvalidArgumentError(
      `startedAfter must be a time such as 2026-01-31T12:00:00Z, not ${JSON.stringify(startedText?.slice(0, 100))}`,
    );
  }
  const template = query.get('template') || undefined;
  return {
    startedAfter,
    template,
    metadata: parseMetadata(query.get('metadata')),
    states: STATES.filter((state) => states.length === 0 || states.includes(state)),
    limit,
    order,
    after: token ? decodeToken(token) : undefined,
  };
}

function encodeToken(row: { createdAt: number; id: string }): string {
  return Buffer.from(JSON.stringify([row.createdAt, row.id])).toString('base64url');
}

function decodeToken(token: string): { createdAt: number; id: string } {
  try {
    const [createdAt, id] = JSON.parse(Buffer.from(token, 'base64url').toString('utf8'));
    if (Number.isSafeInteger(createdAt) && typeof id === 'string') return { createdAt, id };
  } catch {
    // refused below
  }
  throw new InvalidArgumentError(
    `nextToken ${JSON.stringify(token)} is not a token this API gave: pass the X-Next-Token header of the previous page as is`,
  );
}

/** One page of `rows` (in any order) and the token of the next, if there is a next. */
export function page<T extends { createdAt: number; id: string }>(
  rows: T[],
  query: Pick<ListQuery, 'order' | 'after' | 'limit'>,
): { items: T[]; nextToken: string | undefined } {
  const sign = query.order === 'asc' ? 1 : -1;
  const compare = (a: { createdAt: number; id: string }, b: { createdAt: number; id: string }) =>
    sign * (a.createdAt - b.createdAt || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const sorted = [...rows].sort(compare);
  const { after } = query;
  const rest = after ? sorted.filter((row) => compare(row, after) > 0) : sorted;
  const items = rest.slice(0, query.limit);
  const last = items.at(-1);
  return {
    items,
    nextToken: rest.length > items.length && last ? encodeToken(last) : undefined,
  };
}
