import { createServer, type Server } from 'node:http';
import type { Server as NetServer, Socket } from 'node:net';
import { createServer as createTlsServer, type TLSSocket } from 'node:tls';
import { routeCapability } from '../../runtime/envd/capabilities.js';
import { capabilityRefusal } from '../../runtime/protocol/capabilities.js';
import { ENVD_PORT } from '../../runtime/protocol/constants.js';
import { E2bControlApi } from '../compat/e2b/control-api.js';
import type { E2bEnvdFace, E2bPassOn, EnvdFaceAnswer } from '../compat/e2b/envd-face.js';
import { rootRefused } from '../compat/e2b/files-route.js';
import {
  BadRequestError,
  CapabilityError,
  errorResponse,
  MethodNotAllowedError,
  PermissionDeniedError,
  RouteNotFoundError,
  SandboxError,
  SandboxPausedError,
  UpstreamError,
} from '../errors.js';
import { sandboxFilesOf } from '../providers/local/sandbox-files.js';
import { type AuditLog, auditText } from './audit.js';
import { type AccessDecision, API_ACCESS_KEY, authorize, pausedError } from './authorize.js';
import { Dashboard } from './dashboard.js';
import { type AuditTap, e2bAuditCallback, gatewayAuditTap } from './gateway-audit.js';
import {
  ClientConnection,
  type ConnectionLimits,
  type GatewayRoutes,
  type LocalAnswer,
  type RequestTarget,
  type Route,
} from './gateway-connection.js';
import { type DirectTransfer, directCandidate, directTransfer } from './gateway-files.js';
import type { RequestHead } from './gateway-http.js';
import {
  checkFetchSite,
  durationOption,
  LINK_DEFAULT_MS,
  LINK_MAX_MS,
  LINK_PARAM,
  PortLinks,
  parseSandboxPath,
  SESSION_COOKIE,
  SESSION_DEFAULT_MS,
  SESSION_MAX_MS,
  sessionCookieOf,
  withoutSessionCookie,
} from './gateway-links.js';
import { UPSTREAM_MAX_IDLE_MS, UpstreamPool } from './gateway-upstream.js';
import { LOCAL_FILE_HEADER } from './local-handoff.js';
import type { ConnectionEnds } from './peer-uid.js';
import type { GatewayCounts, GatewayRequestKind } from './prometheus.js';
import type { SandboxRecord } from './registry.js';

/** The port that names envd itself (as E2B's envd port): `49983-{id}.{domain}`. */
export { ENVD_PORT };

/** A client's request headers must arrive within this (against slowloris clients). */
export const GATEWAY_HEADERS_TIMEOUT_MS = 30_000;
/**
 * A whole request, body included, must arrive within this: envd's deadline for a streamed
 * upload. JSON bodies have their own, shorter deadline in envd and the command server.
 */
export const GATEWAY_REQUEST_TIMEOUT_MS = 3_600_000;
/**
 * An idle client connection is closed after this. Longer than the `Keep-Alive: timeout=5` the
 * sandbox's node servers announce (passed on to the client), so the client closes first.
 */
export const GATEWAY_KEEP_ALIVE_TIMEOUT_MS = 10_000;
/** After an answer that closes a connection, what the client still sends is dropped this long. */
const LINGER_MS = 2000;

/**
 * Headers that concern one connection only (RFC 9110 §7.6.1): the client's connection to the
 * gateway, not the gateway's to the sandbox, which outlives it. Upgrades keep theirs.
 */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'upgrade',
]);
/** The gateway's own headers: never passed on. */
const GATEWAY_HEADERS = new Set([
  'x-access-token',
  'x-sandbox-id',
  'x-sandbox-port',
  // E2B's SDKs name the sandbox this way (one URL for every sandbox).
  'e2b-sandbox-id',
  'e2b-sandbox-port',
  // `@e2b/code-interpreter` sends the sandbox's token this way on its context routes.
  'e2b-traffic-access-token',
  // Which envd a native request goes to (root's, where the sandbox allows root).
  'x-abx-user',
]);

