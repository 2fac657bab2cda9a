/**
 * A small client of the Docker Engine API, covering exactly what abx asks of an engine:
 * `GET /info` and `/_ping`, containers (create, inspect, start, stop, pause, unpause, remove,
 * list, wait, logs, commit, export, archives), images (inspect, list, remove, tag, import and
 * build from a tar stream, pull, push with `X-Registry-Auth`), volumes, `/system/df` and the
 * event stream.
 *
 * Why our own: dockerode pulls in docker-modem → ssh2 → cpu-features, whose install scripts
 * compile native code with node-gyp, and abx never speaks to an engine over SSH. It is written on
 * node:http rather than undici: a live stream (the engine's events) can unref its socket so it
 * never keeps a process alive, request bodies stream from any Readable, and the wire is the one
 * dockerode spoke (same unversioned paths, query encoding, chunked uploads, keep-alive agent).
 *
 * Timeouts (dockerode had none unless DOCKER_CLIENT_TIMEOUT was set; a stuck engine hung a call):
 * - a call that answers with a document: the whole exchange within {@link REQUEST_MS}, except
 *   `stop` (its grace period on top), `commit` ({@link COMMIT_MS}: it copies the writable layer)
 *   and `wait` (the caller's limit, {@link WAIT_MS} by default);
 * - a call that streams a body either way (archives, export, import, build, pull, push): ended
 *   when no byte moves either way for its idle time ({@link ARCHIVE_IDLE_MS},
 *   {@link TRANSFER_IDLE_MS}, {@link BUILD_IDLE_MS}: a build step can be silent for long);
 * - the event stream: none (it is meant to stay open; its reader ends it).
 * A timeout is an error with code `ETIMEDOUT` naming the engine, the call and the limit.
 */
import { existsSync, readFileSync } from 'node:fs';
import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'node:querystring';
import type { Readable } from 'node:stream';

/** A call that answers with a document: the whole exchange. */
export const REQUEST_MS = 60_000;
/** `commit`: the engine copies the container's writable layer into an image first. */
export const COMMIT_MS = 10 * 60_000;
/** `wait`, unless the caller gives its own limit. */
export const WAIT_MS = 10 * 60_000;
/** Archives in and out of a container, its export, its log: idle time. */
export const ARCHIVE_IDLE_MS = 2 * 60_000;
/** Image import, pull and push: idle time (the engine unpacks or uploads layers meanwhile). */
export const TRANSFER_IDLE_MS = 10 * 60_000;
/** A build: idle time (one RUN step may print nothing for minutes). */
export const BUILD_IDLE_MS = 30 * 60_000;
/** The most of an error body kept (Docker's are a line of JSON). */
const ERROR_BODY_BYTES = 64 * 1024;

/** A failure the engine answered with: its HTTP status and its own words. */
export class EngineApiError extends Error {
  /** The HTTP status (404 no such object, 409 conflict, 500 the engine failed, ...). */
  readonly statusCode: number;
  /** Docker's own message (`No such container: abx-x`). */
  readonly engineMessage: string;
  /** The body as JSON (`{ message }`), or its text when it is not JSON. */
  readonly json: unknown;

  constructor(statusCode: number, method: string, path: string, body: string) {
    let json: unknown = body;
    try {
      json = JSON.parse(body);
    } catch {
      // not JSON: the text is the message
    }
    const said = (json as { message?: unknown } | null)?.message;
    const engineMessage = (typeof said === 'string' ? said : body).trim() || `HTTP ${statusCode}`;
    super(`(HTTP code ${statusCode}) ${method} ${path.split('?')[0]} - ${engineMessage}`);
    this.name = 'EngineApiError';
    this.statusCode = statusCode;
    this.engineMessage = engineMessage;
    this.json = json;
  }
}

/** One line of a JSON progress stream (import, build, pull, push). */
export interface ProgressEvent {
  status?: string;
  stream?: string;
  id?: string;
  progress?: string;
  error?: string;
  errorDetail?: { message?: string; code?: number };
  aux?: { Digest?: string; ID?: string; Tag?: string; Size?: number };
}

/** A progress stream that reported a failure: the engine's words, every event read. */
export class ProgressError extends Error {
  constructor(
    message: string,
    readonly events: ProgressEvent[],
  ) {
    super(message);
    this.name = 'ProgressError';
  }
}

/**
 * Reads a JSON progress stream (one JSON object a line) to its end, giving each event to
 * `onEvent`. Resolves with every event; rejects when the stream fails, a line is not JSON, or
 * an event has `error`/`errorDetail` (the first one's message, once the stream has ended).
 */
