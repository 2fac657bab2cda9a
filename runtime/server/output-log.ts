/**
 * The output of a background process or terminal, addressed by absolute byte offsets so a client
 * can replay from where it stopped. Only the newest `capacity` bytes are kept; reading from an
 * offset that was dropped starts at the oldest byte still held.
 */
export class OutputLog {
  private chunks: Buffer[] = [];
  private held = 0;
  /** Offset of the first byte still held. */
  private base = 0;
  private closed = false;
  private readonly waiters = new Set<() => void>();

  constructor(private readonly capacity = 8 * 1024 * 1024) {}

  /** Offset just past the last byte written. */
  get end(): number {
    return this.base + this.held;
  }

  get done(): boolean {
    return this.closed;
  }

  append(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.held += chunk.length;
    while (this.held > this.capacity && this.chunks.length > 1) {
      const dropped = this.chunks.shift() as Buffer;
      this.held -= dropped.length;
      this.base += dropped.length;
    }
    this.wake();
  }

  /** No more output will come (the process exited). */
  close(): void {
    this.closed = true;
    this.wake();
  }

  /** The bytes from `offset` on, and the offset to read from next time. */
  read(offset: number): { data: Buffer; offset: number; next: number } {
    const start = Math.max(offset, this.base);
    const all = Buffer.concat(this.chunks);
    return {
      data: all.subarray(Math.min(start - this.base, all.length)),
      offset: start,
      next: this.end,
    };
  }

  /** Resolves when output past `offset` exists, the log closes, the signal aborts or `ms` pass. */
  async waitPast(offset: number, ms: number, signal?: AbortSignal): Promise<void> {
    if (this.end > offset || this.closed || signal?.aborted) return;
    await new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.waiters.delete(done);
        signal?.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.waiters.add(done);
      signal?.addEventListener('abort', done, { once: true });
    });
  }

  private wake(): void {
    for (const waiter of [...this.waiters]) waiter();
  }
}