/** What the gateway needs from the control plane. */
export interface GatewayBackend {
  /**
   * The sandbox's record if it exists (any state): at once where the registry can answer in the
   * thread (SQLite), else a promise (PostgreSQL, behind a cache of running sandboxes).
   */
  find(id: string): SandboxRecord | undefined | Promise<SandboxRecord | undefined>;
  /** True while its processes run. */
  isAlive(record: SandboxRecord): boolean;
  /** Makes envd forward `port` and returns the host Unix socket that reaches it. */
  openPort(record: SandboxRecord, token: string, port: number): Promise<string>;
  /**
   * The installation's token secret: it signs browser links and their session cookies, and gives
   * the token of the sandbox a cookie is for. Without it the gateway mints no links.
   */
  tokenSecret?: string;
  /**
   * Where the daemon's API answers (`tcp://127.0.0.1:PORT`), for requests that name no sandbox:
   * `api.{domain}`, and `/v1/…` or E2B's control paths on any other host. One URL then serves
   * the API and every sandbox, as E2B's SDKs expect (docs/e2b.md). Without it such requests are
   * refused as naming no sandbox.
   */
  apiTarget?(): string | undefined;
  /** Told of each request head and each closed client connection (the daemon's metrics). */
  counts?: GatewayCounts;
  /**
   * Resumes a paused sandbox created with `autoResume`, for a request that presented its
   * credential; resolves with its running record. Absent: such requests get 409 as any other.
   */
  resume?(record: SandboxRecord): Promise<SandboxRecord>;
  /** The audit trail the gateway records commands, files and links in (gateway-audit.ts). */
  audit?: AuditLog;
  /**
   * Whether native uploads and downloads of a local sandbox's files skip envd (gateway-files.ts;
   * default true). `ABX_DIRECT_FILES=0` turns it off, to compare or to rule it out.
   */
  directFiles?: boolean;
}

/** What a request is for, as the gateway's request counter labels it. */
export function gatewayRequestKind(target: RequestTarget): GatewayRequestKind {
  if (target.api) return 'api';
  if (target.local?.kind === 'preflight') return 'preflight';
  if (target.local) return 'link';
  if (target.e2b) return 'e2b';
  return target.port === ENVD_PORT ? 'envd' : 'port';
}

/**
 * The paths the daemon's API serves (`/v1/…`, E2B's control API), which the gateway passes to it
 * when they name no sandbox.
 */
function isApiPath(target: string): boolean {
  return target.startsWith('/v1/') || E2bControlApi.claims(target);
}

/**
 * What a signed `/files` URL of E2B's SDKs claims (`signature`, `signature_expiration`, `path`,
 * `username` in the query): a GET reads, a POST writes. Undefined without a signature.
 */
function signedFiles(method: string, query: string): RequestTarget['signed'] {
  if (!query.includes('signature')) return undefined;
  const params = new URLSearchParams(query);
  const signature = params.get('signature');
  if (signature === null) return undefined;
  return {
    signature,
    expiration: params.get('signature_expiration') ?? undefined,
    path: params.get('path') ?? '',
    user: params.get('username') ?? '',
    operation: method === 'POST' ? 'write' : 'read',
  };
}

/** A request that names no sandbox (the gateway answers it, or passes it to the API). */
function noSandbox(pathname: string, path: string): RequestTarget {
  return {
    id: '',
    port: 0,
    token: undefined,
    via: 'header',
    pathname,
    path,
  };
}

/**
 * `X-Abx-User` of a native request: `root` (root's envd) or `user` (the default, as without the
 * header); only on envd's port.
 */
function userHeader(head: RequestHead, port: number): 'root' | 'user' | undefined {
  const user = headerOf(head, 'x-abx-user');
  if (user === undefined) return undefined;
  if (user !== 'root' && user !== 'user') {
    throw new BadRequestError(
      `X-Abx-User ${JSON.stringify(user.slice(0, 64))} is not a user of an abx sandbox: give root (where the sandbox's template allows root) or user, or leave it out`,
    );
  }
  if (port !== ENVD_PORT) {
    throw new BadRequestError(
      `X-Abx-User is for envd's port (${ENVD_PORT}), not port ${port}: a sandbox's own servers choose their user themselves`,
    );
  }
  return user;
}

/**
 * `X-Abx-User: root` on a request that carries no token: a one-time link, a dashboard session and
 * a signed file URL reach the default user's envd only (E2B's signed URLs name root in their
 * `username`), so the header is refused rather than silently unused.
 */
function refuseRootHeader(head: RequestHead, carrier: string): void {
  if (headerOf(head, 'x-abx-user') !== 'root') return;
  throw new BadRequestError(
    `X-Abx-User: root needs the sandbox's access token (X-Access-Token): ${carrier} reaches the sandbox's default user only`,
  );
}