export function followProgress(
  stream: Readable,
  onEvent?: (event: ProgressEvent) => void,
): Promise<ProgressEvent[]> {
  return new Promise((resolve, reject) => {
    const events: ProgressEvent[] = [];
    let pending = '';
    let bad: Error | undefined;
    const take = (line: string) => {
      if (!line.trim() || bad) return;
      let event: ProgressEvent;
      try {
        event = JSON.parse(line) as ProgressEvent;
      } catch {
        bad = new Error(
          `the Docker engine sent a progress line that is not JSON: ${line.slice(0, 200)}`,
        );
        return;
      }
      events.push(event);
      onEvent?.(event);
    };
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => {
      pending += chunk;
      const lines = pending.split('\n');
      pending = lines.pop() ?? '';
      for (const line of lines) take(line);
    });
    stream.once('error', reject);
    stream.once('end', () => {
      take(pending);
      if (bad) return reject(bad);
      const failed = events.find((event) => event.error || event.errorDetail);
      if (failed) {
        const message = failed.errorDetail?.message || failed.error || 'unknown error';
        return reject(new ProgressError(message, events));
      }
      resolve(events);
    });
  });
}

/**
 * A non-TTY container's output as text: its frames (8-byte headers: stream 0-2, three zero
 * bytes, the length, big-endian) in order, stdout and stderr together. Anything that does not
 * start with a frame (a TTY container's output) is taken as plain text.
 */
export function logText(raw: Buffer): string {
  const parts: Buffer[] = [];
  let at = 0;
  while (at + 8 <= raw.length && (raw[at] as number) <= 2 && raw.readUIntBE(at + 1, 3) === 0) {
    const length = raw.readUInt32BE(at + 4);
    parts.push(raw.subarray(at + 8, at + 8 + length));
    at += 8 + length;
  }
  return at === 0 ? raw.toString('utf8') : Buffer.concat(parts).toString('utf8');
}

// The parts of the API's documents abx reads or writes (the engine sends and takes more).

export interface Ulimit {
  Name: string;
  Soft: number;
  Hard: number;
}

export interface MountSettings {
  Type: 'bind' | 'volume' | 'tmpfs';
  Source?: string;
  Target: string;
  ReadOnly?: boolean;
  VolumeOptions?: { NoCopy?: boolean; Labels?: Record<string, string> };
}

export interface HostConfig {
  Binds?: string[];
  Mounts?: MountSettings[];
  Tmpfs?: Record<string, string>;
  NetworkMode?: string;
  IpcMode?: string;
  CgroupnsMode?: 'private' | 'host';
  CgroupParent?: string;
  Init?: boolean;
  Privileged?: boolean;
  ReadonlyRootfs?: boolean;
  SecurityOpt?: string[];
  CapAdd?: string[] | null;
  CapDrop?: string[] | null;
  GroupAdd?: string[];
  PidsLimit?: number;
  Memory?: number;
  MemorySwap?: number;
  NanoCpus?: number;
  Ulimits?: Ulimit[];
  StorageOpt?: Record<string, string>;
  LogConfig?: { Type: string; Config?: Record<string, string> };
}

/** The image configuration a container is made with (and a commit's body). */
export interface ContainerConfig {
  Hostname?: string;
  User?: string;
  Env?: string[];
  Cmd?: string[];
  Entrypoint?: string[];
  WorkingDir?: string;
  Labels?: Record<string, string>;
  Tty?: boolean;
  NetworkDisabled?: boolean;
  [field: string]: unknown;
}

export interface ContainerCreateOptions extends ContainerConfig {
  /** The container's name (a query parameter, not part of the body). */
  name?: string;
  Image: string;
  HostConfig?: HostConfig;
}

export interface ContainerInspectInfo {
  Id: string;
  Name: string;
  Image: string;
  State: {
    Status: string;
    Running: boolean;
    Paused: boolean;
    OOMKilled: boolean;
    Pid: number;
    ExitCode: number;
    Error: string;
  };
  Config: ContainerConfig & { Labels: Record<string, string> };
  HostConfig: HostConfig;
}

export interface ContainerInfo {
  Id: string;
  Names: string[];
  Image: string;
  State: string;
  Labels: Record<string, string>;
}

export interface ImageInspectInfo {
  Id: string;
  RepoTags?: string[];
  RepoDigests?: string[];
  Config?: ContainerConfig;
}

