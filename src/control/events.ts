import { createHash, randomUUID } from 'node:crypto';
import { envMilliseconds } from '../util/env-ms.js';

/**
 * Lifecycle events of sandboxes: one row per change of a sandbox's state, written by the registry
 * in the same transaction as the change (a change that fails leaves no event), kept for
 * {@link eventsRetentionMs} and read by `/v1/events`, E2B's `/events/sandboxes`, the SDK, the CLI
 * and the dashboard. `seq` orders them and is every reader's cursor: a row with a higher `seq`
 * committed after every row with a lower one (PostgreSQL takes {@link EVENTS_LOCK} before each
 * insert), so a reader that follows `seq > cursor` never misses one.
 */

/** E2B's lifecycle event types (its OpenAPI spec's `SandboxEvent.type` and webhook `events`). */
export const E2B_EVENT_TYPES = [
  'sandbox.lifecycle.created',
  'sandbox.lifecycle.updated',
  'sandbox.lifecycle.paused',
  'sandbox.lifecycle.resumed',
  'sandbox.lifecycle.killed',
  'sandbox.lifecycle.checkpointed',
] as const;

/**
 * abx's own types, in E2B's style: a sandbox that failed to start (it never ran; no row is left)
 * and one whose timeout is near. E2B's routes show them only when asked for by type.
 */
export const ABX_EVENT_TYPES = ['sandbox.lifecycle.failed', 'sandbox.lifecycle.expiring'] as const;

export const EVENT_TYPES = [...E2B_EVENT_TYPES, ...ABX_EVENT_TYPES] as const;

export type SandboxEventType = (typeof EVENT_TYPES)[number];

export function isEventType(type: string): type is SandboxEventType {
  return (EVENT_TYPES as readonly string[]).includes(type);
}

/** One lifecycle event as the registry keeps it. */
export interface SandboxEvent {
  /** The order of commits, from 1: the readers' cursor (`after`, SSE `id:`, `Last-Event-ID`). */
  seq: number;
  /** A UUID: what a receiver deduplicates on (E2B's event id is one). */
  id: string;
  /** When it happened, in ms since the epoch. */
  at: number;
  sandboxId: string;
  /** The API key id that owns the sandbox; null for the daemon's own key. */
  owner: string | null;
  template: string;
  type: SandboxEventType;
  /**
   * What changed, as JSON: abx's finer reason (`killed`: `reason` `api`|`expired`|`oom`|`dead`;
   * `paused`: `kind` `memory`|`disk`; `updated`: `timeout` with `endAt`, or `network`...).
   */
  data: Record<string, unknown>;
}

/** An event to append: everything but `seq`, which the store assigns. */
export type NewSandboxEvent = Omit<SandboxEvent, 'seq'>;

/**
 * An event that goes with a change of one sandbox's row: the store fills in the sandbox's id,
 * owner and template from the row it changes (so the event is written only when the row is).
 */
export interface EventDraft {
  type: SandboxEventType;
  data?: Record<string, unknown>;
  /** Default: now. */
  at?: number;
  /** Default: a new UUID. */
  id?: string;
}

/** What `listEvents` reads. */
export interface EventFilter {
  /** Only this key's sandboxes' events (null: the daemon's own key); undefined: every owner's. */
  owner?: string | null;
  sandboxId?: string;
  /** Any of these types; undefined or empty: every type. */
  types?: readonly string[];
  /** Only `seq` greater than this (the cursor). */
  afterSeq?: number;
  /** Only `seq` less than this (a cursor read newest first). */
  beforeSeq?: number;
  /** Only `at` at or after this (ms since the epoch). */
  since?: number;
  /** Only `at` before this. */
  until?: number;
  limit: number;
  /** By `seq`. */
  order: 'asc' | 'desc';
  /** Rows skipped first (E2B's `offset`). */
  offset?: number;
}

/** How long events are kept by default: 7 days, as E2B's. */
export const EVENTS_RETENTION_MS = 7 * 24 * 3600 * 1000;

/** How long events are kept (`ABX_EVENTS_RETENTION_MS`, a minute or more); the reaper purges older. */
export function eventsRetentionMs(env: NodeJS.ProcessEnv = process.env): number {
  return envMilliseconds('ABX_EVENTS_RETENTION_MS', EVENTS_RETENTION_MS, 60_000, env);
}

