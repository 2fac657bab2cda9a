/** Appends smaller than this are merged into the last chunk, so a log of tiny writes stays cheap. */
const COALESCE_BYTES = 8 * 1024;

/**
 * The output of a background process or terminal, addressed by absolute byte offsets so a client
 * can replay from where it stopped. Only the newest `capacity` bytes are kept; reading from an
 * offset that was dropped starts at the oldest byte still held ({@link start}).
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

  /** Offset of the oldest byte still held: the number of bytes dropped so far. */
  get start(): number {
    return this.base;
  }

  get done(): boolean {
    return this.closed;
  }

  append(chunk: Buffer): void {
    const last = this.chunks.at(-1);
    // Merging copies, so a short line does not pin a chunk object (or a pooled buffer) of its own.
    if (last && last.length + chunk.length <= COALESCE_BYTES) {
      this.chunks[this.chunks.length - 1] = Buffer.concat([last, chunk]);
    } else {
      this.chunks.push(chunk);
    }
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

  /**
   * Up to `maxBytes` from `offset` on, the offset they start at (later than asked when that part
   * was dropped) and the offset to read from next time.
   */
  read(offset: number, maxBytes = Number.POSITIVE_INFINITY) {
    const start = Math.max(offset, this.base);
    const parts: Buffer[] = [];
    let size = 0;
    let at = this.base;
    // Walks the chunks instead of concatenating the whole log: a follower reads often.
    for (const chunk of this.chunks) {
      if (size >= maxBytes) break;
      const chunkEnd = at + chunk.length;
      if (chunkEnd > start) {
        const part = chunk.subarray(Math.max(0, start - at));
        const taken = part.subarray(0, Math.min(part.length, maxBytes - size));
        parts.push(taken);
        size += taken.length;
      }
      at = chunkEnd;
    }
    const data = parts.length === 1 ? (parts[0] as Buffer) : Buffer.concat(parts);
    return { data, offset: start, next: Math.min(start, this.end) + data.length };
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
