import { NotFoundError, SandboxError } from '../errors.js';
import { ndjsonLines } from '../util/ndjson.js';
import type { EntryInfo } from './filesystem.js';
import type { HttpClient } from './http-client.js';

/** What happened to a path below a watched directory. */
export type WatchEventType = 'create' | 'write' | 'remove' | 'rename' | 'chmod';

/** One change below a watched directory. */
export interface WatchEvent {
  type: WatchEventType;
  /** Relative to the watched directory: `a.txt`, or `sub/a.txt` in a recursive watch. */
  name: string;
  /** The absolute path in the sandbox. */
  path: string;
  /** The path as it is now; absent when it is gone (remove, rename away). */
  entry?: Omit<EntryInfo, 'name'>;
}

export interface WatchOptions {
  /** Watch every directory below too (new ones included). Default false. */
  recursive?: boolean;
  /**
   * Called once when the watch ends: without an argument after `stop()`, with the error when it
   * ended otherwise (the directory was removed, a bound was reached, the sandbox went away).
   */
  onExit?: (error?: Error) => void | Promise<void>;
}

interface WatchLine {
  start?: { id: string; path: string; recursive: boolean };
  event?: WatchEvent;
  dropped?: number;
  end?: { reason: 'removed' | 'limit' | 'error'; message: string };
}

/** envd sends a keepalive every 5 s: a stream silent for this long is dead. */
const STREAM_IDLE_MS = 20_000;

/** A running watch of a directory; {@link WatchHandle.stop} ends it. */
export class WatchHandle {
  /** Events lost because this client read too slowly (envd keeps at most 10 000 per watch). */
  dropped = 0;
  /** Settles when the watch has ended and `onExit` was called. */
  readonly done: Promise<void>;

  private constructor(
    /** The directory watched, resolved by envd. */
    readonly path: string,
    private readonly abort: AbortController,
    events: AsyncIterator<WatchLine>,
    onEvent: (event: WatchEvent) => void | Promise<void>,
    options: WatchOptions,
  ) {
    this.done = this.follow(events, onEvent, options);
  }

  /** Opens a watch; resolves once envd watches the directory. @internal */
  static async open(
    envd: HttpClient,
    path: string,
    onEvent: (event: WatchEvent) => void | Promise<void>,
    options: WatchOptions,
  ): Promise<WatchHandle> {
    const abort = new AbortController();
    const response = await envd.send('GET', '/files/watch', {
      query: { path, recursive: options.recursive ?? false },
      timeoutMs: STREAM_IDLE_MS,
      signal: abort.signal,
    });
    const events = ndjsonLines<WatchLine>(response.body)[Symbol.asyncIterator]();
    const first = await events.next().catch((error: Error) => {
      abort.abort();
      throw error;
    });
    if (first.done || !first.value.start) {
      abort.abort();
      throw new SandboxError(`envd did not start watching ${path}`);
    }
    return new WatchHandle(first.value.start.path, abort, events, onEvent, options);
  }

  /** Stops watching; resolves when the watch has ended. */
  async stop(): Promise<void> {
    this.abort.abort();
    await this.done;
  }

  private async follow(
    events: AsyncIterator<WatchLine>,
    onEvent: (event: WatchEvent) => void | Promise<void>,
    options: WatchOptions,
  ): Promise<void> {
    let failure: Error | undefined;
    try {
      for (let next = await events.next(); !next.done; next = await events.next()) {
        const line = next.value;
        if (line.event) await onEvent(line.event);
        else if (line.dropped) this.dropped += line.dropped;
        else if (line.end) {
          failure =
            line.end.reason === 'removed'
              ? new NotFoundError(line.end.message)
              : new SandboxError(line.end.message);
          break;
        }
      }
      if (!failure && !this.abort.signal.aborted) {
        failure = new SandboxError(`the watch of ${this.path} ended: envd closed the stream`);
      }
    } catch (error) {
      if (!this.abort.signal.aborted) failure = error as Error;
    } finally {
      this.abort.abort();
      await events.return?.().catch(() => undefined);
    }
    try {
      await (failure ? options.onExit?.(failure) : options.onExit?.());
    } catch {
      // onExit is the last callback: nothing is left to give its error to.
    }
  }
}
