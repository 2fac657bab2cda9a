import type { Socket } from 'node:net';
import { UpstreamError } from '../errors.js';
import { connectSandboxSocket, unlinkSandboxSocket } from '../providers/sandbox-socket.js';
import {
  type ChunkedScanner,
  END_OF_HEAD,
  MAX_RESPONSE_HEAD_BYTES,
  parseResponseHead,
  responseChunks,
} from './gateway-http.js';

/**
 * A kept-open connection is not reused after this long without a request: servers close idle
 * connections (node after 5 s, gunicorn after 2), and a request sent as they do is lost.
 */
export const UPSTREAM_MAX_IDLE_MS = 1000;
/** Idle connections kept per sandbox socket for the next client connection. */
const MAX_FREE_PER_SOCKET = 32;

/**
 * An error answer (a status outside 2xx) the owner takes whole instead of as bytes for its client,
 * for a request sent with `divertErrors` (the E2B face rewrites it); other answers are forwarded as
 * usual: its status and its body (de-chunked).
 */
export interface DivertedAnswer {
  status: number;
  body: Buffer;
}

/** The most of a diverted answer held: envd's answers to them are a few hundred bytes of JSON. */
export const MAX_DIVERTED_BYTES = 1024 * 1024;

/** Who an upstream connection answers to: the client connection it is paired with. */
export interface UpstreamOwner {
  /** Response bytes, exactly as the sandbox sent them, for the client. */
  forward(bytes: Buffer, from: Upstream): void;
  /**
   * One or more final responses are complete. `closing`: the last one ends the connection
   * (`Connection: close`, or a body delimited by the end of the connection).
   */
  responsesDone(from: Upstream, closing: boolean): void;
  /** The sandbox switched protocols (101): `rest` is what it sent after the head. */
  upgraded(from: Upstream, rest: Buffer): void;
  /**
   * A diverted answer is complete ({@link Upstream.sent}); none of its bytes were forwarded.
   * `closing`: the connection ends after it.
   */
  diverted(from: Upstream, answer: DivertedAnswer, closing: boolean): void;
  /**
   * The connection ended or failed. `error` is set when requests were still waiting for an
   * answer; `midResponse` when part of one was forwarded already.
   */
  ended(from: Upstream, error: UpstreamError | undefined, midResponse: boolean): void;
}

function upstreamMessage(error: Error): string {
  return `the sandbox did not answer (${(error as NodeJS.ErrnoException).code ?? error.message}): nothing listens on that port, or the sandbox stopped`;
}

/**
 * One connection to a sandbox's socket (envd's, or a port's). Requests are written to
 * {@link socket} by the owner; responses are followed here (where each ends, so a client
 * connection can switch to another sandbox between two of them) and handed on unchanged.
 */
export class Upstream {
  readonly socket: Socket;
  owner: UpstreamOwner | undefined;
  /** Called once when an idle connection (no owner) closes: the pool forgets it. */
  onIdleClose: (() => void) | undefined;
  /**
   * Methods of the requests sent and not yet answered, oldest first; `upgrade` marks a switch,
   * `divertErrors` an error answer the owner takes whole.
   */
  readonly waiting: { method: string; upgrade: boolean; divertErrors: boolean }[] = [];
  /** Since when nothing has been waiting for an answer. */
  idleSince = Date.now();
  /** The sandbox said it closes (or will), or the connection failed: never reused. */
  closing = false;
  private state: 'head' | 'length' | 'chunked' | 'close' | 'done' = 'head';
  private left = 0;
  private chunks: ChunkedScanner | undefined;
  private partial: Buffer | undefined;
  private pausedFor: Socket | undefined;
  /** The answer being read whole for the owner ({@link DivertedAnswer}), instead of forwarded. */
  private diverting: { status: number; pieces: Buffer[]; bytes: number } | undefined;

  constructor(
    readonly socketPath: string,
    /** Set for a port's socket: a stale one is removed when nothing answers on it. */
    readonly port: number | undefined,
  ) {
    this.socket = connectSandboxSocket(socketPath);
    this.socket.on('data', (chunk: Buffer) => this.onData(chunk));
    this.socket.on('error', (error) => this.fail(error));
    this.socket.on('close', () => this.fail(undefined));
  }

  /** No request waiting, no response half read: the connection can take any next request. */
  get idle(): boolean {
    return this.waiting.length === 0 && this.state === 'head' && this.partial === undefined;
  }

  /** Nothing more is read: the connection closes, or was handed over. */
  private get finished(): boolean {
    return this.state === 'done';
  }

  /** Part of an answer went to the client already: no other answer can be written instead. */
  get midResponse(): boolean {
    return (
      this.diverting === undefined &&
      (this.state === 'length' || this.state === 'chunked' || this.state === 'close')
    );
  }

  /** Open, not closing, and busy or idle for less than `maxIdleMs`. */
  usable(now: number, maxIdleMs: number): boolean {
    return (
      !this.closing &&
      !this.socket.destroyed &&
      !this.finished &&
      (this.waiting.length > 0 || now - this.idleSince < maxIdleMs)
    );
  }

