import { validateKwargs } from '../commands/arguments.js';
import type { CustomCommand } from '../commands/custom-command.js';
import { type CommandDescription, describeCommand } from '../commands/discovery.js';
import { renderShellCommand } from '../commands/shell-template.js';
import { ENVD_PORT } from '../control/gateway.js';
import { CommandServer } from './command-server.js';
import { Commands } from './commands.js';
import {
  type ConnectionOptions,
  connectDaemon,
  type DaemonConnection,
} from './daemon-connection.js';
import { CommandNotFoundError, NotFoundError, SandboxError } from './errors.js';
import { Filesystem } from './filesystem.js';
import { HttpClient } from './http-client.js';
import { Templates } from './templates.js';

/** A sandbox as the control plane describes it. */
export interface SandboxInfo {
  sandboxId: string;
  template: string;
  state: 'running' | 'killed' | 'expired' | 'dead';
  metadata: Record<string, string>;
  capabilities: string[];
  createdAt: string;
  expiresAt: string;
  endedAt: string | null;
  endReason: string | null;
}

/** Options of {@link Sandbox.create}. */
export interface SandboxCreateOptions extends ConnectionOptions {
  /** Template name; default `base`. */
  template?: string;
  /** Lifetime before the sandbox is reaped; default the template's `timeout`. */
  timeoutMs?: number;
  /** Environment variables of every process in the sandbox, over the template's. */
  envs?: Record<string, string>;
  /** Your own labels, to find sandboxes with {@link Sandbox.list}. */
  metadata?: Record<string, string>;
}

/** Filter of {@link Sandbox.list}. */
export interface SandboxListFilter extends ConnectionOptions {
  state?: SandboxInfo['state'];
  template?: string;
  metadata?: Record<string, string>;
}

const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;

function controlClient(connection: DaemonConnection, options: ConnectionOptions): HttpClient {
  return new HttpClient(
    connection.info.apiUrl,
    { authorization: `Bearer ${connection.apiKey}` },
    options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
    'the abx daemon',
  );
}

/**
 * A disposable, isolated Linux machine. Create one from a template, run commands and move files
 * in it, and kill it when done (or let it expire).
 *
 * @example
 * const sandbox = await Sandbox.create({ template: 'base' });
 * const { stdout } = await sandbox.commands.run('echo hello');
 * await sandbox.kill();
 */
export class Sandbox {
  readonly sandboxId: string;
  readonly template: string;
  readonly files: Filesystem;
  readonly commands: Commands;
  /** The command server serving your decorated classes from inside this sandbox. */
  readonly server: CommandServer;
  /** The sandbox's access token; the gateway wants it as `X-Access-Token`. */
  readonly accessToken: string;
  private readonly control: HttpClient;
  private readonly connection: DaemonConnection;

  private constructor(
    info: SandboxInfo & { accessToken: string },
    connection: DaemonConnection,
    options: ConnectionOptions,
  ) {
    this.sandboxId = info.sandboxId;
    this.template = info.template;
    this.accessToken = info.accessToken;
    this.connection = connection;
    this.control = controlClient(connection, options);
    const envd = this.portClient(ENVD_PORT, options.requestTimeoutMs);
    this.files = new Filesystem(envd);
    this.commands = new Commands(envd);
    this.server = new CommandServer({
      sandboxId: this.sandboxId,
      capabilities: async () => (await this.getInfo()).capabilities,
      portClient: (port, timeoutMs) => this.portClient(port, timeoutMs),
      host: (port) => this.getHost(port),
      start: (cmd, envs) => this.commands.start(cmd, { envs, timeoutMs: 0, stdin: false }),
      running: async (pid) => (await this.commands.list()).some((p) => p.pid === pid && p.running),
      kill: (pid, signal) => this.commands.kill(pid, signal),
      readFile: (path) => this.files.read(path),
      writeFile: async (path, data) => {
        await this.files.write(path, data);
      },
      removeFile: (path) => this.files.remove(path),
    });
  }

  /**
   * Runs a custom command by name: a YAML command of the template runs in a shell with its
   * arguments substituted (quoted), giving `{ stdout, stderr, exitCode }`; a decorated command is
   * called on the command server (start it first) and gives the method's return value.
   */
  async run(name: string, kwargs: Record<string, unknown> = {}): Promise<unknown> {
    const yaml = (await this.templateCommands()).find((c) => c.name === name);
    if (yaml) {
      const script = renderShellCommand(yaml, validateKwargs(yaml, kwargs));
      return this.commands.run(script, {
        allowNonZeroExit: true,
        ...(yaml.timeoutMs ? { timeoutMs: yaml.timeoutMs } : {}),
      });
    }
    if ((await this.serverCommands()).some((c) => c.name === name)) {
      return this.server.call(name, kwargs);
    }
    throw new CommandNotFoundError(
      name,
      (await this.listCommands()).map((c) => c.name),
    );
  }

