/**
 * Delivers lifecycle events to webhooks (docs/events.md, Webhooks), beside the requests and never
 * in their way: when an event is written (WebhookStore.onEventWritten), and every
 * {@link WebhookTiming.pollMs} besides, the dispatcher fans new events out to delivery
 * rows (webhook-store.ts) and claims due rows for a bounded pool of concurrent POSTs, each with an
 * explicit timeout. A receiver that is slow, down or never answers holds one slot of the pool
 * for at most the timeout; no API request waits on a delivery.
 */
import type { ClientRequest, IncomingMessage, RequestOptions } from 'node:http';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { LookupFunction } from 'node:net';
import type { EgressRules } from '../egress/policy.js';
import { envMilliseconds } from '../util/env-ms.js';
import { packageInfo } from '../util/package-info.js';
import {
  e2bWebhookSignature,
  signWebhook,
  WEBHOOK_ID_HEADER,
  WEBHOOK_SIGNATURE_HEADER,
  WEBHOOK_TIMESTAMP_HEADER,
} from '../util/webhook-signature.js';
import { eventsRetentionMs } from './events.js';
import {
  type ClaimedDelivery,
  type DeliveryOutcome,
  isTestDelivery,
  testEventOf,
  type WebhookEvent,
  type WebhookStore,
} from './webhook-store.js';
import { deliveryAddress } from './webhook-url.js';

/** The timings of deliveries, each from the environment (milliseconds). */
export interface WebhookTiming {
  /** One attempt's whole request, connect to answer (`ABX_WEBHOOK_TIMEOUT_MS`, 10 s). */
  timeoutMs: number;
  /** The first retry's wait, doubled at each further one (`ABX_WEBHOOK_BACKOFF_MS`, 5 s)... */
  backoffMs: number;
  /** ...up to this (`ABX_WEBHOOK_BACKOFF_MAX_MS`, 1 h). */
  backoffMaxMs: number;
  /** A delivery not done this long after its event is given up: failed (`ABX_WEBHOOK_RETRY_FOR_MS`, 24 h). */
  retryForMs: number;
  /**
   * How long a claimed attempt is held (`ABX_WEBHOOK_LEASE_MS`, the timeout and 30 s): a daemon
   * that dies mid-attempt leaves it, and it is sent again (same id) once this has passed.
   */
  leaseMs: number;
  /** How often new events and due retries are looked for (`ABX_WEBHOOK_POLL_MS`, 250 ms). */
  pollMs: number;
  /** Attempts in flight at once, per daemon (`ABX_WEBHOOK_CONCURRENCY`, 8). */
  concurrency: number;
}

export function webhookTiming(env: NodeJS.ProcessEnv = process.env): WebhookTiming {
  const timeoutMs = envMilliseconds('ABX_WEBHOOK_TIMEOUT_MS', 10_000, 100, env);
  const leaseMs = envMilliseconds('ABX_WEBHOOK_LEASE_MS', timeoutMs + 30_000, 1, env);
  if (leaseMs <= timeoutMs) {
    throw new Error(
      `ABX_WEBHOOK_LEASE_MS (${leaseMs}) must be longer than ABX_WEBHOOK_TIMEOUT_MS (${timeoutMs}): an attempt still running would be sent again by another daemon`,
    );
  }
  return {
    timeoutMs,
    backoffMs: envMilliseconds('ABX_WEBHOOK_BACKOFF_MS', 5_000, 1, env),
    backoffMaxMs: envMilliseconds('ABX_WEBHOOK_BACKOFF_MAX_MS', 3_600_000, 1, env),
    retryForMs: envMilliseconds('ABX_WEBHOOK_RETRY_FOR_MS', 24 * 3_600_000, 1, env),
    leaseMs,
    pollMs: envMilliseconds('ABX_WEBHOOK_POLL_MS', 250, 10, env),
    concurrency: envMilliseconds('ABX_WEBHOOK_CONCURRENCY', 8, 1, env),
  };
}

/** Events fanned out per webhook per pass. */
const FAN_OUT_BATCH = 500;
/** Bytes of a refusing receiver's answer kept in the delivery log. */
const ANSWER_KEPT = 300;
/** How often delivered and failed rows past the events' retention are removed. */
const PURGE_EVERY_MS = 60_000;

