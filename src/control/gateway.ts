import {
  Agent,
  createServer,
  type IncomingMessage,
  request,
  type Server,
  type ServerResponse,
} from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { routeCapability } from '../../runtime/envd/capabilities.js';
import { capabilityRefusal } from '../../runtime/protocol/capabilities.js';
import {
  ACCESS_TOKEN_HEADER,
  ENVD_PORT,
  SANDBOX_ID_HEADER,
  SANDBOX_PORT_HEADER,
} from '../../runtime/protocol/constants.js';
import { answerClientError } from '../../runtime/server/http.js';
import { splice } from '../../runtime/server/splice.js';
import {
  AuthenticationError,
  BadRequestError,
  CapabilityError,
  errorResponse,
  SandboxError,
  SandboxNotFoundError,
  UpstreamError,
} from '../errors.js';
import { connectSandboxSocket, unlinkSandboxSocket } from '../providers/sandbox-socket.js';
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

/** Headers that concern one connection only (RFC 9110 §7.6.1); upgrades keep theirs. */
const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'upgrade'];

/** Header names clients use when they cannot choose the Host. */

/** What the gateway needs from the control plane. */
export interface GatewayBackend {
  /** The sandbox's record if it exists (any state). */
  find(id: string): SandboxRecord | undefined;
  /** True while its processes run. */
  isAlive(record: SandboxRecord): boolean;
  /** Makes envd forward `port` and returns the host Unix socket that reaches it. */
  openPort(record: SandboxRecord, token: string, port: number): Promise<string>;
}

interface Target {
  socketPath: string;
  /** Set for a port's socket (not envd's): a stale one is removed when nothing answers on it. */
  port?: number;
  path: string;
  headers: Record<string, string | string[] | undefined>;
}

/** Keeps connections to sandbox sockets alive, opening each without following symlinks. */
export class SandboxSocketAgent extends Agent {
  override createConnection(options: { socketPath?: string }): Socket {
    return connectSandboxSocket(options.socketPath as string);
  }
}

/** Parses `{port}-{id}.{domain}` (an optional `:gatewayPort` is ignored). */
export function parseSandboxHost(
  host: string | undefined,
  domain: string,
): { port: number; id: string } | undefined {
  const name = host?.replace(/:\d+$/, '').toLowerCase();
  const suffix = `.${domain.toLowerCase()}`;
  if (!name?.endsWith(suffix)) return undefined;
  const match = /^(\d{1,5})-([a-z0-9-]+)$/.exec(name.slice(0, -suffix.length));
  return match ? { port: Number(match[1]), id: match[2] as string } : undefined;
}

/**
 * The gateway: one loopback listener that routes `Host: {port}-{sandboxId}.{domain}` (or the
 * `X-Sandbox-Id` / `X-Sandbox-Port` headers) to envd, or through envd to a port inside the
 * sandbox. It needs that sandbox's token (`X-Access-Token`, or `?token=` for links), streams
 * bodies both ways without buffering, and passes WebSocket upgrades through.
 */
export class Gateway {
  readonly server: Server;
  /**
   * Connections to envd and to forwarded ports are kept open between requests: a new Unix
   * socket (and, behind a port forwarder, a new TCP connection inside the sandbox) per call would
   * cost more than the call itself.
   */
  private readonly agent = new SandboxSocketAgent({
    keepAlive: true,
    maxSockets: 256,
    maxFreeSockets: 32,
  });

  constructor(
    private readonly backend: GatewayBackend,
    private readonly domain: string,
  ) {
    this.server = createServer(
      {
        headersTimeout: GATEWAY_HEADERS_TIMEOUT_MS,
        requestTimeout: GATEWAY_REQUEST_TIMEOUT_MS,
        // Node checks those deadlines every 30 s by default, so a 30 s limit could hold for 60.
        connectionsCheckingInterval: 1000,
        // Node would answer a request without Host with a bare 400; the X-Sandbox-Id headers name
        // the sandbox without it, and a request naming none gets the contract's 400 below.
        requireHostHeader: false,
      },
      (req, res) => {
        this.resolve(req).then(
          (target) => this.forward(req, res, target),
          (error) => sendError(res, error),
        );
      },
    );
    // What node's parser refuses gets an answer of the contract's shape too.
    this.server.on('clientError', answerClientError);
    this.server.on('upgrade', (req, socket, head) => {
      this.resolve(req).then(
        (target) => this.tunnel(req, socket, head, target),
        (error) => {
          const { status, body } = errorBody(error);
          socket.end(
            `HTTP/1.1 ${status} Error\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n${body}`,
          );
        },
      );
    });
  }

  /** Closes the kept-open connections to sandboxes (the daemon is stopping). */
  close(): void {
    this.agent.destroy();
  }

