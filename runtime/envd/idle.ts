import { readFileSync, rmSync } from 'node:fs';

/**
 * envd's exit code when it went to sleep (EX_TEMPFAIL): the shell loop it runs under waits for a
 * wake (a line on /run/abx/wake) and starts it again. Any other exit ends the sandbox.
 */
export const ASLEEP_EXIT_CODE = 75;
/**
 * How long envd keeps its listener after unlinking its socket's path: a connect that opened the
 * path just before is accepted (and keeps it awake) rather than refused.
 */
export const SLEEP_GRACE_MS = 100;

/** What envd's sleep needs to know of it. */
export interface IdleState {
  /** Open connections that keep it awake (in flight or kept alive; not the daemon's log read). */
  busyConnections(): number;
  /** Connections accepted since the start. */
  accepted(): number;
  /** Children that do not keep it awake (the idle pre-started command server). */
  spareChildren(): number[];
  /** Anything else a restart would lose (a watch, a forwarded connection), named; else undefined. */
  holds(): string | undefined;
  /** Listens at the socket's path again (the sleep was called off). */
  relisten(path: string): Promise<void>;
  /** Logs a line of envd's (the sandbox's log). */
  log(message: string): void;
  /** Just before the exit: stops the spare children, closes forwarders, saves the environment. */
  beforeSleep(): void;
}

/** envd's children (the main thread's: every spawn), or undefined where /proc does not say. */
function children(): number[] | undefined {
  try {
    return readFileSync(`/proc/self/task/${process.pid}/children`, 'utf8')
      .trim()
      .split(/\s+/)
      .filter(Boolean)
      .map(Number);
  } catch {
    return undefined;
  }
}

/**
 * Why envd must stay awake now, or undefined: an open connection (a stream, a watch, a PTY's,
 * a keep-alive one), a child process (a command, background process, code context, the command
 * server, a PTY), or state of {@link IdleState.holds}.
 */
export function awakeReason(state: IdleState): string | undefined {
  const busy = state.busyConnections();
  if (busy > 0) return `${busy} open connection(s)`;
  const kids = children();
  if (kids === undefined) return 'its children cannot be read from /proc';
  const spare = new Set(state.spareChildren());
  const running = kids.filter((pid) => !spare.has(pid));
  if (running.length > 0) return `${running.length} child process(es)`;
  return state.holds();
}

/**
 * Exits envd with {@link ASLEEP_EXIT_CODE} once nothing has kept it awake for `idleMs`
 * (checked every tenth of it, at most every second). The socket's path is unlinked first, so a new
 * connect fails with ENOENT (the daemon's cue to wake it) instead of reaching a process on its way
 * out; a connection accepted in the {@link SLEEP_GRACE_MS} after calls the sleep off.
 */
export function sleepWhenIdle(idleMs: number, socket: string, state: IdleState): void {
  let awakeAt = Date.now();
  let sleeping = false;
  const check = async () => {
    if (sleeping) return;
    if (awakeReason(state) !== undefined) {
      awakeAt = Date.now();
      return;
    }
    if (Date.now() - awakeAt < idleMs) return;
    sleeping = true;
    const before = state.accepted();
    rmSync(socket, { force: true });
    state.log(`envd sleeps after ${idleMs} ms idle; the next request wakes it`);
    await new Promise((resolve) => setTimeout(resolve, SLEEP_GRACE_MS));
    const reason = state.accepted() !== before ? 'a connection came in' : awakeReason(state);
    if (reason !== undefined) {
      await state.relisten(socket);
      state.log(`envd stays awake: ${reason}`);
      awakeAt = Date.now();
      sleeping = false;
      return;
    }
    state.beforeSleep();
    process.exit(ASLEEP_EXIT_CODE);
  };
  const timer = setInterval(
    () => void check().catch(() => undefined),
    Math.max(50, Math.min(1000, Math.floor(idleMs / 10))),
  );
  timer.unref();
}

/**
 * How long envd has had no request in flight (but the daemon's read of its log) before it gives
 * back the memory its requests left: an agent's next call usually comes later than this (a
 * model's turn), so the collection falls between calls, not on one.
 */
export const SETTLE_MS = 2000;

/**
 * Collects all of envd's garbage and gives V8's spare pages back (V8's "last resort" collection,
 * which a plain major one does not: it also shrinks the young generation to what it holds and
 * releases the pages V8 pooled). About 2 MiB of a fresh envd's 13 after a command (Node 24,
 * bench/README.md "envd's memory"), a few ms of CPU once per quiet spell. Needs `--expose-gc`
 * (ENVD_NODE_OPTIONS); without it (an envd started by an older daemon) it does nothing. Returns
 * whether it collected.
 */
export function settleGarbage(): boolean {
  const collect = (globalThis as { gc?: (options?: object) => unknown }).gc;
  if (typeof collect !== 'function') return false;
  collect({ type: 'major', execution: 'sync', flavor: 'last-resort' });
  return true;
}
