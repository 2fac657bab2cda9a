/**
 * Webhooks of API keys (docs/events.md, Webhooks): registered through `/v1/webhooks` (abx's
 * flavour: Standard Webhooks signatures) or E2B's `/events/webhooks` (E2B's flavour: its payload
 * and `e2b-signature`). A webhook gets the lifecycle events of its own key's sandboxes only (an
 * admin key's webhook too: like E2B's per-team webhooks, it is not a feed of every key). Its
 * signing secret is write-only: sealed at rest (secret-crypto.ts), never answered, except once
 * in the create's answer when abx generated it.
 */
import { randomBytes } from 'node:crypto';
import type { EgressRules } from '../egress/policy.js';
import { InvalidArgumentError, LimitExceededError, WebhookNotFoundError } from '../errors.js';
import { EVENT_TYPES, isEventType } from './events.js';
import type { Caller } from './key-service.js';
import type { Registry } from './registry.js';
import { openSecret, type SecretsKey, sealSecret } from './secret-crypto.js';
import {
  type DeliveryRecord,
  isTestDelivery,
  type SealedWebhookSecret,
  TEST_EVENT_TYPE,
  TEST_PENDING_MAX,
  type WebhookChange,
  type WebhookFlavour,
  type WebhookRecord,
} from './webhook-store.js';
import { checkWebhookUrl, parseWebhookUrl } from './webhook-url.js';

/** Webhooks one key may have. */
export const WEBHOOKS_PER_KEY = 50;
/** A webhook's name: 1 to this many characters. */
export const WEBHOOK_NAME_MAX = 128;
/** A signing secret given by the caller: this many characters at least, and at most 1024. */
export const WEBHOOK_SECRET_MIN = 8;

/**
 * Who may see, change and remove a webhook: the key that registered it, and admin keys. Anyone
 * else is answered as for an unknown id (404), so ids of other keys' webhooks are not learned.
 */
export function mayReachWebhook(caller: Caller, webhook: WebhookRecord): boolean {
  return caller.admin || webhook.owner === caller.keyId;
}

/** What a create or update asks for, read from either face's body. */
export interface WebhookRequest {
  name?: unknown;
  url?: unknown;
  enabled?: unknown;
  events?: unknown;
  /** abx's field; E2B's is `signatureSecret`. */
  secret?: unknown;
  signatureSecret?: unknown;
}

/** A webhook as abx's API answers it: never its secret. */
export function webhookJson(webhook: WebhookRecord, admin: boolean) {
  return {
    id: webhook.id,
    name: webhook.name,
    url: webhook.url,
    enabled: webhook.enabled,
    events: webhook.events,
    flavour: webhook.flavour,
    createdAt: new Date(webhook.createdAt).toISOString(),
    updatedAt: new Date(webhook.updatedAt).toISOString(),
    ...(admin ? { owner: webhook.owner } : {}),
  };
}

/** One delivery of the log. */
export function deliveryJson(delivery: DeliveryRecord) {
  const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());
  const test = isTestDelivery(delivery);
  return {
    id: delivery.id,
    /** `event` (a lifecycle event) or `test` (POST /v1/webhooks/{id}/test: a webhook.test event). */
    kind: test ? 'test' : 'event',
    eventSeq: test ? null : delivery.eventSeq,
    sandboxId: delivery.sandboxId,
    state: delivery.state,
    attempts: delivery.attempts,
    lastStatus: delivery.lastStatus,
    lastError: delivery.lastError,
    createdAt: iso(delivery.createdAt),
    nextAttemptAt: delivery.state === 'pending' ? iso(delivery.nextAttemptAt) : null,
    deliveredAt: iso(delivery.deliveredAt),
  };
}

const sealedFor = (id: string, version: number) => ({ id, name: 'webhook-signature', version });

export class WebhookService {
  constructor(
    private readonly registry: Registry,
    private readonly key: SecretsKey,
    private readonly rules: () => EgressRules,
  ) {}

  /** Registers a webhook; `secret` is set only when abx generated it (shown this once). */
  async create(
    caller: Caller,
    request: WebhookRequest,
    flavour: WebhookFlavour,
  ): Promise<{ webhook: WebhookRecord; secret?: string }> {
    const fields = await this.read(request, flavour, true);
    const mine = await this.registry.webhooks.listWebhooks(caller.keyId);
    if (mine.length >= WEBHOOKS_PER_KEY) {
      throw new LimitExceededError(
        `this key has ${mine.length} webhooks, the most a key may have (${WEBHOOKS_PER_KEY}); remove one first`,
        { code: 'webhook_limit' },
      );
    }
    const id = `whk_${randomBytes(10).toString('hex')}`;
    const given = fields.secret;
    const secret = given ?? `whsec_${randomBytes(24).toString('base64')}`;
    const now = Date.now();
    const webhook = await this.registry.webhooks.insertWebhook({
      id,
      owner: caller.keyId,
      flavour,
      name: fields.name ?? new URL(fields.url as string).host,
      url: fields.url as string,
      enabled: fields.enabled ?? true,
      events: fields.events ?? [],
      secret: this.seal(id, 1, secret),
      createdAt: now,
      updatedAt: now,
    });
    return given === undefined ? { webhook, secret } : { webhook };
  }

