import { PassThrough, type Readable } from 'node:stream';
import type { SandboxInfo } from '../../runtime/protocol/wire.js';
import { LimitExceededError } from '../errors.js';
import { envMilliseconds } from '../util/env-ms.js';
import { type EventService, eventJson } from './event-service.js';
import type { Caller } from './key-service.js';
import type { MetricsSample } from './metrics.js';

/**
 * How often an event stream looks for changes (`ABX_EVENTS_INTERVAL_MS`, 100 ms or more). Its
 * lifecycle events are read at once when one is written (by this daemon, or, on PostgreSQL, by a
 * replica): the interval is what a missed wake costs at most.
 */
export const EVENTS_INTERVAL_MS = 1000;
/** A comment line this often keeps proxies and the browser from closing a quiet stream. */
const KEEPALIVE_MS = 15_000;
/** Streams open at once, over all keys, and per key. */
const MAX_STREAMS = 200;
const MAX_STREAMS_PER_KEY = 20;
/** The samples a sandbox new to a stream brings along. */
const HISTORY = 60;
/** Lifecycle events read at once by a stream (it reads again at once while pages are full). */
const LIFECYCLE_PAGE = 500;

/** What a stream follows of the lifecycle events (events.ts) besides the dashboard's view. */
export interface StreamOptions {
  /** Follow from after this seq (`Last-Event-ID`, `?after=`); absent: from the newest now. */
  after?: number;
  /** Only this sandbox's lifecycle events (the caller may see it: checked before). */
  sandboxId?: string;
  /** Only lifecycle events of these types. */
  types?: string[];
  /** Only lifecycle events: no snapshot, sandbox, ended or metrics events. */
  lifecycleOnly?: boolean;
}

/** What a stream reads: the sandboxes a caller may see, their states and samples. */
export interface EventSource {
  /** Running and paused sandboxes the caller may see, as the API shows them. */
  visible(caller: Caller): Promise<SandboxInfo[]>;
  /** A sandbox as the API shows it, ended ones included; undefined when the registry forgot it. */
  find(id: string): Promise<SandboxInfo | undefined>;
  /** Its samples taken at or after `start` (ms since the epoch), oldest first. */
  samples(id: string, start: number): MetricsSample[];
  /** A sample as the API shows it. */
  metricJson(sample: MetricsSample): unknown;
}

/**
 * `GET /v1/events`: server-sent events of the sandboxes a caller may see. `snapshot` first (every
 * running and paused one), then `sandbox` when one appears or changes, `ended` when one leaves,
 * `metrics` for each new sample. Each stream reads the registry every interval, so sandboxes made
 * through another daemon sharing the registry show up as well. With lifecycle events, it also
 * follows those of the caller's sandboxes: `lifecycle` events whose SSE `id:` is the event's
 * seq, so a client that reconnects with `Last-Event-ID` (a browser's EventSource does) goes on
 * after the last one it had: none is missed, none repeated. A written event wakes every stream
 * (`wakes`), which then reads its lifecycle events at once instead of at its next pass.
 */
export class SandboxEventStreams {
  private open = 0;
  private readonly perKey = new Map<string, number>();
  /** The streams' lifecycle reads, run when an event is written. */
  private readonly followers = new Set<() => void>();
  private unwake: (() => Promise<void>) | undefined;

  constructor(
    private readonly source: EventSource,
    private readonly intervalMs = eventsInterval(),
    /** The lifecycle events the streams follow; none: only the dashboard's view. */
    private readonly lifecycle?: EventService,
    /** Calls a listener after event writes (WebhookStore.onEventWritten); the function returned stops it. */
    private readonly wakes?: (listener: () => void) => () => Promise<void>,
  ) {}

  /** Runs `follower` after each event write while its stream is open (one wake for all streams). */
  private wakeOn(follower: () => void): () => void {
    this.followers.add(follower);
    if (this.wakes && !this.unwake) {
      this.unwake = this.wakes(() => {
        for (const each of this.followers) each();
      });
    }
    return () => {
      this.followers.delete(follower);
      if (this.followers.size === 0 && this.unwake) {
        const stop = this.unwake;
        this.unwake = undefined;
        void stop().catch(() => undefined);
      }
    };
  }

