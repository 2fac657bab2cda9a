import { randomBytes } from 'node:crypto';
import { resolve } from 'node:path';
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
  SandboxError,
  ServerCommandError,
  ServerNotRunningError,
} from '../errors.js';
import { bundleCache, type CommandBundle } from './bundle-cache.js';
import type { CommandHandle } from './command-handle.js';
import { Commands } from './commands.js';
import { Filesystem } from './filesystem.js';
import type { HttpClient } from './http-client.js';
import { startServer } from './server-process.js';

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
}

/** A server to start: its bundle, where that goes in the sandbox, and its command line. */
interface Launch {
  port: number;
  bundle: CommandBundle;
  bundlePath: string;
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
  private readonly files: Filesystem;

  constructor(private readonly host: ServerHost) {
    const envd = host.portClient(ENVD_PORT);
    this.processes = new Commands(envd);
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
    const capabilities = await this.host.capabilities();
    if (!capabilities.includes('ports')) {
      throw new CapabilityError(
        `sandbox ${this.host.sandboxId}'s template lacks the ports capability, so a command server in it could not be reached; add ports to the template's capabilities`,
      );
    }
    const [launch, running] = await Promise.all([this.prepare(port, options), this.find(port)]);
    if (running && !options.restart && running.command === launch.command) {
      this.port = port;
      this.state = running;
      return this;
    }
    const [uploaded] = await Promise.all([
      this.files.exists(launch.bundlePath),
      running && this.shutdown(running),
    ]);
    this.state = await this.launch(launch, uploaded, options.timeoutMs ?? 30_000);
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
    const bundle = await bundleCache.bundle(files, shipped, kept);
    // Named by its content: a sandbox (or a snapshot of one) that has it needs no upload.
    const bundlePath = `${SERVER_DIR}/bundles/${bundle.sha256}.cjs`;
    const groups = Array.isArray(options.groups) ? options.groups.join(',') : options.groups;
    const args = [
      RUNTIME,
      '--host 127.0.0.1',
      `--port ${port}`,
      // Also on the socket the gateway dials for this port: no forwarding hop through envd.
      `--socket /run/abx/ports/${port}.sock`,
      `--load ${bundlePath}`,
      `--load-sha256 ${bundle.sha256}`,
      ...(groups ? [`--groups '${groups.replace(/[^A-Za-z0-9_,-]/g, '')}'`] : []),
      ...(options.commandTimeoutMs
        ? [`--command-timeout-ms ${Math.round(options.commandTimeoutMs)}`]
        : []),
    ];
    return {
      port,
      bundle,
      bundlePath,
      command: `exec node ${args.join(' ')}`,
      commands: decorated.map(({ command }) => describeCommand(command)),
    };
  }

  /**
   * Uploads the bundle unless the sandbox has it, starts the server and writes its state file
   * while it comes up. A bundle the server finds damaged (exit 3) is uploaded again, once.
   */
  private async launch(launch: Launch, uploaded: boolean, timeoutMs: number): Promise<ServerState> {
    const deadline = Date.now() + timeoutMs;
    if (!uploaded) await this.host.writeFile(launch.bundlePath, launch.bundle.code);
    for (let attempt = 1; ; attempt++) {
      const token = randomBytes(24).toString('base64url');
      // envd keeps the server's output (for the messages below, and for commands.connect).
      const server = await startServer(
        this.processes,
        launch.command,
        { ABX_SERVER_TOKEN: token },
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
        if (outcome.exitCode === BUNDLE_REFUSED && attempt === 1) {
          await this.host.writeFile(launch.bundlePath, launch.bundle.code);
          continue;
        }
        throw new SandboxError(
          `the command server exited (code ${outcome.exitCode}) before answering; its output ends:\n${outcome.output}`,
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
