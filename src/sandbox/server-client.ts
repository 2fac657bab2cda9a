import { createHash, randomBytes } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { readClassRecord } from '../../decorators/records.js';
import {
  ENVD_PORT,
  SANDBOX_RUNTIME_DIR,
  SERVER_STATE_DIR,
} from '../../runtime/protocol/constants.js';
import { validateKwargs } from '../commands/arguments.js';
import type { DecoratedCommand } from '../commands/command-builder.js';
import { commandRegistry } from '../commands/command-registry.js';
import type { CustomCommand } from '../commands/custom-command.js';
import { type CommandDescription, describeCommand } from '../commands/discovery.js';
import type { ShippedCommand } from '../commands/shipped-commands.js';
import {
  CapabilityError,
  errorClassOf,
  RouteNotFoundError,
  SandboxError,
  ServerCommandError,
  ServerNotRunningError,
} from '../errors.js';
import { packageInfo } from '../util/package-info.js';
import { bundleCache, type CommandBundle } from './bundle-cache.js';
import type { AuthoringMode } from './bundler.js';
import type { CommandHandle } from './command-handle.js';
import { Commands } from './commands.js';
import { Filesystem } from './filesystem.js';
import type { HttpClient } from './http-client.js';
import { ProcessApi } from './process-api.js';
import { serverRoute, shellCommand, startServer } from './server-process.js';

type AnyClass = DecoratedCommand['cls'];

/** Options of {@link ServerClient.start}. */
export interface ServerStartOptions {
  /** Port inside the sandbox; default 8080. */
  port?: number;
  /** Decorated classes whose commands to serve (their modules are bundled). */
  commands?: AnyClass[];
  /** Module files (JS or TS) with decorated classes, imported here and bundled. */
  modules?: string[];
  /** Capability groups of the server (`files,process`...); default all. */
  groups?: string | string[];
  /** How long to wait for the server to listen; default 30 s. */
  timeoutMs?: number;
  /** Default timeout of one command call inside the server; default the server's (300 s). */
  commandTimeoutMs?: number;
  /**
   * Stop a running server and start again. Without it, a server already running on the port
   * from the same bundle and options is returned as it is, and any other one is replaced.
   */
  restart?: boolean;
}

/** What a running server's state file in the sandbox holds (so other clients can use it). */
interface ServerState {
  port: number;
  token: string;
  /** envd's id of the server process. */
  pid: string;
  startedAt: string;
  commands: CommandDescription[];
  /** The sandbox that started it (a snapshot's sandboxes inherit the file, not the server). */
  sandboxId?: string;
  /** The command line it runs (token apart): the same bundle and options give the same one. */
  command?: string;
  /** It runs in a process envd started ahead of the start (`server.cjs --prestart`). */
  prestarted?: boolean;
}

/** agent-sandbox's authoring half as this client's package ships it for sandboxes. */
interface AuthoringHalf {
  /** Its file here (`dist/runtime/authoring.cjs`). */
  file: string;
  sha256: string;
  /** Where it goes in the sandbox when the runtime's own is another one. */
  sandboxPath: string;
}

/** A server to start: its bundle, where that goes in the sandbox, and its command line. */
interface Launch {
  port: number;
  bundle: CommandBundle;
  bundlePath: string;
  /** The authoring half the bundle needs from the server (a `shared` bundle). */
  authoring?: AuthoringHalf;
  /** `server.cjs`'s arguments (`POST /exec/server`). */
  args: string[];
  /** The command line: shown in listings, and what tells two servers' bundles and options apart. */
  command: string;
  commands: CommandDescription[];
}

/** What the command server needs of its sandbox. */
export interface ServerHost {
  readonly sandboxId: string;
  capabilities(): Promise<string[]>;
  portClient(port: number, timeoutMs?: number): HttpClient;
  host(port: number): string;
  /** `{scheme}://{port}-{sandboxId}.{domain}[:{gateway}]` (https behind a TLS control plane). */
  url?(port: number): string;
  /**
   * @deprecated Unused: the client starts the server through envd itself
   * (`portClient(ENVD_PORT)`) to follow its output until it listens, and waits for its exit the
   * same way.
   */
  start?(cmd: string, envs: Record<string, string>): Promise<CommandHandle>;
  /** @deprecated Unused, see {@link start}. */
  running?(pid: string): Promise<boolean>;
  kill(pid: string, signal?: NodeJS.Signals): Promise<boolean>;
  readFile(path: string): Promise<string>;
  writeFile(path: string, data: string): Promise<void>;
  removeFile(path: string): Promise<void>;
}

