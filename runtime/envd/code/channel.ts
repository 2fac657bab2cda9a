/**
 * A one-reader queue of values, read as an async iterable: what is pushed before the reader
 * comes waits for it; a reader that goes away (the client hung up) leaves the writer unaffected.
 */
export class Channel<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;
  private closed = false;
  private abandoned = false;

  push(item: T): void {
    if (this.closed || this.abandoned) return;
    this.items.push(item);
    this.wake?.();
  }

  close(): void {
    this.closed = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    try {
      for (;;) {
        const item = this.items.shift();
        if (item !== undefined) {
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
    }
  }
}
