import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import {
  type ClientRequestArgs,
  createServer as createHttpServer,
  type Server as HttpServer,
  request as httpRequest,
  type IncomingMessage,
  type ServerResponse,
} from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest, type RequestOptions } from 'node:https';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { type SecureContext, TLSSocket, connect as tlsConnect } from 'node:tls';
import dnsPacket from 'dns-packet';
import ipaddr from 'ipaddr.js';
import { getExtensionData, readTlsClientHello } from 'read-tls-client-hello';
import { EgressAuditQueue, type EgressAuditRow, OPEN_ROW_INTERVAL_MS } from './audit-queue.js';
import { type HostRule, placeholderNames, ruleHeaders, rulesFor } from './header-rules.js';
import {
  canonicalName,
  type EgressPolicy,
  type EgressRules,
  type ParsedPolicy,
  parsePolicy,
  plainAddress,
} from './policy.js';
import type { NameResolver } from './resolver.js';
import { relay, upstreamSocket } from './socks-dial.js';

/** How long a client may take to send its request head or TLS ClientHello. */
export const HELLO_TIMEOUT_MS = 10_000;
/** How long a dial to an allowed address may take. */
export const DIAL_TIMEOUT_MS = 15_000;
/** What a relayed connection reads from its upstream at once: Node's own socket read size. */
const RELAY_CHUNK = 64 * 1024;
/** Buffers a relayed connection keeps for its next reads (more are made only while writes wait). */
const RELAY_FREE_BUFFERS = 2;
/** Events kept per sandbox for `abx logs --network`. */
const RECENT_EVENTS = 200;

export interface EgressEvent {
  time: string;
  kind: 'dns' | 'http' | 'tls' | 'connect';
  target: string;
  allowed: boolean;
  rule: string;
}

export interface EgressCounters {
  allowed: number;
  refused: number;
  recent: EgressEvent[];
}

/** The ports on the egress namespace's loopback that one sandbox's traffic is sent to. */
export interface EgressPorts {
  http: number;
  tls: number;
  dns: number;
}

interface Entry {
  id: string;
  policy: EgressPolicy;
  parsed: ParsedPolicy;
  counters: EgressCounters;
  servers: Array<Server | HttpServer | UdpSocket>;
  sockets: Set<Socket>;
  ports: EgressPorts;
  /** Kept-alive TLS connections to hosts with rules (made on the first such request). */
  agent?: HttpsAgent;
  /** Allowed connections still open, for the audit trail (see `writeOpen`). */
  open: Set<OpenFlow>;
}

/** An allowed connection still open: its row, its socket, and the bytes already written. */
interface OpenFlow {
  row: Omit<EgressAuditRow, 'seq'>;
  socket: Socket;
  up: number;
  down: number;
  /** When it was last written as open (ms), 0: never; its later rows are at their writing. */
  written: number;
}

/**
 * What a decision adds for the audit trail: the port and address, and, for an allowed
 * connection, the sandbox's socket whose bytes are counted when it closes (`later`: the caller
 * counts and queues the row itself).
 */
interface AuditExtra {
  port: number;
  address?: string;
  flow?: Socket | 'later';
}

/** A connection whose TLS egress terminated: for whom, which host it named, on which port. */
interface Terminated {
  entry: Entry;
  name: string;
  port: number;
}

/**
 * The egress service: per sandbox, a DNS server, an HTTP proxy (transparent for port 80, and
 * explicit with CONNECT for tools that honour HTTP_PROXY) and a TLS passthrough for port 443
 * that reads the ClientHello's server name. Each decides by the sandbox's policy, then dials the
 * name itself (never the address the client claims), and counts what it allowed and refused.
 * It runs in the egress network namespace; sandboxes reach its loopback ports through their
 * user-mode network (slirp4netns), whose rules send DNS, 80 and 443 here.
 */
export class EgressService {
  private readonly sandboxes = new Map<string, Entry>();
  /** Serves the HTTP inside TLS connections egress terminated (hosts with rules). */
  private readonly inner: HttpServer;
  private readonly terminated = new WeakMap<Socket, Terminated>();
  /** Every decision, for the daemon's audit trail (`GET /audit` on the control socket). */
  readonly audit = new EgressAuditQueue();

