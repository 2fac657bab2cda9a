import { createHash, randomBytes } from 'node:crypto';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { readClassRecord } from '../../decorators/records.js';
import { SANDBOX_RUNTIME_DIR, SERVER_STATE_DIR } from '../../runtime/protocol/constants.js';
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
import { bundleCommands } from './bundler.js';
import type { CommandHandle } from './command-handle.js';
import type { HttpClient } from './http-client.js';

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
  /** How long to wait for the server to answer `/health`; default 30 s. */
  timeoutMs?: number;
  /** Default timeout of one command call inside the server; default the server's (300 s). */
  commandTimeoutMs?: number;
  /** Stop a running server and start again (default: return the running one). */
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
}

/** What the command server needs of its sandbox. */
export interface ServerHost {
  readonly sandboxId: string;
  capabilities(): Promise<string[]>;
  portClient(port: number, timeoutMs?: number): HttpClient;
  host(port: number): string;
  /** Starts a background process (no timeout) and follows its output. */
  start(cmd: string, envs: Record<string, string>): Promise<CommandHandle>;
  /** Whether a background process still runs. */
  running(pid: string): Promise<boolean>;
  kill(pid: string, signal?: NodeJS.Signals): Promise<boolean>;
  readFile(path: string): Promise<string>;
  writeFile(path: string, data: string): Promise<void>;
  removeFile(path: string): Promise<void>;
}

const SERVER_DIR = SERVER_STATE_DIR;
const RUNTIME = `${SANDBOX_RUNTIME_DIR}/server.cjs`;
/** Error types that come from the gateway, not from the command server. */
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * The command server of one sandbox (`sandbox.server`): start it with your decorated classes,
 * call their commands in one HTTP round trip each, discover them, stop it.
 */
export class ServerClient {
  private state: ServerState | undefined;
  private port = 8080;

  constructor(private readonly host: ServerHost) {}

  /** The server's address through the gateway: `http://{port}-{sandboxId}.{domain}:{gateway}`. */
  get url(): string {
    return `http://${this.host.host(this.port)}`;
  }

  /**
   * Bundles the commands, writes the bundle into the sandbox, starts the server in the
   * background and waits until it answers. A server already running on that port is returned
   * as it is unless `restart` is set.
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
    const running = await this.adopt(port);
    if (running && !options.restart) {
      this.port = port;
      return this;
    }
    if (running) await this.stop();

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
    const bundle = await bundleCommands(files, shipped);
    const digest = createHash('sha256').update(bundle).digest('hex').slice(0, 12);
    const bundlePath = `${SERVER_DIR}/commands-${digest}.cjs`;
    await this.host.writeFile(bundlePath, bundle);

    const token = randomBytes(24).toString('base64url');
    const groups = Array.isArray(options.groups) ? options.groups.join(',') : options.groups;
    const args = [
      RUNTIME,
      '--host 127.0.0.1',
      `--port ${port}`,
      // Also on the socket the gateway dials for this port: no forwarding hop through envd.
      `--socket /run/abx/ports/${port}.sock`,
      `--load ${bundlePath}`,
      ...(groups ? [`--groups '${groups.replace(/[^A-Za-z0-9_,-]/g, '')}'`] : []),
      ...(options.commandTimeoutMs
        ? [`--command-timeout-ms ${Math.round(options.commandTimeoutMs)}`]
        : []),
    ];
    // envd keeps the server's output (for the log tail below, and for commands.connect).
    const server = await this.host.start(`exec node ${args.join(' ')}`, {
      ABX_SERVER_TOKEN: token,
    });
    try {
      await this.waitHealthy(port, server, options.timeoutMs ?? 30_000);
    } finally {
      server.disconnect();
    }
    this.port = port;
    this.state = {
      port,
      token,
      pid: server.pid,
      startedAt: new Date().toISOString(),
      commands: decorated.map(({ command }) => describeCommand(command)),
    };
    await this.host.writeFile(`${SERVER_DIR}/server-${port}.json`, JSON.stringify(this.state));
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
    await this.client(state)
      .json('POST', '/shutdown', { headers: { authorization: `Bearer ${state.token}` } })
      .catch(() => undefined);
    // The server finishes calls in flight and exits; past 10 s it is killed.
    for (let i = 0; i < 200 && (await this.host.running(state.pid)); i++) await sleep(50);
    await this.host.kill(state.pid).catch(() => false);
    await this.host.removeFile(`${SERVER_DIR}/server-${state.port}.json`);
    this.state = undefined;
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
    if (this.state?.port === port) {
      // The server this client knew may have crashed since: then it is not running.
      if (await this.healthy(this.state)) return this.state;
      this.state = undefined;
    }
    if (this.state) return undefined;
    let state: ServerState;
    try {
      state = JSON.parse(await this.host.readFile(`${SERVER_DIR}/server-${port}.json`));
    } catch {
      return undefined;
    }
    if (!(await this.healthy(state))) return undefined;
    this.state = state;
    return state;
  }

  private async healthy(state: ServerState): Promise<boolean> {
    try {
      await this.client(state).json('GET', '/health', { timeoutMs: 5000 });
      return true;
    } catch {
      return false;
    }
  }

  private async waitHealthy(port: number, server: CommandHandle, timeoutMs: number) {
    const deadline = Date.now() + timeoutMs;
    const client = this.host.portClient(port, 2000);
    const tail = () => `${server.stdout}${server.stderr}`.slice(-2000).trim() || '(no output)';
    while (Date.now() < deadline) {
      if (server.exitCode !== undefined) {
        throw new SandboxError(
          `the command server exited (code ${server.exitCode}) before answering; its output ends:\n${tail()}`,
        );
      }
      try {
        await client.json('GET', '/health');
        return;
      } catch {
        // not listening yet
      }
      await sleep(20);
    }
    await server.kill().catch(() => false);
    throw new SandboxError(
      `the command server did not answer /health within ${timeoutMs} ms; its output ends:\n${tail()}`,
    );
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
