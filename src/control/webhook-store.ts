/**
 * Webhooks as the registry keeps them (migration 8): one row per webhook, with `cursor`, the last
 * lifecycle event (events.seq) fanned out to it, and one row per delivery, written once per
 * (webhook, event) by the fan-out in the same transaction that moves the cursor. Deliveries are
 * rows, not memory: a daemon that stops or is SIGKILLed mid-delivery leaves the row pending,
 * and it is sent again (same id) once its claim's lease ends. Both stores implement
 * {@link WebhookStore}: SQLite (one daemon) and PostgreSQL (claims with `FOR UPDATE SKIP
 * LOCKED`, so replicas on one database deliver each row once).
 */
import { createHash, randomBytes, randomInt } from 'node:crypto';
import { E2B_EVENT_TYPES, type SandboxEvent } from './events.js';

/** Which wire a webhook was registered through, and so how its deliveries are shaped and signed. */
export type WebhookFlavour = 'e2b' | 'abx';

/** A webhook's signing secret as the registry keeps it: sealed (secret-crypto.ts). */
export interface SealedWebhookSecret {
  sealed: string;
  /** Which key sealed it (secret-crypto.ts keyCheck). */
  keyCheck: string;
  /** One more at each change of the secret (part of what the sealed value is bound to). */
  version: number;
}

export interface WebhookRecord {
  /** `whk_` and 20 hex digits. */
  id: string;
  /** The API key id that registered it; null for the daemon's own key. */
  owner: string | null;
  flavour: WebhookFlavour;
  name: string;
  url: string;
  enabled: boolean;
  /** Event types delivered; empty: every type. */
  events: string[];
  secret: SealedWebhookSecret;
  /** The last events.seq fanned out to it (set to the newest at create: no history is sent). */
  cursor: number;
  createdAt: number;
  updatedAt: number;
}

/** What a webhook's update changes (absent: kept). */
export interface WebhookChange {
  name?: string;
  url?: string;
  enabled?: boolean;
  events?: string[];
  secret?: SealedWebhookSecret;
  at: number;
}

export type DeliveryState = 'pending' | 'delivered' | 'failed';

export interface DeliveryRecord {
  /** `whd_` and 24 hex digits: the same on every attempt (what a receiver deduplicates on). */
  id: string;
  webhookId: string;
  eventSeq: number;
  sandboxId: string;
  state: DeliveryState;
  /** Attempts started (counted at each claim, so one a SIGKILL cut short counts too). */
  attempts: number;
  nextAttemptAt: number;
  /** While an attempt runs: until when its daemon holds it (after that, another may retry). */
  claimedUntil: number | null;
  /** The receiver's last HTTP status; null when it gave none (refused, timed out...). */
  lastStatus: number | null;
  lastError: string | null;
  createdAt: number;
  deliveredAt: number | null;
}

/** A lifecycle event as a delivery carries it (a row of the events table, events.ts). */
export type WebhookEvent = SandboxEvent;

/** A claimed delivery with what sending it needs; `event` is undefined when it was purged. */
export interface ClaimedDelivery {
  delivery: DeliveryRecord;
  webhook: WebhookRecord;
  event: WebhookEvent | undefined;
}

/** How an attempt ended. */
export type DeliveryOutcome =
  | { state: 'delivered'; status: number; at: number }
  | { state: 'pending'; status: number | null; error: string; nextAttemptAt: number }
  | { state: 'failed'; status: number | null; error: string };