export interface ImageInfo {
  Id: string;
  RepoTags?: string[] | null;
  Labels?: Record<string, string> | null;
}

export interface VolumeInspectInfo {
  Name: string;
  Driver: string;
  Mountpoint: string;
  Labels?: Record<string, string> | null;
  Options?: Record<string, string> | null;
}

/** `filters` of the list calls and the event stream: each key a list of values. */
export type Filters = Record<string, string[]>;

type Query = Record<string, string | number | boolean | string[] | Filters | undefined>;

/** Docker's query encoding (as dockerode's): objects as JSON, lists as repeated keys. */
function queryString(query: Query | undefined): string {
  if (!query) return '';
  const flat: Record<string, string | string[]> = {};
  for (const [key, value] of Object.entries(query)) {
    if (value === undefined) continue;
    if (Array.isArray(value)) flat[key] = value;
    else if (typeof value === 'object') flat[key] = JSON.stringify(value);
    else flat[key] = String(value);
  }
  const text = stringify(flat);
  return text ? `?${text}` : '';
}

/** A name in a path: `/` and `:` stay (image references have them), the rest is escaped. */
function segment(name: string): string {
  return encodeURIComponent(name).replace(/%2F/gi, '/').replace(/%3A/gi, ':');
}

interface RequestOptions {
  query?: Query;
  /** A JSON document, or a stream (a tar) sent chunked. */
  body?: unknown;
  headers?: Record<string, string>;
  /** The whole exchange must end within this (a document call). */
  deadlineMs?: number;
  /** No byte either way for this long ends it (a streaming call). */
  idleMs?: number;
}

/** Where the engine is, from `DOCKER_HOST` the way the docker CLI and dockerode read it. */
interface Endpoint {
  socketPath?: string;
  https?: boolean;
  host?: string;
  port?: number;
  tls?: { ca?: string; cert?: Buffer; key?: Buffer };
  /** Why this endpoint cannot be used (an SSH address). */
  unsupported?: string;
}

function endpointOf(host: string | undefined): Endpoint {
  if (!host) {
    // Docker Desktop's socket when it is there (as dockerode looked), else the system one.
    const desktop = join(homedir(), '.docker', 'run', 'docker.sock');
    return { socketPath: existsSync(desktop) ? desktop : '/var/run/docker.sock' };
  }
  if (host.startsWith('unix://')) return { socketPath: host.slice(7) || '/var/run/docker.sock' };
  if (host.startsWith('ssh://')) {
    return {
      unsupported: `DOCKER_HOST=${host}: abx reaches an engine over a Unix socket or TCP, not SSH; forward its socket (ssh -nNT -L /tmp/docker.sock:/var/run/docker.sock ${host.slice(6)}) and set DOCKER_HOST=unix:///tmp/docker.sock`,
    };
  }
  let url: URL;
  try {
    url = new URL(host.includes('//') ? host : `tcp://${host}`);
  } catch {
    return {
      unsupported: `DOCKER_HOST=${host} is not an address like tcp://host:2375 or unix:///path`,
    };
  }
  const port = url.port || '2375';
  const https = process.env.DOCKER_TLS_VERIFY === '1' || port === '2376';
  const certs = process.env.DOCKER_CERT_PATH;
  return {
    host: url.hostname,
    port: Number(port),
    https,
    ...(certs
      ? {
          tls: {
            ca: readFileSync(join(certs, 'ca.pem'), 'utf8'),
            cert: readFileSync(join(certs, 'cert.pem')),
            key: readFileSync(join(certs, 'key.pem')),
          },
        }
      : {}),
  };
}

/** The engine's client. One keep-alive agent of its own, which {@link close} destroys. */
export class DockerEngine {
  /** The socket's path, when the engine is on a Unix socket. */
  readonly socketPath: string | undefined;
  /** Where the engine is, for messages: the socket's path, or `DOCKER_HOST`. */
  readonly address: string;
  private readonly endpoint: Endpoint;
  private readonly agent: HttpAgent;

  /** `socketPath` given: that socket; else `DOCKER_HOST` (unix:// or tcp://), else the default socket. */
  constructor(options: { socketPath?: string } = {}) {
    this.endpoint = options.socketPath
      ? { socketPath: options.socketPath }
      : endpointOf(process.env.DOCKER_HOST);
    this.socketPath = this.endpoint.socketPath;
    this.address = this.socketPath ?? process.env.DOCKER_HOST ?? '';
    this.agent = this.endpoint.https
      ? new HttpsAgent({ keepAlive: true, ...this.endpoint.tls })
      : new HttpAgent({ keepAlive: true });
  }