/** A request for the daemon's API (see {@link GatewayBackend.apiTarget}). */
function apiTarget(pathname: string, path: string): RequestTarget {
  return { ...noSandbox(pathname, path), api: true };
}

/**
 * A browser's CORS preflight (OPTIONS with `Origin` and `Access-Control-Request-Method`) for a
 * request that will send `X-Access-Token`: the preflight itself carries no token, so the sandbox
 * could never be asked; the gateway answers it. Whatever page sent it, the real request still
 * needs the token, and no cookie is ever allowed to authorize a cross-origin read (no
 * `Access-Control-Allow-Credentials`). Any other OPTIONS goes to the sandbox as it came.
 */
function tokenPreflight(head: RequestHead): RequestTarget | undefined {
  const origin = headerOf(head, 'origin');
  const method = headerOf(head, 'access-control-request-method');
  const headers = headerOf(head, 'access-control-request-headers')?.toLowerCase() ?? '';
  if (origin === undefined || method === undefined) return undefined;
  if (!headers.split(',').some((name) => name.trim() === 'x-access-token')) return undefined;
  return {
    ...noSandbox('', ''),
    local: {
      kind: 'preflight',
      origin: origin.slice(0, 300),
      method: method.slice(0, 20),
      headers: headers.slice(0, 1000),
    },
  };
}

/** The gateway's answer to a {@link tokenPreflight}: the origin may send that method and those headers. */
function preflightAnswer(local: { origin: string; method: string; headers: string }): LocalAnswer {
  // Header values from the request go back only when they are plain tokens (no CR/LF smuggled).
  const token = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/;
  // Never a local file's descriptor (local-handoff.ts): no page may ask for that.
  const headers = local.headers
    .split(',')
    .map((name) => name.trim())
    .filter((name) => token.test(name) && name.toLowerCase() !== LOCAL_FILE_HEADER);
  const safeOrigin = /^[\x21-\x7e]+$/.test(local.origin) ? local.origin : 'null';
  return {
    status: 204,
    headers: [
      `access-control-allow-origin: ${safeOrigin}`,
      `access-control-allow-methods: ${token.test(local.method) ? local.method : 'GET'}`,
      `access-control-allow-headers: ${headers.join(', ')}`,
      'access-control-max-age: 600',
      'vary: origin',
    ],
    body: '',
  };
}

/** The route of {@link apiTarget}s, but for the socket. */
const API_ROUTE = {
  id: '',
  port: 0,
  token: undefined,
  key: API_ACCESS_KEY,
  until: Number.POSITIVE_INFINITY,
  envd: false,
  template: '',
  capabilities: [],
} as const;

/** The value of a header (repeated ones joined with `sep`), by its lower-case name. */
function headerOf(head: RequestHead, key: string, sep = ', '): string | undefined {
  let value: string | undefined;
  for (let i = 0; i < head.keys.length; i++) {
    if (head.keys[i] === key) {
      value = value === undefined ? head.values[i] : `${value}${sep}${head.values[i]}`;
    }
  }
  return value;
}

/** A path for a Location header on this host: never `//host` or `/\\host` (another site). */
function localPath(path: string): string {
  return `/${path.replace(/^[/\\]+/, '')}`;
}

/** Parses `{port}-{id}.{domain}` (an optional `:gatewayPort` is ignored). */
export function parseSandboxHost(
  host: string | undefined,
  domain: string,
): { port: number; id: string } | undefined {
  // A DNS name is at most 253 characters; the port may follow.
  if (host !== undefined && host.length > 260) {
    throw new BadRequestError(
      `the Host header is ${host.length} characters long, over a host name's 253`,
    );
  }
  const name = host?.replace(/:\d+$/, '').toLowerCase();
  const suffix = `.${domain.toLowerCase()}`;
  if (!name?.endsWith(suffix)) return undefined;
  const match = /^(\d{1,5})-([a-z0-9-]{1,64})$/.exec(name.slice(0, -suffix.length));
  if (!match) {
    throw new BadRequestError(
      `Host ${JSON.stringify(name.slice(0, 100))} names no sandbox port: sandbox hosts are {port}-{sandboxId}.${domain}`,
    );
  }
  return { port: Number(match[1]), id: match[2] as string };
}