/**
 * The PostgreSQL advisory lock every event insert takes first in its transaction: inserts line
 * up, so `seq` (taken inside the lock) grows in commit order.
 */
export const EVENTS_LOCK = 0x61627865; // "abxe"

/**
 * The PostgreSQL channel each event insert NOTIFYs (delivered at its commit, to every daemon
 * LISTENing on the database, itself included): deliveries wake on another replica's events too.
 */
export const EVENTS_CHANNEL = 'abx_events';

/** A whole event from a draft and the sandbox it is about. */
export function eventFor(
  sandbox: { id: string; owner: string | null; template: string },
  draft: EventDraft,
): NewSandboxEvent {
  return {
    id: draft.id ?? randomUUID(),
    at: draft.at ?? Date.now(),
    sandboxId: sandbox.id,
    owner: sandbox.owner,
    template: sandbox.template,
    type: draft.type,
    data: draft.data ?? {},
  };
}

/**
 * The `data` of a `killed` event: abx's reason (`api`: a kill asked for; `expired`: its timeout;
 * `oom`: the kernel's OOM killer; `dead`: its processes ended by themselves; `revoked`: its key
 * was revoked; `failed`: a create or fork that could not finish), its end state and the
 * registry's end reason text.
 */
export function killedData(
  state: 'killed' | 'expired' | 'dead',
  endReason: string,
): Record<string, unknown> {
  let reason: string;
  if (state === 'expired') reason = 'expired';
  else if (state === 'dead') reason = endReason === 'oom' ? 'oom' : 'dead';
  else if (/revoked/.test(endReason)) reason = 'revoked';
  else if (/fail|could not/.test(endReason)) reason = 'failed';
  else reason = 'api';
  return { reason, state, endReason };
}

/**
 * Who is told that an event was written: the webhook dispatcher, which then looks for deliveries
 * at once instead of at its next poll. {@link signal} is called where an event is inserted; the
 * listeners run on a later turn of the event loop (after the insert's transaction committed: the
 * SQLite registry's are synchronous), once for however many signals came meanwhile. A signal of a
 * transaction that then rolled back only costs a look that finds nothing.
 */
export class EventWakes {
  private readonly listeners = new Set<() => void>();
  private pending = false;

  /** Calls `listener` after event writes; the function returned stops that. */
  on(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => {
      this.listeners.delete(listener);
    };
  }

  /** Whether nobody listens. */
  idle(): boolean {
    return this.listeners.size === 0;
  }

  /** An event was written (or is about to commit). */
  signal(): void {
    if (this.pending || this.listeners.size === 0) return;
    this.pending = true;
    setImmediate(() => {
      this.pending = false;
      for (const listener of this.listeners) listener();
    });
  }
}

/** How long before its timeout a running sandbox gets its `expiring` event, by default. */
export const EXPIRING_LEAD_MS = 60_000;

/**
 * How long before its timeout a running sandbox gets its `expiring` event
 * (`ABX_EVENTS_EXPIRING_LEAD_MS`; 0: never).
 */
export function expiringLeadMs(env: NodeJS.ProcessEnv = process.env): number {
  return envMilliseconds('ABX_EVENTS_EXPIRING_LEAD_MS', EXPIRING_LEAD_MS, 0, env);
}

/**
 * The id of a sandbox's `expiring` event for one expiry: a UUID made from the two, so the event
 * is written once per sandbox and expiry, by whichever daemon's reaper comes first.
 */
export function expiringEventId(sandboxId: string, expiresAt: number): string {
  const hex = createHash('sha256').update(`expiring:${sandboxId}:${expiresAt}`).digest('hex');
  // RFC 9562 version 8 (custom) and variant bits.
  return [
    hex.slice(0, 8),
    hex.slice(8, 12),
    `8${hex.slice(13, 16)}`,
    ((Number.parseInt(hex.slice(16, 17), 16) & 0x3) | 0x8).toString(16) + hex.slice(17, 20),
    hex.slice(20, 32),
  ].join('-');
}
