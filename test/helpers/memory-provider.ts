import { cpSync, mkdirSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { create as createTar } from 'tar';
import { capabilityOfSegment } from '../../runtime/protocol/capabilities.js';
import type {
  EndCause,
  IsolationReport,
  SandboxHandle,
  SandboxProvider,
  SandboxSpec,
} from '../../src/providers/provider.js';

/** What `POST /process/exec` answers. */
export interface ExecResult {
  stdout: string;
  stderr: string;
  exit_code: number;
}

/** One fake sandbox, as the provider keeps it. */
export interface MemorySandbox {
  id: string;
  spec: SandboxSpec;
  handle: SandboxHandle;
  /** Its home folder on the host (`{dir}/home`), a copy of `spec.baseHome` when there is one. */
  home: string;
  /** The environment its "processes" get: `spec.env`, then what `PUT /env` added. */
  env: Record<string, string>;
  /** Each `PUT /env` body's `env`, in order. */
  envUpdates: Record<string, string>[];
  /** `METHOD url` of every request that reached its envd, refused ones included. */
  requests: string[];
  /** Each `POST /process/exec` and `POST /exec` command, in order. */
  execs: string[];
  /** Ports envd was asked to forward (`POST /ports/{port}`), in order. */
  portOpens: number[];
  /** Ports whose `{port}.sock` is served. */
  ports: Set<number>;
  alive: boolean;
  /** Set when it ended by itself ({@link MemoryProvider.die}). */
  cause?: EndCause;
  /** Set once {@link MemoryProvider.kill} ended it. */
  killed: boolean;
  servers: Server[];
}

/** The report {@link MemoryProvider.isolation} returns, whatever the host. */
export const MEMORY_ISOLATION: IsolationReport = {
  mode: 'rootless',
  limits: {
    memory: { enforced: false, how: 'memory provider: nothing is enforced (tests only)' },
  },
  warnings: [],
};

type Handler = (req: IncomingMessage, res: ServerResponse, body: Buffer) => void | Promise<void>;

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
  });
  res.end(text);
}

function listen(socketPath: string, handler: Handler): Promise<Server> {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      Promise.resolve(handler(req, res, Buffer.concat(chunks))).catch((error: Error) => {
        if (res.headersSent) res.destroy();
        else sendJson(res, 500, { error: error.message, type: error.name });
      });
    });
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => resolve(server));
  });
}

function closeServer(server: Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    // Kept-alive connections (the gateway's agent holds some) would keep `close` waiting.
    server.closeAllConnections();
  });
}

/**
 * The few commands the fake envd "runs": `true`, `false`, `exit N`, `echo WORDS` and
 * `echo WORDS > NAME` (NAME a plain file name in the home folder).
 */
export function runFakeCommand(box: MemorySandbox, cmd: string): ExecResult {
  const trimmed = cmd.trim();
  if (trimmed === 'true') return { stdout: '', stderr: '', exit_code: 0 };
  if (trimmed === 'false') return { stdout: '', stderr: 'false: failed\n', exit_code: 1 };
  const exit = /^exit (\d+)$/.exec(trimmed);
  if (exit) return { stdout: '', stderr: '', exit_code: Number(exit[1]) };
  const redirect = /^echo (.*) > ([\w.-]+)$/.exec(trimmed);
  if (redirect) {
    writeFileSync(join(box.home, redirect[2] as string), `${redirect[1]}\n`);
    return { stdout: '', stderr: '', exit_code: 0 };
  }
  const echo = /^echo (.*)$/.exec(trimmed);
  if (echo) return { stdout: `${echo[1]}\n`, stderr: '', exit_code: 0 };
  return { stdout: '', stderr: `memory provider: cannot run ${cmd}\n`, exit_code: 127 };
}

export interface MemoryProviderOptions {
  /** How long each `create` takes before it resolves (a slow host); default 0. */
  createDelayMs?: number;
  /** How long each `kill` takes; the sandbox stays alive until the end of it. Default 0. */
  killDelayMs?: number;
}