  constructor(
    private readonly rules: EgressRules,
    private readonly resolver: NameResolver,
    private readonly hooks: {
      /**
       * Told the addresses a sandbox may now dial by address (its DNS answers), before they go
       * out; may give the TTL the answer carries instead (what is left of an earlier opening).
       */
      onAllowedAddresses?: (
        id: string,
        addresses: string[],
        ttl: number,
        name: string,
      ) => Promise<number | undefined>;
      /**
       * The current value of the secret `name` for the sandbox `id` (its owner's secret), or
       * undefined when there is none: asked as each request to a host with rules leaves, never
       * cached (a rotation applies to the next request, a removal fails it).
       */
      resolveSecret?: (id: string, name: string) => Promise<string | undefined>;
      /**
       * Certificates for hosts with rules, signed by the CA the sandboxes trust (egress-ca.ts):
       * with it, HTTPS to such a host is terminated here and its headers set; without it, such
       * a tunnel is refused rather than sent without them.
       */
      certificates?: { contextFor(name: string): Promise<SecureContext> };
    } = {},
  ) {
    this.inner = createHttpServer({ requestTimeout: 0, headersTimeout: HELLO_TIMEOUT_MS });
    this.inner.on('request', (req: IncomingMessage, res: ServerResponse) => {
      const at = this.terminated.get(req.socket);
      if (!at || !this.sandboxes.has(at.entry.id)) return res.destroy();
      void this.forwardTerminated(at, req, res);
    });
    this.inner.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
      const at = this.terminated.get(socket);
      if (!at || !this.sandboxes.has(at.entry.id)) return socket.destroy();
      void this.upgrade(at.entry, req, socket, head, at);
    });
    this.inner.on('clientError', (_error, socket) => socket.destroy());
  }

  /**
   * Starts serving a sandbox; its ports (`wanted`, when given: a sandbox adopted by a new daemon
   * keeps the ports its rules name). Replaces nothing: a known id is an error.
   */
  async add(id: string, policy: EgressPolicy, wanted?: EgressPorts): Promise<EgressPorts> {
    if (this.sandboxes.has(id)) throw new Error(`sandbox ${id} is already served`);
    const parsed = parsePolicy(policy);
    const entry: Entry = {
      id,
      policy,
      parsed,
      counters: { allowed: 0, refused: 0, recent: [] },
      servers: [],
      sockets: new Set(),
      open: new Set(),
      ports: { http: 0, tls: 0, dns: 0 },
    };
    this.sandboxes.set(id, entry);
    try {
      entry.ports.http = await this.listen(entry, this.httpServer(entry), wanted?.http);
      entry.ports.tls = await this.listen(entry, this.tlsServer(entry), wanted?.tls);
      entry.ports.dns = await this.dnsServers(entry, wanted?.dns);
    } catch (error) {
      this.remove(id);
      throw error;
    }
    return { ...entry.ports };
  }

  /** The sandbox's policy from now on: new connections and queries are decided by it at once. */
  setPolicy(id: string, policy: EgressPolicy): void {
    const entry = this.entry(id);
    entry.parsed = parsePolicy(policy);
    entry.policy = policy;
  }

  counters(id: string): EgressCounters {
    const { allowed, refused, recent } = this.entry(id).counters;
    return { allowed, refused, recent: [...recent] };
  }

  ports(id: string): EgressPorts | undefined {
    const entry = this.sandboxes.get(id);
    return entry ? { ...entry.ports } : undefined;
  }

  ids(): string[] {
    return [...this.sandboxes.keys()];
  }

  /**
   * Queues a row for each allowed connection of the sandbox's still open (its trail is being
   * read), `open: true`, with the bytes it carried since it was last written: once, then again
   * only after {@link OPEN_ROW_INTERVAL_MS} and when it carried more. The row queued when it ends
   * carries the rest. Nothing for a sandbox egress does not serve.
   */
  writeOpen(id: string, now = Date.now()): void {
    const entry = this.sandboxes.get(id);
    if (!entry) return;
    for (const open of entry.open) {
      const up = open.socket.bytesRead - open.up;
      const down = open.socket.bytesWritten - open.down;
      if (open.written && (now - open.written < OPEN_ROW_INTERVAL_MS || (up === 0 && down === 0)))
        continue;
      this.audit.push({
        ...open.row,
        ...(open.written ? { at: now } : {}),
        up,
        down,
        open: true,
      });
      open.up += up;
      open.down += down;
      open.written = now;
    }
  }

  /** Stops serving a sandbox: its listeners close and its open connections end. */
  remove(id: string): void {
    const entry = this.sandboxes.get(id);
    if (!entry) return;
    this.sandboxes.delete(id);
    for (const server of entry.servers) {
      try {
        server.close();
      } catch {
        // never listened
      }
    }
    for (const socket of entry.sockets) socket.destroy();
    entry.agent?.destroy();
  }

  close(): void {
    for (const id of this.ids()) this.remove(id);
  }

  private entry(id: string): Entry {
    const entry = this.sandboxes.get(id);
    if (!entry) throw new Error(`sandbox ${id} is not served by the egress service`);
    return entry;
  }

  private record(
    entry: Entry,
    event: Omit<EgressEvent, 'time'>,
    extra: AuditExtra,
  ): Omit<EgressAuditRow, 'seq'> {
    if (event.allowed) entry.counters.allowed++;
    else entry.counters.refused++;
    entry.counters.recent.push({ time: new Date().toISOString(), ...event });
    if (entry.counters.recent.length > RECENT_EVENTS) entry.counters.recent.shift();
    const row: Omit<EgressAuditRow, 'seq'> = {
      at: Date.now(),
      sandbox: entry.id,
      kind: event.kind,
      name: event.target,
      ...(extra.address === undefined ? {} : { address: extra.address }),
      port: extra.port,
      allowed: event.allowed,
      rule: event.rule,
      up: 0,
      down: 0,
    };
    const flow = extra.flow;
    if (flow === 'later') return row;
    if (flow && event.allowed) {
      // Queued when the connection ends, with what it carried (since a read wrote it as open);
      // never on the connection's path.
      const open: OpenFlow = { row, socket: flow, up: 0, down: 0, written: 0 };
      entry.open.add(open);
      flow.once('close', () => {
        entry.open.delete(open);
        this.audit.push({
          ...row,
          ...(open.written ? { at: Date.now() } : {}),
          up: flow.bytesRead - open.up,
          down: flow.bytesWritten - open.down,
        });
      });
    } else {
      this.audit.push(row);
    }
    return row;
  }

  private listen(entry: Entry, server: Server | HttpServer, port = 0): Promise<number> {
    entry.servers.push(server);
    server.on('connection', (socket: Socket) => {
      entry.sockets.add(socket);
      socket.once('close', () => entry.sockets.delete(socket));
    });
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => {
        server.off('error', reject);
        resolve((server.address() as { port: number }).port);
      });
    });
  }

  /** Where a connection asked for by `name` may go: the first allowed address, or the refusal. */
  private async route(
    entry: Entry,
    name: string,
  ): Promise<{ address: string; rule: string } | { refused: string }> {
    const route = await this.resolveAllowed(entry, name);
    if ('refused' in route) return { refused: route.refused };
    return { address: route.addresses[0] as string, rule: route.rule };
  }

  /**
   * Connects to `address` and relays both ways. Downloads (upstream → sandbox) are read into
   * buffers used again once the kernel has their bytes, not a fresh allocation per read as
   * `pipe` makes: on a VM, touching fresh memory (page faults) cost about as much as the copy
   * itself (bench/README.md, egress). The upstream is paused while the sandbox's side is full.
   * With an egress proxy, the connection goes through it, for `via.name` when the sandbox asked
   * by name (the proxy resolves it), piped as it comes.
   */
  private dial(
    address: string,
    port: number,
    socket: Socket,
    head: Buffer | undefined,
    via: { entry: Entry; name?: string },
  ): void {
    if (via.entry.policy.egressProxy) {
      this.upstream(via.entry, via.name, address, port).then(
        (upstream) => relay(upstream, socket, head),
        () => socket.destroy(),
      );
      return;
    }
    const free: Uint8Array[] = [];
    let ended = false;
    const upstream = connect({
      host: address,
      port,
      timeout: DIAL_TIMEOUT_MS,
      onread: {
        buffer: () => free.pop() ?? Buffer.allocUnsafeSlow(RELAY_CHUNK),
        // `write` holds the buffer until its callback; returning false pauses the upstream.
        callback: (length, buffer) =>
          socket.write(buffer.subarray(0, length), () => {
            if (free.length < RELAY_FREE_BUFFERS) free.push(buffer);
          }),
      },
    });
    upstream.once('timeout', () => upstream.destroy(new Error('dial timed out')));
    upstream.once('connect', () => {
      upstream.setTimeout(0);
      if (head && head.length > 0) upstream.write(head);
      socket.pipe(upstream);
    });
    socket.on('drain', () => upstream.resume());
    // The upstream's end is passed on once what it sent is written; an error cuts at once.
    upstream.once('end', () => {
      ended = true;
      socket.end();
    });
    upstream.once('error', () => socket.destroy());
    upstream.once('close', () => {
      if (!ended || socket.writableFinished) socket.destroy();
      else socket.once('finish', () => socket.destroy());
    });
    socket.once('error', () => upstream.destroy());
    socket.once('close', () => upstream.destroy());
  }

  /**
   * A connection for the sandbox to `address`, asked for as `name`: plain, or through its egress
   * proxy (socks-dial.ts). What any path that dials upstream for a sandbox calls.
   */
  private upstream(
    entry: Entry,
    name: string | undefined,
    address: string,
    port: number,
  ): Promise<Socket> {
    return upstreamSocket(entry.policy, name, address, port, {
      rules: this.rules,
      resolver: this.resolver,
      timeoutMs: DIAL_TIMEOUT_MS,
    });
  }

  /**
   * A verified TLS connection to `name` at `address` (through the sandbox's egress proxy when it
   * has one), once its handshake is done: verified with Node's store and the daemon's
   * NODE_EXTRA_CA_CERTS for `name`, else the error says why.
   */
  private async secureUpstream(
    entry: Entry,
    name: string,
    address: string,
    port: number,
  ): Promise<TLSSocket> {
    const options = { servername: name, ALPNProtocols: ['http/1.1'] };
    const secure = entry.policy.egressProxy
      ? tlsConnect({ ...options, socket: await this.upstream(entry, name, address, port) })
      : tlsConnect({ ...options, host: address, port, timeout: DIAL_TIMEOUT_MS });
    return new Promise((resolve, reject) => {
      secure.once('timeout', () => secure.destroy(new Error('the TLS handshake timed out')));
      secure.once('error', reject);
      secure.once('secureConnect', () => {
        secure.setTimeout(0);
        secure.off('error', reject);
        resolve(secure);
      });
    });
  }

  /** An HTTP request's connection through the sandbox's egress proxy; none without one. */
  private connectionFor(
    entry: Entry,
    name: string,
    address: string,
    port: number,
  ): Pick<ClientRequestArgs, 'createConnection'> {
    if (!entry.policy.egressProxy) return {};
    return {
      createConnection: (_options, done) => {
        this.upstream(entry, name, address, port).then(
          (socket) => done(null, socket),
          (error: Error) => done(error, undefined as never),
        );
        return undefined;
      },
    };
  }

  /**
   * The headers a host's rules set on this request, placeholders resolved now; or why the
   * request must not leave (a secret missing or not readable). Undefined when no rule names it.
   */
  private async headersFor(
    entry: Entry,
    host: string,
  ): Promise<{ headers: Record<string, string> } | { refused: string } | undefined> {
    const name = canonicalName(host);
    const rules: HostRule[] | undefined = name ? rulesFor(entry.parsed.rules, name) : undefined;
    if (!rules) return undefined;
    const values = new Map<string, string>();
    for (const secret of placeholderNames(rules)) {
      let value: string | undefined;
      try {
        value = await this.hooks.resolveSecret?.(entry.id, secret);
      } catch (error) {
        return {
          refused: `the rule for ${host} names the secret ${secret}, which could not be read (${(error as Error).message}); the request was not sent`,
        };
      }
      if (value === undefined) {
        return {
          refused: `the rule for ${host} names the secret ${secret}, which does not exist for this sandbox's owner (missing or removed); the request was not sent`,
        };
      }
      values.set(secret, value);
    }
    const headers = ruleHeaders(rules, values);
    // A stored value that no header can carry (a newline…) is refused, not sent cut or mangled.
    for (const [header, value] of Object.entries(headers)) {
      if (/[^\t\x20-\x7e\x80-\xff]/.test(value)) {
        return {
          refused: `the rule for ${host} sets ${header} from a secret whose value cannot be sent in a header (it holds a control character); the request was not sent`,
        };
      }
    }
    return { headers };
  }

  /** The canonical form of `host` when the sandbox's rules name it, else undefined. */
  private ruledName(entry: Entry, host: string): string | undefined {
    const name = canonicalName(host);
    return name && rulesFor(entry.parsed.rules, name) ? name : undefined;
  }

  /**
   * Sends one HTTP request on to `target` (plain, or TLS to `target.tls` for a terminated
   * connection), decided now by the policy, with the rules' headers; the answer comes back as
   * sent. A missing secret refuses it whole.
   */
  private async forward(
    entry: Entry,
    req: IncomingMessage,
    res: ServerResponse,
    target: { host: string; port: number; path: string; hostHeader?: string; tls?: string },
  ): Promise<void> {
    const { host, port } = target;
    const route = await this.route(entry, host);
    if ('refused' in route) {
      this.record(
        entry,
        { kind: 'http', target: host, allowed: false, rule: route.refused },
        { port },
      );
      return refuseHttp(
        res,
        403,
        `${host} is refused by the sandbox's network policy: ${route.refused}`,
      );
    }
    // Resolved before anything is sent: a missing secret refuses the request whole.
    const ruled = await this.headersFor(entry, host);
    if (ruled && 'refused' in ruled) {
      this.record(
        entry,
        { kind: 'http', target: host, allowed: false, rule: ruled.refused },
        { port, address: route.address },
      );
      return refuseHttp(res, 403, ruled.refused);
    }
    const row = this.record(
      entry,
      {
        kind: 'http',
        target: host,
        allowed: true,
        rule: ruled
          ? `${route.rule}; header rules${target.tls ? ' (TLS terminated)' : ''}`
          : route.rule,
      },
      { port, address: route.address, flow: 'later' },
    );
    // One row per request: its body up, its answer's body down, queued when the answer ends.
    req.on('data', (chunk: Buffer) => {
      row.up += chunk.length;
    });
    res.once('close', () => this.audit.push(row));
    const headers = { ...req.headers };
    if (target.hostHeader) headers.host = target.hostHeader;
    delete headers['proxy-connection'];
    delete headers['proxy-authorization'];
    // The rule's headers replace the sandbox's own of the same names. The request goes to the
    // address `host` resolves to, with Host `host` (and, over TLS, its name as SNI and as the
    // name the server's certificate must have): the rule's host on every count.
    if (ruled) Object.assign(headers, ruled.headers);
    const options = {
      host: route.address,
      port,
      method: req.method,
      path: target.path,
      headers,
      setHost: false,
      timeout: DIAL_TIMEOUT_MS,
    };
    let upstream: ReturnType<typeof httpRequest>;
    if (target.tls) {
      // Verified with Node's store (and the daemon's NODE_EXTRA_CA_CERTS): an origin whose
      // certificate does not hold is a 502 naming why, never a request sent anyway.
      // Through the sandbox's own proxy when it has one: TLS inside its tunnel, one per request
      // (no agent: with one, even `agent: false`, Node ignores `createConnection`).
      const viaProxy: RequestOptions = {
        createConnection: (_options, done) => {
          this.secureUpstream(entry, target.tls as string, route.address, port).then(
            (socket) => done(null, socket),
            (error: Error) => done(error, undefined as never),
          );
          return undefined;
        },
      };
      if (!entry.policy.egressProxy) {
        entry.agent ??= new HttpsAgent({ keepAlive: true, maxSockets: 64 });
      }
      upstream = httpsRequest({
        ...options,
        servername: target.tls,
        ...(entry.policy.egressProxy ? viaProxy : { agent: entry.agent }),
      });
    } else {
      upstream = httpRequest({
        ...options,
        ...this.connectionFor(entry, host, route.address, port),
      });
    }
    upstream.once('timeout', () => upstream.destroy(new Error('the server did not answer')));
    upstream.once('response', (answer) => {
      upstream.setTimeout(0);
      res.writeHead(answer.statusCode ?? 502, answer.rawHeaders);
      answer.on('data', (chunk: Buffer) => {
        row.down += chunk.length;
      });
      answer.pipe(res);
    });
    upstream.once('error', (error) => {
      if (res.headersSent) res.destroy();
      else refuseHttp(res, 502, `${host}: ${error.message}`);
    });
    req.pipe(upstream);
  }

  /**
   * A request inside a TLS connection egress terminated: only for the host the connection named
   * (its SNI, or its CONNECT target), whatever its Host header says.
   */
  private async forwardTerminated(
    at: Terminated,
    req: IncomingMessage,
    res: ServerResponse,
  ): Promise<void> {
    const asked = hostOf(req.headers.host);
    const path = req.url ?? '/';
    if (
      !asked ||
      asked.name !== at.name ||
      (asked.port ?? 443) !== at.port ||
      !path.startsWith('/')
    ) {
      const why = `this TLS connection is for ${at.name}:${at.port}; a request for ${req.headers.host ?? 'no Host'} on it is refused`;
      this.record(
        at.entry,
        { kind: 'http', target: req.headers.host ?? '?', allowed: false, rule: why },
        { port: at.port },
      );
      return refuseHttp(res, 421, why);
    }
    await this.forward(at.entry, req, res, {
      host: at.name,
      port: at.port,
      path,
      hostHeader: req.headers.host as string,
      tls: at.name,
    });
  }

  /**
   * Terminates the sandbox's TLS to `name` (a host with rules) with a certificate for it from
   * the CA the sandbox trusts, and serves the HTTP inside ({@link forwardTerminated}). Without
   * certificates, or when one cannot be made, the connection is refused.
   */
  private async terminate(entry: Entry, socket: Socket, name: string, port: number): Promise<void> {
    let context: SecureContext | undefined;
    let why = `${name} has header rules, and this egress has no CA to read its HTTPS with; the connection is refused rather than sent without its headers`;
    try {
      context = await this.hooks.certificates?.contextFor(name);
    } catch (error) {
      why = `${name} has header rules, and no certificate could be made for it (${(error as Error).message})`;
    }
    if (!context) {
      this.record(entry, { kind: 'tls', target: name, allowed: false, rule: why }, { port });
      return refuseTls(socket);
    }
    socket.setTimeout(HELLO_TIMEOUT_MS, () => socket.destroy());
    const secure = new TLSSocket(socket, {
      isServer: true,
      secureContext: context,
      ALPNProtocols: ['http/1.1'],
    });
    secure.on('error', () => socket.destroy());
    secure.once('secure', () => {
      socket.setTimeout(0);
      // The name in the ClientHello is the one the connection was decided and certified for.
      const sni = secure.servername ? canonicalName(secure.servername) : undefined;
      if (sni !== name) return secure.destroy();
      this.terminated.set(secure, { entry, name, port });
      this.inner.emit('connection', secure);
    });
  }

  private httpServer(entry: Entry): HttpServer {
    const server = createHttpServer({ requestTimeout: 0, headersTimeout: HELLO_TIMEOUT_MS });
    server.on('request', (req: IncomingMessage, res: ServerResponse) => {
      // Absolute form from a client that uses this as its HTTP_PROXY; origin form with a Host
      // header from a transparent one.
      let host: string;
      let port = 80;
      let path = req.url ?? '/';
      let hostHeader: string | undefined;
      try {
        if (/^https?:\/\//i.test(path)) {
          const url = new URL(path);
          if (url.protocol !== 'http:')
            return refuseHttp(res, 400, `${url.protocol} is not proxied`);
          host = url.hostname;
          port = url.port ? Number(url.port) : 80;
          path = `${url.pathname}${url.search}`;
          // RFC 9112 §3.2.2: a proxy ignores the Host header of an absolute-form request and
          // sends the target's, so a Host that lies cannot pick another site at that address.
          hostHeader = url.host;
        } else {
          const header = req.headers.host;
          if (!header) return refuseHttp(res, 400, 'a request without a Host header is refused');
          host = new URL(`http://${header}`).hostname;
        }
      } catch {
        return refuseHttp(res, 400, 'the request target or Host header is malformed');
      }
      void this.forward(entry, req, res, {
        host,
        port,
        path,
        ...(hostHeader ? { hostHeader } : {}),
      });
    });
    server.on('connect', async (req: IncomingMessage, socket: Socket, head: Buffer) => {
      const [host = '', portText = ''] = (req.url ?? '').split(/:(?=\d+$)/);
      const port = Number(portText);
      const answer = (status: string, why: string) =>
        socket.end(
          `HTTP/1.1 ${status}\r\ncontent-type: text/plain\r\nx-abx-egress: refused\r\nconnection: close\r\n\r\nabx egress: ${why}\n`,
        );
      if (!host || !Number.isInteger(port) || port < 1 || port > 65_535) {
        return answer('400 Bad Request', 'CONNECT needs host:port');
      }
      const bare = host.replace(/^\[|\]$/g, '');
      const route = await this.route(entry, bare);
      if ('refused' in route) {
        this.record(
          entry,
          { kind: 'connect', target: host, allowed: false, rule: route.refused },
          { port },
        );
        // The reason phrase says it too: clients show it, not a CONNECT answer's body.
        const why = `${host} is refused by the sandbox's network policy: ${route.refused}`;
        return answer(`403 ${why.replace(/[^\x20-\x7e]/g, '?')}`, why);
      }
      const ruled = this.ruledName(entry, bare);
      socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (ruled) {
        // A tunnel to a host with rules must carry TLS, which egress reads to set the headers;
        // anything else through it is cut (it would leave without them).
        if (head.length > 0) socket.unshift(head);
        return void this.afterFirstByte(socket, (byte) => {
          if (byte === 0x16) return void this.terminate(entry, socket, ruled, port);
          const why = `${ruled} has header rules: a tunnel to it must carry TLS (HTTPS), which abx reads to set them`;
          this.record(
            entry,
            { kind: 'connect', target: host, allowed: false, rule: why },
            { port, address: route.address },
          );
          socket.destroy();
        });
      }
      this.record(
        entry,
        { kind: 'connect', target: host, allowed: true, rule: route.rule },
        { port, address: route.address, flow: socket },
      );
      this.dial(route.address, port, socket, head, { entry, name: bare });
    });
    server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
      void this.upgrade(entry, req, socket, head);
    });
    server.on('clientError', (_error, socket) => socket.destroy());
    return server;
  }

  /** Calls `then` with the first byte the socket sends (left unread), or ends it on a timeout. */
  private afterFirstByte(socket: Socket, then: (byte: number) => void): void {
    socket.setTimeout(HELLO_TIMEOUT_MS, () => socket.destroy());
    socket.once('readable', function first() {
      const chunk = socket.read(1) as Buffer | null;
      if (!chunk) return void socket.once('readable', first);
      socket.unshift(chunk);
      socket.setTimeout(0);
      then(chunk[0] as number);
    });
  }

  /**
   * A protocol upgrade (WebSocket) on the host the Host header names, with the rules' headers:
   * sent as a head on a relayed connection, plain or (`secure`, a terminated connection) TLS.
   */
  private async upgrade(
    entry: Entry,
    req: IncomingMessage,
    socket: Socket,
    head: Buffer,
    secure?: Terminated,
  ): Promise<void> {
    const refuse = (why: string): void => {
      socket.end(`HTTP/1.1 403 Forbidden\r\nconnection: close\r\n\r\nabx egress: ${why}\n`);
    };
    const asked = hostOf(req.headers.host);
    if (!asked) return void socket.destroy();
    const host = asked.name;
    if (secure && (host !== secure.name || (asked.port ?? 443) !== secure.port)) {
      return refuse(`this TLS connection is for ${secure.name}:${secure.port}`);
    }
    const port = secure ? secure.port : 80;
    const route = await this.route(entry, host);
    if ('refused' in route) {
      this.record(
        entry,
        { kind: 'http', target: host, allowed: false, rule: route.refused },
        { port },
      );
      return refuse(`${host} is refused: ${route.refused}`);
    }
    const ruled = await this.headersFor(entry, host);
    if (ruled && 'refused' in ruled) {
      this.record(
        entry,
        { kind: 'http', target: host, allowed: false, rule: ruled.refused },
        { port, address: route.address },
      );
      return refuse(ruled.refused);
    }
    this.record(
      entry,
      { kind: 'http', target: host, allowed: true, rule: route.rule },
      { port, address: route.address, flow: socket },
    );
    const set = ruled?.headers ?? {};
    const lines = [`${req.method} ${req.url} HTTP/${req.httpVersion}`];
    for (let i = 0; i < req.rawHeaders.length; i += 2) {
      // The sandbox's own header of a name a rule sets is dropped for the rule's.
      if ((req.rawHeaders[i] as string).toLowerCase() in set) continue;
      lines.push(`${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}`);
    }
    for (const [name, value] of Object.entries(set)) lines.push(`${name}: ${value}`);
    const first = Buffer.concat([Buffer.from(`${lines.join('\r\n')}\r\n\r\n`), head]);
    if (!secure) return this.dial(route.address, 80, socket, first, { entry, name: host });
    let upstream: TLSSocket;
    try {
      upstream = await this.secureUpstream(entry, secure.name, route.address, secure.port);
    } catch {
      return void socket.destroy();
    }
    relay(upstream, socket, first);
  }

  private tlsServer(entry: Entry): Server {
    return createServer((socket) => {
      socket.setTimeout(HELLO_TIMEOUT_MS, () => socket.destroy());
      socket.on('error', () => undefined);
      void (async () => {
        let name: string | undefined;
        try {
          const hello = await readTlsClientHello(socket);
          name = (getExtensionData(hello, 'server_name') as { serverName?: string } | null)
            ?.serverName;
        } catch {
          this.record(
            entry,
            { kind: 'tls', target: '?', allowed: false, rule: 'not a TLS ClientHello' },
            { port: 443 },
          );
          return socket.destroy();
        }
        if (!name) {
          this.record(
            entry,
            {
              kind: 'tls',
              target: '?',
              allowed: false,
              rule: 'a TLS connection without a server name (SNI) is refused',
            },
            { port: 443 },
          );
          return refuseTls(socket);
        }
        const route = await this.route(entry, name);
        if ('refused' in route) {
          this.record(
            entry,
            { kind: 'tls', target: name, allowed: false, rule: route.refused },
            { port: 443 },
          );
          return refuseTls(socket);
        }
        const ruled = this.ruledName(entry, name);
        // readTlsClientHello put the ClientHello back: terminated or relayed, it is read again.
        if (ruled) return void this.terminate(entry, socket, ruled, 443);
        this.record(
          entry,
          { kind: 'tls', target: name, allowed: true, rule: route.rule },
          { port: 443, address: route.address, flow: socket },
        );
        socket.setTimeout(0);
        // readTlsClientHello put the ClientHello back: it flows on to the server as sent.
        this.dial(route.address, 443, socket, undefined, { entry, name });
      })();
    });
  }

  /** A UDP and a TCP DNS server on one port; its number. */
  private async dnsServers(entry: Entry, wanted = 0): Promise<number> {
    for (let attempt = 0; attempt < (wanted ? 1 : 20); attempt++) {
      const udp = createSocket('udp4');
      const port = await new Promise<number>((resolve, reject) => {
        udp.once('error', reject);
        udp.bind(wanted, '127.0.0.1', () => resolve(udp.address().port));
      });
      const tcp = createServer();
      const bound = await new Promise<boolean>((resolve) => {
        tcp.once('error', () => resolve(false));
        tcp.listen(port, '127.0.0.1', () => resolve(true));
      });
      if (!bound) {
        udp.close();
        continue;
      }
      entry.servers.push(udp, tcp);
      udp.on('message', async (message, from) => {
        const answer = await this.dnsAnswer(entry, message);
        if (answer) udp.send(answer, from.port, from.address);
      });
      tcp.on('connection', (socket) => {
        entry.sockets.add(socket);
        socket.once('close', () => entry.sockets.delete(socket));
        socket.setTimeout(HELLO_TIMEOUT_MS, () => socket.destroy());
        socket.on('error', () => undefined);
        let buffered = Buffer.alloc(0);
        socket.on('data', async (chunk: Buffer) => {
          buffered = Buffer.concat([buffered, chunk]);
          while (buffered.length >= 2) {
            const length = buffered.readUInt16BE(0);
            if (buffered.length < 2 + length) break;
            const message = buffered.subarray(2, 2 + length);
            buffered = buffered.subarray(2 + length);
            const answer = await this.dnsAnswer(entry, message);
            if (!answer) return socket.destroy();
            const size = Buffer.alloc(2);
            size.writeUInt16BE(answer.length);
            socket.write(Buffer.concat([size, answer]));
          }
        });
      });
      return port;
    }
    throw new Error('no free port for the DNS server of the egress service');
  }

  /** The answer to one DNS message; undefined for bytes that are not a query. */
  private async dnsAnswer(entry: Entry, message: Buffer): Promise<Buffer | undefined> {
    let query: dnsPacket.Packet;
    try {
      query = dnsPacket.decode(message);
    } catch {
      return undefined;
    }
    if (query.type !== 'query') return undefined;
    const question = query.questions?.[0];
    const reply = (rcode: number, answers: dnsPacket.Answer[] = [], why?: string) =>
      dnsPacket.encode({
        type: 'response',
        id: query.id,
        // QR, RD copied, RA, and the response code.
        flags: 0x8000 | ((query.flags ?? 0) & 0x0100) | 0x0080 | rcode,
        questions: query.questions,
        answers,
        // RFC 8914 extended error 18 (Prohibited) with the rule, for tools that show it (dig).
        additionals: why
          ? [
              {
                type: 'OPT',
                name: '.',
                udpPayloadSize: 1232,
                options: [
                  { code: 15, data: Buffer.concat([Buffer.from([0, 18]), Buffer.from(why)]) },
                ],
              } as unknown as dnsPacket.Answer,
            ]
          : [],
      });
    const NOERROR = 0;
    const NXDOMAIN = 3;
    const NOTIMP = 4;
    const REFUSED = 5;
    if (!question) return reply(1);
    const name = question.name.toLowerCase();
    if (question.type !== 'A' && question.type !== 'AAAA') return reply(NOTIMP);
    const route = await this.resolveAllowed(entry, name);
    if ('refused' in route) {
      this.record(
        entry,
        { kind: 'dns', target: name, allowed: false, rule: route.refused },
        { port: 53 },
      );
      return reply(route.nx ? NXDOMAIN : REFUSED, [], route.refused);
    }
    this.record(
      entry,
      { kind: 'dns', target: name, allowed: true, rule: route.rule },
      { port: 53, address: route.addresses.join(' ') },
    );
    // No IPv6 route: AAAA questions get an empty answer, so clients use the A records at once.
    if (question.type === 'AAAA') return reply(NOERROR);
    const ttl =
      (await this.hooks.onAllowedAddresses?.(entry.id, route.addresses, route.ttl, name)) ??
      route.ttl;
    return reply(
      NOERROR,
      route.addresses.map((address) => ({ type: 'A', name: question.name, ttl, data: address })),
    );
  }

  /**
   * A name's addresses that the policy lets the sandbox dial. A name the policy refuses by name
   * is never sent upstream (no lookups leak what a denied name was).
   */
  private async resolveAllowed(
    entry: Entry,
    name: string,
  ): Promise<
    { addresses: string[]; ttl: number; rule: string } | { refused: string; nx?: boolean }
  > {
    // An address in any spelling a client may send (127.1, 0x7f000001, 2130706433, [::1],
    // ::ffff:127.0.0.1) is decided as that address, with no lookup.
    const literal = name.replace(/^\[(.*)\]$/, '$1');
    if (ipaddr.isValid(literal)) {
      const address = plainAddress(literal).toString();
      const decision = this.rules.decide(entry.parsed, { address });
      if (!decision.allowed) return { refused: `${decision.rule} (${address})` };
      return { addresses: [address], ttl: 60, rule: decision.rule };
    }
    const canonical = canonicalName(name);
    if (!canonical) return { refused: `'${name}' is not a domain name`, nx: true };
    const byName = this.rules.decide(entry.parsed, { name: canonical });
    if (!byName.allowed) return { refused: byName.rule };
    let resolved: { addresses: string[]; ttl: number };
    try {
      // localhost and its subdomains are the loopback (RFC 6761), never asked of a resolver.
      resolved =
        canonical === 'localhost' || canonical.endsWith('.localhost')
          ? { addresses: ['127.0.0.1'], ttl: 60 }
          : await this.resolver.resolve(canonical);
    } catch (error) {
      return { refused: (error as Error).message };
    }
    if (resolved.addresses.length === 0) return { refused: `${name} has no address`, nx: true };
    const allowed: string[] = [];
    let rule = byName.rule;
    let refusal: string | undefined;
    for (const address of resolved.addresses) {
      const decision = this.rules.decide(entry.parsed, { name, address });
      if (decision.allowed) {
        allowed.push(address);
        rule = decision.rule;
      } else refusal ??= `${decision.rule} (${name} is ${address})`;
    }
    if (allowed.length === 0) return { refused: refusal as string };
    return { addresses: allowed, ttl: resolved.ttl, rule };
  }
}

/** Answers a request egress refuses itself: the status and why, and the connection ends. */
function refuseHttp(res: ServerResponse, status: number, why: string): void {
  const body = `abx egress: ${why}\n`;
  res.writeHead(status, {
    'content-type': 'text/plain; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    'x-abx-egress': 'refused',
    connection: 'close',
  });
  res.end(body);
}

/** A Host header's name (canonical) and port, or undefined when it is malformed. */
function hostOf(header: string | undefined): { name: string; port?: number } | undefined {
  if (!header) return undefined;
  try {
    const url = new URL(`http://${header}`);
    const name = canonicalName(url.hostname) ?? url.hostname;
    return url.port ? { name, port: Number(url.port) } : { name };
  } catch {
    return undefined;
  }
}

/** Ends a TLS connection with a fatal access_denied alert (TLS 1.2 record, as a server sends). */
function refuseTls(socket: Socket): void {
  socket.end(Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31]));
}