  async list(caller: Caller): Promise<WebhookRecord[]> {
    return this.registry.webhooks.listWebhooks(caller.admin ? undefined : caller.keyId);
  }

  /** One webhook the caller may reach; WebhookNotFoundError otherwise (another key's too). */
  async get(caller: Caller, id: string): Promise<WebhookRecord> {
    const webhook = await this.registry.webhooks.getWebhook(id);
    if (!webhook || !mayReachWebhook(caller, webhook)) {
      throw new WebhookNotFoundError(
        `no webhook ${JSON.stringify(id.slice(0, 100))} among this key's webhooks; see abx webhook list`,
      );
    }
    return webhook;
  }

  async update(caller: Caller, id: string, request: WebhookRequest): Promise<WebhookRecord> {
    const webhook = await this.get(caller, id);
    const fields = await this.read(request, webhook.flavour, false);
    const change: WebhookChange = { at: Date.now() };
    if (fields.name !== undefined) change.name = fields.name;
    if (fields.url !== undefined) change.url = fields.url;
    if (fields.enabled !== undefined) change.enabled = fields.enabled;
    if (fields.events !== undefined) change.events = fields.events;
    if (fields.secret !== undefined) {
      change.secret = this.seal(id, webhook.secret.version + 1, fields.secret);
    }
    const updated = await this.registry.webhooks.updateWebhook(id, change);
    if (!updated) return this.get(caller, id);
    return updated;
  }

  async remove(caller: Caller, id: string): Promise<WebhookRecord> {
    const webhook = await this.get(caller, id);
    await this.registry.webhooks.removeWebhook(id);
    return webhook;
  }

  async deliveries(caller: Caller, id: string, limit: number): Promise<DeliveryRecord[]> {
    await this.get(caller, id);
    return this.registry.webhooks.listDeliveries(id, limit);
  }

  /** One delivery of a webhook the caller may reach; 404 for none (or another webhook's). */
  async delivery(caller: Caller, id: string, deliveryId: string): Promise<DeliveryRecord> {
    await this.get(caller, id);
    return this.deliveryOf(id, deliveryId);
  }

  /**
   * Queues a test delivery to this one webhook: a `webhook.test` event, signed as the others,
   * tried once, in its delivery log. The webhook must be enabled (a disabled one is sent nothing).
   */
  async test(caller: Caller, id: string): Promise<DeliveryRecord> {
    const webhook = await this.get(caller, id);
    this.mustBeEnabled(webhook, 'test');
    const delivery = await this.registry.webhooks.insertTestDelivery(webhook.id, Date.now());
    if (!delivery) {
      throw new LimitExceededError(
        `webhook ${webhook.id} has ${TEST_PENDING_MAX} test deliveries pending already, the most it may have: wait for their outcome (abx webhook deliveries ${webhook.id}), then test again`,
        { code: 'webhook_tests_pending' },
      );
    }
    return delivery;
  }

  /**
   * Queues a delivered or failed delivery again: the same id and event (a receiver deduplicates
   * it), its attempts, status and error started anew, its retry window from now.
   */
  async redeliver(caller: Caller, id: string, deliveryId: string): Promise<DeliveryRecord> {
    const webhook = await this.get(caller, id);
    const delivery = await this.deliveryOf(id, deliveryId);
    this.mustBeEnabled(webhook, 'redeliver');
    if (delivery.state === 'pending') {
      throw new InvalidArgumentError(
        `delivery ${delivery.id} is still pending (${delivery.attempts} attempt${delivery.attempts === 1 ? '' : 's'} so far): it is sent again on its own; redeliver it once it is delivered or failed`,
        { code: 'delivery_pending' },
      );
    }
    const restarted = await this.registry.webhooks.restartDelivery(id, deliveryId, Date.now());
    if (restarted) return restarted;
    const now = await this.registry.webhooks.getDelivery(id, deliveryId);
    if (now?.state === 'pending') return now; // another request queued it meanwhile
    throw new InvalidArgumentError(
      `delivery ${deliveryId}'s event (seq ${delivery.eventSeq}) is past the events' retention (ABX_EVENTS_RETENTION_MS) and gone: it cannot be sent again`,
      { code: 'event_purged' },
    );
  }