/**
 * An in-memory {@link SandboxProvider} for unit tests of the control plane, and nothing else: a
 * "sandbox" is a node:http server on a Unix socket in the sandbox's folder that answers a few of
 * envd's routes. Nothing is isolated and nothing is spawned (no bwrap).
 * `isAlive` answers from the provider's own state (the handle's pid is the test process's own).
 */
export class MemoryProvider implements SandboxProvider {
  readonly name = 'memory';
  /** Calls of `create` (failed ones included); planted orphans are not counted. */
  creates = 0;
  /** Calls of `kill`, on live and ended sandboxes alike. */
  kills = 0;
  /** Calls of `close`. */
  closes = 0;
  /** `create` calls still waiting out {@link createDelayMs} (or held, see {@link holdCreates}). */
  pendingCreates = 0;
  /** The most `create` calls that were waiting at once (a test may reset it to 0). */
  peakPendingCreates = 0;
  /** Ids passed to `create`, in order. */
  readonly created: string[] = [];
  /** Ids of the sandboxes passed to `kill`, in order. */
  readonly killed: string[] = [];
  /** What each `sweepOrphans` call got. */
  readonly sweeps: { sandboxesDir: string; running: string[] }[] = [];
  createDelayMs: number;
  killDelayMs: number;
  private nextCreateError: Error | undefined;
  private held: { gate: Promise<void>; open: () => void; passing: number } | undefined;
  private sequence = 0;
  /** By `startTime`, unique per sandbox (ids repeat across template builds). */
  private readonly boxes = new Map<string, MemorySandbox>();

  constructor(options: MemoryProviderOptions = {}) {
    this.createDelayMs = options.createDelayMs ?? 0;
    this.killDelayMs = options.killDelayMs ?? 0;
  }

  /** The latest sandbox started with this id. */
  /** The latest sandbox of this id (or, for a template build, `build-NAME`: its `build-NAME-…`). */
  sandbox(id: string): MemorySandbox {
    const found = [...this.boxes.values()]
      .filter((box) => box.id === id || (id.startsWith('build-') && box.id.startsWith(`${id}-`)))
      .pop();
    if (!found) throw new Error(`memory provider: no sandbox ${id}`);
    return found;
  }

  /** Ids of the sandboxes alive now. */
  aliveIds(): string[] {
    return [...this.boxes.values()].filter((box) => box.alive).map((box) => box.id);
  }

  /** The next `create` throws `error` (after its delay) and starts nothing. */
  failNextCreate(error: Error): void {
    this.nextCreateError = error;
  }

  /**
   * From now on every `create` but the next `passing` ones waits (after its delay) until
   * {@link releaseCreates}: a start that takes as long as the test wants, with no timing in it.
   */
  holdCreates(passing = 0): void {
    this.releaseCreates();
    let open = () => {};
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    this.held = { gate, open, passing };
  }

  /** Lets the held creates (and every later one) go on. */
  releaseCreates(): void {
    this.held?.open();
    this.held = undefined;
  }

  /** The sandbox ends by itself (OOM kill, or its init exited): its servers close. */
  async die(id: string, cause: EndCause): Promise<void> {
    const box = this.sandbox(id);
    if (!box.alive) throw new Error(`memory provider: sandbox ${id} already ended`);
    box.alive = false;
    box.cause = cause;
    await this.closeServers(box);
  }

  /**
   * A sandbox left running in `sandboxesDir` without a registry row (a daemon crashed between
   * starting it and recording it): `sweepOrphans` finds it.
   */
  plantOrphan(sandboxesDir: string, id: string): Promise<MemorySandbox> {
    return this.start({
      id,
      accessToken: `orphan-token-${id}`,
      dir: join(sandboxesDir, id),
      env: {},
      workdir: '/home/user',
      resources: {},
      network: 'none',
    });
  }

  /**
   * Serves `{portsDir}/{port}.sock` as a program of the sandbox listening there itself would (a
   * command server): the gateway then reaches it without asking envd.
   */
  async servePort(id: string, port: number): Promise<void> {
    await this.openPort(this.sandbox(id), port, 'own socket');
  }