  /** Records a request written to the socket, for the answer's framing (and which to divert). */
  sent(method: string, upgrade: boolean, divertErrors = false): void {
    this.waiting.push({ method, upgrade, divertErrors });
  }

  /** Stops reading the sandbox while `client` cannot take more (backpressure). */
  pauseFor(client: Socket): void {
    if (this.pausedFor) return;
    this.pausedFor = client;
    this.socket.pause();
    client.once('drain', () => {
      if (this.pausedFor !== client) return;
      this.pausedFor = undefined;
      if (!this.socket.destroyed && !this.finished) this.socket.resume();
    });
  }

  /**
   * Gives the connection to `owner` (undefined: idle in the pool). Reading resumes: a client that
   * went away full never drains, and a paused socket would see neither answers nor its own end.
   */
  handTo(owner: UpstreamOwner | undefined): void {
    this.owner = owner;
    this.pausedFor = undefined;
    if (!this.socket.destroyed && !this.finished) this.socket.resume();
  }

  /** Closes the connection without telling its owner. */
  destroy(): void {
    this.owner = undefined;
    this.closing = true;
    this.state = 'done';
    this.socket.destroy();
  }

  /** Hands the socket over as a raw tunnel: nothing is parsed any more. */
  detach(): Socket {
    this.state = 'done';
    this.closing = true;
    this.owner = undefined;
    this.socket.removeAllListeners('data');
    this.socket.removeAllListeners('error');
    this.socket.removeAllListeners('close');
    return this.socket;
  }

  private onData(chunk: Buffer): void {
    const owner = this.owner;
    if (!owner || this.state === 'done') {
      // Bytes nobody asked for: on an idle pooled connection, or after a closing answer.
      this.destroy();
      return;
    }
    let buf = chunk;
    if (this.partial) {
      buf = Buffer.concat([this.partial, chunk]);
      this.partial = undefined;
    }
    let pos = 0;
    let flushed = 0;
    let done = 0;
    const flush = () => {
      if (pos > flushed) owner.forward(buf.subarray(flushed, pos), this);
      flushed = pos;
    };
    /** A diverted answer's body bytes: kept, not forwarded. */
    const keep = (from: number, to: number) => {
      const d = this.diverting;
      if (!d || to <= from) return;
      d.bytes += to - from;
      if (d.bytes > MAX_DIVERTED_BYTES) {
        throw new UpstreamError(
          `the sandbox answered with over ${MAX_DIVERTED_BYTES} bytes where a short answer was expected`,
        );
      }
      d.pieces.push(Buffer.from(buf.subarray(from, to)));
    };
    /** The answer ended: a diverted one goes to the owner whole. */
    const ended = () => {
      const d = this.diverting;
      if (d) flushed = pos;
      this.diverting = undefined;
      this.complete();
      if (d)
        owner.diverted(this, { status: d.status, body: Buffer.concat(d.pieces) }, this.finished);
      else done++;
    };
    try {
      while (pos < buf.length && !this.finished) {
        if (this.state === 'length') {
          const take = Math.min(this.left, buf.length - pos);
          keep(pos, pos + take);
          pos += take;
          this.left -= take;
          if (this.left === 0) ended();
        } else if (this.state === 'chunked') {
          const end = (this.chunks as ChunkedScanner).feed(
            buf,
            pos,
            buf.length,
            this.diverting ? keep : undefined,
          );
          pos = end < 0 ? buf.length : end;
          if (end >= 0) ended();
        } else if (this.state === 'close') {
          keep(pos, buf.length);
          pos = buf.length;
        } else {
          const exchange = this.waiting[0];
          if (!exchange) {
            throw new UpstreamError('the sandbox answered a request that was not sent');
          }
          const end = buf.indexOf(END_OF_HEAD, pos);
          if (end < 0 || end - pos > MAX_RESPONSE_HEAD_BYTES) {
            if (buf.length - pos > MAX_RESPONSE_HEAD_BYTES) {
              throw new UpstreamError('the sandbox answered with a head over 64 KiB');
            }
            // The head is forwarded once whole (and valid): keep its start.
            this.partial = buf.subarray(pos);
            break;
          }
          const head = parseResponseHead(buf.toString('latin1', pos, end), exchange.method);
          const divert = exchange.divertErrors && (head.status < 200 || head.status > 299);
          if (divert && head.status >= 200) {
            // What came before this answer goes on; the answer itself is kept.
            flush();
            this.diverting = { status: head.status, pieces: [], bytes: 0 };
          }
          pos = end + 4;
          if (head.status === 101) {
            if (!exchange.upgrade)
              throw new UpstreamError('the sandbox switched protocols unasked');
            flush();
            this.waiting.shift();
            owner.upgraded(this, buf.subarray(pos));
            return;
          }
          if (head.status < 200) continue; // 100 Continue and other interim answers
          if (head.close) this.closing = true;
          const body = head.body;
          if (body.kind === 'none' || (body.kind === 'length' && body.length === 0)) {
            ended();
          } else if (body.kind === 'length') {
            this.state = 'length';
            this.left = body.length;
          } else if (body.kind === 'chunked') {
            this.state = 'chunked';
            this.chunks = responseChunks();
          } else {
            this.state = 'close';
          }
        }
      }
    } catch (error) {
      if (this.diverting) flushed = pos;
      flush();
      this.fail(error as Error);
      return;
    }
    if (this.diverting) flushed = pos;
    flush();
    // Anything after an answer that closes the connection is not for anyone.
    if (this.finished) this.socket.pause();
    if (done > 0) owner.responsesDone(this, this.finished);
  }