/** The request of one attempt: body and headers as its webhook's flavour has them. */
export function deliveryRequest(
  claimed: ClaimedDelivery & { event: WebhookEvent },
  secret: string,
  now: number,
): { body: string; headers: Record<string, string> } {
  const { delivery, webhook, event } = claimed;
  const common = {
    'content-type': 'application/json',
    'user-agent': `abx-webhooks/${packageInfo().version}`,
  };
  if (webhook.flavour === 'e2b') {
    // E2B's payload (its docs' "Webhook payload"); abx has no builds or executions of its own:
    // the template's name and the sandbox's id stand in.
    const body = JSON.stringify({
      version: 'v1',
      id: event.id,
      type: event.type,
      eventData: event.data,
      sandboxBuildId: event.template,
      sandboxExecutionId: event.sandboxId,
      sandboxId: event.sandboxId,
      sandboxTeamId: event.owner ?? '',
      sandboxTemplateId: event.template,
      timestamp: new Date(event.at).toISOString(),
    });
    return {
      body,
      headers: {
        ...common,
        'e2b-webhook-id': webhook.id,
        'e2b-delivery-id': delivery.id,
        'e2b-signature-version': 'v1',
        'e2b-signature': e2bWebhookSignature(secret, body),
      },
    };
  }
  const body = JSON.stringify({
    id: event.id,
    seq: event.seq,
    type: event.type,
    at: new Date(event.at).toISOString(),
    sandboxId: event.sandboxId,
    template: event.template,
    webhookId: webhook.id,
    data: event.data,
  });
  const timestamp = Math.floor(now / 1000);
  return {
    body,
    headers: {
      ...common,
      [WEBHOOK_ID_HEADER]: delivery.id,
      [WEBHOOK_TIMESTAMP_HEADER]: String(timestamp),
      [WEBHOOK_SIGNATURE_HEADER]: signWebhook(secret, delivery.id, timestamp, body),
    },
  };
}

/** One POST to `url`, connected to `address` only: the receiver's status and the start of its answer. */
function post(
  url: URL,
  address: { address: string; family: 4 | 6 },
  body: string,
  headers: Record<string, string>,
  timeoutMs: number,
  signal: AbortSignal,
): Promise<{ status: number; answer: string }> {
  return new Promise((resolve, reject) => {
    const lookup = ((
      _host: string,
      options: { all?: boolean },
      callback: (...args: unknown[]) => void,
    ) => {
      if (options.all) callback(null, [address]);
      else callback(null, address.address, address.family);
    }) as unknown as LookupFunction;
    const options: RequestOptions = {
      method: 'POST',
      headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) },
      lookup,
      agent: false,
      signal,
    };
    let request: ClientRequest;
    const timer = setTimeout(
      () => request.destroy(new Error(`no answer within ${timeoutMs} ms (ABX_WEBHOOK_TIMEOUT_MS)`)),
      timeoutMs,
    );
    const done = (error: Error | undefined, result?: { status: number; answer: string }) => {
      clearTimeout(timer);
      if (error) reject(error);
      else resolve(result as { status: number; answer: string });
    };
    const onResponse = (res: IncomingMessage) => {
      const chunks: Buffer[] = [];
      let kept = 0;
      res.on('data', (chunk: Buffer) => {
        if (kept < ANSWER_KEPT) chunks.push(chunk);
        kept += chunk.length;
      });
      res.on('end', () =>
        done(undefined, {
          status: res.statusCode ?? 0,
          answer: Buffer.concat(chunks).toString('utf8').slice(0, ANSWER_KEPT),
        }),
      );
      res.on('error', (error) => done(error));
    };
    request =
      url.protocol === 'https:'
        ? httpsRequest(url, options, onResponse)
        : httpRequest(url, options, onResponse);
    request.on('error', (error) => done(error));
    request.end(body);
  });
}

/** The next outcome of an attempt that did not deliver. */
export function retryOutcome(
  claimed: ClaimedDelivery,
  status: number | null,
  error: string,
  now: number,
  timing: WebhookTiming,
): DeliveryOutcome {
  const { attempts, createdAt } = claimed.delivery;
  const wait = Math.min(timing.backoffMs * 2 ** Math.max(0, attempts - 1), timing.backoffMaxMs);
  if (now + wait > createdAt + timing.retryForMs) {
    return {
      state: 'failed',
      status,
      error: `${error}; given up after ${attempts} attempt${attempts === 1 ? '' : 's'} (ABX_WEBHOOK_RETRY_FOR_MS ${timing.retryForMs} ms)`,
    };
  }
  return { state: 'pending', status, error, nextAttemptAt: now + wait };
}

export class WebhookDispatcher {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private again = false;
  private stopped = false;
  private lastPurge = 0;
  private lastError = '';
  private readonly inFlight = new Set<Promise<void>>();
  /** Stops the wake on event writes. */
  private unwake: (() => Promise<void>) | undefined;
  private readonly abort = new AbortController();

