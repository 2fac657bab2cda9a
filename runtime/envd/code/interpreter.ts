import type { CodeEvent, CodeLanguage } from '../../protocol/wire.js';
import { killGroup } from '../../server/child-process.js';
import type { ManagedProcess } from '../../server/process-table.js';
import { Channel } from './channel.js';

/** How long an interrupted cell may take to stop before its interpreter is killed. */
export const INTERRUPT_GRACE_MS = 2000;

/**
 * How much of a cell's output envd holds for a client that reads slowly (characters of text and
 * encoded results): past it the interpreter's output pipes are not read, so the cell blocks on
 * its next write until the client catches up (or its timeout interrupts it).
 */
export const EVENT_BACKLOG_LIMIT = 8 * 1024 * 1024;

/** The characters an event holds, near enough to its size on the wire. */
export function eventSize(event: CodeEvent): number {
  let size = 32;
  for (const value of Object.values(event)) {
    if (typeof value === 'string') size += value.length;
    else if (value !== null && typeof value === 'object') size += JSON.stringify(value).length;
  }
  return size;
}

/** One `POST /execute` request as an interpreter takes it. */
export interface Execution {
  code: string;
  env: Record<string, string>;
  timeoutMs: number;
  /** Aborted when the client went away: a queued cell is skipped, a running one interrupted. */
  signal?: AbortSignal;
}

/** The cell being run: where its events go and how it ends. */
export interface Running {
  events: Channel<CodeEvent>;
  count: number;
  timeoutMs: number;
  timedOut: boolean;
  finish(): void;
}

const errorEvent = (name: string, value: string, traceback = ''): CodeEvent => ({
  type: 'error',
  name,
  value,
  traceback,
});

/**
 * One interpreter process of a code context, kept alive between executions. Cells run one at a
 * time, in the order they arrived; each gets its events as they come. A cell past its timeout is
 * interrupted (SIGINT) and, if it has not ended {@link INTERRUPT_GRACE_MS} later, the interpreter
 * is killed and the context is dead until restarted.
 */
export abstract class Interpreter {
  /** Why the interpreter is gone, once it is. */
  dead: string | undefined;
  protected running: Running | undefined;
  private count = 0;
  private queue: Promise<void> = Promise.resolve();

  constructor(
    readonly language: CodeLanguage,
    readonly entry: ManagedProcess,
  ) {
    entry.child.once('close', (code, signal) => {
      this.dead ??= `its ${language} interpreter ${signal ? `was killed by ${signal}` : `exited with code ${code}`}`;
      const running = this.running;
      if (running) {
        running.events.push(
          errorEvent(
            'ContextDeadError',
            `the code context died while running this cell: ${this.dead}; restart it (POST /contexts/{id}/restart) for a new interpreter (its state is lost)`,
          ),
        );
        running.finish();
      }
    });
  }

  /** Queues a cell; its events (stdout, stderr, results, error), `end` last. */
  execute(execution: Execution): AsyncIterable<CodeEvent> {
    const events = new Channel<CodeEvent>({
      limit: EVENT_BACKLOG_LIMIT,
      size: eventSize,
      pause: () => this.hold(true),
      resume: () => this.hold(false),
    });
    this.queue = this.queue.then(() => this.run(execution, events));
    return events;
  }

  /** Stops (or starts again) reading the interpreter's output, so it blocks on its writes. */
  private hold(paused: boolean): void {
    for (const stream of [this.entry.child.stdout, this.entry.child.stderr]) {
      if (paused) stream?.pause();
      else stream?.resume();
    }
  }

  /** Kills the interpreter and everything it started. */
  kill(): void {
    killGroup(this.entry.child);
  }

  /** Starts reading the interpreter's output (called once, right after it is made). */
  abstract start(): void;

  /** Writes the cell to the interpreter. */
  protected abstract send(execution: Execution, count: number): void;

  /** Interrupts the cell that runs (SIGINT). */
  protected interrupt(): void {
    try {
      this.entry.child.kill('SIGINT');
    } catch {
      // already gone
    }
  }

  /** An error of a cell that was interrupted at its timeout becomes a TimeoutError. */
  protected error(running: Running, event: CodeEvent & { type: 'error' }): CodeEvent {
    if (!running.timedOut) return event;
    return errorEvent(
      'TimeoutError',
      `the cell ran past its timeout of ${running.timeoutMs} ms and was interrupted (${event.name}); the context keeps its state`,
      event.traceback,
    );
  }

  private run(execution: Execution, events: Channel<CodeEvent>): Promise<void> {
    const count = ++this.count;
    return new Promise<void>((resolve) => {
      const timers: NodeJS.Timeout[] = [];
      const running: Running = {
        events,
        count,
        timeoutMs: execution.timeoutMs,
        timedOut: false,
        finish: () => {
          for (const timer of timers) clearTimeout(timer);
          if (this.running === running) this.running = undefined;
          events.push({ type: 'end', execution_count: count });
          events.close();
          resolve();
        },
      };
      if (this.dead) {
        events.push(errorEvent('ContextDeadError', this.deadMessage()));
        running.finish();
        return;
      }
      if (execution.signal?.aborted) {
        // Nobody waits for this cell any more: do not run it.
        running.finish();
        return;
      }
      this.running = running;
      execution.signal?.addEventListener(
        'abort',
        () => {
          if (this.running !== running) return;
          this.interrupt();
          timers.push(setTimeout(() => this.stuck(running, execution), INTERRUPT_GRACE_MS));
        },
        { once: true },
      );
      if (execution.timeoutMs > 0) {
        timers.push(
          setTimeout(() => {
            running.timedOut = true;
            this.interrupt();
            timers.push(setTimeout(() => this.stuck(running, execution), INTERRUPT_GRACE_MS));
          }, execution.timeoutMs),
        );
      }
      this.send(execution, count);
    });
  }

  /** The cell ignored its interrupt: kill the interpreter, say so, end the cell. */
  private stuck(running: Running, execution: Execution): void {
    if (this.running !== running) return;
    this.running = undefined;
    this.dead = `its ${this.language} interpreter was killed: a cell did not stop within ${INTERRUPT_GRACE_MS} ms of its interrupt`;
    this.kill();
    running.events.push(
      errorEvent(
        'TimeoutError',
        `the cell ran past its timeout of ${execution.timeoutMs} ms and did not stop when interrupted, so the context's interpreter was killed; restart the context (POST /contexts/{id}/restart)`,
      ),
    );
    running.finish();
  }

  /** What an execute on a dead context is told. */
  deadMessage(): string {
    return `this code context is dead: ${this.dead}; restart it (POST /contexts/{id}/restart) for a new interpreter (its state is lost)`;
  }
}
