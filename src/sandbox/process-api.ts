import type {
  OutputEncoding,
  ProcessEvent,
  ProcessInfoWire,
  StreamOffsets,
} from '../../runtime/protocol/wire.js';
import { NotFoundError, SandboxNotFoundError } from '../errors.js';
import { ndjsonLines } from '../util/ndjson.js';
import type { HttpClient } from './http-client.js';

export type {
  ExitWire,
  ProcessEvent,
  ProcessInfoWire,
  StreamOffsets,
} from '../../runtime/protocol/wire.js';

/** What `POST /exec` needs. */
export interface ExecRequest {
  cmd: string;
  cwd?: string;
  envs?: Record<string, string>;
  timeoutMs: number;
  stdin: boolean;
  /** `base64`: output events carry the raw bytes (the default, text, is UTF-8). */
  output?: OutputEncoding;
}

/** What `POST /exec/server` needs: the command server's arguments, and its listing and environment. */
export interface ServerStartRequest {
  /** `server.cjs`'s arguments (`--port 8080 --load FILE ...`). */
  args: string[];
  /** The command line shown in listings. */
  command: string;
  envs: Record<string, string>;
}

/**
 * A silent event stream gets a keepalive line every 5 s; one silent for this long means the
 * peer is gone, so reading fails instead of hanging.
 */
const STREAM_IDLE_MS = 20_000;

/** envd's process routes, spoken over the sandbox's envd client. Internal to the SDK. */
export class ProcessApi {
  constructor(private readonly envd: HttpClient) {}

  /** Starts a command; its events begin with `start`. */
  async exec(request: ExecRequest, signal: AbortSignal): Promise<AsyncIterator<ProcessEvent>> {
    const response = await this.envd.send('POST', '/exec', {
      body: {
        cmd: request.cmd,
        ...(request.cwd ? { cwd: request.cwd } : {}),
        ...(request.envs ? { env: request.envs } : {}),
        timeout: request.timeoutMs / 1000,
        stdin: request.stdin,
        ...(request.output ? { output: request.output } : {}),
      },
      timeoutMs: STREAM_IDLE_MS,
      signal,
    });
    return ndjsonLines<ProcessEvent>(response.body)[Symbol.asyncIterator]();
  }

  /**
   * Starts the command server, in envd's pre-started runtime process when there is one; its
   * events begin with `start` (with `prestarted`). An envd without the route answers 404
   * `RouteNotFoundError`.
   */
  async startServer(
    request: ServerStartRequest,
    signal: AbortSignal,
  ): Promise<AsyncIterator<ProcessEvent>> {
    const response = await this.envd.send('POST', '/exec/server', {
      body: { args: request.args, command: request.command, env: request.envs },
      timeoutMs: STREAM_IDLE_MS,
      signal,
    });
    return ndjsonLines<ProcessEvent>(response.body)[Symbol.asyncIterator]();
  }

  /** A process's events from the given offsets, followed until it exits. */
  async events(
    id: string,
    from: StreamOffsets,
    signal: AbortSignal,
    output?: OutputEncoding,
  ): Promise<AsyncIterator<ProcessEvent>> {
    const response = await this.envd.send('GET', `/exec/${encodeURIComponent(id)}/events`, {
      query: {
        stdout_offset: from.stdout,
        stderr_offset: from.stderr,
        ...(output ? { output } : {}),
      },
      timeoutMs: STREAM_IDLE_MS,
      signal,
    });
    return ndjsonLines<ProcessEvent>(response.body)[Symbol.asyncIterator]();
  }

  async list(): Promise<ProcessInfoWire[]> {
    return (await this.envd.json<{ processes: ProcessInfoWire[] }>('GET', '/process')).processes;
  }

  /** Signals the process group; false when envd does not know the id. */
  async kill(id: string, signal: string): Promise<boolean> {
    try {
      await this.envd.json('POST', `/process/${encodeURIComponent(id)}/kill`, {
        body: { signal },
      });
      return true;
    } catch (error) {
      // The file (or process) is missing; a sandbox that is gone is an error.
      if (error instanceof NotFoundError && !(error instanceof SandboxNotFoundError)) return false;
      throw error;
    }
  }

  /** Writes text (as UTF-8) or bytes (sent base64) to a process's stdin. */
  async stdin(id: string, data: string | Uint8Array, eof: boolean): Promise<void> {
    const body =
      typeof data === 'string'
        ? { data, eof }
        : { data: Buffer.from(data).toString('base64'), encoding: 'base64', eof };
    await this.envd.json('POST', `/process/${encodeURIComponent(id)}/stdin`, { body });
  }
}
