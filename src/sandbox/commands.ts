import { type CommandResult, SandboxError } from '../errors.js';
import { CommandHandle, type HandleOptions, outputFor } from './command-handle.js';
import type { HttpClient } from './http-client.js';
import { ProcessApi, type ProcessInfoWire } from './process-api.js';

/** Options of {@link Commands.run}. */
export interface RunOptions extends HandleOptions {
  /** Working directory; default the template's workdir. */
  cwd?: string;
  /** Extra environment variables for this command. */
  envs?: Record<string, string>;
  /** Kills the command's whole process group after this; default 60 s, 0 for no limit. */
  timeoutMs?: number;
}

/** Options of {@link Commands.start}. */
export interface CommandStartOptions extends RunOptions {
  /** Keep stdin open for `sendStdin()` (default); false closes it at once. */
  stdin?: boolean;
}

/** Options of {@link Commands.connect}. */
export interface CommandConnectOptions extends HandleOptions {
  /** Replay stdout from this byte on; default 0, the start. */
  stdoutOffset?: number;
  /** Replay stderr from this byte on; default 0, the start. */
  stderrOffset?: number;
}

/** A process envd keeps track of, running or finished. */
export interface ProcessInfo {
  /** envd's id: what {@link Commands.connect} and {@link Commands.kill} take. */
  pid: string;
  /** The operating system's pid inside the sandbox. */
  osPid: number | null;
  cmd: string;
  cwd: string;
  startedAt: string;
  running: boolean;
  exitCode: number | null;
  signal: string | null;
}

/** The default timeout of a command: 60 s. */
export const DEFAULT_COMMAND_TIMEOUT_MS = 60_000;

function processInfo(wire: ProcessInfoWire): ProcessInfo {
  return {
    pid: wire.id,
    osPid: wire.pid,
    cmd: wire.command,
    cwd: wire.cwd,
    startedAt: wire.started_at,
    running: wire.running,
    exitCode: wire.exit_code,
    signal: wire.signal,
  };
}

/**
 * Shell commands in a sandbox, through its envd: run to completion, or start in the background
 * and manage by id, from this client or any other.
 *
 * @example
 * const { stdout } = await sandbox.commands.run('ls -l', { onStderr: (d) => process.stderr.write(d) });
 * const server = await sandbox.commands.start('python3 -m http.server 8000', { timeoutMs: 0 });
 * await server.kill();
 */
export class Commands {
  private readonly api: ProcessApi;

  constructor(envd: HttpClient) {
    this.api = new ProcessApi(envd);
  }

  /**
   * Runs a shell command to completion: `{ stdout, stderr, exitCode }`. `onStdout`/`onStderr`
   * get the output live. A non-zero exit throws {@link CommandExitError} carrying the result
   * (unless `allowNonZeroExit`); a timeout kills the command's process group and throws
   * {@link CommandTimeoutError} (a {@link TimeoutError}) with the output captured so far. The
   * command's stdin is closed.
   */
  async run(command: string, options: RunOptions = {}): Promise<CommandResult> {
    const handle = await this.start(command, { ...options, stdin: false });
    return handle.wait();
  }

  /**
   * Starts a shell command in the background, in its own process group, and returns a
   * {@link CommandHandle} as soon as it runs. Its output is kept by envd, so another client can
   * {@link connect} to it later and replay everything.
   */
  async start(command: string, options: CommandStartOptions = {}): Promise<CommandHandle> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
    const abort = new AbortController();
    const events = await this.api.exec(
      {
        cmd: command,
        cwd: options.cwd,
        envs: options.envs,
        timeoutMs,
        stdin: options.stdin ?? true,
        output: outputFor(options),
      },
      abort.signal,
    );
    const first = await events.next().catch((error: Error) => {
      throw new SandboxError(`the command was not confirmed as started: ${error.message}`, {
        cause: error,
      });
    });
    if (first.done || !('start' in first.value)) {
      abort.abort();
      throw new SandboxError('envd did not answer POST /exec with a start event');
    }
    return new CommandHandle(
      {
        api: this.api,
        pid: first.value.start.id,
        events,
        from: { stdout: 0, stderr: 0 },
        abort,
        ...(timeoutMs > 0 ? { timeoutMs } : {}),
      },
      options,
    );
  }

  /**
   * Attaches to a process by id (started by this client or another, running or finished):
   * replays its output from the start (or the given offsets) to the callbacks, then follows it
   * live. Unknown ids throw {@link NotFoundError}.
   */
  async connect(pid: string, options: CommandConnectOptions = {}): Promise<CommandHandle> {
    const from = { stdout: options.stdoutOffset ?? 0, stderr: options.stderrOffset ?? 0 };
    const abort = new AbortController();
    const events = await this.api.events(pid, from, abort.signal, outputFor(options));
    return new CommandHandle({ api: this.api, pid, events, from, abort }, options);
  }

  /** The processes envd tracks: running ones and the most recent finished ones. */
  async list(): Promise<ProcessInfo[]> {
    return (await this.api.list()).map(processInfo);
  }

  /** Signals a process's whole group (default SIGKILL); false when envd does not know the id. */
  kill(pid: string, signal: NodeJS.Signals = 'SIGKILL'): Promise<boolean> {
    return this.api.kill(pid, signal);
  }

  /** Writes to a process's stdin: text (as UTF-8) or bytes, as they are. */
  sendStdin(pid: string, data: string | Uint8Array): Promise<void> {
    return this.api.stdin(pid, data, false);
  }

  /** Closes a process's stdin. */
  closeStdin(pid: string): Promise<void> {
    return this.api.stdin(pid, '', true);
  }
}