const SERVER_DIR = SERVER_STATE_DIR;
const RUNTIME = `${SANDBOX_RUNTIME_DIR}/server.cjs`;
/** The server's exit status for a `--load` file that is missing or not the expected bytes. */
const BUNDLE_REFUSED = 3;
/** The server's exit status when neither the runtime's authoring half nor `--authoring` fits. */
const AUTHORING_REFUSED = 4;
/** How long stop() lets a server finish its calls in flight (its own grace period) before a kill. */
const STOP_WAIT_MS = 10_000;

/**
 * The command server of one sandbox (`sandbox.server`): start it with your decorated classes,
 * call their commands in one HTTP round trip each, discover them, stop it.
 */
export class ServerClient {
  private state: ServerState | undefined;
  private port = 8080;

  private readonly processes: Commands;
  private readonly api: ProcessApi;
  private readonly files: Filesystem;
  /**
   * The sandbox's envd has no `POST /exec/server` (an older runtime): servers start as shell
   * commands, from bundles that carry their authoring half.
   */
  private legacy = false;

  constructor(private readonly host: ServerHost) {
    const envd = host.portClient(ENVD_PORT);
    this.processes = new Commands(envd);
    this.api = new ProcessApi(envd);
    this.files = new Filesystem(envd);
  }

  /** The server's address through the gateway: `http(s)://{port}-{sandboxId}.{domain}[:{gateway}]`. */
  get url(): string {
    return this.host.url?.(this.port) ?? `http://${this.host.host(this.port)}`;
  }

