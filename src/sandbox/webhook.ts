import { WebhookNotFoundError } from '../errors.js';
import type { ConnectionOptions } from '../installation/daemon-connection.js';
import { openControl } from './sandbox-api.js';

/** A webhook as the control plane shows it: never its secret. */
export interface WebhookInfo {
  /** `whk_…`. */
  id: string;
  name: string;
  url: string;
  enabled: boolean;
  /** The event types it gets; empty: every type. */
  events: string[];
  /** `abx` (registered here: Standard Webhooks signatures) or `e2b` (E2B's payload and header). */
  flavour: 'abx' | 'e2b';
  /** ISO 8601. */
  createdAt: string;
  updatedAt: string;
  /** The key that owns it (null: the daemon's own key); shown to admin keys only. */
  owner?: string | null;
}

/** One delivery of a webhook's log. */
export interface WebhookDelivery {
  /** `whd_…`: the same on every attempt (the `abx-webhook-id` header); deduplicate on it. */
  id: string;
  /** `event`: a lifecycle event; `test`: a `webhook.test` event sent by {@link Webhook.test}. */
  kind: 'event' | 'test';
  /** The event's seq (null for a test). */
  eventSeq: number | null;
  /** The sandbox whose event it is ('' for a test). */
  sandboxId: string;
  state: 'pending' | 'delivered' | 'failed';
  attempts: number;
  lastStatus: number | null;
  lastError: string | null;
  createdAt: string;
  /** When it is tried again (pending only). */
  nextAttemptAt: string | null;
  deliveredAt: string | null;
}

/** What a webhook is made or changed with. */
export interface WebhookOptions {
  name?: string;
  enabled?: boolean;
  /** Event types (`sandbox.lifecycle.created`...); empty or left out: every type. */
  events?: string[];
  /** 8 to 1024 characters; left out at create: abx makes one (`whsec_…`), answered once. */
  secret?: string;
}

const hookPath = (id: string) => `/v1/webhooks/${encodeURIComponent(id)}`;

/**
 * Webhooks (docs/events.md, Webhooks): the lifecycle events of the caller's key's sandboxes,
 * POSTed to a URL as they happen, signed, retried with backoff for up to a day. Check each
 * delivery with {@link verifyWebhook} and deduplicate on its `deliveryId`.
 *
 * @example
 * const { secret } = await Webhook.create('https://example.com/abx', { events: ['sandbox.lifecycle.killed'] });
 * // in the receiver: verifyWebhook(secret, req.headers, rawBody)
 */
export class Webhook {
  private constructor() {}

  /** Registers a webhook; `secret` is in the answer only when abx made it (this once). */
  static async create(
    url: string,
    options: ConnectionOptions & WebhookOptions = {},
  ): Promise<WebhookInfo & { secret?: string }> {
    const { name, enabled, events, secret, ...connection } = options;
    const { client } = await openControl(connection);
    return client.json('POST', '/v1/webhooks', {
      body: { url, ...defined({ name, enabled, events, secret }) },
    });
  }

  /** Changes a webhook; what is left out is kept. WebhookNotFoundError for none (or another key's). */
  static async update(
    id: string,
    options: ConnectionOptions & WebhookOptions & { url?: string },
  ): Promise<WebhookInfo> {
    const { name, enabled, events, secret, url, ...connection } = options;
    const { client } = await openControl(connection);
    return client.json('PATCH', hookPath(id), {
      body: defined({ url, name, enabled, events, secret }),
    });
  }

  static async getInfo(id: string, options: ConnectionOptions = {}): Promise<WebhookInfo> {
    const { client } = await openControl(options);
    return client.json('GET', hookPath(id));
  }

  /** The caller's webhooks (an admin key's: every key's), oldest first. */
  static async list(options: ConnectionOptions = {}): Promise<WebhookInfo[]> {
    const { client } = await openControl(options);
    return (await client.json<{ webhooks: WebhookInfo[] }>('GET', '/v1/webhooks')).webhooks;
  }

  /** A webhook's delivery log, newest event first (`limit`: 1 to 500, default 100). */
  static async deliveries(
    id: string,
    options: ConnectionOptions & { limit?: number } = {},
  ): Promise<WebhookDelivery[]> {
    const { limit, ...connection } = options;
    const { client } = await openControl(connection);
    const query = limit === undefined ? '' : `?limit=${limit}`;
    return (
      await client.json<{ deliveries: WebhookDelivery[] }>(
        'GET',
        `${hookPath(id)}/deliveries${query}`,
      )
    ).deliveries;
  }

  /** One delivery of a webhook's log; WebhookNotFoundError for none (or another webhook's). */
  static async getDelivery(
    id: string,
    deliveryId: string,
    options: ConnectionOptions = {},
  ): Promise<WebhookDelivery> {
    const { client } = await openControl(options);
    return client.json('GET', `${hookPath(id)}/deliveries/${encodeURIComponent(deliveryId)}`);
  }

  /**
   * Sends this webhook alone a `webhook.test` event (no sandbox changed), signed as its other
   * deliveries and tried once; resolves to the queued delivery (pending). Wait for its outcome
   * with {@link Webhook.waitForDelivery}. InvalidArgumentError (`webhook_disabled`) when disabled.
   */
  static async test(id: string, options: ConnectionOptions = {}): Promise<WebhookDelivery> {
    const { client } = await openControl(options);
    return client.json('POST', `${hookPath(id)}/test`);
  }

  /**
   * Queues a delivered or failed delivery again: the same delivery id and event (a receiver
   * deduplicates it), its attempts started anew. InvalidArgumentError while it is still pending
   * (`delivery_pending`), for a disabled webhook (`webhook_disabled`) or a purged event
   * (`event_purged`); WebhookNotFoundError for an unknown (or another key's) webhook or delivery.
   */
  static async redeliver(
    id: string,
    deliveryId: string,
    options: ConnectionOptions = {},
  ): Promise<WebhookDelivery> {
    const { client } = await openControl(options);
    return client.json(
      'POST',
      `${hookPath(id)}/deliveries/${encodeURIComponent(deliveryId)}/redeliver`,
    );
  }

  /**
   * Reads a delivery every `intervalMs` (500) until it is no longer pending or `timeoutMs`
   * (30 000) has passed; resolves to its last reading either way (state `pending` when it timed out).
   */
  static async waitForDelivery(
    id: string,
    deliveryId: string,
    options: ConnectionOptions & { timeoutMs?: number; intervalMs?: number } = {},
  ): Promise<WebhookDelivery> {
    const { timeoutMs = 30_000, intervalMs = 500, ...connection } = options;
    const until = Date.now() + timeoutMs;
    for (;;) {
      const delivery = await Webhook.getDelivery(id, deliveryId, connection);
      if (delivery.state !== 'pending' || Date.now() >= until) return delivery;
      await new Promise((resolve) =>
        setTimeout(resolve, Math.min(intervalMs, Math.max(0, until - Date.now()))),
      );
    }
  }

  /** Removes a webhook and its log; false when there was none. */
  static async destroy(id: string, options: ConnectionOptions = {}): Promise<boolean> {
    const { client } = await openControl(options);
    try {
      return (await client.json<{ removed: boolean }>('DELETE', hookPath(id))).removed;
    } catch (error) {
      if (error instanceof WebhookNotFoundError) return false;
      throw error;
    }
  }
}

function defined(fields: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== undefined));
}