  private async resolve(req: IncomingMessage): Promise<Target> {
    // The path goes on as the client sent it: `new URL` would resolve `..` and `%2e%2e` segments,
    // so `/commands/%2e%2e/shutdown` would reach `/shutdown` behind the sandbox's back.
    const target = req.url ?? '/';
    const mark = target.indexOf('?');
    const pathname = mark < 0 ? target : target.slice(0, mark);
    const query = new URLSearchParams(mark < 0 ? '' : target.slice(mark + 1));
    const fromHost = parseSandboxHost(req.headers.host, this.domain);
    const headerId = req.headers[SANDBOX_ID_HEADER];
    const headerPort = req.headers[SANDBOX_PORT_HEADER];
    const id = typeof headerId === 'string' ? headerId : fromHost?.id;
    // Digits only: Number() would also take `0x50`, `1e3` or ` 80`.
    const port =
      typeof headerPort === 'string'
        ? /^\d{1,5}$/.test(headerPort.trim())
          ? Number(headerPort)
          : Number.NaN
        : fromHost?.port;
    if (!id || port === undefined) {
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
    const record = this.backend.find(id);
    const headerToken = req.headers[ACCESS_TOKEN_HEADER];
    const token = typeof headerToken === 'string' ? headerToken : (query.get('token') ?? undefined);
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
    const headers: Target['headers'] = { ...req.headers };
    delete headers[ACCESS_TOKEN_HEADER];
    delete headers[SANDBOX_ID_HEADER];
    delete headers[SANDBOX_PORT_HEADER];
    // Hop-by-hop: they describe the client's connection to the gateway, not the gateway's kept-open
    // connection to the sandbox (a forwarded `Connection: close` makes envd close a socket the
    // gateway's agent would hand to the next request).
    if (req.headers.upgrade === undefined) {
      for (const name of HOP_BY_HOP) delete headers[name];
    }
    let path = target;
    if (query.has('token')) {
      query.delete('token');
      path = query.size > 0 ? `${pathname}?${query}` : pathname;
    }
    if (port === ENVD_PORT) {
      const needed = routeCapability(pathname);
      if (needed && !record.capabilities.includes(needed)) {
        throw new CapabilityError(
          capabilityRefusal(record.template, needed, `${req.method} ${pathname} of sandbox ${id}`),
        );
      }
      headers.authorization = `Bearer ${token}`;
      return { socketPath: record.handle.envdSocket, path, headers };
    }
    if (!record.capabilities.includes('ports')) {
      throw new CapabilityError(
        capabilityRefusal(record.template, 'ports', `reaching port ${port} of sandbox ${id}`),
      );
    }
    const socketPath = await this.backend.openPort(record, token as string, port);
    return { socketPath, path, headers, port };
  }

  private forward(req: IncomingMessage, res: ServerResponse, target: Target): void {
    const upstream = request(
      {
        agent: this.agent,
        socketPath: target.socketPath,
        method: req.method,
        path: target.path,
        headers: target.headers,
      },
      (answer) => {
        const raw = answer.rawHeaders;
        const kept: string[] = [];
        for (let i = 0; i < raw.length; i += 2) {
          const name = raw[i] as string;
          if (name.toLowerCase() !== 'connection' && name.toLowerCase() !== 'keep-alive') {
            kept.push(name, raw[i + 1] as string);
          }
        }
        // An answer before the whole request body arrived (413, 408...): the client's connection
        // holds the unread rest of it, so it cannot carry another request; close it after this.
        if (!req.complete) kept.push('connection', 'close');
        res.writeHead(answer.statusCode ?? 502, kept as unknown as string[]);
        answer.pipe(res);
        answer.on('error', () => res.destroy());
      },
    );
    upstream.on('error', (error) => {
      // A socket file left by a server that died: drop it, so the next request is forwarded by
      // envd to whatever listens on the port now.
      if (target.port && (error as NodeJS.ErrnoException).code === 'ECONNREFUSED') {
        unlinkSandboxSocket(target.socketPath);
      }
      if (res.headersSent) res.destroy();
      else sendError(res, new UpstreamError(upstreamMessage(error), { cause: error }));
    });
    res.on('close', () => {
      if (!res.writableFinished) upstream.destroy();
    });
    // Headers go out now, not with the first body chunk: the sandbox may answer before any body
    // arrives (413 for a declared size, or a route that reads none).
    upstream.flushHeaders();
    req.pipe(upstream);
  }

  private tunnel(req: IncomingMessage, socket: Duplex, head: Buffer, target: Target): void {
    const upstream: Socket = connectSandboxSocket(target.socketPath);
    const lines = [`${req.method} ${target.path} HTTP/1.1`];
    for (const [name, value] of Object.entries(target.headers)) {
      for (const item of Array.isArray(value) ? value : [value]) {
        if (item !== undefined) lines.push(`${name}: ${item}`);
      }
    }
    splice(socket, upstream, {
      event: 'connect',
      first: () => {
        upstream.write(`${lines.join('\r\n')}\r\n\r\n`);
        if (head.length > 0) upstream.write(head);
      },
    });
  }
}

function upstreamMessage(error: Error): string {
  return `the sandbox did not answer (${(error as NodeJS.ErrnoException).code ?? error.message}): nothing listens on that port, or the sandbox stopped`;
}

/** The answer of a request the gateway could not forward; anything unexpected is a 502. */
function errorBody(error: unknown): { status: number; body: string } {
  const known =
    error instanceof SandboxError
      ? error
      : new UpstreamError(error instanceof Error ? error.message : String(error), { cause: error });
  const { status, body } = errorResponse(known);
  return { status, body: JSON.stringify(body) };
}

function sendError(res: ServerResponse, error: unknown): void {
  const { status, body } = errorBody(error);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}
