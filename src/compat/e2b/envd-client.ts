import type { Readable } from 'node:stream';
import { Code, ConnectError } from '@connectrpc/connect';
import { Pool } from 'undici';
import { connectSandboxSocket } from '../../providers/sandbox-socket.js';

/** The envd of one sandbox, as the gateway checked it: its socket and its access token. */
export interface EnvdTarget {
  sandboxId: string;
  socketPath: string;
  token: string;
  /** Root's envd, in a sandbox that allows root: where requests naming user `root` go. */
  rootSocketPath?: string;
  /**
   * Set when envd's stream broke under a call (the sandbox was killed or ended): the face then
   * cuts the client's connection, as E2B's proxy does, rather than answering with an error, so
   * the SDK asks `/health` and reports the sandbox gone.
   */
  lost?: boolean;
  /**
   * Records what the face did for the request in the sandbox's audit trail (the daemon's
   * gateway-audit.ts): `command.started`, `command.exited`, `file.removed`, `file.renamed`.
   */
  audit?(kind: string, data: Record<string, unknown>): void;
}

/** envd's statuses as Connect codes: the E2B SDK branches on the code, not the status. */
function codeOf(status: number): Code {
  switch (status) {
    case 400:
    case 413:
      return Code.InvalidArgument;
    case 401:
      return Code.Unauthenticated;
    case 403:
      return Code.PermissionDenied;
    case 404:
      return Code.NotFound;
    case 409:
      return Code.AlreadyExists;
    case 429:
      return Code.ResourceExhausted;
    case 503:
      return Code.Unavailable;
    case 504:
      return Code.DeadlineExceeded;
    default:
      return Code.Internal;
  }
}

/** An envd error answer (`{error, type}`) as a Connect error with envd's own message. */
function envdError(status: number, text: string, what: string): ConnectError {
  let message = text.slice(0, 500);
  try {
    const body = JSON.parse(text) as { error?: unknown; type?: unknown };
    if (typeof body.error === 'string') message = body.error;
  } catch {
    // not JSON: the text itself
  }
  return new ConnectError(`${what}: ${message}`, codeOf(status));
}

/** The sandbox could not be reached at all (it stopped meanwhile). */
function unreachable(error: unknown, target: EnvdTarget): ConnectError {
  const reason = error instanceof Error ? error.message : String(error);
  return new ConnectError(
    `sandbox ${target.sandboxId} cannot be reached: ${reason}`,
    Code.Unavailable,
  );
}

/** Pools kept at most (one per sandbox); the least recently used one is closed past this. */
const MAX_ENVD_POOLS = 256;
const pools = new Map<string, Pool>();

/**
 * The connections to one envd, for calls whose body is known whole: undici's client costs a
 * fraction of node:http's per call (the face makes one or more per E2B call). Kept open between
 * calls, let go of before envd's own 5 s idle close; no deadline on an answer (a command's event
 * stream lasts as long as the command).
 */
function poolOf(socketPath: string): Pool {
  let pool = pools.get(socketPath);
  if (pool) {
    // Most recently used last.
    pools.delete(socketPath);
  } else {
    pool = new Pool('http://envd', {
      connect: (_options, callback) => {
        const socket = connectSandboxSocket(socketPath);
        const failed = (error: Error) => callback(error, null);
        socket.once('error', failed);
        socket.once('connect', () => {
          socket.off('error', failed);
          callback(null, socket);
        });
      },
      keepAliveTimeout: 4000,
      keepAliveMaxTimeout: 4000,
      headersTimeout: 0,
      bodyTimeout: 0,
    });
    if (pools.size >= MAX_ENVD_POOLS) {
      const [oldest, old] = pools.entries().next().value as [string, Pool];
      pools.delete(oldest);
      // Calls under way finish; no new one reaches it, as it is no longer found.
      old.close().catch(() => undefined);
    }
  }
  pools.set(socketPath, pool);
  return pool;
}

/** envd's answer: its status, and its body as it arrives (destroy it to stop reading). */
export type EnvdResponse = Readable & {
  statusCode: number;
  /** The body whole as text (undici's own reader, cheaper than an async iteration). */
  whole?: () => Promise<string>;
  headers?: Record<string, string | string[] | undefined>;
};

/** One request to envd's native API: JSON `body`, or raw bytes when it is a Buffer. */
export async function envdRequest(
  target: EnvdTarget,
  method: string,
  path: string,
  body: unknown,
  signal: AbortSignal | undefined,
  headers: Record<string, string> = {},
): Promise<EnvdResponse> {
  const raw = Buffer.isBuffer(body);
  const payload = body === undefined ? undefined : raw ? body : Buffer.from(JSON.stringify(body));
  try {
    const res = await poolOf(target.socketPath).request({
      method: method as 'GET',
      path,
      headers: {
        ...headers,
        authorization: `Bearer ${target.token}`,
        ...(payload
          ? {
              'content-type': raw ? 'application/octet-stream' : 'application/json',
              'content-length': String(payload.length),
            }
          : {}),
      },
      ...(payload ? { body: payload } : {}),
      ...(signal ? { signal } : {}),
    });
    const { body } = res;
    const whole = () => body.text();
    return Object.assign(body as Readable, {
      statusCode: res.statusCode,
      headers: res.headers,
      whole,
    });
  } catch (error) {
    throw signal?.aborted ? error : unreachable(error, target);
  }
}

