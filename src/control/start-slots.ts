import { availableParallelism } from 'node:os';

/** Who waits for a slot: a caller's create goes before the warm pool's refills. */
export type StartKind = 'create' | 'refill';

/** Provider starts under way at once by default: starting a sandbox is mostly CPU (Node, bwrap). */
export const DEFAULT_START_CONCURRENCY = Math.max(2, availableParallelism());

/**
 * Bounds the sandbox starts under way at once, creates and refills together: a burst of creates
 * starts in parallel without every start slowing every other down. A freed slot goes to the
 * oldest waiting create, else to the oldest refill. A refill never starts in the turn of the
 * event loop that freed its slot, so its synchronous work (spawning bwrap...) cannot delay the
 * answer of the create that finished.
 */
export class StartSlots {
  private busy = 0;
  private readonly waiting: Record<StartKind, (() => void)[]> = { create: [], refill: [] };
  private pumping = false;

  constructor(readonly limit = DEFAULT_START_CONCURRENCY) {
    if (!Number.isInteger(limit) || limit < 1) {
      throw new RangeError(`the start concurrency must be a whole number ≥ 1, not ${limit}`);
    }
  }

  /** Runs `task` once a slot is free, holding the slot until it settles. */
  async run<T>(kind: StartKind, task: () => Promise<T>): Promise<T> {
    if (this.busy < this.limit && this.waiting.create.length === 0) this.busy++;
    else await new Promise<void>((resolve) => this.waiting[kind].push(resolve));
    try {
      return await task();
    } finally {
      this.busy--;
      this.pump();
    }
  }

  /** Starts waiting in the queue of `kind`. */
  queued(kind: StartKind): number {
    return this.waiting[kind].length;
  }

  private pump(): void {
    while (this.busy < this.limit && this.waiting.create.length > 0) {
      this.busy++;
      this.waiting.create.shift()?.();
    }
    if (this.busy >= this.limit || this.waiting.refill.length === 0 || this.pumping) return;
    this.pumping = true;
    setImmediate(() => {
      this.pumping = false;
      while (
        this.busy < this.limit &&
        this.waiting.create.length === 0 &&
        this.waiting.refill.length > 0
      ) {
        this.busy++;
        this.waiting.refill.shift()?.();
      }
      this.pump();
    });
  }
}
