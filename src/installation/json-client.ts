import http from 'node:http';
import {
  AuthenticationError,
  errorFromBody,
  SandboxError,
  TimeoutError,
  type UnavailableError,
} from '../errors.js';
import type { TlsTrust } from './control-connection.js';

/**
 * JSON calls to the control plane over node:http. The SDK's HttpClient (undici) carries
 * everything that streams or goes to a sandbox; the control plane's small JSON calls go through
 * this one, which loads nothing beyond Node itself: undici alone costs more CPU to load than
 * Node's whole start (bench "abx start"), and `abx list` is made of two such calls.
 */

export type Query = Record<string, string | number | boolean | undefined>;

export interface JsonRequestOptions {
  query?: Query;
  /** A JSON value. */
  body?: unknown;
  headers?: Record<string, string>;
  /** The answer must arrive within this; default the client's. */
  timeoutMs?: number;
}

/** What sends JSON calls and answers with the parsed body; throws SandboxErrors. */
export interface JsonClient {
  json<T>(method: string, path: string, options?: JsonRequestOptions): Promise<T>;
}

/** `path` under `base`, with the defined query values. */
export function requestUrl(base: string, path: string, query?: Query): URL {
  const url = new URL(path, base);
  for (const [key, value] of Object.entries(query ?? {})) {
    if (value !== undefined) url.searchParams.set(key, String(value));
  }
  return url;
}

/** The error an answer of status ≥ 400 stands for: its `{ error, type }` body, else its text. */
export function errorFromAnswer(status: number, text: string, peer: string): SandboxError {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = { error: `${peer} answered ${status}: ${text.slice(0, 500)}` };
  }
  return errorFromBody(status, parsed);
}

/** TLS errors that mean "this client does not trust the server's certificate". */
const UNTRUSTED = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'CERT_UNTRUSTED',
]);

/**
 * A network failure as the error of `unreachable`'s class, saying what to do where the cause is
 * known (an untrusted certificate, one for another name), else what failed.
 */
export function unreachableError(
  unreachable: typeof UnavailableError,
  peer: string,
  what: string,
  error: Error,
): Error {
  const code = (error as NodeJS.ErrnoException).code ?? '';
  if (UNTRUSTED.has(code)) {
    return new unreachable(
      `${peer} could not be reached (${what}): its TLS certificate is not trusted here (${error.message}); set ABX_CA_CERT (or --ca-cert, or the caCert option) to the PEM file of the CA that signed it`,
      { cause: error },
    );
  }
  if (code === 'ERR_TLS_CERT_ALTNAME_INVALID') {
    return new unreachable(
      `${peer} could not be reached (${what}): its TLS certificate is not valid for that name (${error.message})`,
      { cause: error },
    );
  }
  return new unreachable(`${peer} could not be reached (${what}): ${error.message}`, {
    cause: error,
  });
}

/** The status and text of one HTTP exchange over node:http(s); rejects on a network failure. */
export async function exchange(
  url: URL,
  init: {
    method: string;
    headers?: Record<string, string>;
    body?: string;
    timeoutMs: number;
    trust?: TlsTrust | undefined;
  },
): Promise<{ status: number; text: string }> {
  const secure = url.protocol === 'https:';
  // node:https (and with it node:tls) only for a remote control plane over TLS.
  const client = secure ? await import('node:https') : http;
  try {
    return await exchangeOnce(client, url, init, undefined);
  } catch (error) {
    // A kept-alive connection the peer had closed (it went idle, or the daemon was restarted on
    // the same address) is reset when reused, before the peer read a byte of the request: send it
    // once more on a new connection (Node's docs: `request.reusedSocket`).
    if (!(error as { reusedSocket?: boolean }).reusedSocket) throw error;
    return exchangeOnce(client, url, init, false);
  }
}

