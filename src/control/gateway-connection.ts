import { STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';
import { splice } from '../../runtime/server/splice.js';
import { type E2bPassOn, type EnvdFaceAnswer, e2bBodyLimit } from '../compat/e2b/envd-face.js';
import {
  errorResponse,
  PayloadTooLargeError,
  RequestTimeoutError,
  SandboxError,
  UpstreamError,
} from '../errors.js';
import type { SandboxFiles } from '../providers/local/sandbox-files.js';
import { accessKey } from './authorize.js';
import type { AuditTap } from './gateway-audit.js';
import { type DirectTransfer, type DirectWrite, namesLocalFile } from './gateway-files.js';
import {
  badRequest,
  type ChunkedScanner,
  END_OF_HEAD,
  MAX_HEAD_BYTES,
  parseRequestHead,
  type RequestHead,
  requestChunks,
} from './gateway-http.js';
import type { DivertedAnswer, Upstream, UpstreamOwner, UpstreamPool } from './gateway-upstream.js';
import { localFileUnavailable } from './local-handoff.js';
import type { ConnectionEnds } from './peer-uid.js';

/** Who a request is for, read from its head alone. */
export interface RequestTarget {
  id: string;
  port: number;
  token: string | undefined;
  /** The path without its query. */
  pathname: string;
  /** The request target to send: `?token=` (and `?abx_link=`) removed, the path form's prefix too. */
  path: string;
  /** The session cookie a link set (via `session`). */
  session?: string;
  /**
   * Where the credential came from: `header` (X-Access-Token, or E2B's traffic token),
   * `authorization` (a Bearer token, taken off the request), `query` (`?token=`), `session` (the
   * cookie a link set), `link` (a link being redeemed), `signature` (E2B's signed `/files` URL).
   * Who may do what is decided from it in src/control/authorize.ts.
   */
  via: 'header' | 'authorization' | 'query' | 'session' | 'link' | 'signature';
  /**
   * E2B's signed `/files` URL (via `signature`): what the signature covers, checked against the
   * sandbox's token (docs/e2b.md).
   */
  signed?: {
    signature: string;
    /** Unix seconds, or undefined for a signature that does not expire. */
    expiration: string | undefined;
    path: string;
    user: string;
    operation: 'read' | 'write';
  };
  /** The gateway answers it itself: mint a browser link, or redeem one. */
  local?:
    | {
        kind: 'mint';
        expiresInMs: number;
        sessionMs: number;
        /** Where on the port the link leads. */
        path: string;
        /** `{scheme}://{port}-{id}.{domain}[:{port}]` as this request reached the gateway. */
        origin: string;
      }
    | { kind: 'redeem'; link: string; secure: boolean; location: string }
    /** A browser's CORS preflight for a request that will carry X-Access-Token. */
    | { kind: 'preflight'; origin: string; method: string; headers: string };
  /** E2B's SDKs sent it to envd: the gateway reads it whole and its E2B face answers it. */
  e2b?: boolean;
  /** It names no sandbox and is for the daemon's API: passed on to it unchanged. */
  api?: boolean;
  /**
   * `X-Abx-User: root` on a native request to envd: it goes to root's envd, where the sandbox's
   * template allows root (refused elsewhere).
   */
  root?: boolean;
}

/** An answer the gateway gives itself (a link minted or redeemed), not the sandbox's. */
export interface LocalAnswer {
  status: number;
  /** `name: value` lines. */
  headers: string[];
  body: string;
}

/** A sandbox port that a token was checked for, and the socket that reaches it. */
export interface Route {
  id: string;
  port: number;
  token: string | undefined;
  /**
   * The decision's key ({@link accessKey}): a later request on the connection whose target has
   * the same key, before {@link until}, goes this route unchecked. Undefined: never reused.
   */
  key: string | undefined;
  /** Ms since the epoch: the decision is made again after it (a session cookie's end). */
  until: number;
  socketPath: string;
  /** Root's envd, in a sandbox that allows root (`?username=root`, user `root`). */
  rootSocketPath?: string;
  /** The port is envd's: requests get the sandbox's token and the capability check. */
  envd: boolean;
  template: string;
  capabilities: readonly string[];
  /** The sandbox's owner (its API key id; null: the daemon's own key), for the audit trail. */
  owner?: string | null;
  /** The sandbox's files as the daemon reaches them itself (local sandboxes, gateway-files.ts). */
  files?: SandboxFiles;
}

/** What a client connection needs from the gateway. */
export interface GatewayRoutes {
  readonly pool: UpstreamPool;
  /** The sandbox, port and token a request names (`tls`: it came over TLS). Throws a 400. */
  target(head: RequestHead, tls?: boolean, api?: boolean): RequestTarget;
  /**
   * The full check: the sandbox exists and runs, the token is its, the port is reachable. Or the
   * gateway's own answer, for a request it serves itself.
   */
  check(target: RequestTarget): Promise<Route | LocalAnswer>;
  /** The head sent to the sandbox for a request on a checked route. Throws a 403 or 400. */
  rewrite(head: RequestHead, target: RequestTarget, route: Route): string;
  /** The connection closed. */
  forget(connection: ClientConnection): void;
  /** Answers an E2B request on a checked route (see src/compat/e2b), its body read whole. */
  serveE2b?(
    head: RequestHead,
    target: RequestTarget,
    route: Route,
    body: Buffer,
    signal: AbortSignal,
  ): Promise<EnvdFaceAnswer>;
  /**
   * An E2B request that goes to envd as bytes (a `/files` upload or download, of any size): the
   * head to send and how its answer is rewritten, or the face's refusal. Undefined for a request
   * the face answers itself ({@link serveE2b}). Throws a 403 or 400 as {@link rewrite} does.
   */
  passOnE2b?(
    head: RequestHead,
    target: RequestTarget,
    route: Route,
  ): { text: string; pass: E2bPassOn; route?: Route } | EnvdFaceAnswer | undefined;
  /**
   * Where the audit trail records a request passed to a sandbox (gateway-audit.ts): told its
   * body's bytes as they pass and its end. Undefined: nothing is recorded of it.
   */
  audit?(head: RequestHead, target: RequestTarget, route: Route): AuditTap | undefined;
  /** A refusal of an E2B request in the shape its SDK reads. */
  e2bRefusal?(head: RequestHead, target: RequestTarget, error: unknown): EnvdFaceAnswer;
  /**
   * A native file transfer the gateway serves itself, on a checked envd route whose head was
   * rewritten (so its capability is checked): undefined when envd answers it (gateway-files.ts).
   */
  direct?(
    head: RequestHead,
    target: RequestTarget,
    route: Route,
    ends: ConnectionEnds,
  ): DirectTransfer | undefined;
}

/** Timeouts of a client connection, in milliseconds. */
export interface ConnectionLimits {
  /** A request head must arrive within this (against slowloris clients): then 408. */
  headers: number;
  /** A request body must arrive within this. */
  request: number;
  /** An idle kept-alive connection is closed after this. */
  keepAlive: number;
  /** After an answer that closes the connection, what the client still sends is read and dropped this long. */
  linger: number;
  /** A connection to a sandbox idle for longer is not reused (it may be closing). */
  upstreamIdle: number;
}

/** The answer of a request the gateway could not forward; anything unexpected is a 502. */
export function errorBody(error: unknown): { status: number; body: string } {
  const known =
    error instanceof SandboxError
      ? error
      : new UpstreamError(error instanceof Error ? error.message : String(error), { cause: error });
  const { status, body } = errorResponse(known);
  return { status, body: JSON.stringify(body) };
}

/**
 * An error answer of the contract's shape, as bytes for a socket. A browser page may read it (the
 * dashboard shows why a sandbox refused): it says nothing a cookie or token unlocked.
 */
export function errorAnswer(error: unknown, keepAlive = false): string {
  const { status, body } = errorBody(error);
  return `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Error'}\r\ncontent-type: application/json\r\naccess-control-allow-origin: *\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${keepAlive ? '' : 'connection: close\r\n'}\r\n${body}`;
}

/**
 * Whether `route`, checked for an earlier request on the connection, holds for `target` as well:
 * the decision's key is the target's, and it has not ended. Nothing else is compared: the key
 * holds everything the decision read (src/control/authorize.ts).
 */
export function routeHolds(route: Route, target: RequestTarget, now: number): boolean {
  return route.key !== undefined && route.key === accessKey(target) && now < route.until;
}

/** The reason phrase of an E2B answer: its own (one line of visible ASCII, bounded) or the usual. */
function reasonPhrase(answer: EnvdFaceAnswer): string {
  const usual = STATUS_CODES[answer.status] ?? 'OK';
  if (answer.reason === undefined) return usual;
  const text = answer.reason
    .replace(/[^\x20-\x7e]+/g, ' ')
    .trim()
    .slice(0, 300);
  return text === '' ? usual : text;
}

/** A {@link LocalAnswer} as bytes for a socket. */
function localAnswer(answer: LocalAnswer, keepAlive: boolean): string {
  const lines = [
    `HTTP/1.1 ${answer.status} ${STATUS_CODES[answer.status] ?? 'OK'}`,
    ...answer.headers,
    `content-length: ${Buffer.byteLength(answer.body)}`,
  ];
  if (!keepAlive) lines.push('connection: close');
  return `${lines.join('\r\n')}\r\n\r\n${answer.body}`;
}

/**
 * 'head': between requests; 'body' / 'chunked': forwarding a request body; 'collect': reading an
 * E2B request's body for the E2B face; 'e2b': an E2B request is answered (by the face, or by envd
 * and rewritten), nothing more is read until it is done; 'wait': a request is
 * held until the answers before it are complete and its route is checked; 'upgrading': a
 * protocol switch was asked, nothing more is read until the sandbox answers; 'tunnel': switched,
 * bytes flow both ways untouched; 'closing': the last answer is written, input is dropped;
 * 'direct': a file transfer the gateway serves itself (an upload's body is read into the file,
 * then the answer is written; a download's answer is written), nothing else is read meanwhile.
 */
type Mode =
  | 'head'
  | 'body'
  | 'chunked'
  | 'collect'
  | 'e2b'
  | 'wait'
  | 'upgrading'
  | 'tunnel'
  | 'closing'
  | 'direct';

interface Held {
  head: RequestHead | undefined;
  target?: RequestTarget;
  error?: unknown;
  answer?: LocalAnswer;
}

/** An E2B request being read whole, then answered by the E2B face. */
interface Collecting {
  head: RequestHead;
  target: RequestTarget;
  route: Route;
  pieces: Buffer[];
  bytes: number;
  /** Aborted when the client goes away: the face stops what it does for it. */
  abort: AbortController;
}

/**
 * An E2B request sent to envd as bytes (GatewayRoutes.passOnE2b), from its head until its answer
 * is written: nothing else is sent on the connection meanwhile, so answers stay in order.
 */
interface Passing {
  head: RequestHead;
  target: RequestTarget;
  pass: E2bPassOn;
}

const CRLF = Buffer.from('\r\n');
/** The most of an E2B answer held to leave in one write (see respondE2b). */
const HOLD_MAX_BYTES = 64 * 1024;

/** The bytes of a chunked body (already checked whole by a {@link ChunkedScanner}). */
function dechunk(raw: Buffer): Buffer {
  const out: Buffer[] = [];
  let pos = 0;
  for (;;) {
    const eol = raw.indexOf('\r\n', pos);
    if (eol < 0) break;
    const size = Number.parseInt(raw.toString('latin1', pos, eol).split(';')[0] as string, 16);
    pos = eol + 2;
    if (!(size > 0)) break;
    out.push(raw.subarray(pos, pos + size));
    pos += size + 2;
  }
  return Buffer.concat(out);
}

/**
 * One client connection to the gateway, routed whole: the first request's sandbox, port and token
 * are checked, and the connection is paired with a connection to that sandbox socket. Every
 * request head is read (to strip the gateway's own headers and the token, and to give envd the
 * token as it wants it); bodies and answers pass as bytes. A request that names another sandbox,
 * port or token waits for the answers before it, is checked, and moves the connection there.
 */
export class ClientConnection implements UpstreamOwner {
  private mode: Mode = 'head';
  /** Bytes from the client not handled yet. */
  private pending: Buffer | undefined;
  private bodyLeft = 0;
  private chunks: ChunkedScanner | undefined;
  private upstream: Upstream | undefined;
  private route: Route | undefined;
  /** The last E2B request's checked route: the next one for the same sandbox, port and credential needs no new check. */
  private e2bRoute: Route | undefined;
  private held: Held | undefined;
  private collecting: Collecting | undefined;
  private passing: Passing | undefined;
  /** The file transfer the gateway serves itself (mode 'direct'). */
  private directing: DirectTransfer | undefined;
  /** Its upload's body is all read (or it is a download). */
  private directBodyDone = false;
  /** Its upload waits for the file to take what it has. */
  private directBlocked = false;
  /** The audit trail's tap of the request whose body is being sent. */
  private tap: AuditTap | undefined;
  /** The audit trail's watcher of the answer in flight (the only request on its connection). */
  private answerTap: AuditTap['answer'];
  private checking = false;
  private running = false;
  /** Writing to the sandbox waits for it to drain. */
  private blocked = false;
  /** Bytes for the sandbox from the read being handled, written together. */
  private outgoing: (Buffer | string)[] = [];
  private outgoingBytes = 0;
  /**
   * The request being sent is held with its body until the body is whole or over
   * {@link HOLD_MAX_BYTES}: the sandbox gets a small one in one write (see passOn).
   */
  private holdHead = false;
  /** The last request sent asked to close the connection after its answer. */
  private closeAfter = false;
  /** The client closed its side: nothing more will come. */
  private clientEnded = false;
  private requests = 0;
  /** When the current mode began (waiting for a head, sending a body, closing). */
  private since = Date.now();

  constructor(
    readonly socket: Socket,
    private readonly routes: GatewayRoutes,
    private readonly limits: ConnectionLimits,
    private readonly tls = false,
    /** Requests that name no sandbox may go to the daemon's API (see GatewayBackend.apiTarget). */
    private readonly api = true,
  ) {
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('end', () => this.onEnd());
    socket.on('error', () => socket.destroy());
    socket.on('close', () => this.onClose());
  }

  /** Closes the connection at once (the daemon is stopping). */
  destroy(): void {
    this.upstream?.destroy();
    this.upstream = undefined;
    this.socket.destroy();
  }

  /** Enforces the connection's deadlines; called about every second. */
  tick(now: number): void {
    const idle = !this.upstream || this.upstream.idle;
    if (this.mode === 'head') {
      if (this.pending !== undefined || this.requests === 0) {
        if (idle && now - this.since > this.limits.headers) {
          this.fail(
            new RequestTimeoutError('the request could not be read: it did not arrive in time'),
          );
        }
      } else if (
        idle &&
        now - Math.max(this.since, this.upstream?.idleSince ?? 0) > this.limits.keepAlive
      ) {
        this.destroy();
      }
    } else if (this.mode === 'collect') {
      if (now - this.since > this.limits.request) {
        this.collectFailed(
          new RequestTimeoutError('the request could not be read: it did not arrive in time'),
        );
      }
    } else if (this.mode === 'body' || this.mode === 'chunked') {
      if (now - this.since > this.limits.request) {
        this.abortRequest(
          new RequestTimeoutError('the request could not be read: it did not arrive in time'),
        );
      }
    } else if (this.mode === 'direct') {
      if (!this.directBodyDone && now - this.since > this.limits.request) {
        this.directFailed(
          new RequestTimeoutError('the request could not be read: it did not arrive in time'),
        );
      }
    } else if (this.mode === 'closing' && now - this.since > this.limits.linger) {
      this.socket.destroy();
    }
  }

  // --- client → sandbox ---

  private onData(chunk: Buffer): void {
    if (this.mode === 'closing' || this.mode === 'tunnel') return;
    this.pending = this.pending ? Buffer.concat([this.pending, chunk]) : chunk;
    this.run();
  }

  /** Handles what the client sent, as far as the current mode allows. */
  private run(): void {
    if (this.running) return;
    const buf = this.pending;
    if (!buf) return;
    this.pending = undefined;
    this.running = true;
    let pos = 0;
    try {
      while (pos < buf.length) {
        if (this.mode === 'collect') {
          pos = this.collect(buf, pos);
        } else if (this.mode === 'direct' && !this.directBodyDone) {
          pos = this.directBody(buf, pos);
        } else if (this.mode === 'body') {
          const take = Math.min(this.bodyLeft, buf.length - pos);
          this.tap?.data(buf.subarray(pos, pos + take));
          this.toSandbox(buf.subarray(pos, pos + take));
          pos += take;
          this.bodyLeft -= take;
          if (this.bodyLeft === 0) this.bodySent();
        } else if (this.mode === 'chunked') {
          let end: number;
          try {
            const tap = this.tap;
            end = (this.chunks as ChunkedScanner).feed(
              buf,
              pos,
              buf.length,
              tap && ((from, to) => tap.data(buf.subarray(from, to))),
            );
          } catch (error) {
            this.abortRequest(error);
            return;
          }
          const stop = end < 0 ? buf.length : end;
          this.toSandbox(buf.subarray(pos, stop));
          pos = stop;
          if (end >= 0) this.bodySent();
        } else if (this.mode === 'head') {
          // Nothing after a request that closes the connection is read.
          if (this.closeAfter) return;
          const end = buf.indexOf(END_OF_HEAD, pos);
          if (end < 0 || end - pos > MAX_HEAD_BYTES) {
            if (buf.length - pos > MAX_HEAD_BYTES) {
              this.refuse(undefined, headTooLarge());
              return;
            }
            this.pending = buf.subarray(pos);
            return;
          }
          let head: RequestHead;
          try {
            head = parseRequestHead(buf.toString('latin1', pos, end));
          } catch (error) {
            this.refuse(undefined, error);
            return;
          }
          pos = end + 4;
          this.requests++;
          this.startRequest(head);
        } else {
          // Held until the sandbox answers, or a check completes: the rest waits.
          if (
            this.mode === 'wait' ||
            this.mode === 'upgrading' ||
            this.mode === 'e2b' ||
            this.mode === 'direct'
          ) {
            this.pending = buf.subarray(pos);
          }
          return;
        }
      }
    } finally {
      this.flushToSandbox();
      this.running = false;
      this.updateReading();
      this.maybeFinish();
    }
  }

  /**
   * The sandbox `id` was paused (or resumed): its next request here goes through the full check
   * again, which answers a paused sandbox with 409, instead of straight to the frozen envd.
   */
  forgetRoute(id: string): void {
    if (this.route?.id === id) this.route = undefined;
    if (this.e2bRoute?.id === id) this.e2bRoute = undefined;
  }

  private startRequest(head: RequestHead): void {
    let target: RequestTarget;
    try {
      target = this.routes.target(head, this.tls, this.api);
    } catch (error) {
      this.refuse(head, error);
      return;
    }
    const { route, upstream } = this;
    // An E2B request like the last one on this connection, once what was sent before is
    // answered: checked already, as a native request on a paired connection is. Not `/health`:
    // the face answers it without envd, so the check is what says whether the sandbox lives.
    const known = this.e2bRoute;
    if (
      target.e2b &&
      target.pathname !== '/health' &&
      known &&
      this.routes.serveE2b &&
      routeHolds(known, target, Date.now()) &&
      (!upstream || upstream.idle)
    ) {
      this.mode = 'wait';
      this.startE2b(head, target, known);
      return;
    }
    if (
      route &&
      upstream &&
      target.e2b !== true &&
      // A handoff is served or refused on the full path (startDirect), never sent to envd.
      !namesLocalFile(head) &&
      routeHolds(route, target, Date.now()) &&
      this.routes.pool.usable(upstream)
    ) {
      let text: string;
      try {
        text = this.routes.rewrite(head, target, route);
      } catch (error) {
        this.refuse(head, error);
        return;
      }
      if (upstream.idle && this.startDirect(head, target, route)) return;
      this.tap = this.routes.audit?.(head, target, route);
      this.send(head, text, upstream);
      return;
    }
    // Another sandbox, port or token, or no open connection to the sandbox: the full check, once
    // the answers to what was sent before are complete (they come back in order).
    this.hold({ head, target });
  }

  /** Answers a request the gateway refuses, after the answers before it. */
  private refuse(head: RequestHead | undefined, error: unknown): void {
    this.hold({ head, error });
  }

  private hold(held: Held): void {
    this.held = held;
    this.mode = 'wait';
    this.updateReading();
    this.advance();
  }

  /** Moves a held request on once nothing sent before it waits for an answer. */
  private advance(): void {
    if (this.mode !== 'wait' || this.checking) return;
    if (this.upstream && !this.upstream.idle) return;
    const held = this.held as Held;
    if (held.error !== undefined || held.answer !== undefined || !held.target) {
      this.held = undefined;
      const head = held.head;
      // A refused request without a body leaves the connection usable; with one, the unread
      // body would be taken for the next request.
      const keepAlive =
        head !== undefined &&
        !head.close &&
        !head.upgrade &&
        head.bodyLength === 0 &&
        !this.clientEnded &&
        (held.answer !== undefined || held.error instanceof SandboxError);
      if (held.target?.e2b && held.head && this.routes.e2bRefusal && !held.answer) {
        this.answerE2b(this.routes.e2bRefusal(held.head, held.target, held.error), !keepAlive);
        return;
      }
      this.socket.write(
        held.answer ? localAnswer(held.answer, keepAlive) : errorAnswer(held.error, keepAlive),
      );
      if (!keepAlive) {
        this.close();
        return;
      }
      this.requestSent();
      this.resume();
      return;
    }
    this.checking = true;
    const target = held.target;
    this.routes.check(target).then(
      (route) => {
        this.checking = false;
        this.routeChecked(held.head as RequestHead, target, route);
      },
      (error) => {
        this.checking = false;
        held.error = error ?? new Error('the check failed');
        this.advance();
      },
    );
  }

  private routeChecked(
    head: RequestHead,
    target: RequestTarget,
    checked: Route | LocalAnswer,
  ): void {
    if (this.mode !== 'wait' || this.socket.destroyed) return;
    if (!('socketPath' in checked)) {
      this.held = { head, answer: checked };
      this.advance();
      return;
    }
    const route = checked;
    if (target.e2b && this.routes.serveE2b) {
      this.held = undefined;
      this.e2bRoute = route;
      this.startE2b(head, target, route);
      return;
    }
    if (namesLocalFile(head)) {
      this.held = undefined;
      this.startDirect(head, target, route);
      return;
    }
    let text: string;
    try {
      text = this.routes.rewrite(head, target, route);
    } catch (error) {
      this.held = { head, error };
      this.advance();
      return;
    }
    this.held = undefined;
    if (this.startDirect(head, target, route)) return;
    const upstream = this.upstreamFor(route);
    this.route = route;
    this.tap = this.routes.audit?.(head, target, route);
    this.send(head, text, upstream);
    this.resume();
    this.flushToSandbox();
  }

  /**
   * The connection to `route`'s socket: the one held when it goes there and can take a request
   * (nothing is waiting on it here), else one from the pool.
   */
  private upstreamFor(route: Route): Upstream {
    const held = this.upstream;
    if (held && held.socketPath === route.socketPath && this.routes.pool.usable(held)) return held;
    if (held) this.routes.pool.release(held);
    // The native route checked for the connection held before is not this one's.
    this.route = undefined;
    const upstream = this.routes.pool.acquire(
      route.socketPath,
      route.envd ? undefined : route.port,
      this,
    );
    this.upstream = upstream;
    this.blocked = false;
    return upstream;
  }

  // --- E2B requests: read whole, answered by the E2B face ---

  private startE2b(head: RequestHead, target: RequestTarget, route: Route): void {
    if (head.upgrade) {
      this.held = {
        head,
        target,
        error: new UpstreamError('E2B requests to envd never switch protocols'),
      };
      this.advance();
      return;
    }
    let passed: ReturnType<NonNullable<GatewayRoutes['passOnE2b']>>;
    try {
      passed = this.routes.passOnE2b?.(head, target, route);
    } catch (error) {
      this.held = { head, target, error };
      this.advance();
      return;
    }
    if (passed && 'pass' in passed) {
      // E2B's download is envd's `/files/read?path=`, its bytes passed on as they are: the
      // gateway serves it itself where it serves the native one (not root's: `passed.route`).
      const read = passed.pass.target;
      if (
        !passed.route &&
        head.method === 'GET' &&
        read.startsWith('/files/read?') &&
        this.startDirect(
          head,
          { ...target, e2b: false, path: read, pathname: '/files/read' },
          route,
          target,
        )
      ) {
        return;
      }
      this.passOn(head, target, passed.route ?? route, passed.text, passed.pass);
      return;
    }
    if (passed) {
      // The face's own refusal. With a body, the connection ends: the unread body would be taken
      // for the next request.
      this.answerE2b(passed, head.close || head.bodyLength !== 0 || this.clientEnded);
      return;
    }
    const limit = e2bBodyLimit(target.pathname, target.port);
    if (head.bodyLength > limit) {
      this.held = {
        head,
        target,
        error: new PayloadTooLargeError(
          `the request body is ${head.bodyLength} bytes, over the ${limit} an E2B request to ${target.pathname.slice(0, 100)} may send`,
        ),
      };
      this.advance();
      return;
    }
    this.collecting = { head, target, route, pieces: [], bytes: 0, abort: new AbortController() };
    this.closeAfter = head.close;
    this.since = Date.now();
    if (head.bodyLength < 0) {
      this.chunks = requestChunks();
      this.mode = 'collect';
    } else if (head.bodyLength > 0) {
      this.bodyLeft = head.bodyLength;
      this.mode = 'collect';
    } else {
      this.collected();
      return;
    }
    this.resume();
  }

  /** Takes body bytes of the E2B request from `buf` at `pos`; returns where it stopped. */
  private collect(buf: Buffer, pos: number): number {
    const c = this.collecting as Collecting;
    let stop: number;
    let done: boolean;
    if (this.chunks) {
      let end: number;
      try {
        end = this.chunks.feed(buf, pos, buf.length);
      } catch (error) {
        this.collectFailed(error);
        return buf.length;
      }
      stop = end < 0 ? buf.length : end;
      done = end >= 0;
    } else {
      stop = pos + Math.min(this.bodyLeft, buf.length - pos);
      this.bodyLeft -= stop - pos;
      done = this.bodyLeft === 0;
    }
    c.pieces.push(Buffer.from(buf.subarray(pos, stop)));
    c.bytes += stop - pos;
    // A chunked body has no length to refuse up front: it is cut at the limit (with its framing).
    const limit = e2bBodyLimit(c.target.pathname, c.target.port);
    if (c.bytes > limit + 64 * 1024) {
      this.collectFailed(
        new PayloadTooLargeError(
          `the request body is over the ${limit} bytes an E2B request to ${c.target.pathname.slice(0, 100)} may send`,
        ),
      );
      return buf.length;
    }
    if (done) this.collected();
    return stop;
  }

  /** A body that cannot be read: the reason, and the connection ends (its rest is unknown). */
  private collectFailed(error: unknown): void {
    const c = this.collecting;
    this.collecting = undefined;
    this.chunks = undefined;
    this.pending = undefined;
    if (!c || !this.routes.e2bRefusal) {
      this.socket.write(errorAnswer(error));
      this.close();
      return;
    }
    this.mode = 'e2b';
    this.respondE2b(this.routes.e2bRefusal(c.head, c.target, error), true, () => this.close());
  }

  private collected(): void {
    const c = this.collecting as Collecting;
    const raw = Buffer.concat(c.pieces);
    const body = this.chunks ? dechunk(raw) : raw;
    this.chunks = undefined;
    this.mode = 'e2b';
    this.updateReading();
    const serve = this.routes.serveE2b as NonNullable<GatewayRoutes['serveE2b']>;
    const finish = () => {
      this.collecting = undefined;
      if (this.closeAfter || this.clientEnded) {
        this.close();
        return;
      }
      this.requestSent();
      this.resume();
    };
    serve.call(this.routes, c.head, c.target, c.route, body, c.abort.signal).then(
      (answer) => this.respondE2b(answer, this.closeAfter, finish),
      (error) => {
        const refusal = this.routes.e2bRefusal?.(c.head, c.target, error);
        if (!refusal) {
          this.socket.write(errorAnswer(error));
          this.close();
          return;
        }
        this.respondE2b(refusal, this.closeAfter, finish);
      },
    );
  }

  // --- E2B requests passed to envd as bytes, their error answers rewritten ---

  /**
   * Sends an E2B request to envd with the face's head (`text`), its body passed on as it arrives,
   * as a native request's is. envd's error answer comes back whole to {@link diverted}; another
   * answer goes to the client as bytes. The next request waits for it.
   */
  private passOn(
    head: RequestHead,
    target: RequestTarget,
    route: Route,
    text: string,
    pass: E2bPassOn,
  ): void {
    const upstream = this.upstreamFor(route);
    this.passing = { head, target, pass };
    this.tap = this.routes.audit?.(head, target, route);
    // A small body (most uploads) goes to envd with its head in one write, not in as many as the
    // client's writes: E2B's SDK streams a form chunked, its head and each piece apart, and each
    // write into the sandbox wakes envd. So a body of a small length, or a chunked one until it
    // makes 64 KiB; a larger one goes as it comes, so that envd can refuse it early. Not with
    // `Expect: 100-continue`: that client waits for envd's answer before it sends the body.
    this.holdHead =
      (head.bodyLength < 0 || (head.bodyLength > 0 && head.bodyLength <= HOLD_MAX_BYTES)) &&
      !head.keys.includes('expect');
    this.send(head, text, upstream, true);
    this.resume();
    this.flushToSandbox();
  }

  /** A request's body is all sent: the next head, or, for an E2B request, its answer first. */
  private bodySent(): void {
    this.holdHead = false;
    const tap = this.tap;
    this.tap = undefined;
    tap?.end();
    if (this.passing) {
      this.mode = 'e2b';
      this.chunks = undefined;
      return;
    }
    this.requestSent();
  }

  /** Writes an E2B answer, then ends the connection (`close`) or goes on with the next request. */
  private answerE2b(answer: EnvdFaceAnswer, close: boolean): void {
    this.mode = 'e2b';
    this.updateReading();
    this.respondE2b(answer, close, () => {
      if (close) {
        this.close();
        return;
      }
      this.requestSent();
      this.resume();
    });
  }

  /**
   * The request passed on can no longer be answered by envd (its body was cut short, envd went
   * away): the client gets the reason in E2B's shape, and the connection ends.
   */
  private passingFailed(error: unknown): boolean {
    const p = this.passing;
    if (!p || !this.routes.e2bRefusal) return false;
    this.passing = undefined;
    this.mode = 'e2b';
    this.chunks = undefined;
    this.pending = undefined;
    this.updateReading();
    this.respondE2b(this.routes.e2bRefusal(p.head, p.target, error), true, () => this.close());
    return true;
  }

  /**
   * Writes the E2B face's answer (a whole body with its length in one write, pieces chunked as
   * they are produced), then calls `done`.
   */
  private respondE2b(answer: EnvdFaceAnswer, close: boolean, done: () => void): void {
    const socket = this.socket;
    const lines = [`HTTP/1.1 ${answer.status} ${reasonPhrase(answer)}`];
    answer.headers.forEach((value, key) => {
      if (key !== 'content-length' && key !== 'transfer-encoding' && key !== 'connection') {
        lines.push(`${key}: ${value}`);
      }
    });
    const bodyless = answer.status === 204 || answer.status === 304;
    if (close) lines.push('connection: close');
    const { body } = answer;
    if (body instanceof Uint8Array) {
      if (socket.destroyed) return;
      if (bodyless) {
        socket.write(`${lines.join('\r\n')}\r\n\r\n`, 'latin1');
      } else {
        lines.push(`content-length: ${body.length}`);
        const head = Buffer.from(`${lines.join('\r\n')}\r\n\r\n`, 'latin1');
        socket.write(body.length === 0 ? head : Buffer.concat([head, body]));
      }
      done();
      return;
    }
    if (!bodyless) lines.push('transfer-encoding: chunked');
    // The head goes out with the first piece of the body (or with its end). Pieces are held until
    // the event loop turns (or until they make 64 KiB), so that what one turn produced leaves in
    // one write: a unary call's one piece with its end, a stream's last message with its
    // end-stream message and the chunked body's end. Each write wakes the client, which on a
    // busy 2-core machine costs more than the bytes.
    let head: string | undefined = `${lines.join('\r\n')}\r\n\r\n`;
    const iterator = body[Symbol.asyncIterator]();
    const held: Buffer[] = [];
    let heldBytes = 0;
    let flushing: NodeJS.Immediate | undefined;
    const flush = () => {
      clearImmediate(flushing);
      flushing = undefined;
      if (held.length === 0 || socket.destroyed) return;
      const bytes = held.length === 1 ? (held[0] as Buffer) : Buffer.concat(held, heldBytes);
      held.length = 0;
      heldBytes = 0;
      socket.write(bytes);
    };
    const drained = () =>
      new Promise<void>((resolve) => {
        const go = () => {
          socket.off('drain', go);
          socket.off('close', go);
          resolve();
        };
        socket.on('drain', go);
        socket.on('close', go);
      });
    const pump = async () => {
      try {
        for (;;) {
          if (socket.destroyed) return;
          const item = await iterator.next();
          if (item.done) break;
          if (bodyless || item.value.length === 0) continue;
          if (heldBytes + item.value.length > HOLD_MAX_BYTES) flush();
          // Whether the socket still waits to drain now, not whether a write once said so: a
          // 'drain' that came in between would never come again.
          if (socket.writableNeedDrain) await drained();
          const piece = Buffer.concat([
            Buffer.from(`${head ?? ''}${item.value.length.toString(16)}\r\n`, 'latin1'),
            item.value,
            CRLF,
          ]);
          head = undefined;
          held.push(piece);
          heldBytes += piece.length;
          flushing ??= setImmediate(flush);
        }
      } catch {
        // The answer cannot be completed: a cut chunked body tells the client so.
        clearImmediate(flushing);
        socket.destroy();
        return;
      }
      clearImmediate(flushing);
      if (socket.destroyed) return;
      held.push(Buffer.from(`${head ?? ''}${bodyless ? '' : '0\r\n\r\n'}`, 'latin1'));
      socket.write(Buffer.concat(held));
      held.length = 0;
      heldBytes = 0;
      done();
    };
    void pump();
  }

  // --- file transfers the gateway serves itself (gateway-files.ts) ---

  /** Serves the request as a direct file transfer if the gateway takes it; false: envd answers. */
  private startDirect(
    head: RequestHead,
    target: RequestTarget,
    route: Route,
    /** The request as the audit trail records it (E2B's, for E2B's download). */
    audited: RequestTarget = target,
  ): boolean {
    let transfer: DirectTransfer | undefined;
    let refusal: unknown;
    try {
      transfer = this.routes.direct?.(head, target, route, this.socket);
    } catch (error) {
      transfer = undefined;
      refusal = error;
    }
    if (!transfer) {
      if (!namesLocalFile(head)) return false;
      // A request naming a local client's file is never envd's (it would take the empty body).
      this.held = {
        head,
        error:
          refusal ?? localFileUnavailable("this sandbox's files are not served by the gateway"),
      };
      this.advance();
      return true;
    }
    this.directing = transfer;
    this.directBlocked = false;
    this.closeAfter = head.close;
    this.since = Date.now();
    this.mode = 'direct';
    const tap = this.routes.audit?.(head, audited, route);
    if (transfer.kind === 'handoff') {
      this.directBodyDone = true;
      this.updateReading();
      const close = () => this.closeAfter || this.clientEnded;
      transfer.run(close()).then(
        ({ answer, size }) => {
          tap?.count?.(size);
          tap?.end();
          if (!this.socket.destroyed) this.socket.write(answer);
          this.directDone();
        },
        (error) => {
          tap?.end();
          if (!this.socket.destroyed) this.socket.write(errorAnswer(error, !close()));
          this.directDone();
        },
      );
      return true;
    }
    if (transfer.kind === 'read') {
      this.directBodyDone = true;
      tap?.end();
      this.updateReading();
      transfer.send(this.socket, this.closeAfter || this.clientEnded).then(
        () => this.directDone(),
        () => {
          this.directing = undefined;
          this.socket.destroy();
        },
      );
      return true;
    }
    this.tap = tap;
    this.directBodyDone = false;
    if (head.bodyLength < 0) this.chunks = requestChunks();
    else this.bodyLeft = head.bodyLength;
    this.resume();
    return true;
  }

  /** Takes an upload's body bytes from `buf` at `pos` into its file; returns where it stopped. */
  private directBody(buf: Buffer, pos: number): number {
    const transfer = this.directing as DirectWrite;
    const take = (from: number, to: number) => {
      if (to <= from) return;
      const chunk = buf.subarray(from, to);
      this.tap?.data(chunk);
      if (!transfer.data(chunk) && !this.directBlocked) {
        this.directBlocked = true;
        transfer.drained().then(() => {
          this.directBlocked = false;
          if (this.directing === transfer) this.resume();
        });
      }
    };
    let stop: number;
    let done: boolean;
    try {
      if (this.chunks) {
        const end = this.chunks.feed(buf, pos, buf.length, take);
        stop = end < 0 ? buf.length : end;
        done = end >= 0;
      } else {
        stop = pos + Math.min(this.bodyLeft, buf.length - pos);
        this.bodyLeft -= stop - pos;
        take(pos, stop);
        done = this.bodyLeft === 0;
      }
    } catch (error) {
      this.directFailed(error);
      return buf.length;
    }
    if (done) this.directEnd(transfer);
    return stop;
  }

  /** An upload's body is whole: the file is put in place, then its answer is written. */
  private directEnd(transfer: DirectWrite): void {
    this.directBodyDone = true;
    this.chunks = undefined;
    const tap = this.tap;
    this.tap = undefined;
    tap?.end();
    this.updateReading();
    const close = () => this.closeAfter || this.clientEnded;
    transfer.end(close()).then(
      (answer) => {
        if (!this.socket.destroyed) this.socket.write(answer);
        this.directDone();
      },
      (error) => {
        if (!this.socket.destroyed) this.socket.write(errorAnswer(error, !close()));
        this.directDone();
      },
    );
  }

  /** An upload that cannot complete (a bad body, a deadline): the reason, and the connection ends. */
  private directFailed(error: unknown): void {
    this.directing?.abort();
    this.directing = undefined;
    this.chunks = undefined;
    this.pending = undefined;
    this.tap = undefined;
    this.socket.write(errorAnswer(error));
    this.close();
  }

  /** The transfer's answer is written: the next request, or the end of the connection. */
  private directDone(): void {
    this.directing = undefined;
    this.directBodyDone = false;
    this.directBlocked = false;
    if (this.mode !== 'direct') return;
    if (this.closeAfter || this.clientEnded) {
      this.close();
      return;
    }
    this.requestSent();
    this.resume();
  }

  private send(head: RequestHead, text: string, upstream: Upstream, divertErrors = false): void {
    // An answer is watched only alone on its connection: its end is then the end of the answers.
    this.answerTap = this.tap?.answer && upstream.idle ? this.tap.answer : undefined;
    upstream.sent(head.method, head.upgrade, divertErrors);
    this.toSandbox(text);
    this.closeAfter = head.close;
    if (head.upgrade) {
      this.mode = 'upgrading';
    } else if (head.bodyLength > 0) {
      this.mode = 'body';
      this.bodyLeft = head.bodyLength;
      this.since = Date.now();
    } else if (head.bodyLength < 0) {
      this.mode = 'chunked';
      this.chunks = requestChunks();
      this.since = Date.now();
    } else {
      this.bodySent();
    }
  }

  private requestSent(): void {
    this.holdHead = false;
    this.mode = 'head';
    this.chunks = undefined;
    this.since = Date.now();
  }

  /** Queues bytes for the sandbox; {@link flushToSandbox} writes what one read produced at once. */
  private toSandbox(data: Buffer | string): void {
    this.outgoing.push(data);
    this.outgoingBytes += data.length; // strings are heads: latin1, a byte per character
  }

  /**
   * Writes the queued bytes in one system call: a head and its body (or several pipelined
   * requests) copied into one buffer while small, as a vectored write past that.
   */
  private flushToSandbox(): void {
    const pieces = this.outgoing;
    if (
      pieces.length === 0 ||
      (this.holdHead &&
        (this.mode === 'body' || this.mode === 'chunked') &&
        this.outgoingBytes <= HOLD_MAX_BYTES)
    ) {
      return;
    }
    const bytes = this.outgoingBytes;
    this.outgoing = [];
    this.outgoingBytes = 0;
    const upstream = this.upstream;
    if (!upstream || upstream.socket.destroyed) return;
    const socket = upstream.socket;
    let more = true;
    if (pieces.length === 1 || bytes > 64 * 1024) {
      if (pieces.length > 1) socket.cork();
      for (const piece of pieces) {
        more = typeof piece === 'string' ? socket.write(piece, 'latin1') : socket.write(piece);
      }
      if (pieces.length > 1) socket.uncork();
    } else {
      const joined = Buffer.allocUnsafe(bytes);
      let at = 0;
      for (const piece of pieces) {
        at +=
          typeof piece === 'string' ? joined.write(piece, at, 'latin1') : piece.copy(joined, at);
      }
      more = socket.write(joined);
    }
    if (!more && !this.blocked) {
      this.blocked = true;
      socket.once('drain', () => {
        this.blocked = false;
        this.updateReading();
      });
    }
  }

  /** Reads from the client only when what it sends can go somewhere. */
  private updateReading(): void {
    if (this.mode === 'tunnel' || this.socket.destroyed) return;
    if (this.mode === 'closing') this.socket.resume();
    else if (
      this.blocked ||
      this.mode === 'wait' ||
      this.mode === 'upgrading' ||
      this.mode === 'e2b' ||
      (this.mode === 'direct' && (this.directBodyDone || this.directBlocked))
    )
      this.socket.pause();
    else this.socket.resume();
  }

  /** Continues with what the client sent meanwhile. */
  private resume(): void {
    this.updateReading();
    if (this.pending) this.run();
    else this.maybeFinish();
  }

  /** A request the sandbox has in part cannot complete: answer it, or cut the connection. */
  private abortRequest(error: unknown): void {
    const upstream = this.upstream;
    const answerable =
      upstream !== undefined && upstream.waiting.length === 1 && !upstream.midResponse;
    this.upstream = undefined;
    this.route = undefined;
    upstream?.destroy();
    if (answerable) {
      if (this.passingFailed(error)) return;
      this.socket.write(errorAnswer(error));
      this.close();
    } else {
      this.socket.destroy();
    }
  }

  /** A refusal before any request of the connection is in the sandbox's hands, or a timeout. */
  private fail(error: unknown): void {
    this.refuse(undefined, error);
  }

  /** Ends the connection when the client asked to, or went away, once every answer is out. */
  private maybeFinish(): void {
    if (this.mode !== 'head' || this.running) return;
    if (this.upstream && !this.upstream.idle) return;
    if (this.closeAfter || this.clientEnded) this.close();
  }

  /** Ends the connection after what was written, reading and dropping what still comes. */
  private close(): void {
    if (this.mode === 'closing' || this.mode === 'tunnel') return;
    // A direct transfer never used the connection to the sandbox: it is idle as before it.
    const wasBetweenRequests =
      this.mode === 'head' || this.mode === 'wait' || this.mode === 'direct';
    this.mode = 'closing';
    this.since = Date.now();
    this.pending = undefined;
    this.passing = undefined;
    const upstream = this.upstream;
    this.upstream = undefined;
    if (upstream) {
      if (wasBetweenRequests && upstream.idle) this.routes.pool.release(upstream);
      else upstream.destroy();
    }
    this.socket.end();
    if (this.clientEnded) this.socket.destroy();
    else this.updateReading();
  }

  private onEnd(): void {
    this.clientEnded = true;
    if (this.mode === 'tunnel') return;
    if (this.mode === 'closing') {
      this.socket.destroy();
    } else if (this.mode === 'collect') {
      this.collecting?.abort.abort();
      this.socket.destroy();
    } else if (this.mode === 'e2b') {
      // The client finished sending; its answer is still being written.
    } else if (this.mode === 'direct') {
      if (!this.directBodyDone) {
        // An upload cut short: its temporary file goes, nothing is renamed into place.
        this.directing?.abort();
        this.directing = undefined;
        this.socket.destroy();
      }
    } else if (this.mode === 'body' || this.mode === 'chunked') {
      // A request cut short: it can never complete.
      this.upstream?.destroy();
      this.upstream = undefined;
      this.socket.destroy();
    } else {
      this.maybeFinish();
    }
  }

  private onClose(): void {
    this.routes.forget(this);
    this.collecting?.abort.abort();
    this.directing?.abort();
    this.directing = undefined;
    const upstream = this.upstream;
    this.upstream = undefined;
    if (!upstream) return;
    if (this.mode === 'head' && upstream.idle) this.routes.pool.release(upstream);
    else upstream.destroy();
  }

  // --- sandbox → client ---

  forward(bytes: Buffer, from: Upstream): void {
    if (from !== this.upstream) return;
    this.answerTap?.data(bytes);
    if (!this.socket.write(bytes)) from.pauseFor(this.socket);
  }

  responsesDone(from: Upstream, closing: boolean): void {
    if (from !== this.upstream) return;
    const answered = this.answerTap;
    this.answerTap = undefined;
    answered?.end();
    if (closing) {
      // The sandbox closes the connection after that answer, and told the client so (or the
      // body ended with the connection): the client's connection ends too.
      this.upstream = undefined;
      this.route = undefined;
      from.destroy();
      this.close();
      return;
    }
    if (!from.idle) return;
    if (this.passing && this.mode === 'e2b') {
      // envd's answer to an E2B request went to the client as it was: the next request may go.
      this.passing = undefined;
      this.requestSent();
      this.resume();
    } else if (this.mode === 'upgrading') {
      // The sandbox declined the switch: the connection goes on with HTTP.
      this.requestSent();
      this.resume();
    } else if (this.mode === 'wait') {
      this.advance();
    } else {
      this.maybeFinish();
    }
  }

  diverted(from: Upstream, answer: DivertedAnswer, closing: boolean): void {
    const p = this.passing;
    if (from !== this.upstream || !p) {
      from.destroy();
      if (from === this.upstream) {
        this.upstream = undefined;
        this.socket.destroy();
      }
      return;
    }
    this.passing = undefined;
    let reply: EnvdFaceAnswer;
    try {
      reply = p.pass.translate(answer);
    } catch (error) {
      reply = this.routes.e2bRefusal?.(p.head, p.target, error) ?? {
        status: 502,
        headers: new Headers(),
        body: (async function* () {})(),
      };
    }
    // envd answered before the whole body was sent (a refusal, a full disk): the rest of the body
    // has nowhere to go, so the connection ends after the answer. So it does when envd's does.
    const early = this.mode === 'body' || this.mode === 'chunked';
    if (early || closing) {
      this.upstream = undefined;
      this.route = undefined;
      from.destroy();
      this.closeAfter = true;
      this.chunks = undefined;
      this.pending = undefined;
    }
    this.answerE2b(reply, this.closeAfter || this.clientEnded);
  }

  upgraded(from: Upstream, rest: Buffer): void {
    if (from !== this.upstream) {
      from.destroy();
      return;
    }
    // Still known to the gateway until it closes: a stopping daemon closes tunnels too.
    this.mode = 'tunnel';
    this.upstream = undefined;
    const sandbox = from.detach();
    this.socket.removeAllListeners('data');
    this.socket.removeAllListeners('end');
    if (rest.length > 0) this.socket.write(rest);
    if (this.pending) sandbox.write(this.pending);
    this.pending = undefined;
    splice(this.socket, sandbox);
    sandbox.resume();
    this.socket.resume();
  }

  ended(from: Upstream, error: UpstreamError | undefined, midResponse: boolean): void {
    if (from !== this.upstream) return;
    this.upstream = undefined;
    this.route = undefined;
    this.blocked = false;
    if (midResponse) {
      this.socket.destroy();
    } else if (error && this.passingFailed(error)) {
      // answered in E2B's shape
    } else if (error) {
      // Nothing of the answer was sent: the client gets the reason, and the connection ends
      // (requests pipelined after it are lost with the sandbox's connection).
      this.socket.write(errorAnswer(error));
      this.close();
    } else if (this.mode === 'body' || this.mode === 'chunked') {
      // The sandbox answered before the whole body arrived, then closed: the rest has nowhere to go.
      this.close();
    } else if (this.mode === 'wait') {
      this.advance();
    }
  }
}

function headTooLarge() {
  return badRequest(`its head is over ${MAX_HEAD_BYTES / 1024} KiB`, {
    status: 431,
    code: 'HPE_HEADER_OVERFLOW',
  });
}