  /** The answer to the oldest request is complete. */
  private complete(): void {
    this.waiting.shift();
    this.chunks = undefined;
    this.state = this.closing ? 'done' : 'head';
    if (this.waiting.length === 0) this.idleSince = Date.now();
  }

  private fail(error: Error | undefined): void {
    const owner = this.owner;
    const state = this.state;
    this.owner = undefined;
    this.closing = true;
    this.state = 'done';
    this.socket.destroy();
    if (!owner) {
      this.onIdleClose?.();
      this.onIdleClose = undefined;
      return;
    }
    const diverting = this.diverting;
    this.diverting = undefined;
    if (state === 'close' && error === undefined) {
      // A body delimited by the end of the connection is complete now.
      this.waiting.shift();
      if (diverting) {
        const body = Buffer.concat(diverting.pieces);
        owner.diverted(this, { status: diverting.status, body }, true);
      } else {
        owner.responsesDone(this, true);
      }
      return;
    }
    // A socket file left by a server that died: drop it, so the next request is forwarded by
    // envd to whatever listens on the port now.
    const code = (error as NodeJS.ErrnoException | undefined)?.code;
    if (this.port !== undefined && code === 'ECONNREFUSED') unlinkSandboxSocket(this.socketPath);
    // A diverted answer's bytes went nowhere yet: another answer can still be given instead.
    const midResponse = state !== 'head' && diverting === undefined;
    const failure =
      this.waiting.length === 0 && !midResponse
        ? undefined
        : error instanceof UpstreamError
          ? error
          : new UpstreamError(upstreamMessage(error ?? closedEarly()), { cause: error });
    owner.ended(this, failure, midResponse);
  }
}

const closedEarly = () =>
  Object.assign(new Error('the connection closed before an answer'), { code: 'ECONNRESET' });

/** Idle connections to sandbox sockets, by socket path, for the next client connection. */
export class UpstreamPool {
  private readonly free = new Map<string, Upstream[]>();

  constructor(
    /** Idle connections older than this are not reused. */
    readonly maxIdleMs = UPSTREAM_MAX_IDLE_MS,
  ) {}

  /** True when `upstream` can take another request. */
  usable(upstream: Upstream, now = Date.now()): boolean {
    return upstream.usable(now, this.maxIdleMs);
  }

  /** An idle connection to `socketPath` that is fresh enough, or a new one. */
  acquire(socketPath: string, port: number | undefined, owner: UpstreamOwner): Upstream {
    const list = this.free.get(socketPath);
    const now = Date.now();
    while (list && list.length > 0) {
      const upstream = list.pop() as Upstream;
      if (list.length === 0) this.free.delete(socketPath);
      upstream.onIdleClose = undefined;
      if (this.usable(upstream, now)) {
        upstream.handTo(owner);
        return upstream;
      }
      upstream.destroy();
    }
    const upstream = new Upstream(socketPath, port);
    upstream.handTo(owner);
    return upstream;
  }

  /** Keeps an idle connection for the next client, or closes it. */
  release(upstream: Upstream): void {
    upstream.handTo(undefined);
    if (upstream.closing || upstream.socket.destroyed || !upstream.idle) {
      upstream.destroy();
      return;
    }
    const list = this.free.get(upstream.socketPath) ?? [];
    if (list.length >= MAX_FREE_PER_SOCKET) {
      upstream.destroy();
      return;
    }
    list.push(upstream);
    this.free.set(upstream.socketPath, list);
    upstream.onIdleClose = () => this.forget(upstream);
  }

  private forget(upstream: Upstream): void {
    const list = this.free.get(upstream.socketPath);
    const index = list?.indexOf(upstream) ?? -1;
    if (index >= 0) list?.splice(index, 1);
    if (list?.length === 0) this.free.delete(upstream.socketPath);
  }

  /** Closes connections idle for too long to be reused. */
  sweep(now: number): void {
    for (const list of this.free.values()) {
      for (const upstream of [...list]) {
        if (!this.usable(upstream, now)) {
          this.forget(upstream);
          upstream.destroy();
        }
      }
    }
  }

  close(): void {
    const lists = [...this.free.values()];
    this.free.clear();
    for (const list of lists) for (const upstream of list) upstream.destroy();
  }
}
