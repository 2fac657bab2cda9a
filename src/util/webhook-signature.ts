import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { WebhookVerificationError } from '../errors.js';

/**
 * How webhook deliveries are signed (docs/events.md, Webhooks). Natively, the Standard Webhooks
 * scheme (standardwebhooks.com): headers `abx-webhook-id` (the delivery's id, the same on every
 * retry), `abx-webhook-timestamp` (unix seconds of this attempt) and `abx-webhook-signature`
 * `v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`, where the key is the bytes after
 * `whsec_` base64-decoded for a secret of that form (what abx generates), else the secret's
 * UTF-8 bytes. On the E2B face, E2B's: `e2b-signature`, unpadded base64 of SHA-256 over the
 * secret followed by the raw body.
 */

/** The headers of a native delivery's signature. */
export const WEBHOOK_ID_HEADER = 'abx-webhook-id';
export const WEBHOOK_TIMESTAMP_HEADER = 'abx-webhook-timestamp';
export const WEBHOOK_SIGNATURE_HEADER = 'abx-webhook-signature';

/** A delivery older or newer than this (seconds) fails verification by default. */
export const WEBHOOK_TOLERANCE_SECONDS = 300;

function keyOf(secret: string): Buffer {
  return secret.startsWith('whsec_')
    ? Buffer.from(secret.slice('whsec_'.length), 'base64')
    : Buffer.from(secret, 'utf8');
}

/** `v1,<base64 HMAC-SHA256>` of a native delivery. */
export function signWebhook(
  secret: string,
  id: string,
  timestamp: number,
  body: string | Buffer,
): string {
  const mac = createHmac('sha256', keyOf(secret))
    .update(`${id}.${timestamp}.`)
    .update(body)
    .digest('base64');
  return `v1,${mac}`;
}

/** E2B's `e2b-signature`: unpadded base64 of SHA-256 over the secret followed by the raw body. */
export function e2bWebhookSignature(secret: string, body: string | Buffer): string {
  return createHash('sha256').update(secret).update(body).digest('base64').replace(/=+$/, '');
}

type HeaderBag =
  | Headers
  | Record<string, string | string[] | undefined>
  | { get(name: string): string | null };

function header(headers: HeaderBag, name: string): string | undefined {
  if (typeof (headers as { get?: unknown }).get === 'function') {
    return (headers as { get(name: string): string | null }).get(name) ?? undefined;
  }
  const bag = headers as Record<string, string | string[] | undefined>;
  const key = Object.keys(bag).find((k) => k.toLowerCase() === name);
  const value = key === undefined ? undefined : bag[key];
  return Array.isArray(value) ? value[0] : value;
}

/**
 * Checks a native delivery of abx: its signature (any of the space-separated `v1,` signatures
 * in `abx-webhook-signature`) over its id, timestamp and raw body with `secret`, and that its
 * timestamp is within `toleranceSeconds` (default 300) of now, so a captured delivery cannot be
 * replayed later. Returns the parsed body; throws {@link WebhookVerificationError} naming what
 * was wrong. Pass the body exactly as received (bytes or text), not parsed and re-serialized.
 * Deduplicate on the returned `deliveryId` (the same on every retry).
 */
export function verifyWebhook(
  secret: string,
  headers: HeaderBag,
  body: string | Buffer,
  options: { toleranceSeconds?: number; now?: number } = {},
): { deliveryId: string; timestamp: number; payload: unknown } {
  const id = header(headers, WEBHOOK_ID_HEADER);
  const stamp = header(headers, WEBHOOK_TIMESTAMP_HEADER);
  const signatures = header(headers, WEBHOOK_SIGNATURE_HEADER);
  if (!id || !stamp || !signatures) {
    throw new WebhookVerificationError(
      `the delivery lacks ${[!id && WEBHOOK_ID_HEADER, !stamp && WEBHOOK_TIMESTAMP_HEADER, !signatures && WEBHOOK_SIGNATURE_HEADER].filter(Boolean).join(', ')}: it was not sent by abx, or a proxy dropped headers`,
    );
  }
  const timestamp = Number(stamp);
  if (!Number.isSafeInteger(timestamp)) {
    throw new WebhookVerificationError(`${WEBHOOK_TIMESTAMP_HEADER} is not unix seconds: ${stamp}`);
  }
  const tolerance = options.toleranceSeconds ?? WEBHOOK_TOLERANCE_SECONDS;
  const now = Math.floor((options.now ?? Date.now()) / 1000);
  if (Math.abs(now - timestamp) > tolerance) {
    throw new WebhookVerificationError(
      `the delivery's timestamp ${timestamp} is ${Math.abs(now - timestamp)} s from now, outside the ${tolerance} s window: a replay, or this host's clock is off`,
    );
  }
  const expected = Buffer.from(signWebhook(secret, id, timestamp, body).slice(3), 'base64');
  const matches = signatures.split(' ').some((item) => {
    const [version, mac] = item.split(',', 2);
    if (version !== 'v1' || !mac) return false;
    const given = Buffer.from(mac, 'base64');
    return given.length === expected.length && timingSafeEqual(given, expected);
  });
  if (!matches) {
    throw new WebhookVerificationError(
      "the delivery's signature does not match: another secret signed it, or the body was changed (verify the raw body as received)",
    );
  }
  const text = typeof body === 'string' ? body : body.toString('utf8');
  let payload: unknown;
  try {
    payload = JSON.parse(text);
  } catch {
    throw new WebhookVerificationError('the signed body is not JSON');
  }
  return { deliveryId: id, timestamp, payload };
}
