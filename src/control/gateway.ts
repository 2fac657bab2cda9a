import { createServer, type Server } from 'node:http';
import type { Server as NetServer, Socket } from 'node:net';
import { createServer as createTlsServer, type TLSSocket } from 'node:tls';
import { routeCapability } from '../../runtime/envd/capabilities.js';
import { capabilityRefusal } from '../../runtime/protocol/capabilities.js';
import { ENVD_PORT } from '../../runtime/protocol/constants.js';
import {
  AuthenticationError,
  BadRequestError,
  CapabilityError,
  SandboxNotFoundError,
} from '../errors.js';
import {
  ClientConnection,
  type ConnectionLimits,
  type GatewayRoutes,
  type RequestTarget,
  type Route,
} from './gateway-connection.js';
import type { RequestHead } from './gateway-http.js';
import { UPSTREAM_MAX_IDLE_MS, UpstreamPool } from './gateway-upstream.js';
import { tokenMatches } from './ids.js';
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
const GATEWAY_HEADERS = new Set(['x-access-token', 'x-sandbox-id', 'x-sandbox-port']);

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
  ) {
    Object.assign(this.limits, limits);
    this.pool = new UpstreamPool(this.limits.upstreamIdle);
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
  listener(tls?: { cert: string; key: string }): NetServer {
    if (!tls) {
      const server = createServer();
      server.removeAllListeners('connection');
      server.on('connection', (socket: Socket) => this.accept(socket));
      return server;
    }
    const server = createTlsServer(tls);
    server.on('secureConnection', (socket: TLSSocket) => this.accept(socket));
    // A failed handshake (a client that does not trust the certificate) concerns that client only.
    server.on('tlsClientError', (_error, socket) => socket.destroy());
    return server;
  }

  private accept(socket: Socket): void {
    if (this.closed) {
      socket.destroy();
      return;
    }
    this.connections.add(new ClientConnection(socket, this, this.limits));
    // Deadlines are checked once a second for all connections, as node's server does: a timer
    // per request would cost more than the request.
    this.sweeper ??= setInterval(() => this.sweep(), 1000).unref();
  }

  private sweep(): void {
    const now = Date.now();
    for (const connection of this.connections) connection.tick(now);
    this.pool.sweep(now);
  }

  forget(connection: ClientConnection): void {
    this.connections.delete(connection);
  }

  target(head: RequestHead): RequestTarget {
    // The path goes on as the client sent it: `new URL` would resolve `..` and `%2e%2e` segments,
    // so `/commands/%2e%2e/shutdown` would reach `/shutdown` behind the sandbox's back.
    const target = head.target;
    const mark = target.indexOf('?');
    const pathname = mark < 0 ? target : target.slice(0, mark);
    let path = target;
    let queryToken: string | undefined;
    if (mark >= 0 && target.includes('token', mark)) {
      const query = new URLSearchParams(target.slice(mark + 1));
      if (query.has('token')) {
        queryToken = query.get('token') ?? undefined;
        query.delete('token');
        path = query.size > 0 ? `${pathname}?${query}` : pathname;
      }
    }
    const fromHost =
      head.sandboxId === undefined || head.sandboxPort === undefined
        ? parseSandboxHost(head.host, this.domain)
        : undefined;
    const id = head.sandboxId ?? fromHost?.id;
    const headerPort = head.sandboxPort;
    // Digits only: Number() would also take `0x50`, `1e3` or ` 80`.
    const port =
      headerPort !== undefined
        ? /^\d{1,5}$/.test(headerPort)
          ? Number(headerPort)
          : Number.NaN
        : fromHost?.port;
    if (!id || port === undefined) {
      const name = head.host?.replace(/:\d+$/, '');
      if (name && head.sandboxId === undefined && head.sandboxPort === undefined) {
        throw new BadRequestError(
          `Host ${JSON.stringify(name.slice(0, 100))} is not a sandbox host of this gateway: use {port}-{sandboxId}.${this.domain} or the X-Sandbox-Id and X-Sandbox-Port headers`,
        );
      }
      throw new BadRequestError(
        `no sandbox named: use Host {port}-{sandboxId}.${this.domain} or the X-Sandbox-Id and X-Sandbox-Port headers`,
      );
    }
    if (!/^[a-z0-9-]{1,64}$/.test(id)) {
      throw new BadRequestError('the sandbox id is not a sandbox id');
    }
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new BadRequestError(`port ${headerPort ?? port} is not a TCP port`);
    }
    return { id, port, token: head.accessToken ?? queryToken, pathname, path };
  }

  async check(target: RequestTarget): Promise<Route> {
    const { id, port, token } = target;
    const found = this.backend.find(id);
    const record = found instanceof Promise ? await found : found;
    // The token is checked before saying anything about the sandbox's state.
    if (!record || !tokenMatches(token, record.tokenHash)) {
      throw record
        ? new AuthenticationError(
            `missing or wrong access token for sandbox ${id}: send X-Access-Token (or ?token=)`,
          )
        : new SandboxNotFoundError(`sandbox ${id} does not exist`);
    }
    if (record.state !== 'running' || !this.backend.isAlive(record)) {
      throw new SandboxNotFoundError(
        `sandbox ${id} is not running (${record.state === 'running' ? 'its processes ended' : `${record.state}: ${record.endReason}`})`,
      );
    }
    const route = {
      id,
      port,
      token,
      template: record.template,
      capabilities: record.capabilities,
    };
    if (port === ENVD_PORT) {
      return { ...route, socketPath: record.handle.envdSocket, envd: true };
    }
    if (!record.capabilities.includes('ports')) {
      throw new CapabilityError(
        capabilityRefusal(record.template, 'ports', `reaching port ${port} of sandbox ${id}`),
      );
    }
    const socketPath = await this.backend.openPort(record, token as string, port);
    return { ...route, socketPath, envd: false };
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
      // envd gets the sandbox's token as it wants it, whatever the client sent.
      if (route.envd && key === 'authorization') continue;
      text += `${names[i]}: ${values[i]}\r\n`;
    }
    // Node's servers refuse an HTTP/1.1 request without Host; the sandbox is the host.
    if (head.host === undefined) text += 'host: localhost\r\n';
    if (route.envd) text += `authorization: Bearer ${route.token}\r\n`;
    return `${text}\r\n`;
  }
}