  /**
   * Ends every connection to the engine (an idle keep-alive one would keep the process alive
   * until the engine closes it) and any stream still open.
   */
  close(): void {
    this.agent.destroy();
  }

  /**
   * One request; resolves with the response once its head arrived with a 2xx status (any other
   * status is an {@link EngineApiError} with the engine's message from the body).
   */
  request(method: string, path: string, options: RequestOptions = {}): Promise<IncomingMessage> {
    const target = `${path}${queryString(options.query)}`;
    const what = `${method} ${path}`;
    return new Promise((resolve, reject) => {
      if (this.endpoint.unsupported) {
        reject(Object.assign(new Error(this.endpoint.unsupported), { code: 'EPROTONOSUPPORT' }));
        return;
      }
      const streamed = typeof (options.body as Readable | undefined)?.pipe === 'function';
      const json =
        options.body !== undefined && !streamed ? JSON.stringify(options.body) : undefined;
      const headers: Record<string, string | number> = { ...options.headers };
      if (json !== undefined) {
        headers['Content-Type'] = 'application/json';
        headers['Content-Length'] = Buffer.byteLength(json);
      } else if (streamed) {
        headers['Content-Type'] ??= 'application/x-tar';
      }
      const send = this.endpoint.https ? httpsRequest : httpRequest;
      const req = send({
        method,
        path: target,
        headers,
        agent: this.agent,
        ...(this.endpoint.socketPath
          ? { socketPath: this.endpoint.socketPath }
          : { host: this.endpoint.host, port: this.endpoint.port }),
      });
      let response: IncomingMessage | undefined;
      let deadline: NodeJS.Timeout | undefined;
      let idle: NodeJS.Timeout | undefined;
      const fail = (limit: number, kind: string) => {
        const error = Object.assign(
          new Error(
            `the Docker engine at ${this.address} did not ${kind} ${what} within ${limit / 1000} s`,
          ),
          { code: 'ETIMEDOUT' },
        );
        stopTimers();
        req.destroy(error);
        response?.destroy(error);
        reject(error);
      };
      const stopTimers = () => {
        clearTimeout(deadline);
        clearInterval(idle);
      };
      if (options.deadlineMs) {
        const limit = options.deadlineMs;
        deadline = setTimeout(() => fail(limit, 'finish'), limit);
      }
      if (options.idleMs) {
        // The socket's byte counts, watched: a listener on either stream would change how it
        // flows (a response read later would lose what came before).
        const limit = options.idleMs;
        let moved = -1;
        let since = Date.now();
        idle = setInterval(
          () => {
            const socket = req.socket;
            const now = socket ? socket.bytesRead + socket.bytesWritten : 0;
            if (now !== moved) {
              moved = now;
              since = Date.now();
            } else if (Date.now() - since >= limit) fail(limit, 'move a byte of');
          },
          Math.min(1000, limit / 4),
        );
        idle.unref();
      }
      req.once('error', (error) => {
        stopTimers();
        reject(error);
      });
      req.once('response', (res) => {
        response = res;
        res.once('close', stopTimers);
        const status = res.statusCode ?? 0;
        if (status >= 200 && status < 300) {
          resolve(res);
          return;
        }
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          if (body.length < ERROR_BODY_BYTES) body += chunk;
        });
        res.once('error', reject);
        res.once('end', () => reject(new EngineApiError(status, method, path, body)));
      });
      if (streamed) {
        const source = options.body as Readable;
        source.once('error', (error) => req.destroy(error));
        source.pipe(req);
      } else {
        req.end(json);
      }
    });
  }

  /** A request whose answer is a document: its body, parsed when it is JSON. */
  async call<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const res = await this.request(method, path, { deadlineMs: REQUEST_MS, ...options });
    const chunks: Buffer[] = [];
    for await (const chunk of res) chunks.push(chunk as Buffer);
    const text = Buffer.concat(chunks).toString('utf8');
    if (!text) return undefined as T;
    if (!/json/.test(res.headers['content-type'] ?? '')) return text as T;
    return JSON.parse(text) as T;
  }

  /** `GET /info`. */
  info(): Promise<Record<string, unknown>> {
    return this.call('GET', '/info');
  }

  /** `GET /_ping`: resolves when the engine answers. */
  async ping(options: { timeoutMs?: number } = {}): Promise<void> {
    await this.call('GET', '/_ping', { deadlineMs: options.timeoutMs ?? REQUEST_MS });
  }

  getContainer(id: string): EngineContainer {
    return new EngineContainer(this, id);
  }

  getImage(name: string): EngineImage {
    return new EngineImage(this, name);
  }

  getVolume(name: string): EngineVolume {
    return new EngineVolume(this, name);
  }

  /** `POST /containers/create`: the container, made but not started. */
  async createContainer(options: ContainerCreateOptions): Promise<EngineContainer> {
    const { name, ...body } = options;
    const made = await this.call<{ Id: string }>('POST', '/containers/create', {
      query: { name },
      body,
    });
    return new EngineContainer(this, made.Id);
  }

  listContainers(options: { all?: boolean; filters?: Filters } = {}): Promise<ContainerInfo[]> {
    return this.call('GET', '/containers/json', { query: options });
  }

  listImages(options: { all?: boolean; filters?: Filters } = {}): Promise<ImageInfo[]> {
    return this.call('GET', '/images/json', { query: options });
  }

  listVolumes(
    options: { filters?: Filters } = {},
  ): Promise<{ Volumes: VolumeInspectInfo[] | null; Warnings: string[] | null }> {
    return this.call('GET', '/volumes', { query: options });
  }

  createVolume(options: {
    Name: string;
    Driver?: string;
    DriverOpts?: Record<string, string>;
    Labels?: Record<string, string>;
  }): Promise<VolumeInspectInfo> {
    return this.call('POST', '/volumes/create', { body: options });
  }

  /** `GET /system/df` (`type` limits what the engine sizes, API 1.42). */
  systemDf(options: { type?: string[] } = {}): Promise<{
    Volumes?: { Name: string; UsageData?: { Size?: number } }[];
  }> {
    return this.call('GET', '/system/df', { query: options, deadlineMs: 2 * REQUEST_MS });
  }

  /** `docker import` of a tar stream as `repo:tag`: its progress stream (see {@link followProgress}). */
  importImage(tar: Readable, options: { repo: string; tag: string }): Promise<IncomingMessage> {
    return this.request('POST', '/images/create', {
      query: { fromSrc: '-', ...options },
      body: tar,
      idleMs: TRANSFER_IDLE_MS,
    });
  }

  /** `docker build` of a context tar: its progress stream. */
  buildImage(
    context: Readable,
    options: {
      t: string;
      dockerfile: string;
      networkmode?: string;
      rm?: boolean;
      forcerm?: boolean;
    },
  ): Promise<IncomingMessage> {
    return this.request('POST', '/build', { query: options, body: context, idleMs: BUILD_IDLE_MS });
  }

  /** `docker pull` of `repository[:tag]` (default `latest`): its progress stream. */
  pull(reference: string): Promise<IncomingMessage> {
    const slash = reference.lastIndexOf('/');
    const colon = reference.lastIndexOf(':');
    const tagged = colon > slash && !reference.includes('@');
    return this.request('POST', '/images/create', {
      query: {
        fromImage: tagged ? reference.slice(0, colon) : reference,
        tag: tagged ? reference.slice(colon + 1) : reference.includes('@') ? undefined : 'latest',
      },
      idleMs: TRANSFER_IDLE_MS,
    });
  }

  /**
   * The engine's event stream (one JSON object a line), open until it is destroyed. It has no
   * timeout; unref its `socket` so it never keeps a process alive.
   */
  getEvents(options: { filters?: Filters } = {}): Promise<IncomingMessage> {
    return this.request('GET', '/events', { query: options });
  }
}