/**
 * The gateway: one loopback listener that routes `Host: {port}-{sandboxId}.{domain}` (or the
 * `X-Sandbox-Id` / `X-Sandbox-Port` headers) to envd, or through envd to a port inside the
 * sandbox. It needs that sandbox's token (`X-Access-Token`, or `?token=` for links), streams
 * bodies both ways without buffering, and passes WebSocket upgrades through.
 *
 * It routes whole connections rather than single requests: the first request of a connection is
 * checked in full and the connection is paired with a connection to that sandbox's socket; later
 * requests naming the same sandbox, port and token go straight there, each head rewritten as the
 * first (see {@link ClientConnection}). A request naming another is checked again.
 */
export class Gateway implements GatewayRoutes {
  readonly server: Server;
  /**
   * Connections to envd and to forwarded ports, kept between client connections: a new Unix
   * socket (and, behind a port forwarder, a new TCP connection inside the sandbox) per call would
   * cost more than the call itself.
   */
  readonly pool: UpstreamPool;
  /** Browser links and their session cookies (when the backend gave a token secret). */
  readonly links: PortLinks | undefined;
  private readonly connections = new Set<ClientConnection>();
  private readonly limits: ConnectionLimits = {
    headers: GATEWAY_HEADERS_TIMEOUT_MS,
    request: GATEWAY_REQUEST_TIMEOUT_MS,
    keepAlive: GATEWAY_KEEP_ALIVE_TIMEOUT_MS,
    linger: LINGER_MS,
    upstreamIdle: UPSTREAM_MAX_IDLE_MS,
  };
  private sweeper: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(
    private readonly backend: GatewayBackend,
    private readonly domain: string,
    limits: Partial<ConnectionLimits> = {},
    /** envd's E2B face, for requests shaped as E2B's SDKs send them (docs/e2b.md). */
    private readonly e2b?: E2bEnvdFace,
  ) {
    Object.assign(this.limits, limits);
    this.pool = new UpstreamPool(this.limits.upstreamIdle);
    this.links = backend.tokenSecret === undefined ? undefined : new PortLinks(backend.tokenSecret);
    // An http.Server for its listening and closing, but the connections are read here: node's
    // own parser is taken off, as it would consume the bytes the gateway passes on.
    this.server = createServer();
    this.server.removeAllListeners('connection');
    this.server.on('connection', (socket: Socket) => this.accept(socket));
  }

  /** Closes every connection, to clients and to sandboxes (the daemon is stopping). */
  close(): void {
    this.closed = true;
    clearInterval(this.sweeper);
    this.sweeper = undefined;
    for (const connection of [...this.connections]) connection.destroy();
    this.connections.clear();
    this.pool.close();
  }

  /**
   * One more listener whose connections this gateway serves: for remote clients, with TLS when
   * given a certificate and key (the connection is served once its handshake is done).
   */
  listener(tls?: { cert: string; key: string }, options: { api?: boolean } = {}): NetServer {
    const api = options.api ?? true;
    if (!tls) {
      const server = createServer();
      server.removeAllListeners('connection');
      server.on('connection', (socket: Socket) => this.accept(socket, false, api));
      return server;
    }
    const server = createTlsServer(tls);
    server.on('secureConnection', (socket: TLSSocket) => this.accept(socket, true, api));
    // A failed handshake (a client that does not trust the certificate) concerns that client only.
    server.on('tlsClientError', (_error, socket) => socket.destroy());
    return server;
  }

  private accept(socket: Socket, tls = false, api = true): void {
    if (this.closed) {
      socket.destroy();
      return;
    }
    this.connections.add(new ClientConnection(socket, this, this.limits, tls, api));
    // Deadlines are checked once a second for all connections, as node's server does: a timer
    // per request would cost more than the request.
    this.sweeper ??= setInterval(() => this.sweep(), 1000).unref();
  }

  private sweep(): void {
    const now = Date.now();
    for (const connection of this.connections) connection.tick(now);
    this.pool.sweep(now);
  }

  /** A sandbox was paused or resumed: every connection checks its next request to it afresh. */
  forgetSandbox(id: string): void {
    for (const connection of this.connections) connection.forgetRoute(id);
  }

  forget(connection: ClientConnection): void {
    this.connections.delete(connection);
    // Once per connection, from the socket's own tallies: nothing is counted per chunk.
    const { socket } = connection;
    this.backend.counts?.connection(socket.bytesRead, socket.bytesWritten);
  }

