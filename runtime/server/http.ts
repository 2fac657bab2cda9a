import type { IncomingMessage, ServerResponse } from 'node:http';
import { type Duplex, Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import {
  BadRequestError,
  errorResponse,
  payloadTooLarge,
  RequestTimeoutError,
  requestTimeout,
} from './errors.js';

/** A handler's answer when plain `200` JSON is not enough: another status, headers, raw bytes. */
export class Reply {
  constructor(
    readonly status: number,
    /** Buffer or string: sent as is; Readable: piped; anything else: JSON. */
    readonly body: unknown,
    readonly headers: Record<string, string> = {},
  ) {}
}

/** Limits of reading one request body. */
export interface BodyLimits {
  /** Bytes; a body over it is refused with 413 as soon as that is known. */
  maxBytes: number;
  /**
   * Bytes of a streamed body (`body: 'stream'` routes, which never hold it whole); default
   * `maxBytes`. envd raises it for uploads while JSON bodies, read whole, stay small.
   */
  maxStreamBytes?: number;
  /** The whole body must arrive within this, so a trickling client cannot hold a request open. */
  timeoutMs: number;
  /** The same for a streamed body; default `timeoutMs`. envd gives large uploads longer. */
  streamTimeoutMs?: number;
}

/**
 * The request body as chunks, refusing it with 413 from `Content-Length` before reading or as
 * soon as the count passes the limit, and with 408 when it does not arrive in time.
 */
export async function* bodyChunks(req: IncomingMessage, limits: BodyLimits, received = 0) {
  const declared = Number(req.headers['content-length']);
  if (declared > limits.maxBytes) throw payloadTooLarge(limits.maxBytes);
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(requestTimeout(limits.timeoutMs)), limits.timeoutMs);
  });
  deadline.catch(() => {});
  const iterator = req[Symbol.asyncIterator]();
  try {
    while (true) {
      const next = await Promise.race([iterator.next(), deadline]);
      if (next.done) return;
      const chunk = next.value as Buffer;
      received += chunk.length;
      if (received > limits.maxBytes) throw payloadTooLarge(limits.maxBytes);
      yield chunk;
    }
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The whole request body (within the limits). Event-driven rather than through
 * {@link bodyChunks}: for the small JSON bodies of command calls, an async iterator and a
 * promise race per chunk cost more than the rest of the request.
 */
export function readBody(req: IncomingMessage, limits: BodyLimits): Promise<Buffer> {
  return readUpTo(req, limits, Number.POSITIVE_INFINITY) as Promise<Buffer>;
}

/**
 * The body whole when it ends within `small` bytes, read as {@link readBody} reads it (E2B's SDK
 * sends even a 5-byte form as four chunks, each a promise race through {@link bodyChunks}), else
 * the same bytes as a stream that goes on with the rest, within the same limits and deadline.
 */
export function readBodyIfSmall(
  req: IncomingMessage,
  limits: BodyLimits,
  small: number,
): Promise<Buffer | AsyncIterable<Buffer>> {
  return readUpTo(req, limits, small);
}

function readUpTo(
  req: IncomingMessage,
  limits: BodyLimits,
  small: number,
): Promise<Buffer | AsyncIterable<Buffer>> {
  const declared = Number(req.headers['content-length']);
  if (declared > limits.maxBytes) return Promise.reject(payloadTooLarge(limits.maxBytes));
  if (declared > small) return Promise.resolve(bodyChunks(req, limits));
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let received = 0;
    const finish = (error?: Error, more = false) => {
      clearTimeout(timer);
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', finish);
      if (error) {
        // Stop reading what is left: the error answer closes the connection.
        req.pause();
        reject(error);
      } else if (more) {
        // Over `small`: the rest is read as it comes, by whoever iterates.
        req.pause();
        const left = Math.max(1, limits.timeoutMs - (Date.now() - started));
        resolve(goOn(chunks, req, { ...limits, timeoutMs: left }, received));
      } else {
        resolve(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, received));
      }
    };
    const onData = (chunk: Buffer) => {
      received += chunk.length;
      if (received > limits.maxBytes) return finish(payloadTooLarge(limits.maxBytes));
      chunks.push(chunk);
      if (received > small) finish(undefined, true);
    };
    const onEnd = () => finish();
    const timer = setTimeout(() => finish(requestTimeout(limits.timeoutMs)), limits.timeoutMs);
    req.on('data', onData);
    req.once('end', onEnd);
    req.once('error', finish);
  });
}