  /**
   * Bundles the commands (or takes the bundle from the cache while its files are unchanged),
   * writes it into the sandbox unless it is there already, starts the server in the background
   * and waits until it listens. A server already running on that port from the same bundle and
   * options is returned as it is unless `restart` is set; any other one is stopped first.
   */
  async start(options: ServerStartOptions = {}): Promise<this> {
    const port = options.port ?? 8080;
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new SandboxError(`port must be a TCP port (1-65535), not ${port}`);
    }
    // Side by side: the capability check, the bundle and whether the sandbox has it, the server
    // running on the port. A sandbox without ports refuses before anything is started.
    const capabilities = this.host.capabilities();
    const preparing = this.prepare(port, options);
    const uploaded = preparing.then((launch) => this.files.exists(launch.bundlePath));
    const finding = this.find(port);
    for (const pending of [preparing, uploaded, finding]) pending.catch(() => undefined);
    if (!(await capabilities).includes('ports')) {
      throw new CapabilityError(
        `sandbox ${this.host.sandboxId}'s template lacks the ports capability, so a command server in it could not be reached; add ports to the template's capabilities`,
      );
    }
    const [launch, running] = await Promise.all([preparing, finding]);
    if (running && !options.restart && running.command === launch.command) {
      this.port = port;
      this.state = running;
      return this;
    }
    const timeoutMs = options.timeoutMs ?? 30_000;
    const [has] = await Promise.all([uploaded, running && this.shutdown(running)]);
    try {
      this.state = await this.launch(launch, has, timeoutMs);
    } catch (error) {
      if (this.legacy || !(error instanceof RouteNotFoundError)) throw error;
      // An envd of an older runtime: its server.cjs needs the bundle to carry the authoring half.
      this.legacy = true;
      const again = await this.prepare(port, options);
      this.state = await this.launch(again, await this.files.exists(again.bundlePath), timeoutMs);
    }
    this.port = port;
    return this;
  }

  /**
   * Points this client at the server on `port` (one started earlier, by this or another client)
   * and says whether one answers there. Later calls, `discover`, `commands` and `stop` use it.
   */
  async attach(port = 8080): Promise<boolean> {
    if (this.state && this.state.port !== port) this.state = undefined;
    this.port = port;
    return (await this.adopt(port)) !== undefined;
  }

  /** True while a server this client started or adopted answers. */
  get running(): boolean {
    return this.state !== undefined;
  }

  /**
   * Calls a command: kwargs are checked on this side first when the command is known, then sent
   * in one request. An error inside the server becomes {@link ServerCommandError} with the remote
   * error class as `type`.
   */
  async call<T = unknown>(name: string, kwargs: Record<string, unknown> = {}): Promise<T> {
    const state = await this.ensureState();
    const known = state.commands.find((c) => c.name === name);
    if (known) validateKwargs(known as CustomCommand, kwargs);
    try {
      const { result } = await this.client(state).json<{ result: T }>(
        'POST',
        `/commands/${encodeURIComponent(name)}`,
        { body: kwargs, headers: { authorization: `Bearer ${state.token}` } },
      );
      return result;
    } catch (error) {
      throw asServerError(error);
    }
  }

  /** The commands the server serves (`GET /commands`), built-ins included. */
  async discover(): Promise<CommandDescription[]> {
    const state = await this.ensureState();
    try {
      const { commands } = await this.client(state).json<{ commands: CommandDescription[] }>(
        'GET',
        '/commands',
        { headers: { authorization: `Bearer ${state.token}` } },
      );
      return commands;
    } catch (error) {
      throw asServerError(error);
    }
  }

  /** The decorated commands of the running server (no built-ins). */
  async commands(): Promise<CommandDescription[]> {
    return (await this.ensureState()).commands;
  }

  /** Stops the server (it finishes calls in flight first); no-op when none runs. */
  async stop(): Promise<void> {
    const state = this.state ?? (await this.adopt(this.port));
    if (!state) return;
    await this.shutdown(state);
    this.state = undefined;
  }

  /** The modules' bundle and the command line of a server serving them on `port`. */
  private async prepare(port: number, options: ServerStartOptions): Promise<Launch> {
    const modules = (options.modules ?? []).map((module) => resolve(module));
    const classes = [...(options.commands ?? [])];
    for (const module of modules) classes.push(...(await classesOf(module)));
    const decorated = commandRegistry().decoratedOf(classes);
    if (decorated.length === 0 && classes.length > 0) {
      throw new SandboxError(
        'none of the given classes registers a command: decorate them with @sandbox(...) and their methods with @sandbox.register',
      );
    }
    const files = [...new Set([...modules, ...sourceFiles(classes)])];
    const shipped: Record<string, ShippedCommand> = {};
    for (const { command, place } of decorated) {
      shipped[place] = {
        ...describeCommand(command),
        template: command.template,
        ...(command.timeoutMs === undefined ? {} : { timeoutMs: command.timeoutMs }),
      };
    }
    // Per module, the classes to keep when the module is a script and must be cut down to them.
    const kept: Record<string, string[]> = {};
    for (const cls of classes) {
      const file = readClassRecord(cls)?.sourceFile;
      if (file) kept[file] = [...new Set([...(kept[file] ?? []), cls.name])].sort();
    }
    // A bundle of the user's code alone, whose authoring half the server loads (a pre-started
    // server has it loaded already); the whole of it for an older runtime, or a package built
    // without the runtime's authoring half.
    const authoring = this.legacy ? undefined : clientAuthoring();
    const mode: AuthoringMode = authoring ? 'shared' : 'inline';
    const bundle = await bundleCache.bundle(files, shipped, kept, mode);
    // Named by its content: a sandbox (or a snapshot of one) that has it needs no upload.
    const bundlePath = `${SERVER_DIR}/bundles/${bundle.sha256}.cjs`;
    const groups = (
      Array.isArray(options.groups) ? options.groups.join(',') : (options.groups ?? '')
    ).replace(/[^A-Za-z0-9_,-]/g, '');
    const args = [
      ...['--host', '127.0.0.1', '--port', String(port)],
      // Also on the socket the gateway dials for this port: no forwarding hop through envd.
      ...['--socket', `/run/abx/ports/${port}.sock`],
      ...['--load', bundlePath, '--load-sha256', bundle.sha256],
      ...(authoring
        ? ['--authoring', authoring.sandboxPath, '--authoring-sha256', authoring.sha256]
        : []),
      ...(groups ? ['--groups', groups] : []),
      ...(options.commandTimeoutMs
        ? ['--command-timeout-ms', String(Math.round(options.commandTimeoutMs))]
        : []),
    ];
    return {
      port,
      bundle,
      bundlePath,
      ...(authoring ? { authoring } : {}),
      args,
      // Only [A-Za-z0-9_,./-] in the arguments: the line runs in a shell as it is.
      command: `${this.legacy ? 'exec ' : ''}node ${RUNTIME} ${args.join(' ')}`,
      commands: decorated.map(({ command }) => describeCommand(command)),
    };
  }

  /**
   * Uploads the bundle unless the sandbox has it, starts the server (in envd's pre-started
   * runtime process when it has one) and writes its state file while it comes up. A bundle the
   * server finds damaged (exit 3) is uploaded again, once; an authoring half it does not have
   * (exit 4: this client's agent-sandbox differs from the runtime's) is uploaded, once.
   */
  private async launch(launch: Launch, uploaded: boolean, timeoutMs: number): Promise<ServerState> {
    const deadline = Date.now() + timeoutMs;
    if (!uploaded) await this.host.writeFile(launch.bundlePath, launch.bundle.code);
    const refused = new Set<number>();
    for (;;) {
      const token = randomBytes(24).toString('base64url');
      const envs = { ABX_SERVER_TOKEN: token };
      // envd keeps the server's output (for the messages below, and for commands.connect).
      const server = await startServer(
        this.legacy
          ? shellCommand(this.processes, launch.command, envs)
          : serverRoute(this.api, { args: launch.args, command: launch.command, envs }),
        deadline,
      );
      const state: ServerState = {
        port: launch.port,
        token,
        pid: server.pid,
        startedAt: new Date().toISOString(),
        commands: launch.commands,
        sandboxId: this.host.sandboxId,
        command: launch.command,
        prestarted: server.prestarted,
      };
      const stateFile = `${SERVER_DIR}/server-${launch.port}.json`;
      const [ready, written] = await Promise.allSettled([
        server.ready,
        this.host.writeFile(stateFile, JSON.stringify(state)),
      ]);
      if (ready.status === 'fulfilled' && ready.value.state === 'listening') {
        if (written.status === 'fulfilled') return state;
        await this.host.kill(server.pid).catch(() => false);
        throw written.reason;
      }
      if (written.status === 'fulfilled') await this.host.removeFile(stateFile).catch(() => {});
      if (ready.status === 'rejected') throw ready.reason;
      const outcome = ready.value;
      if (outcome.state === 'timeout') {
        throw new SandboxError(
          `the command server did not start listening within ${timeoutMs} ms; its output ends:\n${outcome.output}`,
        );
      }
      if (outcome.state === 'exited') {
        const { exitCode } = outcome;
        if (exitCode === BUNDLE_REFUSED && !refused.has(exitCode)) {
          refused.add(exitCode);
          await this.host.writeFile(launch.bundlePath, launch.bundle.code);
          continue;
        }
        if (exitCode === AUTHORING_REFUSED && launch.authoring && !refused.has(exitCode)) {
          refused.add(exitCode);
          const { file, sandboxPath } = launch.authoring;
          await this.host.writeFile(sandboxPath, readFileSync(file, 'utf8'));
          continue;
        }
        throw new SandboxError(
          `the command server exited (code ${exitCode}) before answering; its output ends:\n${outcome.output}`,
        );
      }
    }
  }

  /**
   * Asks the server to stop and waits for its exit, then kills what is left of its process
   * group and removes its state file. One request follows the process to its exit, from past the
   * end of its output (nothing is replayed).
   */
  private async shutdown(state: ServerState): Promise<void> {
    const end = Number.MAX_SAFE_INTEGER;
    const [following] = await Promise.all([
      this.processes
        .connect(state.pid, { stdoutOffset: end, stderrOffset: end })
        .catch(() => undefined),
      this.client(state)
        .json('POST', '/shutdown', { headers: { authorization: `Bearer ${state.token}` } })
        .catch(() => undefined),
    ]);
    if (following) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        following.wait().catch(() => undefined),
        new Promise((resolve) => {
          timer = setTimeout(resolve, STOP_WAIT_MS);
        }),
      ]);
      clearTimeout(timer);
      following.disconnect();
    }
    await Promise.all([
      this.host.kill(state.pid).catch(() => false),
      this.host.removeFile(`${SERVER_DIR}/server-${state.port}.json`),
    ]);
    if (this.state === state) this.state = undefined;
  }

  private client(state: ServerState): HttpClient {
    return this.host.portClient(state.port);
  }

  private async ensureState(): Promise<ServerState> {
    const state = this.state ?? (await this.adopt(this.port));
    if (!state) {
      throw new ServerNotRunningError(
        `no command server runs in sandbox ${this.host.sandboxId} on port ${this.port}; start one with sandbox.server.start({ commands: [YourClass] })`,
      );
    }
    return state;
  }

  /** Picks up a server started earlier (by this or another client) from its state file. */
  private async adopt(port: number): Promise<ServerState | undefined> {
    const state = await this.find(port);
    if (state) this.state = state;
    else if (this.state?.port === port) this.state = undefined;
    return state;
  }

  /**
   * The healthy server on `port`: the one this client knows, else the one its state file names
   * (unless that file came with a snapshot from another sandbox).
   */
  private async find(port: number): Promise<ServerState | undefined> {
    let state = this.state?.port === port ? this.state : undefined;
    if (!state) {
      try {
        state = JSON.parse(await this.host.readFile(`${SERVER_DIR}/server-${port}.json`));
      } catch {
        return undefined;
      }
    }
    if (!state || (state.sandboxId && state.sandboxId !== this.host.sandboxId)) return undefined;
    return (await this.healthy(state)) ? state : undefined;
  }

  private async healthy(state: ServerState): Promise<boolean> {
    try {
      await this.client(state).json('GET', '/health', { timeoutMs: 5000 });
      return true;
    } catch {
      return false;
    }
  }
}

