import type { CommandHandle } from './command-handle.js';
import type { Commands } from './commands.js';

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

/**
 * Starts the command server through envd and follows its output on that one request: readiness
 * is the server's own `listening` line, so nothing polls its port meanwhile (a request that
 * reaches the port before the server would fail and be retried through the gateway). The stream
 * is let go once the wait ends; envd keeps the output for `commands.connect`.
 */
export async function startServer(
  processes: Commands,
  command: string,
  envs: Record<string, string>,
  deadline: number,
): Promise<StartingServer> {
  let partial = '';
  let listened!: () => void;
  const listening = new Promise<ServerOutcome>((resolve) => {
    listened = () => resolve({ state: 'listening' });
  });
  const handle = await processes.start(command, {
    envs,
    timeoutMs: 0,
    stdin: false,
    onStdout: (data) => {
      const lines = (partial + data).split('\n');
      partial = lines.pop() ?? '';
      if (lines.some(isListening)) listened();
    },
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
  return { pid: handle.pid, ready };
}
