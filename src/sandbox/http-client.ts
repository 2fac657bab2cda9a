import { Agent, type Dispatcher, errors, getGlobalDispatcher, Pool, request } from 'undici';
import { SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER } from '../../runtime/protocol/constants.js';
import {
  AuthenticationError,
  DaemonUnavailableError,
  SandboxError,
  SandboxPausedError,
  TimeoutError,
  UnavailableError,
  UpstreamError,
} from '../errors.js';
import {
  type ControlConnection,
  keyRefused,
  type TlsTrust,
} from '../installation/control-connection.js';
import { errorFromAnswer, requestUrl, unreachableError } from '../installation/json-client.js';
import { onCloseConnections } from '../util/idle-connections.js';

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
export function sandboxPool(
  origin: string,
  sandboxId: string,
  port: string,
  trust?: TlsTrust,
): Pool {
  const key = `${origin} ${sandboxId} ${port}${trust ? ` ${trustKey(trust)}` : ''}`;
  let pool = sandboxPools.get(key);
  if (pool) {
    // Most recently used last.
    sandboxPools.delete(key);
  } else {
    pool = new Pool(origin, trust ? { connect: { ca: trust.ca } } : {});
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

const trustKeys = new Map<string, string>();
/** A short key for a trust's CA text. */
function trustKey(trust: TlsTrust): string {
  let key = trustKeys.get(trust.id);
  if (key === undefined) {
    key = `ca${trustKeys.size}`;
    trustKeys.set(trust.id, key);
  }
  return key;
}

/** One undici agent per private CA, for requests outside the sandbox pools. */
const agents = new Map<string, Agent>();
function agentFor(trust: TlsTrust): Agent {
  let agent = agents.get(trust.id);
  if (!agent) {
    agent = new Agent({ connect: { ca: trust.ca } });
    agents.set(trust.id, agent);
  }
  return agent;
}

// Closed at the end of a CLI command (src/util/idle-connections.ts): the sandbox pools, the
// agents of private CAs, and the global dispatcher that plain requests use.
onCloseConnections('sdk', () =>
  Promise.all(
    [...sandboxPools.values(), ...agents.values(), getGlobalDispatcher()].map((dispatcher) =>
      dispatcher.destroy(),
    ),
  ),
);

/** True for a body that is read as it is sent (a stream), so it cannot be sent again. */
function isStream(body: unknown): boolean {
  return (
    typeof body === 'object' &&
    body !== null &&
    (typeof (body as { pipe?: unknown }).pipe === 'function' ||
      typeof (body as { getReader?: unknown }).getReader === 'function' ||
      Symbol.asyncIterator in body)
  );
}

/** What else an {@link HttpClient} may need: TLS trust, a better word for a refused key. */
export interface HttpClientExtras {
  /** A private CA to trust besides the system's. */
  trust?: TlsTrust | undefined;
  /** Turns a 401 into an error that says which key and what to do. */
  unauthorized?: (error: AuthenticationError) => Error;
  /**
   * Resumes the sandbox when the gateway answers that it is paused; the request is then sent
   * once more (one whose body is a stream, which cannot be sent twice, fails with the answer).
   */
  resume?: () => Promise<void>;
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
    private readonly extras: HttpClientExtras = {},
  ) {
    const id = headers[SANDBOX_ID_HEADER];
    const port = headers[SANDBOX_PORT_HEADER];
    this.sandboxPort =
      id !== undefined && port !== undefined
        ? { origin: new URL(baseUrl).origin, id, port }
        : undefined;
  }

  /**
   * Whether requests go to this host's loopback (`localhost`, `*.localhost`, 127.0.0.0/8, `::1`):
   * the peer may then take a local file by descriptor (`Filesystem.upload`, `.download`).
   */
  get loopback(): boolean {
    const host = new URL(this.baseUrl).hostname.replace(/^\[|\]$/g, '');
    return (
      host === 'localhost' ||
      host.endsWith('.localhost') ||
      host === '::1' ||
      /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host)
    );
  }

  url(path: string, query?: RequestOptions['query']): string {
    return requestUrl(this.baseUrl, path, query).toString();
  }

  /**
   * Sends a request and returns the undici response; throws on an error status. A `GET` that
   * could not reach the peer at all (a keep-alive connection it closed meanwhile, say) is sent
   * once more: it changes nothing, so sending it twice is safe.
   */
  async send(method: string, path: string, options: RequestOptions = {}) {
    try {
      return await this.sendOnce(method, path, options);
    } catch (error) {
      if (
        error instanceof SandboxPausedError &&
        error.code === 'paused' &&
        this.extras.resume &&
        !isStream(options.body)
      ) {
        await this.extras.resume();
        return this.sendOnce(method, path, options);
      }
      if (method !== 'GET' || !(error instanceof this.unreachable)) throw error;
      return this.sendOnce(method, path, options);
    }
  }

  private async sendOnce(method: string, path: string, options: RequestOptions) {
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    const json = options.body !== undefined && !options.raw;
    const target = this.sandboxPort;
    try {
      const trust = this.extras.trust;
      const response = await request(this.url(path, options.query), {
        ...(target
          ? { dispatcher: sandboxPool(target.origin, target.id, target.port, trust) }
          : trust
            ? { dispatcher: agentFor(trust) }
            : {}),
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
        const error = errorFromAnswer(response.statusCode, await response.body.text(), this.peer);
        if (error instanceof AuthenticationError && this.extras.unauthorized) {
          throw this.extras.unauthorized(error);
        }
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
    if ((error as NodeJS.ErrnoException).code === 'ENOTFOUND' && this.sandboxPort) {
      return new this.unreachable(
        `${this.peer} could not be reached at ${this.sandboxPort.origin} (${method} ${path}): the name does not resolve here (${error.message}); sandbox hosts need wildcard DNS for the control plane's domain, or set ABX_GATEWAY_URL (or the gatewayUrl option) to its gateway's address`,
        { cause: error },
      );
    }
    return unreachableError(this.unreachable, this.peer, `${method} ${path}`, error);
  }
}

/**
 * A client of the control plane's REST API: the local daemon or a remote one; one that does not
 * answer is a DaemonUnavailableError, a refused key says which URL refused it.
 */
export function daemonClient(connection: ControlConnection, timeoutMs: number): HttpClient {
  return new HttpClient(
    connection.apiUrl,
    { authorization: `Bearer ${connection.apiKey}` },
    timeoutMs,
    connection.peer,
    undefined,
    DaemonUnavailableError,
    { trust: connection.trust, unauthorized: keyRefused(connection) },
  );
}