  async create(spec: SandboxSpec): Promise<SandboxHandle> {
    this.creates++;
    this.created.push(spec.id);
    this.pendingCreates++;
    this.peakPendingCreates = Math.max(this.peakPendingCreates, this.pendingCreates);
    try {
      if (this.createDelayMs > 0) await sleep(this.createDelayMs);
      if (this.held && this.held.passing-- <= 0) await this.held.gate;
    } finally {
      this.pendingCreates--;
    }
    const error = this.nextCreateError;
    if (error) {
      this.nextCreateError = undefined;
      throw error;
    }
    return (await this.start(spec)).handle;
  }

  isAlive(handle: SandboxHandle): boolean {
    return handle.pid === process.pid && this.boxes.get(handle.startTime)?.alive === true;
  }

  endCause(handle: SandboxHandle): EndCause {
    return this.boxes.get(handle.startTime)?.cause ?? 'exited';
  }

  async kill(handle: SandboxHandle): Promise<void> {
    this.kills++;
    const box = this.boxes.get(handle.startTime);
    if (!box) return;
    this.killed.push(box.id);
    if (this.killDelayMs > 0) await sleep(this.killDelayMs);
    if (box.alive) {
      box.alive = false;
      box.killed = true;
    }
    await this.closeServers(box);
  }

  async sweepOrphans(sandboxesDir: string, running: ReadonlySet<string>): Promise<string[]> {
    this.sweeps.push({ sandboxesDir, running: [...running] });
    const orphans = [...this.boxes.values()].filter(
      (box) => box.alive && dirname(box.spec.dir) === sandboxesDir && !running.has(box.id),
    );
    for (const box of orphans) await this.kill(box.handle);
    return orphans.map((box) => box.id);
  }

  isolation(): IsolationReport {
    return MEMORY_ISOLATION;
  }

  /** Like a real provider's: releases nothing of the sandboxes, which keep running. */
  async close(): Promise<void> {
    this.closes++;
  }

  /** Closes every server of every sandbox, alive or not (a test's cleanup). */
  async dispose(): Promise<void> {
    await Promise.all([...this.boxes.values()].map((box) => this.closeServers(box)));
    for (const box of this.boxes.values()) box.alive = false;
  }

  private async start(spec: SandboxSpec): Promise<MemorySandbox> {
    const run = join(spec.dir, 'run');
    const home = join(spec.dir, 'home');
    mkdirSync(join(run, 'ports'), { recursive: true });
    if (spec.baseHome) cpSync(spec.baseHome, home, { recursive: true });
    else mkdirSync(home, { recursive: true });
    const handle: SandboxHandle = {
      provider: this.name,
      pid: process.pid,
      startTime: `memory-${++this.sequence}`,
      envdSocket: join(run, 'envd.sock'),
      portsDir: join(run, 'ports'),
    };
    const box: MemorySandbox = {
      id: spec.id,
      spec,
      handle,
      home,
      env: { ...spec.env },
      envUpdates: [],
      requests: [],
      execs: [],
      portOpens: [],
      ports: new Set(),
      alive: true,
      killed: false,
      servers: [],
    };
    box.servers.push(
      await listen(handle.envdSocket, (req, res, body) => this.envd(box, req, res, body)),
    );
    this.boxes.set(handle.startTime, box);
    return box;
  }

  private async closeServers(box: MemorySandbox): Promise<void> {
    const servers = box.servers.splice(0);
    await Promise.all(servers.map(closeServer));
  }

  private async openPort(box: MemorySandbox, port: number, via: string): Promise<string> {
    const socket = join(box.handle.portsDir, `${port}.sock`);
    if (box.ports.has(port)) return socket;
    box.ports.add(port);
    box.servers.push(
      await listen(socket, (req, res) =>
        sendJson(res, 200, {
          sandbox: box.id,
          port,
          via,
          method: req.method,
          url: req.url,
          headers: req.headers,
        }),
      ),
    );
    return socket;
  }

