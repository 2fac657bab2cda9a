import { constants } from 'node:os';
import { TextDecoder } from 'node:util';
import type { OutputEncoding } from '../../runtime/protocol/wire.js';
import {
  CommandExitError,
  type CommandResult,
  CommandTimeoutError,
  SandboxError,
} from '../errors.js';
import type { ExitWire, ProcessApi, ProcessEvent, StreamOffsets } from './process-api.js';

/** Callbacks that get a command's output live, each stream on its own, in order. */
export interface OutputCallbacks {
  /** Called with each piece of stdout as it arrives (UTF-8 text, never a split character). */
  onStdout?: (data: string) => void;
  /** Called with each piece of stderr as it arrives. */
  onStderr?: (data: string) => void;
  /**
   * Called with each piece of stdout as the bytes the command wrote, UTF-8 or not (binary
   * output, another encoding). With either bytes callback, the text (`onStdout`, `stdout`) is
   * decoded from those same bytes here, by a streaming `TextDecoder`. Output envd no longer
   * holds (past 16 MiB a stream) is skipped: the text says so, the bytes just go on.
   */
  onStdoutBytes?: (data: Uint8Array) => void;
  /** Called with each piece of stderr as the bytes the command wrote. */
  onStderrBytes?: (data: Uint8Array) => void;
}

/** The output encoding to ask envd for: raw bytes only when a callback wants them. */
export function outputFor(options: OutputCallbacks): OutputEncoding | undefined {
  return options.onStdoutBytes || options.onStderrBytes ? 'base64' : undefined;
}

/** Options every handle takes. */
export interface HandleOptions extends OutputCallbacks {
  /** `wait()` resolves with the result instead of throwing {@link CommandExitError}. */
  allowNonZeroExit?: boolean;
}

/** What a handle needs to know about where its events come from. */
export interface HandleSource {
  api: ProcessApi;
  pid: string;
  /** The events, already open (and past `start` for a new command). */
  events: AsyncIterator<ProcessEvent>;
  /** Where those events begin. */
  from: StreamOffsets;
  /** Aborts the open stream (and reopened ones). */
  abort: AbortController;
  /** For the timeout message; unknown for a process found by {@link Commands.connect}. */
  timeoutMs?: number;
}

/**
 * A command running (or finished) in the sandbox's envd: its output so far, and `wait()` for the
 * result. The handle follows the command's event stream; if that stream breaks while the sandbox
 * lives, it resumes from the byte offsets already received, so nothing is lost or repeated.
 */
export class CommandHandle {
  /** envd's id of the process (as `commands.list()` and `commands.connect()` name it). */
  readonly pid: string;
  private out = '';
  private err = '';
  private exit: ExitWire | undefined;
  private readonly offsets: StreamOffsets;
  private readonly finished: Promise<ExitWire>;
  /** Set when envd sends raw bytes: the text of each stream is decoded here. */
  private readonly decoders: Record<'stdout' | 'stderr', TextDecoder> | undefined;

  /** @internal Made by `sandbox.commands.start()` and `sandbox.commands.connect()`. */
  constructor(
    private readonly source: HandleSource,
    private readonly options: HandleOptions = {},
  ) {
    this.pid = source.pid;
    this.offsets = { ...source.from };
    this.decoders = outputFor(options)
      ? { stdout: new TextDecoder(), stderr: new TextDecoder() }
      : undefined;
    this.finished = this.follow().catch((error: unknown) => {
      if (!source.abort.signal.aborted) throw error;
      throw new SandboxError(`stopped following command ${this.pid}: disconnect() was called`, {
        cause: error,
      });
    });
    // wait() reports a failure; a handle nobody waits for must not crash the program with it.
    this.finished.catch(() => {});
  }

  /** The stdout received so far. */
  get stdout(): string {
    return this.out;
  }

  /** The stderr received so far. */
  get stderr(): string {
    return this.err;
  }

  /** The exit code once the command has exited (128 + n when killed by signal n). */
  get exitCode(): number | undefined {
    return this.exit ? exitCodeOf(this.exit) : undefined;
  }

  /**
   * Waits for the command to exit: `{ stdout, stderr, exitCode }`. A non-zero exit throws
   * {@link CommandExitError} carrying the result (unless `allowNonZeroExit`); a timeout throws
   * {@link CommandTimeoutError} with the output captured until the process group was killed. A
   * sandbox that stops meanwhile gives an error, not a hang.
   */
  async wait(): Promise<CommandResult> {
    const exit = await this.finished;
    const result: CommandResult = {
      stdout: this.out,
      stderr: this.err,
      exitCode: exitCodeOf(exit),
    };
    if (exit.timed_out) {
      const after = this.source.timeoutMs === undefined ? '' : ` after ${this.source.timeoutMs} ms`;
      result.error = `timed out${after}`;
      throw CommandTimeoutError.of(
        `command ${this.pid} timed out${after}; its process group was killed (partial output in .result)`,
        result,
      );
    }
    if (exit.signal) result.error = `killed by ${exit.signal}`;
    if (result.exitCode !== 0 && !this.options.allowNonZeroExit) throw CommandExitError.of(result);
    return result;
  }

