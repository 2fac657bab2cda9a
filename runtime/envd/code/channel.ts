/**
 * Flow control of a {@link Channel}: past `limit` (in the units of `size`) of unread items the
 * writer is paused, and resumed once the reader has brought that under half of it (or left).
 */
export interface ChannelFlow<T> {
  limit: number;
  size(item: T): number;
  pause(): void;
  resume(): void;
}

/**
 * A one-reader queue of values, read as an async iterable: what is pushed before the reader
 * comes waits for it; a reader that goes away (the client hung up) leaves the writer unaffected.
 * With a {@link ChannelFlow}, a slow reader holds back the writer instead of growing the queue.
 */
export class Channel<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;
  private closed = false;
  private abandoned = false;
  private queued = 0;
  private paused = false;

  constructor(private readonly flow?: ChannelFlow<T>) {}

  push(item: T): void {
    if (this.closed || this.abandoned) return;
    this.items.push(item);
    if (this.flow) {
      this.queued += this.flow.size(item);
      if (!this.paused && this.queued > this.flow.limit) {
        this.paused = true;
        this.flow.pause();
      }
    }
    this.wake?.();
  }

  close(): void {
    this.closed = true;
    this.wake?.();
  }

  /** True while the writer is held back by an unread backlog. */
  get holding(): boolean {
    return this.paused;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    try {
      for (;;) {
        if (this.items.length > 0) {
          const item = this.items.shift() as T;
          this.taken(item);
          yield item;
          continue;
        }
        if (this.closed) return;
        await new Promise<void>((resolve) => {
          this.wake = resolve;
        });
        this.wake = undefined;
      }
    } finally {
      this.abandoned = true;
      this.items.length = 0;
      this.release();
    }
  }

  private taken(item: T): void {
    if (!this.flow) return;
    this.queued -= this.flow.size(item);
    if (this.queued <= this.flow.limit / 2) this.release();
  }

  private release(): void {
    if (!this.paused) return;
    this.paused = false;
    this.flow?.resume();
  }
}