  target(head: RequestHead, tls = false, api = true): RequestTarget {
    const counts = this.backend.counts;
    if (!counts) return this.targetOf(head, tls, api);
    let target: RequestTarget;
    try {
      target = this.targetOf(head, tls, api);
    } catch (error) {
      counts.request('invalid');
      throw error;
    }
    counts.request(gatewayRequestKind(target));
    return target;
  }

  /** The sandbox, port and token a request names (see {@link GatewayRoutes.target}). */
  private targetOf(head: RequestHead, tls: boolean, api: boolean): RequestTarget {
    if (head.method === 'OPTIONS') {
      const preflight = tokenPreflight(head);
      if (preflight) return preflight;
    }
    // The path goes on as the client sent it: `new URL` would resolve `..` and `%2e%2e` segments,
    // so `/commands/%2e%2e/shutdown` would reach `/shutdown` behind the sandbox's back.
    const target = head.target;
    const mark = target.indexOf('?');
    let pathname = mark < 0 ? target : target.slice(0, mark);
    let query = mark < 0 ? '' : target.slice(mark + 1);
    let queryToken: string | undefined;
    let link: string | undefined;
    if (mark >= 0 && (query.includes('token') || query.includes(LINK_PARAM))) {
      const params = new URLSearchParams(query);
      if (params.has('token')) {
        queryToken = params.get('token') ?? undefined;
        params.delete('token');
      }
      if (params.has(LINK_PARAM)) {
        link = params.get(LINK_PARAM) ?? '';
        params.delete(LINK_PARAM);
      }
      query = params.toString();
    }
    // E2B's SDKs name the sandbox with their own headers; the native ones win when both are sent.
    const e2bId = head.sandboxId === undefined ? headerOf(head, 'e2b-sandbox-id') : undefined;
    const e2bPort = head.sandboxPort === undefined ? headerOf(head, 'e2b-sandbox-port') : undefined;
    const e2bHeaders = e2bId !== undefined || e2bPort !== undefined;
    const sandboxId = head.sandboxId ?? e2bId;
    const sandboxPort = head.sandboxPort ?? e2bPort;
    const fromHeaders = sandboxId !== undefined || sandboxPort !== undefined;
    // `api.{domain}` is the daemon's API (E2B's SDKs with E2B_DOMAIN call it so).
    const toApi = api && this.backend.apiTarget !== undefined;
    const apiHost =
      toApi &&
      !fromHeaders &&
      head.host?.replace(/:\d+$/, '').toLowerCase() === `api.${this.domain.toLowerCase()}`;
    if (apiHost) {
      // The dashboard lives on the API's own listener: its cookie never passes the gateway.
      if (Dashboard.claims(target)) {
        throw new RouteNotFoundError(
          `${pathname} is the dashboard's, which the API's own listener serves (abx dashboard prints its link), not the gateway`,
        );
      }
      return apiTarget(pathname, target);
    }
    const fromHost =
      sandboxId === undefined || sandboxPort === undefined
        ? parseSandboxHost(head.host, this.domain)
        : undefined;
    // `/sandboxes/{id}/ports/{port}/…` on any host: no DNS needed. A sandbox host or the headers
    // come first, so a sandbox's own `/sandboxes/…` paths stay its own.
    const fromPath = !fromHeaders && !fromHost ? parseSandboxPath(pathname) : undefined;
    if (fromPath) pathname = fromPath.rest;
    const id = sandboxId ?? fromHost?.id ?? fromPath?.id;
    const headerPort = sandboxPort;
    // Digits only: Number() would also take `0x50`, `1e3` or ` 80`.
    const port =
      headerPort !== undefined
        ? /^\d{1,5}$/.test(headerPort)
          ? Number(headerPort)
          : Number.NaN
        : (fromHost?.port ?? fromPath?.port);
    if (!id || port === undefined) {
      // The API's own paths, on the gateway's URL: one URL for the API and the sandboxes.
      if (toApi && !fromHeaders && isApiPath(target)) {
        return apiTarget(pathname, target);
      }
      const name = head.host?.replace(/:\d+$/, '');
      const forms = `Host {port}-{sandboxId}.${this.domain}, the path /sandboxes/{sandboxId}/ports/{port}/… or the X-Sandbox-Id and X-Sandbox-Port headers`;
      if (name && !fromHeaders && !/^(\d{1,3}\.){3}\d{1,3}$|^\[|^localhost$/i.test(name)) {
        throw new BadRequestError(
          `Host ${JSON.stringify(name.slice(0, 100))} is not a sandbox host of this gateway: use ${forms}`,
        );
      }
      throw new BadRequestError(`no sandbox named: use ${forms}`);
    }
    if (!/^[a-z0-9-]{1,64}$/.test(id)) {
      throw new BadRequestError('the sandbox id is not a sandbox id');
    }
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new BadRequestError(`port ${headerPort ?? port} is not a TCP port`);
    }
    const path = query ? `${pathname}?${query}` : pathname;
    const secure = tls || headerOf(head, 'x-forwarded-proto')?.toLowerCase() === 'https';
    // The token: X-Access-Token, else `?token=`, else `Authorization: Bearer` (then taken off the
    // request). A session cookie counts only on the sandbox port's own host, which set it.
    let token = head.accessToken;
    let via: RequestTarget['via'] = 'header';
    if (token === undefined && queryToken !== undefined) {
      token = queryToken;
      via = 'query';
    } else if (token === undefined) {
      const authorization = headerOf(head, 'authorization');
      if (authorization?.startsWith('Bearer ')) {
        token = authorization.slice(7).trim();
        via = 'authorization';
      }
    }
    // E2B's traffic token is the sandbox's token too (the E2B control API announces it so).
    token ??= headerOf(head, 'e2b-traffic-access-token');
    if (fromPath?.kind === 'link') {
      if (head.method !== 'POST') {
        throw new MethodNotAllowedError(
          `${head.method} /sandboxes/${id}/links/${port}: links are made with POST`,
        );
      }
      const params = new URLSearchParams(query);
      const where = params.get('path') ?? '/';
      // biome-ignore lint/suspicious/noControlCharactersInRegex: refusing them is the point
      if (!where.startsWith('/') || /[\x00-\x20\x7f\\]/.test(where) || where.startsWith('//')) {
        throw new BadRequestError(
          `path=${JSON.stringify(where.slice(0, 100))} is not a path on the sandbox port (/..., no spaces, controls or backslashes)`,
        );
      }
      const hostPort = /:(\d{1,5})$/.exec(head.host ?? '')?.[1];
      return {
        id,
        port,
        token,
        via,
        pathname,
        path,
        local: {
          kind: 'mint',
          expiresInMs: durationOption(
            params.get('expires_in_ms'),
            'expires_in_ms',
            LINK_DEFAULT_MS,
            LINK_MAX_MS,
          ),
          sessionMs: durationOption(
            params.get('session_ms'),
            'session_ms',
            SESSION_DEFAULT_MS,
            SESSION_MAX_MS,
          ),
          path: where,
          origin: `${secure ? 'https' : 'http'}://${port}-${id}.${this.domain}${hostPort ? `:${hostPort}` : ''}`,
        },
      };
    }
    if (link !== undefined && fromHost) {
      refuseRootHeader(head, 'a one-time link');
      return {
        id,
        port,
        token: undefined,
        via: 'link',
        pathname,
        path,
        local: { kind: 'redeem', link, secure, location: localPath(path) },
      };
    }
    // E2B's signed file URLs carry no token: the signature stands for it (checked in `check`).
    if (token === undefined && port === ENVD_PORT && pathname === '/files') {
      const signed = signedFiles(head.method, query);
      if (signed) {
        refuseRootHeader(head, 'a signed file URL');
        return {
          id,
          port,
          token,
          via: 'signature',
          pathname,
          path,
          signed,
          e2b: true,
        };
      }
    }
    if (token === undefined && fromHost) {
      const session = sessionCookieOf(headerOf(head, 'cookie', '; '));
      if (session !== undefined) {
        refuseRootHeader(head, 'a dashboard session');
        checkFetchSite(
          head.method,
          headerOf(head, 'sec-fetch-site'),
          headerOf(head, 'sec-fetch-mode'),
        );
        return {
          id,
          port,
          token,
          session,
          via: 'session',
          pathname,
          path,
        };
      }
    }
    const e2b = this.e2b?.claims(port, pathname, e2bHeaders) === true;
    const root = !e2b && userHeader(head, port) === 'root';
    return {
      id,
      port,
      token,
      via,
      pathname,
      path,
      ...(e2b ? { e2b } : {}),
      ...(root ? { root } : {}),
    };
  }