export interface WebhookStore {
  /**
   * Records a webhook; its cursor is set to the newest event's seq in the same statement, so it
   * gets what happens from now on.
   */
  insertWebhook(record: Omit<WebhookRecord, 'cursor'>): Promise<WebhookRecord>;
  getWebhook(id: string): Promise<WebhookRecord | undefined>;
  /** The webhooks of `owner` (null: the daemon's own key), oldest first; every one without. */
  listWebhooks(owner?: string | null): Promise<WebhookRecord[]>;
  /** The webhook as changed; undefined when it is gone. */
  updateWebhook(id: string, change: WebhookChange): Promise<WebhookRecord | undefined>;
  /** Removes a webhook and its deliveries; false when it was gone. */
  removeWebhook(id: string): Promise<boolean>;
  /** A webhook's deliveries, newest event first. */
  listDeliveries(webhookId: string, limit: number): Promise<DeliveryRecord[]>;
  /**
   * Writes a delivery row for each event after each webhook's cursor that it takes (its owner's
   * sandboxes' events, of its types, while enabled) and moves the cursor past them, in one
   * transaction per webhook (up to `batch` events each); PostgreSQL skips a webhook another
   * daemon is fanning out. Resolves to the rows written.
   */
  fanOut(now: number, batch: number): Promise<number>;
  /**
   * Claims up to `limit` due deliveries (pending, time come, not held by a live claim, of an
   * enabled webhook, and the oldest pending one of its sandbox for its webhook: in order per
   * sandbox) until `now + leaseMs`, counting an attempt each.
   */
  claimDue(now: number, leaseMs: number, limit: number): Promise<ClaimedDelivery[]>;
  /** Records how an attempt ended (pending again with its next time, delivered, or failed). */
  finishDelivery(id: string, outcome: DeliveryOutcome): Promise<void>;
  /** Removes delivered and failed rows created before `before`; the number removed. */
  purgeDeliveries(before: number): Promise<number>;
  /** One delivery of `webhookId`'s log; undefined for none (or one of another webhook). */
  getDelivery(webhookId: string, id: string): Promise<DeliveryRecord | undefined>;
  /**
   * Queues a test delivery to one webhook (POST /v1/webhooks/{id}/test): a pending row whose
   * event_seq is {@link testSeq} (negative: no event has it) and whose sandbox is '' (tests wait
   * behind no sandbox's events). Undefined, writing nothing, when the webhook has
   * {@link TEST_PENDING_MAX} tests pending already.
   */
  insertTestDelivery(webhookId: string, now: number): Promise<DeliveryRecord | undefined>;
  /**
   * Queues a finished (delivered or failed) delivery again, same id and event, as new: pending
   * from `now`, no attempts, no last status or error, `createdAt` now (its retry window starts
   * again). Undefined when it is not finished, is gone, or its event was purged (a test's never is).
   */
  restartDelivery(webhookId: string, id: string, now: number): Promise<DeliveryRecord | undefined>;
  /**
   * Calls `listener` soon after an event is written to the registry: by this daemon (SQLite), or
   * by any daemon sharing it (PostgreSQL: LISTEN/NOTIFY). Best effort: the dispatcher still
   * polls. The function returned stops it.
   */
  onEventWritten?(listener: () => void): () => Promise<void>;
}

/** Test deliveries one webhook may have pending at once (more are refused: 429). */
export const TEST_PENDING_MAX = 5;

/** The type of a test delivery's event (POST /v1/webhooks/{id}/test): no sandbox changed. */
export const TEST_EVENT_TYPE = 'webhook.test';

/**
 * A test delivery's event_seq: negative (no lifecycle event has one), growing with `now` so a
 * webhook's tests are sent in the order they were asked for; unique per webhook in practice
 * (a millisecond and a random thousandth), and the (webhook, event_seq) key refuses a clash.
 */
export function testSeq(now: number): number {
  return now * 1000 + randomInt(1000) - 2 ** 52;
}

export const isTestDelivery = (delivery: DeliveryRecord): boolean => delivery.eventSeq < 0;

/**
 * The event a test delivery carries, made from its row: the same every attempt and every
 * redelivery (its `id` is derived from the delivery's, so a receiver deduplicates it too).
 */
export function testEventOf(delivery: DeliveryRecord, webhook: WebhookRecord): WebhookEvent {
  const hex = createHash('sha256').update(delivery.id).digest('hex');
  const id = `${hex.slice(0, 8)}-${hex.slice(8, 12)}-4${hex.slice(13, 16)}-a${hex.slice(17, 20)}-${hex.slice(20, 32)}`;
  return {
    seq: delivery.eventSeq,
    id,
    at: delivery.createdAt,
    sandboxId: '',
    owner: webhook.owner,
    template: '',
    type: TEST_EVENT_TYPE as WebhookEvent['type'],
    data: {
      test: true,
      webhookId: webhook.id,
      message: 'a test delivery (abx webhook test); no sandbox changed',
    },
  };
}

/** The newest event's seq (0 when there is none): a new webhook's cursor. */
export const NEWEST_SEQ = 'COALESCE((SELECT MAX(seq) FROM events), 0)';

/** A new delivery's id: `whd_` and 24 hex digits. */
export function newDeliveryId(): string {
  return `whd_${randomBytes(12).toString('hex')}`;
}

/**
 * Whether a webhook takes an event of `type`: one of its `events`, or with none listed, every type
 * (a webhook registered through E2B's face: E2B's types only, as E2B's routes show them).
 */
export function takes(webhook: WebhookRecord, type: string): boolean {
  if (webhook.events.length > 0) return webhook.events.includes(type);
  return webhook.flavour !== 'e2b' || (E2B_EVENT_TYPES as readonly string[]).includes(type);
}
