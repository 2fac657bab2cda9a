import { type Dispatcher, errors, Pool, request } from 'undici';
import { SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER } from '../../runtime/protocol/constants.js';
import {
  DaemonUnavailableError,
  errorFromBody,
  SandboxError,
  TimeoutError,
  UnavailableError,
  UpstreamError,
} from '../errors.js';
import { type DaemonConnection, forgetDaemon } from '../installation/daemon-connection.js';

type Body = Dispatcher.RequestOptions['body'];

/** Pools kept at most; the least recently used one is closed (gracefully) past this. */
const MAX_SANDBOX_POOLS = 256;
const sandboxPools = new Map<string, Pool>();

/**
 * The connection pool of one sandbox port behind the gateway. The gateway routes whole
 * connections: a connection that stays with one sandbox port is checked once, while one shared
 * by several would be checked again (and moved) at every change. Keyed by gateway, sandbox and
 * port, so every client of that port (a `Sandbox`'s envd client, its server client...) shares it.
 */
export function sandboxPool(origin: string, sandboxId: string, port: string): Pool {
  const key = `${origin} ${sandboxId} ${port}`;
  let pool = sandboxPools.get(key);
  if (pool) {
    // Most recently used last.
    sandboxPools.delete(key);
  } else {
    pool = new Pool(origin);
    if (sandboxPools.size >= MAX_SANDBOX_POOLS) {
      const [oldest, old] = sandboxPools.entries().next().value as [string, Pool];
      sandboxPools.delete(oldest);
      // Requests under way finish; no new one reaches it, as it is no longer found.
      old.close().catch(() => undefined);
    }
  }
  sandboxPools.set(key, pool);
  return pool;
}

export interface RequestOptions {
  query?: Record<string, string | number | boolean | undefined>;
  /** A JSON value, or raw bytes / a stream with `raw: true`. */
  body?: unknown;
  raw?: boolean;
  /** Extra headers. */
  headers?: Record<string, string>;
  /** Headers must arrive within this; default the client's. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/**
 * JSON over HTTP with undici, turning `{ error, type }` answers into {@link SandboxError}s and
 * network failures into errors that say which service did not answer. Every request has a
 * deadline: a dead peer gives an error, never a hang.
 */
export class HttpClient {
  /** The sandbox port this client reaches through the gateway, which gets a pool of its own. */
  private readonly sandboxPort: { origin: string; id: string; port: string } | undefined;

  constructor(
    private readonly baseUrl: string,
    private readonly headers: Record<string, string>,
    private readonly timeoutMs: number,
    /** Names the peer in messages: "the abx daemon", "sandbox i123". */
    private readonly peer: string,
    /** Called on a network failure to explain it better (e.g. "the sandbox was killed"). */
    private readonly explain?: (error: Error) => Promise<Error | undefined>,
    /** The class of "could not be reached". */
    private readonly unreachable: typeof UnavailableError = UnavailableError,
  ) {
    const id = headers[SANDBOX_ID_HEADER];
    const port = headers[SANDBOX_PORT_HEADER];
    this.sandboxPort =
      id !== undefined && port !== undefined
        ? { origin: new URL(baseUrl).origin, id, port }
        : undefined;
  }

  url(path: string, query?: RequestOptions['query']): string {
    const url = new URL(path, this.baseUrl);
    for (const [key, value] of Object.entries(query ?? {})) {
      if (value !== undefined) url.searchParams.set(key, String(value));
    }
    return url.toString();
  }

  /** Sends a request and returns the undici response; throws on an error status. */
  async send(method: string, path: string, options: RequestOptions = {}) {
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    const json = options.body !== undefined && !options.raw;
    const target = this.sandboxPort;
    try {
      const response = await request(this.url(path, options.query), {
        ...(target ? { dispatcher: sandboxPool(target.origin, target.id, target.port) } : {}),
        method: method as 'GET',
        headers: {
          ...this.headers,
          ...(json ? { 'content-type': 'application/json' } : {}),
          ...options.headers,
        },
        body: (json ? JSON.stringify(options.body) : options.body) as Body,
        headersTimeout: timeoutMs,
        bodyTimeout: timeoutMs,
        ...(options.signal ? { signal: options.signal } : {}),
      });
      if (response.statusCode >= 400) {
        const text = await response.body.text();
        let parsed: unknown;
        try {
          parsed = JSON.parse(text);
        } catch {
          parsed = { error: `${this.peer} answered ${response.statusCode}: ${text.slice(0, 500)}` };
        }
        const error = errorFromBody(response.statusCode, parsed);
        // The gateway could not reach the sandbox: say why, when the sandbox itself is gone.
        if (error instanceof UpstreamError) {
          throw (await this.explain?.(error).catch(() => undefined)) ?? error;
        }
        throw error;
      }
      return response;
    } catch (error) {
      if (error instanceof SandboxError) throw error;
      throw await this.networkError(error as Error, method, path, timeoutMs);
    }
  }

  async json<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const response = await this.send(method, path, options);
    try {
      return (await response.body.json()) as T;
    } catch (error) {
      throw await this.networkError(
        error as Error,
        method,
        path,
        options.timeoutMs ?? this.timeoutMs,
      );
    }
  }

  private async networkError(error: Error, method: string, path: string, timeoutMs: number) {
    const better = await this.explain?.(error).catch(() => undefined);
    if (better) return better;
    if (error instanceof errors.HeadersTimeoutError || error instanceof errors.BodyTimeoutError) {
      return new TimeoutError(
        `${this.peer} did not answer ${method} ${path} within ${timeoutMs} ms`,
        {
          cause: error,
        },
      );
    }
    if (error.name === 'AbortError') return error;
    return new this.unreachable(
      `${this.peer} could not be reached (${method} ${path}): ${error.message}`,
      { cause: error },
    );
  }
}

/** A client of the daemon's REST API; a daemon that does not answer is a DaemonUnavailableError. */
export function daemonClient(connection: DaemonConnection, timeoutMs: number): HttpClient {
  return new HttpClient(
    connection.info.apiUrl,
    { authorization: `Bearer ${connection.apiKey}` },
    timeoutMs,
    'the abx daemon',
    // A daemon that cannot be reached is looked for again next time (it may have restarted).
    async () => {
      forgetDaemon(connection.home);
      return undefined;
    },
    DaemonUnavailableError,
  );
}