/**
 * The most of envd's answers the face holds at once: a JSON answer, or one NDJSON line (envd's
 * events carry at most 64 KiB of output). envd runs inside the sandbox, so its answers are
 * bounded like any other bytes from there.
 */
export const MAX_ENVD_ANSWER_BYTES = 16 * 1024 * 1024;

function tooLarge(): ConnectError {
  return new ConnectError(
    `envd's answer is over ${MAX_ENVD_ANSWER_BYTES} bytes: refused`,
    Code.Internal,
  );
}

export async function readText(res: EnvdResponse | Readable): Promise<string> {
  // Most of envd's answers are small JSON with a length: read whole, at once.
  const length = Number((res as EnvdResponse).headers?.['content-length'] ?? Number.NaN);
  const whole = (res as EnvdResponse).whole;
  if (whole && length >= 0 && length <= MAX_ENVD_ANSWER_BYTES) return whole();
  const chunks: Buffer[] = [];
  let bytes = 0;
  for await (const chunk of res) {
    bytes += (chunk as Buffer).length;
    if (bytes > MAX_ENVD_ANSWER_BYTES) {
      res.destroy();
      throw tooLarge();
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** The NDJSON lines of an answer, each bounded. */
export async function* linesOf(res: Readable): AsyncGenerator<string> {
  let rest: Buffer = Buffer.alloc(0);
  for await (const chunk of res) {
    rest = rest.length === 0 ? (chunk as Buffer) : Buffer.concat([rest, chunk as Buffer]);
    let start = 0;
    for (let end = rest.indexOf(10, start); end >= 0; end = rest.indexOf(10, start)) {
      if (end > start) yield rest.toString('utf8', start, end);
      start = end + 1;
    }
    rest = rest.subarray(start);
    if (rest.length > MAX_ENVD_ANSWER_BYTES) throw tooLarge();
  }
  if (rest.length > 0) yield rest.toString('utf8');
}

/** One JSON call to envd's native API; a non-2xx answer throws the matching Connect error. */
export async function envdJson<T>(
  target: EnvdTarget,
  method: string,
  path: string,
  body?: unknown,
  signal?: AbortSignal,
): Promise<T> {
  const res = await envdRequest(target, method, path, body, signal);
  const text = await readText(res);
  const status = res.statusCode ?? 500;
  if (status < 200 || status > 299)
    throw envdError(status, text, `${method} ${path.split('?')[0]}`);
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new ConnectError(`envd answered ${method} ${path} with non-JSON`, Code.Internal);
  }
}

/** envd's NDJSON lines; `return()` cuts the stream, `finish()` lets it end. */
export interface EnvdLines extends AsyncIterator<unknown> {
  /**
   * The last line that matters was read (a process's `exit`): the answer's end is read in the
   * background, so that its connection is kept for the next call rather than closed (a new
   * connection into the sandbox costs more than the rest of a call). A stream that goes on past a
   * few more lines is cut.
   */
  finish(): void;
}

/** Lines read past {@link EnvdLines.finish} before the stream is cut instead. */
const FINISH_MAX_LINES = 16;

/**
 * A call to one of envd's NDJSON streams (`/exec`, `/exec/{id}/events`): the parsed lines, in
 * order. A non-2xx answer throws the matching Connect error before the first line.
 */
export async function envdLines(
  target: EnvdTarget,
  method: string,
  path: string,
  body: unknown,
  signal: AbortSignal,
): Promise<EnvdLines> {
  // The call's signal cuts the stream until `finish()`. Past that the stream's end is read
  // whatever the call does next: its signal is aborted once it ends, and undici closes a
  // connection whose answer is cut.
  const cut = new AbortController();
  const onAbort = () => cut.abort(signal.reason);
  const release = () => signal.removeEventListener('abort', onAbort);
  if (signal.aborted) onAbort();
  else signal.addEventListener('abort', onAbort, { once: true });
  let res: EnvdResponse;
  try {
    res = await envdRequest(target, method, path, body, cut.signal);
  } catch (error) {
    release();
    throw error;
  }
  const status = res.statusCode ?? 500;
  if (status < 200 || status > 299) {
    release();
    throw envdError(status, await readText(res), `${method} ${path.split('?')[0]}`);
  }
  const source = linesOf(res);
  return {
    async next() {
      const item = await source.next();
      if (item.done) return { done: true, value: undefined };
      try {
        return { done: false, value: JSON.parse(item.value) as unknown };
      } catch {
        throw new ConnectError(`envd sent a line that is not JSON on ${path}`, Code.Internal);
      }
    },
    async return() {
      release();
      res.destroy();
      await source.return(undefined);
      return { done: true, value: undefined };
    },
    finish() {
      release();
      void (async () => {
        for (let read = 0; read < FINISH_MAX_LINES; read++) {
          if ((await source.next()).done) return;
        }
        res.destroy();
        await source.return(undefined);
      })().catch(() => res.destroy());
    },
  };
}
