/**
 * A request body handed on as it arrives (an E2B upload, to the E2B face): the gateway pushes the
 * client's bytes in, one reader pulls them out. The gateway stops reading the client's socket
 * while {@link full} is true, so the client is held back by TCP, not buffered: at most about
 * `highWater` bytes (plus one socket read) wait here, whatever the body's size.
 */
export class BodyFeed implements AsyncIterable<Buffer> {
  private readonly queue: Buffer[] = [];
  private queued = 0;
  private ended = false;
  private error: unknown;
  private abandoned = false;
  private iterating = false;
  private wake: (() => void) | undefined;

  constructor(
    private readonly highWater: number,
    /** Called when the reader took enough that the gateway may read the client again. */
    private readonly onDrain: () => void,
  ) {}

  /** The reader has this much waiting: stop reading the client. */
  get full(): boolean {
    return this.queued >= this.highWater;
  }

  /** The whole body was pushed (it may not all be read yet). */
  get complete(): boolean {
    return this.ended;
  }

  /** The reader stopped before the end (it answered without the rest): what comes is dropped. */
  get dropped(): boolean {
    return this.abandoned;
  }

  push(chunk: Buffer): void {
    if (this.abandoned || this.ended || this.error !== undefined || chunk.length === 0) return;
    this.queue.push(chunk);
    this.queued += chunk.length;
    this.signal();
  }

  /** The body ended as its framing says. */
  end(): void {
    if (this.error !== undefined) return;
    this.ended = true;
    this.signal();
  }

  /**
   * The body cannot complete (the client went away, its framing broke, it came too slowly): the
   * reader's next pull throws `error`, so nothing downstream takes a cut body for a whole one.
   */
  fail(error: unknown): void {
    if (this.ended || this.error !== undefined) return;
    this.error = error;
    this.queue.length = 0;
    this.queued = 0;
    this.signal();
  }

  /** The reader answered without the rest of the body: what is queued and what comes is dropped. */
  drop(): void {
    if (!this.ended || this.queue.length > 0) this.abandoned = true;
    this.queue.length = 0;
    this.queued = 0;
    this.onDrain();
  }

  private signal(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  [Symbol.asyncIterator](): AsyncIterator<Buffer> {
    if (this.iterating) throw new Error('a request body is read once');
    this.iterating = true;
    return {
      next: async (): Promise<IteratorResult<Buffer>> => {
        for (;;) {
          if (this.error !== undefined) throw this.error;
          if (this.abandoned) return { done: true, value: undefined };
          const chunk = this.queue.shift();
          if (chunk !== undefined) {
            const wasFull = this.full;
            this.queued -= chunk.length;
            if (wasFull && !this.full) this.onDrain();
            return { done: false, value: chunk };
          }
          if (this.ended) return { done: true, value: undefined };
          await new Promise<void>((resolve) => {
            this.wake = resolve;
          });
        }
      },
      return: async (): Promise<IteratorResult<Buffer>> => {
        this.drop();
        return { done: true, value: undefined };
      },
    };
  }
}