export class EngineContainer {
  constructor(
    private readonly engine: DockerEngine,
    readonly id: string,
  ) {}

  private get path(): string {
    return `/containers/${segment(this.id)}`;
  }

  inspect(): Promise<ContainerInspectInfo> {
    return this.engine.call('GET', `${this.path}/json`);
  }

  async start(): Promise<void> {
    await this.engine.call('POST', `${this.path}/start`);
  }

  /** `docker stop -t t`: the grace period, then the exchange's own limit. */
  async stop(options: { t?: number } = {}): Promise<void> {
    await this.engine.call('POST', `${this.path}/stop`, {
      query: options,
      deadlineMs: (options.t ?? 10) * 1000 + REQUEST_MS,
    });
  }

  async pause(): Promise<void> {
    await this.engine.call('POST', `${this.path}/pause`);
  }

  async unpause(): Promise<void> {
    await this.engine.call('POST', `${this.path}/unpause`);
  }

  async remove(options: { force?: boolean; v?: boolean } = {}): Promise<void> {
    await this.engine.call('DELETE', this.path, { query: options });
  }

  /** `POST /containers/{id}/wait`: the exit once it ended, within `timeoutMs`. */
  wait(options: { timeoutMs?: number } = {}): Promise<{ StatusCode: number; Error?: unknown }> {
    return this.engine.call('POST', `${this.path}/wait`, {
      deadlineMs: options.timeoutMs ?? WAIT_MS,
    });
  }

