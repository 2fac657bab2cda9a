/**
 * E2B's webhooks on abx's (docs/events.md, Webhooks): `POST /events/webhooks` (201), `GET
 * /events/webhooks`, and `GET`, `PATCH`, `DELETE /events/webhooks/{webhookID}` (200 each), in
 * E2B's `Webhook` shape (`id`, `teamID`, `name`, `createdAt`, `enabled`, `url`, `events`): never
 * the signature secret. Deliveries of a webhook registered here are E2B's payload, signed with
 * `e2b-signature`. A key sees its own webhooks (an admin key: all).
 */
import type { E2bBackend, E2bCaller, E2bWebhook } from './backend.js';

export interface WebhookCall {
  params: Record<string, string>;
  body: Record<string, unknown>;
  caller: E2bCaller;
  backend: E2bBackend;
}

/** E2B's `Webhook`; `teamID` is the owning key's id (`''` for the daemon's own key). */
function webhookJson(webhook: E2bWebhook) {
  return {
    id: webhook.id,
    teamID: webhook.owner ?? '',
    name: webhook.name,
    createdAt: new Date(webhook.createdAt).toISOString(),
    enabled: webhook.enabled,
    url: webhook.url,
    events: webhook.events,
  };
}

export async function createWebhook(call: WebhookCall): Promise<{ status: number; body: unknown }> {
  return {
    status: 201,
    body: webhookJson(await call.backend.createWebhook(call.body, call.caller)),
  };
}

export async function listWebhooks(call: WebhookCall): Promise<{ status: number; body: unknown }> {
  return { status: 200, body: (await call.backend.listWebhooks(call.caller)).map(webhookJson) };
}

export async function getWebhook(call: WebhookCall): Promise<{ status: number; body: unknown }> {
  const webhook = await call.backend.getWebhook(call.params.id as string, call.caller);
  return { status: 200, body: webhookJson(webhook) };
}

export async function updateWebhook(call: WebhookCall): Promise<{ status: number; body: unknown }> {
  const webhook = await call.backend.updateWebhook(
    call.params.id as string,
    call.body,
    call.caller,
  );
  return { status: 200, body: webhookJson(webhook) };
}

export async function removeWebhook(call: WebhookCall): Promise<{ status: number; body: unknown }> {
  await call.backend.removeWebhook(call.params.id as string, call.caller);
  return { status: 200, body: undefined };
}
