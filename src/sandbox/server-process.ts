import { SandboxError } from '../errors.js';
import { CommandHandle } from './command-handle.js';
import type { Commands } from './commands.js';
import type { ProcessApi, ServerStartRequest } from './process-api.js';

/**
 * How the start of a command server ended: listening; exited first; or still not listening at
 * the deadline (it was killed then). The last two carry the end of its output.
 */
export type ServerOutcome =
  | { state: 'listening' }
  | { state: 'exited'; exitCode: number; output: string }
  | { state: 'timeout'; output: string };

/** A command server process that envd started, and the wait for it to listen. */
export interface StartingServer {
  /** envd's id of the process. */
  pid: string;
  /** It runs in a process envd started ahead (`server.cjs --prestart`). */
  prestarted: boolean;
  /**
   * Settles once the server prints its `listening` line (it then serves on its port and on its
   * socket), exits, or `deadline` passes; rejects only when envd's stream breaks.
   */
  ready: Promise<ServerOutcome>;
}

/** The line `runtime/server/main.ts` prints once it serves: `{"event":"listening",...}`. */
function isListening(line: string): boolean {
  if (!line.startsWith('{"event":"listening"')) return false;
  try {
    return (JSON.parse(line) as { event?: unknown }).event === 'listening';
  } catch {
    return false;
  }
}

function tail(handle: CommandHandle): string {
  return `${handle.stdout}${handle.stderr}`.slice(-2000).trim() || '(no output)';
}

/** Starts a command server process through envd, its stdout going to `onStdout`. */
export type ServerLauncher = (
  onStdout: (data: string) => void,
) => Promise<{ handle: CommandHandle; prestarted: boolean }>;

/** The start through `POST /exec/server`: in envd's pre-started runtime process when it has one. */
export function serverRoute(api: ProcessApi, request: ServerStartRequest): ServerLauncher {
  return async (onStdout) => {
    const abort = new AbortController();
    const events = await api.startServer(request, abort.signal);
    const first = await events.next().catch((error: Error) => {
      throw new SandboxError(`the command server was not confirmed as started: ${error.message}`, {
        cause: error,
      });
    });
    if (first.done || !('start' in first.value)) {
      abort.abort();
      throw new SandboxError('envd did not answer POST /exec/server with a start event');
    }
    const handle = new CommandHandle(
      { api, pid: first.value.start.id, events, from: { stdout: 0, stderr: 0 }, abort },
      { onStdout },
    );
    return { handle, prestarted: first.value.prestarted === true };
  };
}

/** The start as a shell command through `POST /exec` (an envd without `/exec/server`). */
export function shellCommand(
  processes: Commands,
  command: string,
  envs: Record<string, string>,
): ServerLauncher {
  return async (onStdout) => ({
    handle: await processes.start(command, { envs, timeoutMs: 0, stdin: false, onStdout }),
    prestarted: false,
  });
}

/**
 * Starts the command server through envd and follows its output on that one request: readiness
 * is the server's own `listening` line, so nothing polls its port meanwhile (a request that
 * reaches the port before the server would fail and be retried through the gateway). The stream
 * is let go once the wait ends; envd keeps the output for `commands.connect`.
 */
export async function startServer(
  launcher: ServerLauncher,
  deadline: number,
): Promise<StartingServer> {
  let partial = '';
  let listened!: () => void;
  const listening = new Promise<ServerOutcome>((resolve) => {
    listened = () => resolve({ state: 'listening' });
  });
  const { handle, prestarted } = await launcher((data) => {
    const lines = (partial + data).split('\n');
    partial = lines.pop() ?? '';
    if (lines.some(isListening)) listened();
  });
  const exited = handle.wait().then(
    (): ServerOutcome => ({ state: 'exited', exitCode: 0, output: tail(handle) }),
    (error: unknown): ServerOutcome => {
      // A non-zero exit is an outcome; a broken stream (the sandbox went away) is an error.
      if (handle.exitCode === undefined) throw error;
      return { state: 'exited', exitCode: handle.exitCode, output: tail(handle) };
    },
  );
  const ready = (async (): Promise<ServerOutcome> => {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), Math.max(0, deadline - Date.now()));
    });
    try {
      const outcome = await Promise.race([listening, exited, timedOut]);
      if (outcome) return outcome;
      await handle.kill().catch(() => false);
      return { state: 'timeout', output: tail(handle) };
    } finally {
      clearTimeout(timer);
      handle.disconnect();
      // After disconnect() the wait rejects; nobody needs that any more.
      exited.catch(() => undefined);
    }
  })();
  return { pid: handle.pid, prestarted, ready };
}