let authoringCache: { key: string; half: AuthoringHalf } | undefined;

/**
 * This package's authoring half for sandboxes (`dist/runtime/authoring.cjs`), hashed once per
 * version of the file; undefined when the package was built without it.
 */
function clientAuthoring(): AuthoringHalf | undefined {
  const file = join(packageInfo().root, 'dist', 'runtime', 'authoring.cjs');
  let key: string;
  try {
    const { dev, ino, size, mtimeMs, ctimeMs } = statSync(file);
    key = `${dev}:${ino}:${size}:${mtimeMs}:${ctimeMs}`;
  } catch {
    return undefined;
  }
  if (authoringCache?.key !== key) {
    const sha256 = createHash('sha256').update(readFileSync(file)).digest('hex');
    authoringCache = {
      key,
      half: { file, sha256, sandboxPath: `${SERVER_DIR}/authoring/${sha256}.cjs` },
    };
  }
  return authoringCache.half;
}

/**
 * A command's own exception arrives with its own class name as `type` (`RangeError`,
 * `ValueError`), which is none of ours: it becomes a {@link ServerCommandError} keeping that type,
 * status and body. Errors of our protocol (a bad argument, an unknown command, a gateway that
 * could not reach the sandbox) keep their class.
 */
function asServerError(error: unknown): unknown {
  if (!(error instanceof SandboxError) || errorClassOf(error.type) !== undefined) return error;
  return new ServerCommandError(error.message, {
    type: error.type,
    status: error.status,
    ...(error.code === undefined ? {} : { code: error.code }),
    problems: error.problems,
    details: error.details,
    cause: error,
  });
}

function sourceFiles(classes: readonly AnyClass[]): string[] {
  return classes.map((cls) => {
    const file = readClassRecord(cls)?.sourceFile;
    if (!file) {
      throw new SandboxError(
        `cannot tell which file defines ${cls.name || 'a class'}: is it decorated with @sandbox(...)? Pass its module with modules: ['path/to/file.js'] instead`,
      );
    }
    return file;
  });
}

/** Imports a module and returns the decorated classes it registered. */
async function classesOf(module: string): Promise<AnyClass[]> {
  const exports = (await import(pathToFileURL(module).href)) as Record<string, unknown>;
  const exported = Object.values(exports).filter(
    (value): value is AnyClass =>
      typeof value === 'function' && readClassRecord(value) !== undefined,
  );
  // Classes the module defines without exporting them registered themselves on import.
  const defined = commandRegistry()
    .registeredClasses()
    .filter((cls) => readClassRecord(cls)?.sourceFile === module);
  return [...new Set([...exported, ...defined])];
}