  /**
   * The custom commands of this sandbox: its template's YAML commands and the decorated commands
   * of its running command server, merged.
   */
  async listCommands(): Promise<(CommandDescription & { source: 'yaml' | 'decorator' })[]> {
    const yaml = (await this.templateCommands()).map((c) => ({
      ...describeCommand(c),
      source: 'yaml' as const,
    }));
    const decorated = (await this.serverCommands()).map((c) => ({
      ...c,
      source: 'decorator' as const,
    }));
    return [...yaml, ...decorated];
  }

  private async templateCommands(): Promise<CustomCommand[]> {
    return (await Templates.get(this.template, { home: this.connection.home })).customCommands;
  }

  private async serverCommands(): Promise<CommandDescription[]> {
    try {
      return await this.server.commands();
    } catch {
      return [];
    }
  }

  /** Creates a sandbox from a template (starting the local daemon first if none runs). */
  static async create(options: SandboxCreateOptions = {}): Promise<Sandbox> {
    const connection = await connectDaemon(options);
    const info = await controlClient(connection, options).json<
      SandboxInfo & { accessToken: string }
    >('POST', '/v1/sandboxes', {
      body: {
        ...(options.template ? { template: options.template } : {}),
        ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
        ...(options.envs ? { envs: options.envs } : {}),
        ...(options.metadata ? { metadata: options.metadata } : {}),
      },
    });
    return new Sandbox(info, connection, options);
  }

  /** A running sandbox by id, e.g. one created by another process. */
  static async connect(sandboxId: string, options: ConnectionOptions = {}): Promise<Sandbox> {
    const connection = await connectDaemon(options);
    const info = await controlClient(connection, options).json<
      SandboxInfo & { accessToken: string }
    >('POST', `/v1/sandboxes/${encodeURIComponent(sandboxId)}/connect`);
    return new Sandbox(info, connection, options);
  }

  /** Sandboxes of this installation, filtered by state, template and metadata. */
  static async list(filter: SandboxListFilter = {}): Promise<SandboxInfo[]> {
    const connection = await connectDaemon(filter);
    const query: Record<string, string> = {};
    if (filter.state) query.state = filter.state;
    if (filter.template) query.template = filter.template;
    for (const [key, value] of Object.entries(filter.metadata ?? {}))
      query[`metadata.${key}`] = value;
    const { sandboxes } = await controlClient(connection, filter).json<{
      sandboxes: SandboxInfo[];
    }>('GET', '/v1/sandboxes', { query });
    return sandboxes;
  }

  /** Kills a sandbox by id; false when it had already ended. */
  static async kill(sandboxId: string, options: ConnectionOptions = {}): Promise<boolean> {
    const connection = await connectDaemon(options);
    const { killed } = await controlClient(connection, options).json<{ killed: boolean }>(
      'DELETE',
      `/v1/sandboxes/${encodeURIComponent(sandboxId)}`,
    );
    return killed;
  }

  /** Kills this sandbox and every process in it; false when it had already ended. */
  kill(): Promise<boolean> {
    return Sandbox.kill(this.sandboxId, { home: this.connection.home });
  }

  /** Sets the time left before the sandbox is reaped, counted from now. */
  async setTimeout(timeoutMs: number): Promise<void> {
    await this.control.json('POST', `/v1/sandboxes/${this.sandboxId}/timeout`, {
      body: { timeoutMs },
    });
  }

  async getInfo(): Promise<SandboxInfo> {
    return this.control.json<SandboxInfo>('GET', `/v1/sandboxes/${this.sandboxId}`);
  }

  async isRunning(): Promise<boolean> {
    return (await this.getInfo()).state === 'running';
  }

  /** The host name of a port of this sandbox: `{port}-{sandboxId}.{domain}:{gatewayPort}`. */
  getHost(port: number): string {
    const gateway = new URL(this.connection.info.gatewayUrl);
    return `${port}-${this.sandboxId}.${this.connection.info.domain}:${gateway.port}`;
  }

  /**
   * An HTTP client for a port inside the sandbox, through the gateway. It names the sandbox with
   * headers (no DNS needed for `*.localhost`) and explains a failed call by the sandbox's state.
   */
  portClient(port: number, timeoutMs = DEFAULT_REQUEST_TIMEOUT_MS): HttpClient {
    return new HttpClient(
      this.connection.info.gatewayUrl,
      {
        'x-sandbox-id': this.sandboxId,
        'x-sandbox-port': String(port),
        'x-access-token': this.accessToken,
      },
      timeoutMs,
      `sandbox ${this.sandboxId}`,
      async (error) => {
        const info = await this.getInfo();
        if (info.state !== 'running') {
          return new NotFoundError(
            `sandbox ${this.sandboxId} stopped during the call (${info.state}: ${info.endReason})`,
            { cause: error },
          );
        }
        return error instanceof SandboxError ? error : undefined;
      },
    );
  }
}