  serveE2b(
    head: RequestHead,
    target: RequestTarget,
    route: Route,
    body: Buffer,
    signal: AbortSignal,
  ): Promise<EnvdFaceAnswer> {
    const face = this.e2b as E2bEnvdFace;
    const headers = new Headers();
    for (let i = 0; i < head.keys.length; i++) {
      const key = head.keys[i] as string;
      if (GATEWAY_HEADERS.has(key) || HOP_BY_HOP.has(key)) continue;
      headers.append(key, head.values[i] as string);
    }
    return face.serve({
      method: head.method,
      target: target.path,
      headers,
      body,
      envd: {
        sandboxId: route.id,
        socketPath: route.socketPath,
        token: route.token as string,
        ...(route.rootSocketPath ? { rootSocketPath: route.rootSocketPath } : {}),
        ...(this.backend.audit
          ? { audit: e2bAuditCallback(this.backend.audit, target, route) }
          : {}),
      },
      port: target.port,
      signal,
    });
  }

  passOnE2b(
    head: RequestHead,
    target: RequestTarget,
    route: Route,
  ): { text: string; pass: E2bPassOn; route?: Route } | EnvdFaceAnswer | undefined {
    const passed = this.e2b?.passOn(head.method, target.path, target.port);
    if (passed === undefined || !('translate' in passed)) return passed;
    if (passed.root) {
      // `?username=root` goes to root's envd, where the sandbox has one.
      if (!route.rootSocketPath) return rootRefused();
      const rootRoute = { ...route, socketPath: route.rootSocketPath };
      const mark = passed.target.indexOf('?');
      const pathname = mark < 0 ? passed.target : passed.target.slice(0, mark);
      const text = this.rewrite(head, { ...target, path: passed.target, pathname }, rootRoute);
      return { text, pass: passed, route: rootRoute };
    }
    const mark = passed.target.indexOf('?');
    const pathname = mark < 0 ? passed.target : passed.target.slice(0, mark);
    // The head envd gets, as for its own route (capability, token), with the face's target.
    const text = this.rewrite(head, { ...target, path: passed.target, pathname }, route);
    return { text, pass: passed };
  }