  constructor(
    private readonly store: WebhookStore,
    private readonly options: {
      secretOf: (webhook: ClaimedDelivery['webhook']) => string;
      rules: () => EgressRules;
      /** Whether a key was revoked: its webhooks get nothing more (failed, saying so). */
      ownerRevoked?: (owner: string) => Promise<boolean>;
      timing: WebhookTiming;
      log?: (line: string) => void;
    },
  ) {}

  start(): void {
    // An event written (here, or by a replica on PostgreSQL) is looked for at once; the poll stays
    // for due retries and for a wake that was missed.
    this.unwake = this.store.onEventWritten?.(() => this.kick());
    this.schedule(0);
  }

  /** Looks for work now (an attempt ended: the next event of its sandbox may be due). */
  kick(): void {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.schedule(0);
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.running = this.pass().finally(() => {
        this.running = undefined;
        const next = this.again ? 0 : this.options.timing.pollMs;
        this.again = false;
        this.schedule(next);
      });
    }, ms);
    this.timer.unref();
  }

  private async pass(): Promise<void> {
    const now = Date.now();
    try {
      await this.store.fanOut(now, FAN_OUT_BATCH);
      const free = this.options.timing.concurrency - this.inFlight.size;
      const claimed = await this.store.claimDue(now, this.options.timing.leaseMs, free);
      for (const one of claimed) {
        const attempt = this.attempt(one).finally(() => {
          this.inFlight.delete(attempt);
          this.kick();
        });
        this.inFlight.add(attempt);
      }
      if (now - this.lastPurge > PURGE_EVERY_MS) {
        this.lastPurge = now;
        await this.store.purgeDeliveries(now - eventsRetentionMs());
      }
      if (this.lastError) {
        this.options.log?.('webhooks: delivering again');
        this.lastError = '';
      }
    } catch (error) {
      // Said once per kind of failure (a database that is down fails every pass).
      const message = (error as Error).message;
      if (message !== this.lastError) this.options.log?.(`webhooks: ${message}`);
      this.lastError = message;
    }
  }

  /** One attempt of one delivery, its outcome recorded. */
  private async attempt(claimed: ClaimedDelivery): Promise<void> {
    const { timing } = this.options;
    let outcome: DeliveryOutcome;
    // A test delivery (POST /v1/webhooks/{id}/test) has no event row: its event is made from it.
    const test = isTestDelivery(claimed.delivery);
    const event = test ? testEventOf(claimed.delivery, claimed.webhook) : claimed.event;
    if (!event) {
      outcome = {
        state: 'failed',
        status: null,
        error: 'its event was purged (past ABX_EVENTS_RETENTION_MS) before it could be delivered',
      };
    } else if (
      claimed.webhook.owner !== null &&
      (await this.options.ownerRevoked?.(claimed.webhook.owner).catch(() => false))
    ) {
      outcome = {
        state: 'failed',
        status: null,
        error: `not sent: the webhook's key ${claimed.webhook.owner} was revoked`,
      };
    } else {
      try {
        const { body, headers } = deliveryRequest(
          { ...claimed, event },
          this.options.secretOf(claimed.webhook),
          Date.now(),
        );
        const url = new URL(claimed.webhook.url);
        const address = await deliveryAddress(url, this.options.rules());
        const { status, answer } = await post(
          url,
          address,
          body,
          headers,
          timing.timeoutMs,
          this.abort.signal,
        );
        outcome =
          status >= 200 && status < 300
            ? { state: 'delivered', status, at: Date.now() }
            : retryOutcome(
                claimed,
                status,
                `the receiver answered ${status}${answer ? `: ${answer}` : ''}`,
                Date.now(),
                timing,
              );
      } catch (error) {
        if (this.stopped) {
          // Stopping: sent again at the next start (same id), without waiting for the lease.
          outcome = {
            state: 'pending',
            status: null,
            error: 'the daemon stopped mid-delivery',
            nextAttemptAt: Date.now(),
          };
        } else {
          outcome = retryOutcome(claimed, null, (error as Error).message, Date.now(), timing);
        }
      }
    }
    if (test && outcome.state === 'pending' && !this.stopped) {
      // A test is tried once: its sender waits for the outcome (abx webhook test).
      outcome = { state: 'failed', status: outcome.status, error: outcome.error };
    }
    await this.store
      .finishDelivery(claimed.delivery.id, outcome)
      .catch((error) =>
        this.options.log?.(
          `webhooks: delivery ${claimed.delivery.id}'s outcome was not recorded (${(error as Error).message}); it is sent again after its lease`,
        ),
      );
  }

  /** Stops looking for work and ends attempts in flight (they are retried at the next start). */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.unwake?.();
    this.abort.abort();
    await this.running;
    await Promise.allSettled([...this.inFlight]);
  }
}