  /** A new stream for `caller`, ending when `signal` aborts (the client went away). */
  stream(caller: Caller, signal: AbortSignal, options: StreamOptions = {}): Readable {
    const who = caller.keyId ?? '';
    const mine = this.perKey.get(who) ?? 0;
    if (this.open >= MAX_STREAMS || mine >= MAX_STREAMS_PER_KEY) {
      throw new LimitExceededError(
        `too many event streams open (${mine} for this key, at most ${MAX_STREAMS_PER_KEY}; ${this.open} in all, at most ${MAX_STREAMS}): close some dashboard tabs`,
        { code: 'limit_exceeded' },
      );
    }
    this.open++;
    this.perKey.set(who, mine + 1);
    const out = new PassThrough();
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      this.open--;
      const left = (this.perKey.get(who) ?? 1) - 1;
      if (left > 0) this.perKey.set(who, left);
      else this.perKey.delete(who);
      clearTimeout(timer);
      clearInterval(keepalive);
      unfollow?.();
      out.end();
    };
    signal.addEventListener('abort', end, { once: true });
    out.once('close', end);
    const send = (event: string, data: unknown) => {
      if (!ended) out.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    };
    const keepalive = setInterval(() => {
      if (!ended) out.write(': keepalive\n\n');
    }, KEEPALIVE_MS);
    keepalive.unref();
    // What was last sent of each sandbox, and the time of its newest sample sent.
    const shown = new Map<string, string>();
    const sampled = new Map<string, number>();
    let first = true;
    let timer: NodeJS.Timeout | undefined;
    // The seq of the last lifecycle event sent (undefined until the first pass reads where to start).
    let cursor = options.after;
    const follow = async () => {
      const lifecycle = this.lifecycle;
      if (!lifecycle) return;
      cursor ??= await lifecycle.newestSeq(caller);
      for (;;) {
        const page = await lifecycle.list(caller, {
          afterSeq: cursor,
          order: 'asc',
          limit: LIFECYCLE_PAGE,
          ...(options.types && options.types.length > 0 ? { types: options.types } : {}),
          ...(options.sandboxId ? { sandboxId: options.sandboxId } : {}),
        });
        for (const event of page) {
          if (ended) return;
          out.write(
            `id: ${event.seq}\nevent: lifecycle\ndata: ${JSON.stringify(eventJson(event))}\n\n`,
          );
          cursor = event.seq;
        }
        if (page.length < LIFECYCLE_PAGE) return;
      }
    };
    // One read of the lifecycle events at a time: a wake during one makes it read once more.
    let following: Promise<void> | undefined;
    let followAgain = false;
    const followNow = (): Promise<void> => {
      if (following) {
        followAgain = true;
        return following;
      }
      const run = (async () => {
        try {
          do {
            followAgain = false;
            await follow();
          } while (followAgain && !ended);
        } finally {
          following = undefined;
        }
      })();
      following = run;
      return run;
    };
    // A failed read on a wake is read again at the next pass, which says what failed.
    const unfollow = this.lifecycle
      ? this.wakeOn(() => {
          if (!ended) followNow().catch(() => undefined);
        })
      : undefined;
    const dashboardPass = async () => {
      const now = await this.source.visible(caller);
      if (ended) return;
      if (first) {
        first = false;
        // A client that reconnects is told to wait the interval, not the browser's 3 s.
        out.write(`retry: ${Math.max(this.intervalMs, 1000)}\n\n`);
        send('snapshot', { sandboxes: now });
        for (const sandbox of now) shown.set(sandbox.sandboxId, JSON.stringify(sandbox));
      } else {
        const seen = new Set<string>();
        for (const sandbox of now) {
          seen.add(sandbox.sandboxId);
          const text = JSON.stringify(sandbox);
          if (shown.get(sandbox.sandboxId) !== text) {
            shown.set(sandbox.sandboxId, text);
            send('sandbox', { sandbox });
          }
        }
        for (const id of [...shown.keys()]) {
          if (seen.has(id)) continue;
          shown.delete(id);
          sampled.delete(id);
          const gone = await this.source.find(id).catch(() => undefined);
          send('ended', {
            sandboxId: id,
            state: gone?.state ?? 'killed',
            endReason: gone?.endReason ?? null,
          });
        }
      }
      for (const id of shown.keys()) {
        const after = sampled.get(id);
        // A sandbox new to the stream brings its recent history, enough for a small chart.
        const samples = this.source.samples(id, (after ?? 0) + 1);
        for (const sample of after === undefined ? samples.slice(-HISTORY) : samples) {
          sampled.set(id, sample.at);
          send('metrics', { sandboxId: id, metric: this.source.metricJson(sample) });
        }
      }
    };
    const pass = async () => {
      try {
        if (first && options.lifecycleOnly) {
          first = false;
          out.write(`retry: ${Math.max(this.intervalMs, 1000)}\n\n`);
        }
        if (!options.lifecycleOnly) await dashboardPass();
        await followNow();
      } catch (error) {
        // The registry did not answer this time: say so, and try again at the next pass.
        send('problem', { error: error instanceof Error ? error.message : String(error) });
      }
      if (!ended) timer = setTimeout(() => void pass(), this.intervalMs);
    };
    void pass();
    return out;
  }
}

function eventsInterval(): number {
  return envMilliseconds('ABX_EVENTS_INTERVAL_MS', EVENTS_INTERVAL_MS, 100);
}