  e2bRefusal(head: RequestHead, target: RequestTarget, error: unknown): EnvdFaceAnswer {
    const known =
      error instanceof SandboxError
        ? error
        : new UpstreamError(error instanceof Error ? error.message : String(error));
    // E2B's proxy answers for a paused sandbox as for one that is gone (its SDKs' isRunning()
    // reads false); the message still names the way to resume it.
    const status = known instanceof SandboxPausedError ? 404 : errorResponse(known).status;
    const headers = new Headers();
    const type = headerOf(head, 'content-type');
    if (type !== undefined) headers.set('content-type', type);
    return (this.e2b as E2bEnvdFace).refusal(
      headers,
      target.pathname,
      status,
      known.message,
      target.port,
    );
  }

  async check(target: RequestTarget): Promise<Route | LocalAnswer> {
    if (target.local?.kind === 'preflight') return preflightAnswer(target.local);
    if (target.api) {
      const socketPath = this.backend.apiTarget?.();
      if (socketPath === undefined) throw new UpstreamError('the daemon API is not listening');
      // The API checks its own keys: the gateway passes the request on as it came.
      return { ...API_ROUTE, socketPath };
    }
    const { id, port } = target;
    const found = this.backend.find(id);
    let record = found instanceof Promise ? await found : found;
    let decision = this.decide(target, record);
    // Its traffic resumes a sandbox made with autoResume, once the request proved it may reach it.
    if (decision.allow === 'resume' && record && this.backend.resume) {
      record = await this.backend.resume(record);
      decision = this.decide(target, record);
    }
    if (decision.allow === false) throw decision.error;
    // Still paused after a resume (another client paused it again): refused as paused.
    if (decision.allow === 'resume' || !record) throw pausedError(id);
    const { token, key, until } = decision;
    const route = {
      id,
      port,
      token,
      key,
      until,
      template: record.template,
      capabilities: record.capabilities,
      owner: record.owner,
    };
    if (decision.reach !== 'port') {
      const files =
        decision.reach === 'envd' && this.backend.directFiles !== false
          ? sandboxFilesOf(record.handle)
          : undefined;
      return {
        ...route,
        ...(files ? { files } : {}),
        socketPath:
          decision.reach === 'envd-root'
            ? (record.handle.envdRootSocket as string)
            : record.handle.envdSocket,
        envd: true,
        ...(record.handle.envdRootSocket ? { rootSocketPath: record.handle.envdRootSocket } : {}),
      };
    }
    const links = this.links;
    const local = target.local;
    if (local?.kind === 'mint') {
      if (!links) {
        throw new PermissionDeniedError(
          'this gateway makes no browser links (its daemon gave it no token secret)',
        );
      }
      const grant = links.mint(id, port, local.expiresInMs, local.sessionMs);
      this.backend.audit?.record({
        sandboxId: id,
        owner: record.owner,
        actor: null,
        kind: 'link.issued',
        data: {
          port,
          path: auditText(local.path),
          expiresAt: new Date(grant.expiresAt).toISOString(),
          sessionMs: grant.sessionMs,
          via: target.via,
        },
      });
      const sep = local.path.includes('?') ? '&' : '?';
      const body = JSON.stringify({
        url: `${local.origin}${local.path}${sep}${LINK_PARAM}=${grant.link}`,
        link: grant.link,
        expiresAt: new Date(grant.expiresAt).toISOString(),
        sessionMs: grant.sessionMs,
      });
      return {
        status: 200,
        headers: ['content-type: application/json', 'cache-control: no-store'],
        body,
      };
    }
    if (local?.kind === 'redeem') {
      const grant = (links as PortLinks).redeem(local.link, id, port);
      const cookie = (links as PortLinks).session(id, port, grant.sessionMs);
      return {
        status: 303,
        headers: [
          `location: ${local.location}`,
          // Host-only (no Domain): only this sandbox port's host gets it.
          `set-cookie: ${SESSION_COOKIE}=${cookie}; Path=/; Max-Age=${Math.floor(grant.sessionMs / 1000)}; HttpOnly; SameSite=Lax${local.secure ? '; Secure' : ''}`,
          'cache-control: no-store',
          'referrer-policy: no-referrer',
        ],
        body: '',
      };
    }
    const socketPath = await this.backend.openPort(record, token, port);
    return { ...route, socketPath, envd: false };
  }