/** One attempt of {@link exchange}; `agent: false` takes a new connection. */
function exchangeOnce(
  client: typeof http | typeof import('node:https'),
  url: URL,
  init: Parameters<typeof exchange>[1],
  agent: false | undefined,
): Promise<{ status: number; text: string }> {
  const secure = url.protocol === 'https:';
  return new Promise((resolve, reject) => {
    let answered = false;
    const request = client.request(
      url,
      {
        method: init.method,
        ...(agent === false ? { agent } : {}),
        headers: {
          ...init.headers,
          ...(init.body === undefined
            ? {}
            : {
                'content-type': 'application/json',
                'content-length': String(Buffer.byteLength(init.body)),
              }),
        },
        ...(secure && init.trust ? { ca: init.trust.ca } : {}),
      },
      (response) => {
        answered = true;
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.on('end', () =>
          resolve({
            status: response.statusCode ?? 0,
            text: Buffer.concat(chunks).toString('utf8'),
          }),
        );
        response.on('error', reject);
      },
    );
    // No byte for this long (connecting, the answer's head or its body): give up.
    request.setTimeout(init.timeoutMs, () => {
      request.destroy(
        Object.assign(new Error(`no answer within ${init.timeoutMs} ms`), { code: 'ETIMEDOUT' }),
      );
    });
    request.on('error', (error: NodeJS.ErrnoException) => {
      const reset = error.code === 'ECONNRESET' || error.code === 'EPIPE';
      reject(
        reset && request.reusedSocket && !answered
          ? Object.assign(error, { reusedSocket: true })
          : error,
      );
    });
    request.end(init.body);
  });
}

/** An unreachable peer's error whose cause is a refused connection: no byte of the request left. */
function refused(error: unknown, unreachable: typeof UnavailableError): boolean {
  return (
    error instanceof unreachable &&
    (error.cause as NodeJS.ErrnoException | undefined)?.code === 'ECONNREFUSED'
  );
}

/** A {@link JsonClient} of one control plane: its URL, key, name for messages and error class. */
export class NodeJsonClient implements JsonClient {
  constructor(
    private baseUrl: string,
    private readonly headers: Record<string, string>,
    private readonly timeoutMs: number,
    /** Names the peer in messages: "the abx daemon". */
    private readonly peer: string,
    private readonly unreachable: typeof UnavailableError,
    private readonly extras: {
      trust?: TlsTrust | undefined;
      unauthorized?: ((error: AuthenticationError) => Error) | undefined;
      /**
       * The local daemon found again (its health checked, started if allowed) after the one this
       * client names refused a connection: its base URL. Nothing was sent then, so any request
       * goes once more, to it.
       */
      rediscover?: (() => Promise<string>) | undefined;
    } = {},
  ) {}

  async json<T>(method: string, path: string, options: JsonRequestOptions = {}): Promise<T> {
    try {
      return await this.once<T>(method, path, options);
    } catch (error) {
      if (this.extras.rediscover && refused(error, this.unreachable)) {
        this.baseUrl = await this.extras.rediscover();
        return this.once<T>(method, path, options);
      }
      // A GET that never reached the peer changes nothing: once more is safe.
      if (method !== 'GET' || !(error instanceof this.unreachable)) throw error;
      return this.once<T>(method, path, options);
    }
  }

  private async once<T>(method: string, path: string, options: JsonRequestOptions): Promise<T> {
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    let answer: { status: number; text: string };
    try {
      answer = await exchange(requestUrl(this.baseUrl, path, options.query), {
        method,
        headers: { ...this.headers, ...options.headers },
        ...(options.body === undefined ? {} : { body: JSON.stringify(options.body) }),
        timeoutMs,
        trust: this.extras.trust,
      });
    } catch (error) {
      const failure = error as NodeJS.ErrnoException;
      if (failure.code === 'ETIMEDOUT') {
        throw new TimeoutError(
          `${this.peer} did not answer ${method} ${path} within ${timeoutMs} ms`,
          { cause: failure },
        );
      }
      throw unreachableError(this.unreachable, this.peer, `${method} ${path}`, failure);
    }
    if (answer.status >= 400) {
      const error = errorFromAnswer(answer.status, answer.text, this.peer);
      if (error instanceof AuthenticationError && this.extras.unauthorized) {
        throw this.extras.unauthorized(error);
      }
      throw error;
    }
    try {
      return JSON.parse(answer.text) as T;
    } catch (error) {
      throw new SandboxError(
        `${this.peer} answered ${method} ${path} with something that is not JSON: ${answer.text.slice(0, 200)}`,
        { cause: error },
      );
    }
  }
}