  /** Sends a signal (default SIGKILL) to the command's whole process group; false if unknown. */
  kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<boolean> {
    return this.source.api.kill(this.pid, signal);
  }

  /** Writes to the command's stdin: text (as UTF-8) or bytes, as they are. */
  sendStdin(data: string | Uint8Array): Promise<void> {
    return this.source.api.stdin(this.pid, data, false);
  }

  /** Closes the command's stdin: it reads end of file. */
  closeStdin(): Promise<void> {
    return this.source.api.stdin(this.pid, '', true);
  }

  /**
   * Stops receiving output; the command keeps running in the sandbox (reattach with
   * `commands.connect(pid)`). A pending `wait()` rejects.
   */
  disconnect(): void {
    this.source.abort.abort();
  }

  /**
   * Reads events until `exit`. A broken stream is reopened from the offsets received (which also
   * explains the failure when the sandbox is gone); a reopened stream that fails before giving a
   * single event is final.
   */
  private async follow(): Promise<ExitWire> {
    let events = this.source.events;
    const signal = this.source.abort.signal;
    let reopened = false;
    for (;;) {
      let failure: unknown;
      try {
        for (;;) {
          const next = await events.next();
          if (next.done) break;
          reopened = false;
          const exit = this.apply(next.value);
          if (exit) {
            this.exit = exit;
            return exit;
          }
        }
      } catch (error) {
        if (signal.aborted) throw error;
        // A callback that throws ends the following with its own error.
        if (error instanceof CallbackError) throw error.cause;
        failure = error;
      } finally {
        await events.return?.().catch(() => undefined);
      }
      if (reopened) {
        const why = failure ? (failure as Error).message : 'it ended before the command exited';
        throw new SandboxError(`lost the output stream of command ${this.pid}: ${why}`, {
          cause: failure,
        });
      }
      events = await this.source.api.events(
        this.pid,
        this.offsets,
        signal,
        outputFor(this.options),
      );
      reopened = true;
    }
  }

  /** Applies one event: output goes to the text and the callbacks; returns the exit, if it is one. */
  private apply(event: ProcessEvent): ExitWire | undefined {
    if ('exit' in event) {
      // A character cut short at the very end is U+FFFD, as envd's own text would have it.
      for (const stream of ['stdout', 'stderr'] as const) {
        const rest = this.decoders?.[stream].decode();
        if (rest) this.output(stream, rest);
      }
      return event.exit;
    }
    if (!('stream' in event)) return undefined;
    this.offsets[event.stream] = 'dropped' in event ? event.offset : event.next;
    if ('dropped' in event) {
      // The bytes before the gap cannot join those after it.
      const rest = this.decoders?.[event.stream].decode() ?? '';
      this.output(
        event.stream,
        `${rest}[abx: ${event.dropped} earlier bytes of ${event.stream} were dropped: envd keeps only the newest output of each stream]\n`,
      );
      return undefined;
    }
    const decoder = this.decoders?.[event.stream];
    if (!decoder || event.encoding !== 'base64') {
      this.output(event.stream, event.data);
      return undefined;
    }
    const bytes = Buffer.from(event.data, 'base64');
    const onBytes =
      event.stream === 'stdout' ? this.options.onStdoutBytes : this.options.onStderrBytes;
    try {
      onBytes?.(bytes);
    } catch (error) {
      throw new CallbackError(error);
    }
    const text = decoder.decode(bytes, { stream: true });
    if (text) this.output(event.stream, text);
    return undefined;
  }

  /** Adds text to a stream's output and hands it to its callback. */
  private output(stream: 'stdout' | 'stderr', text: string): void {
    if (stream === 'stdout') this.out += text;
    else this.err += text;
    const callback = stream === 'stdout' ? this.options.onStdout : this.options.onStderr;
    try {
      callback?.(text);
    } catch (error) {
      throw new CallbackError(error);
    }
  }
}

/** Marks an error thrown by a user callback, so it is not taken for a broken stream. */
class CallbackError extends Error {
  constructor(cause: unknown) {
    super('an output callback threw', { cause });
  }
}

/** The exit code, shell style: 128 + the signal number when a signal ended the process. */
function exitCodeOf(exit: ExitWire): number {
  if (exit.code !== null) return exit.code;
  const number = exit.signal ? constants.signals[exit.signal as NodeJS.Signals] : undefined;
  return 128 + (number ?? 0);
}