  /** The fake envd: health without a token, the rest with `Authorization: Bearer <token>`. */
  private async envd(
    box: MemorySandbox,
    req: IncomingMessage,
    res: ServerResponse,
    body: Buffer,
  ): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://envd');
    box.requests.push(`${req.method} ${req.url}`);
    if (req.method === 'GET' && url.pathname === '/health') {
      sendJson(res, 200, { status: 'ok' });
      return;
    }
    const control =
      box.spec.controlToken !== undefined &&
      req.headers.authorization === `Bearer ${box.spec.controlToken}`;
    if (!control && req.headers.authorization !== `Bearer ${box.spec.accessToken}`) {
      sendJson(res, 401, { error: 'missing or wrong access token', type: 'AuthenticationError' });
      return;
    }
    // As envd: the access token reaches only the routes of the template's capabilities.
    const needed = capabilityOfSegment(url.pathname.split('/')[1]);
    if (!control && needed && box.spec.capabilities && !box.spec.capabilities.includes(needed)) {
      sendJson(res, 403, {
        error: `memory provider: no ${needed} capability`,
        type: 'CapabilityError',
      });
      return;
    }
    const json = () => (body.length > 0 ? JSON.parse(body.toString('utf8')) : undefined);
    const port = /^\/ports\/(\d+)$/.exec(url.pathname);
    if (req.method === 'PUT' && url.pathname === '/env') {
      const env = (json() as { env?: Record<string, string> } | undefined)?.env;
      if (typeof env !== 'object' || env === null || Array.isArray(env)) {
        sendJson(res, 400, { error: 'the body must be { "env": {...} }', type: 'BadRequestError' });
        return;
      }
      // The same checks as envd's (runtime/envd/env.ts).
      for (const [name, value] of Object.entries(env)) {
        const bad = !/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)
          ? `${JSON.stringify(name)} is not a variable name`
          : typeof value !== 'string' || value.includes('\0')
            ? `env.${name} must be a string without NUL bytes`
            : undefined;
        if (bad) {
          sendJson(res, 400, { error: bad, type: 'BadRequestError' });
          return;
        }
      }
      box.envUpdates.push(env);
      Object.assign(box.env, env);
      sendJson(res, 200, { set: Object.keys(env) });
    } else if (req.method === 'POST' && url.pathname === '/process/exec') {
      const cmd = String((json() as { cmd?: unknown } | undefined)?.cmd ?? '');
      box.execs.push(cmd);
      sendJson(res, 200, runFakeCommand(box, cmd));
    } else if (req.method === 'POST' && url.pathname === '/exec') {
      // envd's streamed form (what template builds use): start, output, exit as NDJSON.
      const cmd = String((json() as { cmd?: unknown } | undefined)?.cmd ?? '');
      box.execs.push(cmd);
      const result = runFakeCommand(box, cmd);
      const lines: unknown[] = [{ start: { id: String(box.execs.length), command: cmd } }];
      let offset = { stdout: 0, stderr: 0 };
      for (const stream of ['stdout', 'stderr'] as const) {
        const data = result[stream];
        if (data === '') continue;
        const next = offset[stream] + Buffer.byteLength(data);
        lines.push({ stream, data, offset: offset[stream], next });
        offset = { ...offset, [stream]: next };
      }
      lines.push({ exit: { code: result.exit_code, signal: null, timed_out: false } });
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end(lines.map((line) => `${JSON.stringify(line)}\n`).join(''));
    } else if (req.method === 'GET' && url.pathname === '/files/archive') {
      if (url.searchParams.get('path') !== '/home/user') {
        sendJson(res, 404, { error: 'memory provider: only /home/user', type: 'NotFoundError' });
        return;
      }
      res.writeHead(200, { 'content-type': 'application/x-tar' });
      createTar({ cwd: box.home, portable: true }, ['.']).pipe(res);
    } else if (req.method === 'POST' && port) {
      box.portOpens.push(Number(port[1]));
      sendJson(res, 200, {
        port: Number(port[1]),
        socket: await this.openPort(box, Number(port[1]), 'envd forwarder'),
      });
    } else if (url.pathname === '/debug/request') {
      // What reached envd, for gateway tests: the path, query and headers after the gateway.
      sendJson(res, 200, {
        sandbox: box.id,
        method: req.method,
        url: req.url,
        headers: req.headers,
        body: body.toString('utf8'),
      });
    } else {
      sendJson(res, 404, {
        error: `memory provider: no route ${req.method} ${url.pathname}`,
        type: 'RouteNotFoundError',
      });
    }
  }
}