  /** {@link authorize} with this gateway's facts: the record's liveness, the time, its links. */
  private decide(target: RequestTarget, record: SandboxRecord | undefined): AccessDecision {
    const alive = record?.state === 'running' && this.backend.isAlive(record);
    const resumes = this.backend.resume !== undefined;
    return authorize(target, { record, alive, now: Date.now(), links: this.links, resumes });
  }

  direct(
    head: RequestHead,
    target: RequestTarget,
    route: Route,
    ends: ConnectionEnds,
  ): DirectTransfer | undefined {
    if (!route.files) return undefined;
    const candidate = directCandidate(head, target, route);
    return candidate && directTransfer(route.files, candidate, ends);
  }

  audit(head: RequestHead, target: RequestTarget, route: Route): AuditTap | undefined {
    return this.backend.audit && gatewayAuditTap(this.backend.audit, head, target, route);
  }

  rewrite(head: RequestHead, target: RequestTarget, route: Route): string {
    if (route.envd) {
      const needed = routeCapability(target.pathname);
      if (needed && !route.capabilities.includes(needed)) {
        throw new CapabilityError(
          capabilityRefusal(
            route.template,
            needed,
            `${head.method} ${target.pathname} of sandbox ${target.id}`,
          ),
        );
      }
    }
    const { names, values, keys } = head;
    let text = `${head.method} ${target.path} ${head.version}\r\n`;
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i] as string;
      if (GATEWAY_HEADERS.has(key)) continue;
      if (!head.upgrade && HOP_BY_HOP.has(key)) continue;
      // envd gets the sandbox's token as it wants it, whatever the client sent; a port never
      // sees the sandbox's token, however it was sent.
      if ((route.envd || target.via === 'authorization') && key === 'authorization') continue;
      if (key === 'cookie') {
        // The session cookie is the gateway's: the sandbox never sees it.
        const rest = withoutSessionCookie(values[i] as string);
        if (rest !== '') text += `${names[i]}: ${rest}\r\n`;
        continue;
      }
      text += `${names[i]}: ${values[i]}\r\n`;
    }
    // Node's servers refuse an HTTP/1.1 request without Host; the sandbox is the host.
    if (head.host === undefined) text += 'host: localhost\r\n';
    if (route.envd) text += `authorization: Bearer ${route.token}\r\n`;
    return `${text}\r\n`;
  }
}
