import {
  Agent,
  type AgentOptions,
  type ClientRequest,
  type IncomingMessage,
  request,
} from 'node:http';
import type { Duplex } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Code, ConnectError } from '@connectrpc/connect';
import { connectSandboxSocket } from '../../providers/sandbox-socket.js';

/** The envd of one sandbox, as the gateway checked it: its socket and its access token. */
export interface EnvdTarget {
  sandboxId: string;
  socketPath: string;
  token: string;
  /**
   * Set when envd's stream broke under a call (the sandbox was killed or ended): the face then
   * cuts the client's connection, as E2B's proxy does, rather than answering with an error, so
   * the SDK asks `/health` and reports the sandbox gone.
   */
  lost?: boolean;
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

/**
 * Keeps connections to envds open between calls (a new Unix socket per call would cost more than
 * the call); pooled per socket path. Connections never follow a symlink the sandbox may have put
 * in place of its envd socket.
 */
class EnvdAgent extends Agent {
  override createConnection(options: AgentOptions & { socketPath?: string }): Duplex {
    return connectSandboxSocket(options.socketPath as string);
  }
}

/** envd's servers close an idle connection after 5 s: the pool lets go of it sooner. */
const agent = new EnvdAgent({ keepAlive: true, maxFreeSockets: 4, timeout: 4000 });

/** A request to a sandbox's envd over its socket, with the sandbox's token. */
function toEnvd(
  target: EnvdTarget,
  method: string,
  path: string,
  signal: AbortSignal | undefined,
  headers: Record<string, string | number>,
): ClientRequest {
  return request({
    socketPath: target.socketPath,
    agent,
    method,
    path,
    signal,
    headers: { authorization: `Bearer ${target.token}`, ...headers },
  });
}

/** One request to envd's native API: JSON `body`, or raw bytes when it is a Buffer. */
export function envdRequest(
  target: EnvdTarget,
  method: string,
  path: string,
  body: unknown,
  signal: AbortSignal | undefined,
): Promise<IncomingMessage> {
  const raw = Buffer.isBuffer(body);
  const payload = body === undefined ? undefined : raw ? body : Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = toEnvd(target, method, path, signal, {
      ...(payload ? { 'content-type': 'application/json', 'content-length': payload.length } : {}),
    });
    req.on('response', resolve);
    req.on('error', (error) => reject(signal?.aborted ? error : unreachable(error, target)));
    req.end(payload);
  });
}

/**
 * A request to envd's native API whose body is streamed from `body` (chunked), with backpressure:
 * `body` is read only as fast as envd takes it. If `body` throws, the request is cut, so envd
 * never sees a cut body as a whole one; `headers` are sent too. Resolves with envd's answer (which may come before the
 * body is all sent: `cancel` then stops sending).
 */
export function envdStream(
  target: EnvdTarget,
  method: string,
  path: string,
  body: AsyncIterable<Uint8Array>,
  signal: AbortSignal | undefined,
  headers: Record<string, string> = {},
): Promise<{ res: IncomingMessage; cancel(): void }> {
  return new Promise((resolve, reject) => {
    const req = toEnvd(target, method, path, signal, {
      ...headers,
      'content-type': 'application/octet-stream',
      'transfer-encoding': 'chunked',
    });
    req.on('response', (res) => resolve({ res, cancel: () => req.destroy() }));
    req.on('error', (error) => reject(signal?.aborted ? error : unreachable(error, target)));
    // Settled here too: a request cut on a reused keep-alive socket emits no 'error'.
    pipeline(body, req).catch((error: unknown) => {
      req.destroy(error as Error);
      reject(error);
    });
    req.on('close', () => reject(unreachable(new Error('the connection closed'), target)));
  });
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

export async function readText(res: IncomingMessage): Promise<string> {
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
export async function* linesOf(res: IncomingMessage): AsyncGenerator<string> {
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
): Promise<AsyncIterator<unknown>> {
  const res = await envdRequest(target, method, path, body, signal);
  const status = res.statusCode ?? 500;
  if (status < 200 || status > 299) {
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
      res.destroy();
      await source.return(undefined);
      return { done: true, value: undefined };
    },
  };
}
