import { rmSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import {
  type AddressInfo,
  createServer as createNetServer,
  type Server as NetServer,
  type Socket,
} from 'node:net';
import type { ArgSpec } from '../protocol/arguments.js';
import { builtinCommands } from './builtins.js';
import { type CommandHandler, CommandTable } from './command-table.js';
import type { ServerContext } from './context.js';
import { AuthenticationError, CapabilityDisabledError } from './errors.js';
import { sameSecret } from './file-tools/random.js';
import { ROUTE_GROUPS } from './groups/index.js';
import { answerClientError } from './http.js';
import { loadManifest } from './manifest.js';
import { Metrics } from './metrics.js';
import { ProcessTable } from './process-table.js';
import { parseGroups, type RouteGroup } from './route-group.js';
import { type Guard, RouteTable } from './route-table.js';

/** Options of a {@link SandboxServer}; every limit has a default and can be changed. */
export interface SandboxServerOptions {
  /** Default `127.0.0.1`: nothing listens beyond loopback unless asked. */
  host?: string;
  /** Default `0`: a free port, read back from {@link SandboxServer.start}. */
  port?: number;
  /** When set, every route but `GET /health` needs `Authorization: Bearer <token>`. */
  token?: string;
  /**
   * A second token with fewer rights than `token`: a request that presents it must also pass
   * `check`, which throws to refuse it. envd serves the control plane with `token` and the
   * sandbox's clients with this one, limited to the template's capabilities.
   */
  limitedToken?: { token: string; check: (req: IncomingMessage) => void };
  /** Enabled groups: names like `files,process` or a list; default all. CORE is always on. */
  groups?: string | readonly string[];
  /** The groups the server can serve; default the command server's eight. envd passes its own. */
  catalog?: readonly RouteGroup[];
  /** Listen on this Unix socket instead of host:port (envd, reached by the host's gateway). */
  socketPath?: string;
  /**
   * Also serve on this Unix socket, besides host:port. In a sandbox the command server listens on
   * `/run/abx/ports/{port}.sock` too, so the host's gateway reaches it without envd's forwarder.
   * Requests on it need no token: only the gateway (which checked the sandbox's token) and the
   * sandbox's own processes can open that file; host:port keeps the token, since with
   * `network: host` it is on the host's loopback.
   */
  extraSocketPath?: string;
  /** Largest request body in bytes; default 64 MiB. */
  bodyLimitBytes?: number;
  /** Largest streamed body (raw uploads, never held whole); default `bodyLimitBytes`. */
  streamBodyLimitBytes?: number;
  /** A request body must arrive within this; default 30 s (against slowloris clients). */
  bodyTimeoutMs?: number;
  /** A streamed body (raw uploads) must arrive within this; default `bodyTimeoutMs`. */
  streamBodyTimeoutMs?: number;
  /** Timeout of a command call that does not set its own; default 300 s. */
  commandTimeoutMs?: number;
  /** How long {@link SandboxServer.stop} waits for requests in flight; default 10 s. */
  graceMs?: number;
  /** Where headless Chromium is; default `/usr/bin/chromium`. */
  chromiumPath?: string;
  /**
   * Requests that leave their connection out of {@link SandboxServer.busyConnections} (envd: the
   * daemon's long read of its log, which must not keep it awake).
   */
  idleNeutral?: (req: IncomingMessage) => boolean;
  /**
   * The numbers the first process and terminal ids start from (envd woken from a sleep goes on
   * from {@link SandboxServer.nextIds} of the envd before it); default 1.
   */
  firstIds?: { process: number; terminal: number };
}

const DEFAULTS = {
  host: '127.0.0.1',
  port: 0,
  bodyLimitBytes: 64 * 1024 * 1024,
  bodyTimeoutMs: 30_000,
  commandTimeoutMs: 300_000,
  graceMs: 10_000,
  chromiumPath: '/usr/bin/chromium',
};

const secret = (text: string) => Buffer.from(text);

/**
 * The in-sandbox command server: built-in and registered commands plus the route groups,
 * over node:http with a declarative {@link RouteTable}.
 *
 * @example
 * const server = new SandboxServer({ port: 0, token });
 * server.register('add', ({ x, y }) => Number(x) + Number(y), [
 *   { name: 'x', type: 'int', required: true },
 *   { name: 'y', type: 'int', required: false, default: 2 },
 * ]);
 * const { port } = await server.start();
 */
export class SandboxServer {
  private readonly options: typeof DEFAULTS & SandboxServerOptions;
  private readonly commands: CommandTable;
  private readonly processes: ProcessTable;
  private readonly terminals: ProcessTable;
  private readonly metrics = new Metrics();
  private readonly table: RouteTable<ServerContext>;
  private readonly enabled: Set<string>;
  private readonly catalog: readonly RouteGroup[];
  private readonly http: Server;
  private readonly context: ServerContext;
  private readonly active = new Set<ServerResponse>();
  private stopping: Promise<void> | undefined;
  private extra: NetServer | undefined;
  /** Connections accepted on {@link SandboxServerOptions.extraSocketPath}. */
  private readonly socketConnections = new WeakSet<object>();
  private tokenSecret: Buffer | undefined;
  /** `limitedToken`'s bytes; never matched when there is none. */
  private limitedSecret: Buffer;
  /** Open connections; with whether their latest request was one `idleNeutral` names. */
  private readonly open = new Map<Socket, boolean>();
  /** Connections accepted since the start (envd's sleep checks none came in meanwhile). */
  private acceptedCount = 0;
  /** Requests in flight that `idleNeutral` does not name. */
  private busyRequests = 0;
  /** What {@link settleWhenQuiet} runs, and its timer while one is armed. */
  private settle: { ms: number; run: () => void; timer?: NodeJS.Timeout } | undefined;
  private resolveStopped = () => {};
  /** Resolves once the server has stopped, whether by {@link stop}, SIGTERM or `POST /shutdown`. */
  readonly stopped = new Promise<void>((resolve) => {
    this.resolveStopped = resolve;
  });

  constructor(options: SandboxServerOptions = {}) {
    // An option given as `undefined` (an absent CLI flag) keeps its default.
    const given = Object.entries(options).filter(([, value]) => value !== undefined);
    this.options = { ...DEFAULTS, ...Object.fromEntries(given) };
    this.processes = new ProcessTable('process', options.firstIds?.process);
    this.terminals = new ProcessTable('terminal', options.firstIds?.terminal);
    const { groups } = options;
    this.catalog = options.catalog ?? ROUTE_GROUPS;
    this.table = new RouteTable(this.catalog.flatMap((g) => g.routes));
    this.enabled =
      groups === undefined
        ? new Set(this.catalog.map((g) => g.name))
        : parseGroups(typeof groups === 'string' ? groups : groups.join(','), this.catalog);
    this.limitedSecret = secret(options.limitedToken?.token ?? '');
    this.commands = new CommandTable(this.options.commandTimeoutMs);
    for (const command of builtinCommands()) this.commands.register(command);
    const enabledGroups = this.catalog.filter((g) => this.enabled.has(g.name));
    this.context = {
      commands: this.commands,
      processes: this.processes,
      terminals: this.terminals,
      metrics: this.metrics,
      enabledGroups,
      chromiumPath: this.options.chromiumPath,
      info: () => ({
        name: 'abx-server',
        pid: process.pid,
        node: process.version,
        ...this.address(),
        uptime_s: (Date.now() - this.metrics.startedAt) / 1000,
        groups: enabledGroups.map((g) => g.name),
        manifest_versions: [1],
        commands: this.commands.list().length,
      }),
      // After the 202 is written, so the caller gets its answer.
      requestShutdown: () => setImmediate(() => void this.stop()),
    };
    this.http = createServer(
      // Headers get the same deadline as bodies; requestTimeout is a backstop behind our own 408.
      {
        headersTimeout: this.options.bodyTimeoutMs,
        // Node checks header/request deadlines every 30 s by default; check every second.
        connectionsCheckingInterval: 1000,
        requestTimeout:
          Math.max(this.options.bodyTimeoutMs, this.options.streamBodyTimeoutMs ?? 0) + 5000,
      },
      (req, res) => {
        // One `close` listener per request for the counters and the set of answers in flight.
        const done = this.metrics.start();
        this.active.add(res);
        const counted = !(this.options.idleNeutral?.(req) ?? false);
        if (counted) {
          this.busyRequests++;
          clearTimeout(this.settle?.timer);
        }
        res.once('close', () => {
          this.active.delete(res);
          done(res.statusCode);
          if (counted) {
            this.busyRequests--;
            this.armSettle();
          }
        });
        if (this.stopping) res.setHeader('connection', 'close');
        // A browser's request (the dashboard, a page using the SDK's wire): any origin may read
        // the answer. The token in a header is what authorizes; no cookie ever does here, and
        // `*` forbids credentialed reads (docs/dashboard.md).
        if (req.headers.origin !== undefined) {
          res.setHeader('access-control-allow-origin', '*');
          res.setHeader('access-control-expose-headers', '*');
        }
        void this.table.dispatch(req, res, this.context, this.limits, this.guard);
      },
    );
    this.http.on('clientError', answerClientError);
    // Every connection, the extra socket's too (handed in by `emit('connection')`).
    this.http.on('connection', (socket: Socket) => {
      this.acceptedCount++;
      this.open.set(socket, false);
      socket.once('close', () => this.open.delete(socket));
    });
    this.http.on('request', (req: IncomingMessage) => {
      if (this.open.has(req.socket as Socket)) {
        this.open.set(req.socket as Socket, this.options.idleNeutral?.(req) ?? false);
      }
    });
  }

  /**
   * Connections open now, in flight or kept alive between requests, but for those whose latest
   * request `idleNeutral` names (envd's log, which the daemon holds open): envd sleeps only at 0.
   */
  busyConnections(): number {
    let busy = 0;
    for (const neutral of this.open.values()) if (!neutral) busy++;
    return busy;
  }

  /**
   * Runs `run` once the server has had no request in flight (but those `idleNeutral` names) for
   * `ms`, and again after each later spell of requests: once per quiet spell, never on a timer
   * of its own in between. The first spell starts now. envd collects its garbage then (idle.ts).
   */
  settleWhenQuiet(ms: number, run: () => void): void {
    clearTimeout(this.settle?.timer);
    this.settle = { ms, run };
    this.armSettle();
  }

  private armSettle(): void {
    const settle = this.settle;
    if (!settle || this.busyRequests > 0 || this.stopping) return;
    clearTimeout(settle.timer);
    settle.timer = setTimeout(() => {
      settle.timer = undefined;
      if (this.busyRequests === 0 && !this.stopping) settle.run();
    }, settle.ms);
    settle.timer.unref();
  }

  /** The numbers the next process and terminal ids will have (what a woken envd goes on from). */
  nextIds(): { process: number; terminal: number } {
    return { process: this.processes.next, terminal: this.terminals.next };
  }

  /** Connections accepted since the start. */
  get accepted(): number {
    return this.acceptedCount;
  }

  /**
   * Serves the same routes, with the same token checks, on one more Unix socket path: envd's
   * own path again after a sleep it called off (its first listener's path was unlinked).
   */
  listenAlso(path: string): Promise<void> {
    rmSync(path, { force: true });
    const server = createNetServer((socket) => this.http.emit('connection', socket));
    return new Promise<void>((resolve, reject) => {
      server.once('error', reject).listen(path, () => resolve());
    });
  }

  /**
   * Registers a command. `args` is its schema as `GET /commands` shows it; kwargs are validated
   * against it (defaults applied) before `handler` is called.
   */
  register(
    name: string,
    handler: CommandHandler,
    args: ArgSpec[] = [],
    options: { description?: string; timeoutMs?: number } = {},
  ): this {
    this.commands.register({
      name,
      handler,
      args,
      ...options,
      description: options.description ?? '',
    });
    return this;
  }

  /** Registers the commands of a bundle built with `commandManifest()` (see `--load`). */
  load(file: string): this {
    for (const command of loadManifest(file)) this.commands.register(command);
    return this;
  }

  /** Starts listening; resolves with the actual address (port 0 picks a free port). */
  start(): Promise<{ host: string; port: number }> {
    return new Promise<{ host: string; port: number }>((resolve, reject) => {
      this.http.once('error', reject);
      const listening = () => {
        this.http.off('error', reject);
        resolve(this.address());
      };
      if (this.options.socketPath) this.http.listen(this.options.socketPath, listening);
      else this.http.listen(this.options.port, this.options.host, listening);
    }).then(async (address) => {
      const extra = this.options.extraSocketPath;
      if (extra) {
        rmSync(extra, { force: true });
        // Connections accepted here are handed to the one HTTP server: same routes, same state.
        this.extra = createNetServer((socket) => {
          this.socketConnections.add(socket);
          this.http.emit('connection', socket);
        });
        await new Promise<void>((resolve, reject) => {
          this.extra?.once('error', reject).listen(extra, () => resolve());
        });
      }
      return address;
    });
  }

  address(): { host: string; port: number } {
    if (this.options.socketPath) return { host: this.options.socketPath, port: 0 };
    const address = this.http.address() as AddressInfo | null;
    return { host: this.options.host, port: address?.port ?? this.options.port };
  }

  /**
   * Stops accepting connections and new command calls, lets requests in flight finish within
   * the grace period, then closes what is left and kills every background process group.
   */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      this.commands.refuseNewCalls();
      this.processes.killAll('SIGTERM');
      this.terminals.killAll('SIGTERM');
      if (this.extra) {
        this.extra.close();
        rmSync(this.options.extraSocketPath as string, { force: true });
      }
      const closed = new Promise<void>((resolve) => this.http.close(() => resolve()));
      this.http.closeIdleConnections();
      // A keep-alive connection of a call in flight would otherwise stay open after its answer.
      for (const res of this.active) if (!res.headersSent) res.setHeader('connection', 'close');
      const grace = setTimeout(() => this.http.closeAllConnections(), this.options.graceMs);
      await closed;
      clearTimeout(grace);
      this.processes.killAll();
      this.terminals.killAll();
      this.resolveStopped();
    })();
    return this.stopping;
  }

  private get limits() {
    return {
      maxBytes: this.options.bodyLimitBytes,
      maxStreamBytes: this.options.streamBodyLimitBytes ?? this.options.bodyLimitBytes,
      timeoutMs: this.options.bodyTimeoutMs,
      streamTimeoutMs: this.options.streamBodyTimeoutMs ?? this.options.bodyTimeoutMs,
    };
  }

  private readonly guard: Guard<ServerContext> = (route, req) => {
    if (route?.public) return;
    if (
      this.options.token !== undefined &&
      !this.socketConnections.has(req.socket) &&
      !this.authorized(req)
    ) {
      const limited = this.options.limitedToken;
      if (!limited || !this.presents(req, this.limitedSecret)) {
        throw new AuthenticationError(
          'missing or wrong token: send the header "Authorization: Bearer <token>"',
        );
      }
      if (route?.control) {
        throw new AuthenticationError(
          `${route.method} ${route.path} takes the control plane's token, not the sandbox's`,
        );
      }
      limited.check(req);
    }
    if (route && !this.enabled.has(route.group)) {
      throw new CapabilityDisabledError(
        `route group ${route.group} is disabled on this server; start it with --groups including ${route.group.toLowerCase()}`,
      );
    }
  };

  /**
   * Replaces the server's token and its limited token. Every request is checked against the
   * current tokens when it arrives, so from the next request on (on any connection, keep-alive
   * ones included) the old tokens are refused; a request already past its check finishes.
   */
  replaceTokens(tokens: { control: string; limited?: string }): void {
    const limited = this.options.limitedToken;
    if (this.options.token === undefined || (tokens.limited !== undefined && !limited)) {
      throw new Error('replaceTokens: this server was started without those tokens');
    }
    // Both in one synchronous step: no request can see one new and one old.
    this.tokenSecret = secret(tokens.control);
    this.options.token = tokens.control;
    if (limited && tokens.limited !== undefined) {
      this.limitedSecret = secret(tokens.limited);
      this.options.limitedToken = { token: tokens.limited, check: limited.check };
    }
  }

  private authorized(req: IncomingMessage): boolean {
    this.tokenSecret ??= secret(this.options.token ?? '');
    return this.presents(req, this.tokenSecret);
  }

  /** True when the request's bearer token is `expected`. */
  private presents(req: IncomingMessage, expected: Buffer): boolean {
    const header = req.headers.authorization ?? '';
    const given = header.startsWith('Bearer ') ? header.slice(7) : '';
    // The comparison's time says nothing about the token but its length (random.ts).
    return sameSecret(Buffer.from(given), expected);
  }
}