/** The chunks read so far, then the rest of the body ({@link bodyChunks}). */
async function* goOn(
  read: Buffer[],
  req: IncomingMessage,
  limits: BodyLimits,
  received: number,
): AsyncGenerator<Buffer> {
  yield* read;
  yield* bodyChunks(req, limits, received);
}

function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
) {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    ...headers,
    'content-type': 'application/json; charset=utf-8',
    'content-length': String(Buffer.byteLength(text)),
  });
  res.end(text);
}

/** Writes a handler's result: a {@link Reply} as it says, any other value as `200` JSON. */
export async function sendResult(res: ServerResponse, result: unknown): Promise<void> {
  if (!(result instanceof Reply)) return sendJson(res, 200, result);
  const { status, body, headers } = result;
  if (body instanceof Readable) {
    res.writeHead(status, { 'content-type': 'application/octet-stream', ...headers });
    await pipeline(body, res);
  } else if (typeof body === 'string' || Buffer.isBuffer(body)) {
    res.writeHead(status, {
      'content-type': 'application/octet-stream',
      ...headers,
      'content-length': String(Buffer.byteLength(body)),
    });
    res.end(body);
  } else {
    sendJson(res, status, body, headers);
  }
}

/**
 * Writes an error in the contract's `{error, type}` shape. A request whose body was refused
 * unread gets its connection closed, or node would read (and discard) the rest of it.
 */
export function sendError(res: ServerResponse, error: unknown, headers: Record<string, string>) {
  if (res.headersSent) {
    res.destroy(error instanceof Error ? error : undefined);
    return;
  }
  const { status, body } = errorResponse(error);
  const unread = status === 413 || status === 408;
  sendJson(res, status, body, unread ? { ...headers, connection: 'close' } : headers);
  if (unread) res.once('finish', () => lingerClose(res.req));
}

/** How long a connection whose body was refused unread may go on sending before it is cut. */
const LINGER_MS = 2000;

/**
 * Closes a connection whose request body was refused unread (413, 408) the way web servers
 * "linger": our side is shut after the answer and what the client still sends is read and
 * dropped for a moment. Destroying at once would reset the connection while the client is still
 * writing, and a client (or a proxy such as the gateway) may then see the reset instead of the
 * answer.
 */
function lingerClose(req: IncomingMessage): void {
  const { socket } = req;
  req.resume();
  socket.end();
  const timer = setTimeout(() => socket.destroy(), LINGER_MS);
  socket.once('close', () => clearTimeout(timer));
}

/**
 * A request node's parser refused (a bad method, NUL or spaces in the URL, headers over the size
 * limit or past the headers timeout) gets the contract's `{error, type}` shape too, not a bare
 * status line.
 */
export function answerClientError(error: NodeJS.ErrnoException, socket: Duplex): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const timedOut = error.code === 'ERR_HTTP_REQUEST_TIMEOUT';
  const message = `the request could not be read: ${timedOut ? 'it did not arrive in time' : (error.code ?? error.message)}`;
  const refused = timedOut
    ? new RequestTimeoutError(message)
    : new BadRequestError(message, {
        ...(error.code ? { code: error.code } : {}),
        ...(error.code === 'HPE_HEADER_OVERFLOW' ? { status: 431 } : {}),
      });
  const { status } = errorResponse(refused);
  const body = JSON.stringify(errorResponse(refused).body);
  socket.end(
    `HTTP/1.1 ${status} Error\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
  );
}

/**
 * Reads and discards what is left of a request body that a handler gave up on half way (a
 * streamed upload that hit a full disk), so the client, still sending, gets the error answer
 * rather than a reset connection. Bounded by the same size and time limits as the body itself;
 * past them the answer closes the connection instead.
 */
export function drainBody(req: IncomingMessage, limits: BodyLimits): Promise<void> {
  if (req.complete || req.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    let left = limits.maxStreamBytes ?? limits.maxBytes;
    const done = () => {
      clearTimeout(timer);
      req.off('readable', onReadable);
      req.off('end', done);
      req.off('close', done);
      req.off('error', done);
      resolve();
    };
    // `readable`, not `data`: the abandoned body iterator still listens for `readable`, which
    // would keep `data` from flowing.
    const onReadable = () => {
      for (let chunk = req.read(); chunk !== null; chunk = req.read()) {
        left -= (chunk as Buffer).length;
        if (left < 0) return done();
      }
    };
    const timer = setTimeout(done, limits.streamTimeoutMs ?? limits.timeoutMs);
    req.on('readable', onReadable);
    req.once('end', done);
    req.once('close', done);
    req.once('error', done);
    onReadable();
  });
}
