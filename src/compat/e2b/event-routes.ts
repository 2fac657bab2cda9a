/**
 * E2B's lifecycle events on abx's (docs/events.md): `GET /events/sandboxes` (the key's sandboxes'
 * events; an admin key: all) and `GET /events/sandboxes/{sandboxID}` (another key's sandbox: 404
 * as an unknown one), with E2B's `offset`, `limit` (1-100, default 10), `orderAsc` (default
 * false: newest first) and `types` (repeated; default E2B's six types), in E2B's `SandboxEvent`
 * shape.
 */
import { InvalidArgumentError } from '../../errors.js';
import type { E2bBackend, E2bCaller, E2bEvent, E2bEventQuery } from './backend.js';

export interface EventCall {
  params: Record<string, string>;
  query: URLSearchParams;
  caller: E2bCaller;
  backend: E2bBackend;
}

/** E2B's page sizes of `/events/sandboxes` (its API's default and maximum). */
export const E2B_DEFAULT_EVENTS_PAGE = 10;
export const E2B_MAX_EVENTS_PAGE = 100;

/** A whole number query parameter from `least` to `most`, `fallback` when absent. */
function wholeNumber(
  query: URLSearchParams,
  name: string,
  fallback: number,
  least: number,
  most: number,
): number {
  const text = query.get(name);
  if (text === null || text === '') return fallback;
  const value = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(value) || value < least || value > most) {
    throw new InvalidArgumentError(
      `${name} must be a whole number from ${least} to ${most}, not '${text}'`,
    );
  }
  return value;
}

/** E2B's query of a read, checked (the types are checked by the backend, which knows them). */
export function eventQuery(query: URLSearchParams): E2bEventQuery {
  const orderAsc = query.get('orderAsc');
  if (orderAsc !== null && orderAsc !== 'true' && orderAsc !== 'false') {
    throw new InvalidArgumentError(`orderAsc must be true or false, not '${orderAsc}'`);
  }
  return {
    offset: wholeNumber(query, 'offset', 0, 0, Number.MAX_SAFE_INTEGER),
    limit: wholeNumber(query, 'limit', E2B_DEFAULT_EVENTS_PAGE, 1, E2B_MAX_EVENTS_PAGE),
    orderAsc: orderAsc === 'true',
    types: query.getAll('types'),
  };
}

/**
 * An event in E2B's `SandboxEvent` shape: `sandboxTeamId` is the owning key's id (`''` for the
 * daemon's own key), `sandboxTemplateId` its template, `sandboxBuildId` the template too (abx has
 * no build ids) and `sandboxExecutionId` the sandbox id (one run per id); `eventData` is abx's
 * `data` (null when empty).
 */
export function e2bEventJson(event: E2bEvent) {
  return {
    version: 'v1',
    id: event.id,
    type: event.type,
    eventData: Object.keys(event.data).length > 0 ? event.data : null,
    sandboxBuildId: event.template,
    sandboxExecutionId: event.sandboxId,
    sandboxId: event.sandboxId,
    sandboxTeamId: event.owner ?? '',
    sandboxTemplateId: event.template,
    timestamp: new Date(event.at).toISOString(),
  };
}

export async function listEvents(call: EventCall): Promise<{ status: number; body: unknown }> {
  const events = await call.backend.listEvents(eventQuery(call.query), call.caller);
  return { status: 200, body: events.map(e2bEventJson) };
}

export async function sandboxEvents(call: EventCall): Promise<{ status: number; body: unknown }> {
  const query = { ...eventQuery(call.query), sandboxId: call.params.id as string };
  const events = await call.backend.listEvents(query, call.caller);
  return { status: 200, body: events.map(e2bEventJson) };
}