  /** The log as the engine keeps it: frames for a non-TTY container (see {@link logText}). */
  async logs(options: { stdout?: boolean; stderr?: boolean; tail?: number } = {}): Promise<Buffer> {
    const res = await this.engine.request('GET', `${this.path}/logs`, {
      query: options,
      idleMs: ARCHIVE_IDLE_MS,
    });
    const chunks: Buffer[] = [];
    for await (const chunk of res) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks);
  }

  /**
   * `docker commit`: `query` the image's name, `pause` and `changes` (Dockerfile lines); `config`
   * the image's configuration (the engine fills what it leaves out from the container's).
   */
  commit(
    query: { repo: string; tag: string; pause?: boolean; changes?: string; comment?: string },
    config?: ContainerConfig,
  ): Promise<{ Id: string }> {
    return this.engine.call('POST', '/commit', {
      query: { container: this.id, ...query },
      ...(config ? { body: config } : {}),
      deadlineMs: COMMIT_MS,
    });
  }

  /** The tar of `path` in the container's file system (404: not there). */
  getArchive(options: { path: string }): Promise<IncomingMessage> {
    return this.engine.request('GET', `${this.path}/archive`, {
      query: options,
      idleMs: ARCHIVE_IDLE_MS,
    });
  }

  /** `HEAD` of an archive: resolves when `path` exists. */
  async infoArchive(options: { path: string }): Promise<void> {
    const res = await this.engine.request('HEAD', `${this.path}/archive`, {
      query: options,
      deadlineMs: REQUEST_MS,
    });
    res.resume();
  }

  /** Unpacks a tar stream at `path` of the container's file system. */
  async putArchive(tar: Readable, options: { path: string }): Promise<void> {
    const res = await this.engine.request('PUT', `${this.path}/archive`, {
      query: options,
      body: tar,
      idleMs: ARCHIVE_IDLE_MS,
    });
    res.resume();
    await new Promise<void>((resolve, reject) => {
      res.once('end', resolve);
      res.once('error', reject);
    });
  }

  /** The container's whole file system as a tar stream. */
  export(): Promise<IncomingMessage> {
    return this.engine.request('GET', `${this.path}/export`, { idleMs: ARCHIVE_IDLE_MS });
  }
}

export class EngineImage {
  constructor(
    private readonly engine: DockerEngine,
    readonly name: string,
  ) {}

  private get path(): string {
    return `/images/${segment(this.name)}`;
  }

  inspect(): Promise<ImageInspectInfo> {
    return this.engine.call('GET', `${this.path}/json`);
  }

  async remove(options: { force?: boolean; noprune?: boolean } = {}): Promise<void> {
    await this.engine.call('DELETE', this.path, { query: options });
  }

  async tag(options: { repo: string; tag: string }): Promise<void> {
    await this.engine.call('POST', `${this.path}/tag`, { query: options });
  }

  /**
   * `docker push` of this reference; `authconfig` goes as `X-Registry-Auth` (base64url JSON; the
   * engine wants the header even for an open registry). Its progress stream.
   */
  push(options: { authconfig: object }): Promise<IncomingMessage> {
    const auth = Buffer.from(JSON.stringify(options.authconfig))
      .toString('base64')
      .replace(/\+/g, '-')
      .replace(/\//g, '_');
    return this.engine.request('POST', `${this.path}/push`, {
      headers: { 'X-Registry-Auth': auth },
      idleMs: TRANSFER_IDLE_MS,
    });
  }
}

export class EngineVolume {
  constructor(
    private readonly engine: DockerEngine,
    readonly name: string,
  ) {}

  inspect(): Promise<VolumeInspectInfo> {
    return this.engine.call('GET', `/volumes/${segment(this.name)}`);
  }

  async remove(): Promise<void> {
    await this.engine.call('DELETE', `/volumes/${segment(this.name)}`);
  }
}