  private async deliveryOf(id: string, deliveryId: string): Promise<DeliveryRecord> {
    const delivery = /^whd_[0-9a-f]{24}$/.test(deliveryId)
      ? await this.registry.webhooks.getDelivery(id, deliveryId)
      : undefined;
    if (!delivery) {
      throw new WebhookNotFoundError(
        `no delivery ${JSON.stringify(deliveryId.slice(0, 100))} in webhook ${id}'s log (ids look like whd_ and 24 hex digits); see abx webhook deliveries ${id}`,
        { code: 'delivery_not_found' },
      );
    }
    return delivery;
  }

  private mustBeEnabled(webhook: WebhookRecord, what: 'test' | 'redeliver'): void {
    if (webhook.enabled) return;
    throw new InvalidArgumentError(
      `webhook ${webhook.id} is disabled, so nothing is sent to it${what === 'test' ? ` (not even a ${TEST_EVENT_TYPE} event)` : ''}: enable it first (abx webhook update ${webhook.id} --enable, or PATCH { "enabled": true })`,
      { code: 'webhook_disabled' },
    );
  }

  /** The signing secret of a webhook (for its deliveries); throws when sealed with another key. */
  secretOf(webhook: WebhookRecord): string {
    if (webhook.secret.keyCheck !== this.key.check) {
      throw new Error(
        `webhook ${webhook.id}'s signing secret was sealed with another secrets key than this daemon's (${this.key.source}): give every daemon on the registry the same key, or set the webhook's secret again`,
      );
    }
    return openSecret(
      this.key.key,
      sealedFor(webhook.id, webhook.secret.version),
      webhook.secret.sealed,
    );
  }

  private seal(id: string, version: number, secret: string): SealedWebhookSecret {
    return {
      sealed: sealSecret(this.key.key, sealedFor(id, version), secret),
      keyCheck: this.key.check,
      version,
    };
  }

  /** The fields of a create (`whole`: name and url required as the flavour says) or update. */
  private async read(request: WebhookRequest, flavour: WebhookFlavour, whole: boolean) {
    if (typeof request !== 'object' || request === null || Array.isArray(request)) {
      throw new InvalidArgumentError(
        'the body must be a JSON object { name, url, enabled?, events?, signatureSecret? }',
      );
    }
    const secretField = flavour === 'e2b' ? 'signatureSecret' : 'secret';
    const known = new Set(['name', 'url', 'enabled', 'events', secretField]);
    const unknown = Object.keys(request).filter((k) => !known.has(k));
    if (unknown.length > 0) {
      throw new InvalidArgumentError(
        `unknown field${unknown.length > 1 ? 's' : ''} ${unknown.map((k) => JSON.stringify(k)).join(', ')}; a webhook takes ${[...known].join(', ')}`,
      );
    }
    const out: {
      name?: string;
      url?: string;
      enabled?: boolean;
      events?: string[];
      secret?: string;
    } = {};
    if (request.name !== undefined || (whole && flavour === 'e2b')) {
      const name = request.name;
      if (typeof name !== 'string' || name.trim() === '' || name.length > WEBHOOK_NAME_MAX) {
        throw new InvalidArgumentError(`name must be 1 to ${WEBHOOK_NAME_MAX} characters`);
      }
      out.name = name;
    }
    if (request.url !== undefined || whole) {
      const url = parseWebhookUrl(request.url, 'url');
      await checkWebhookUrl(url, this.rules(), 'url');
      out.url = url.toString();
    }
    if (request.enabled !== undefined) {
      if (typeof request.enabled !== 'boolean') {
        throw new InvalidArgumentError('enabled must be true or false');
      }
      out.enabled = request.enabled;
    }
    if (request.events !== undefined) {
      const events = request.events;
      if (!Array.isArray(events) || events.some((e) => typeof e !== 'string' || !isEventType(e))) {
        throw new InvalidArgumentError(
          `events must be a list of event types (empty: all): ${EVENT_TYPES.join(', ')}`,
        );
      }
      out.events = [...new Set(events as string[])];
    }
    const secret = request[secretField];
    if (secret !== undefined) {
      if (
        typeof secret !== 'string' ||
        secret.length < WEBHOOK_SECRET_MIN ||
        secret.length > 1024
      ) {
        throw new InvalidArgumentError(
          `${secretField} must be ${WEBHOOK_SECRET_MIN} to 1024 characters (leave it out at create and abx makes one)`,
        );
      }
      out.secret = secret;
    }
    return out;
  }
}
