/**
 * abx's webhook routes (`/v1/webhooks`, docs/events.md): register, list, read, change and remove
 * a key's webhooks, read one's delivery log, send one a test event and redeliver a delivery. Who may reach a webhook is WebhookService's one
 * rule (mayReachWebhook); the secret is never answered but once, at a create that made it.
 */
import { Reply } from '../../runtime/server/http.js';
import type { Route } from '../../runtime/server/route-table.js';
import { InvalidArgumentError } from '../errors.js';
import type { ApiContext } from './api-routes.js';
import type { Caller } from './key-service.js';
import { deliveryJson, webhookJson } from './webhook-service.js';
import { TEST_EVENT_TYPE, TEST_PENDING_MAX } from './webhook-store.js';

/** Deliveries one log page holds at most (and by default). */
export const DELIVERIES_MAX = 500;
const DELIVERIES_DEFAULT = 100;

function callerOf(ctx: ApiContext): Caller {
  if (!ctx.caller) throw new Error('a route that needs an API key ran without a caller');
  return ctx.caller;
}

function bodyOf(body: unknown): Record<string, unknown> {
  const request = body ?? {};
  if (typeof request !== 'object' || Array.isArray(request)) {
    throw new InvalidArgumentError(
      'the body must be a JSON object { name?, url, enabled?, events?, secret? }',
    );
  }
  return request as Record<string, unknown>;
}

function limitOf(query: URLSearchParams): number {
  const text = query.get('limit');
  if (text === null) return DELIVERIES_DEFAULT;
  const limit = Number(text);
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > DELIVERIES_MAX) {
    throw new InvalidArgumentError(`limit must be a whole number from 1 to ${DELIVERIES_MAX}`);
  }
  return limit;
}

export const WEBHOOK_ROUTES: Route<ApiContext>[] = [
  {
    method: 'POST',
    path: '/v1/webhooks',
    group: 'api',
    summary:
      "Register a webhook of the caller's key: { url, name?, enabled? (true), events? (types; none: all), secret? (8 to 1024 characters; left out: abx makes one and answers it this once) }. It gets the lifecycle events of the key's own sandboxes, signed (Standard Webhooks: abx-webhook-id, -timestamp, -signature). 201; 400 for a URL to a denied address (loopback, private, metadata) unless the operator permits it.",
    handler: async ({ body, ctx }) => {
      const caller = callerOf(ctx);
      const { webhook, secret } = await ctx.webhooks.create(caller, bodyOf(body), 'abx');
      return new Reply(201, {
        ...webhookJson(webhook, caller.admin),
        ...(secret === undefined ? {} : { secret }),
      });
    },
  },
  {
    method: 'GET',
    path: '/v1/webhooks',
    group: 'api',
    summary:
      "The caller's key's webhooks (an admin key: every key's, with its owner), oldest first; never a secret.",
    handler: async ({ ctx }) => {
      const caller = callerOf(ctx);
      return {
        webhooks: (await ctx.webhooks.list(caller)).map((w) => webhookJson(w, caller.admin)),
      };
    },
  },
  {
    method: 'GET',
    path: '/v1/webhooks/{id}',
    group: 'api',
    summary: "One webhook; another key's is 404, as an unknown id.",
    handler: async ({ params, ctx }) => {
      const caller = callerOf(ctx);
      return webhookJson(await ctx.webhooks.get(caller, params.id as string), caller.admin);
    },
  },
  {
    method: 'PATCH',
    path: '/v1/webhooks/{id}',
    group: 'api',
    summary:
      'Change a webhook: { name?, url?, enabled?, events?, secret? }; what is left out is kept. A new secret signs the next attempt on.',
    handler: async ({ params, body, ctx }) => {
      const caller = callerOf(ctx);
      const webhook = await ctx.webhooks.update(caller, params.id as string, bodyOf(body));
      return webhookJson(webhook, caller.admin);
    },
  },
  {
    method: 'DELETE',
    path: '/v1/webhooks/{id}',
    group: 'api',
    summary: 'Remove a webhook and its delivery log; nothing more is sent to it.',
    body: 'none',
    handler: async ({ params, ctx }) => {
      const webhook = await ctx.webhooks.remove(callerOf(ctx), params.id as string);
      return { removed: true, id: webhook.id };
    },
  },
  {
    method: 'GET',
    path: '/v1/webhooks/{id}/deliveries',
    group: 'api',
    summary: `A webhook's delivery log, newest event first (?limit=, 1 to ${DELIVERIES_MAX}, default ${DELIVERIES_DEFAULT}): each delivery's id (the same on every retry), event, state (pending, delivered, failed), attempts, last status and error.`,
    handler: async ({ params, query, ctx }) => {
      const deliveries = await ctx.webhooks.deliveries(
        callerOf(ctx),
        params.id as string,
        limitOf(query),
      );
      return { deliveries: deliveries.map(deliveryJson) };
    },
  },
  {
    method: 'GET',
    path: '/v1/webhooks/{id}/deliveries/{deliveryId}',
    group: 'api',
    summary:
      "One delivery of a webhook's log (what abx webhook test and redeliver wait on); 404 for an unknown id or another webhook's.",
    handler: async ({ params, ctx }) =>
      deliveryJson(
        await ctx.webhooks.delivery(
          callerOf(ctx),
          params.id as string,
          params.deliveryId as string,
        ),
      ),
  },
  {
    method: 'POST',
    path: '/v1/webhooks/{id}/test',
    group: 'api',
    summary: `Send this webhook alone a ${TEST_EVENT_TYPE} event (no sandbox changed), signed as its other deliveries, tried once, recorded in its log: 202 with the delivery (kind test, state pending); read it again for the outcome. 400 webhook_disabled for a disabled webhook; 429 webhook_tests_pending with ${TEST_PENDING_MAX} tests pending already. No body.`,
    handler: async ({ body, params, ctx }) => {
      noBody(body);
      const delivery = await ctx.webhooks.test(callerOf(ctx), params.id as string);
      return new Reply(202, deliveryJson(delivery));
    },
  },
  {
    method: 'POST',
    path: '/v1/webhooks/{id}/deliveries/{deliveryId}/redeliver',
    group: 'api',
    summary:
      "Queue a delivered or failed delivery again: the same delivery id (abx-webhook-id) and event, so a receiver deduplicates it; its attempts, status and error start anew, retried as any delivery. 202 with the delivery (pending). 400 delivery_pending while it is still being tried, webhook_disabled, event_purged; 404 for an unknown delivery or webhook (or another key's). No body.",
    handler: async ({ body, params, ctx }) => {
      noBody(body);
      const delivery = await ctx.webhooks.redeliver(
        callerOf(ctx),
        params.id as string,
        params.deliveryId as string,
      );
      return new Reply(202, deliveryJson(delivery));
    },
  },
];

/** A POST that takes no body: an empty one or `{}`; anything else is refused, not ignored. */
function noBody(body: unknown): void {
  if (body === undefined || body === null) return;
  if (typeof body === 'object' && !Array.isArray(body) && Object.keys(body).length === 0) return;
  throw new InvalidArgumentError('this request takes no body (send none, or {})');
}
