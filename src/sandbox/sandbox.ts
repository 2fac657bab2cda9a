import {
  ACCESS_TOKEN_HEADER,
  ENVD_PORT,
  SANDBOX_ID_HEADER,
  SANDBOX_PORT_HEADER,
  SANDBOX_USER_HEADER,
} from '../../runtime/protocol/constants.js';
import type { SandboxInfo, TemplateInfo } from '../../runtime/protocol/wire.js';
import { BaseSandbox } from '../agent/base-sandbox.js';
import { perFile } from '../agent/per-file.js';
import type { ToolRunner } from '../agent/tool-runner.js';
import type { SandboxTool } from '../agent/tool-types.js';
import { type SandboxToolsOptions, sandboxTools } from '../agent/tools.js';
import type {
  ExecuteOptions,
  ExecuteResponse,
  FileDownloadResponse,
  FileOperationError,
  FileUploadResponse,
} from '../agent/types.js';
import { validateKwargs } from '../commands/arguments.js';
import type { CustomCommand } from '../commands/custom-command.js';
import { type CommandDescription, describeCommand } from '../commands/discovery.js';
import { renderShellCommand } from '../commands/shell-template.js';
import {
  CommandNotFoundError,
  CommandTimeoutError,
  InvalidArgumentError,
  InvalidPathError,
  NotFoundError,
  PermissionDeniedError,
  SandboxError,
  SandboxNotFoundError,
  SandboxPausedError,
  ServerNotRunningError,
} from '../errors.js';
import type { ControlConnection } from '../installation/control-connection.js';
import type { ConnectionOptions } from '../installation/daemon-connection.js';
import type { JsonClient } from '../installation/json-client.js';
import { sandboxUrl } from '../installation/public-listen.js';
import type { WorkspaceChange } from '../workspace/types.js';
import {
  type CodeContext,
  CodeContexts,
  type CodeLanguage,
  type Execution,
  type RunCodeOptions,
  runCode,
} from './code.js';
import { Commands } from './commands.js';
import { envdToolRunner } from './envd-tool-runner.js';
import { Filesystem } from './filesystem.js';
import { daemonClient, HttpClient } from './http-client.js';
import {
  applyWorkspace,
  type ConnectedSandbox,
  connectSandbox,
  controlClient,
  createSandbox,
  DEFAULT_REQUEST_TIMEOUT_MS,
  forkSandbox,
  getSandboxInfo,
  getSandboxMetrics,
  getSandboxNetwork,
  getWorkspaceChanges,
  getWorkspaceDiff,
  getWorkspaceInfo,
  killSandbox,
  listSandboxes,
  type NetworkInfo,
  type NetworkPolicy,
  openControl,
  pauseSandbox,
  resumeSandbox,
  type SandboxListFilter,
  type SandboxMetric,
  setSandboxNetwork,
  setSandboxTimeout,
  snapshotSandbox,
  type WorkspaceApplyRequest,
  type WorkspaceApplyResult,
  type WorkspaceRequest,
} from './sandbox-api.js';
import {
  readSandboxAudit,
  type SandboxAuditOptions,
  type SandboxAuditPage,
} from './sandbox-audit.js';
import {
  type FollowEventsOptions,
  followSandboxEvents,
  readSandboxEvents,
  type SandboxEventPage,
  type SandboxEventsOptions,
  type SandboxLifecycleEvent,
} from './sandbox-events.js';
import {
  followSandboxLogs,
  readSandboxLogs,
  type SandboxLogLine,
  type SandboxLogsOptions,
} from './sandbox-logs.js';
import { ServerClient } from './server-client.js';
import { Templates } from './templates.js';
import { type VolumeMounts, volumeMountList } from './volume.js';
import {
  applyLocal,
  UPLOAD_TIMEOUT_MS,
  uploadFolder,
  type WorkspaceApplyLocalRequest,
} from './workspace-upload.js';

export type { SandboxInfo };

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
  /**
   * Egress by policy (the `internet` network, docs/network.md), replacing the template's lists:
   * CIDRs, domain names and `*.` wildcards; an allow entry wins over a deny entry. `egressProxy`
   * sends what the policy allows through your own SOCKS5 proxy.
   *
   * @example
   * await Sandbox.create({ network: { allowOut: ['pypi.org', '*.pythonhosted.org'], denyOut: ['0.0.0.0/0'] } });
   */
  network?: NetworkPolicy;
  /** E2B's switch: true gives the `internet` network; false denies every address but `allowOut`'s. */
  allowInternetAccess?: boolean;
  /**
   * At its timeout the sandbox pauses instead of dying (E2B's `autoPause`): frozen with its
   * memory, or hibernated with `autoPauseMemory: false` (the daemon's default otherwise:
   * `ABX_AUTO_PAUSE_MEMORY`, true). It is removed after the daemon's paused timeout (30 days).
   */
  autoPause?: boolean;
  autoPauseMemory?: boolean;
  /**
   * With `autoPause`: a request for the paused sandbox through the gateway (a command, a file, a
   * port of it) resumes it first, as E2B's `autoResume` does; without it such a request gets 409
   * (the SDK's own calls resume it either way).
   */
  autoResume?: boolean;
  /**
   * Volumes to mount (docs/volumes.md): `[{ name, path, readOnly? }]`, or E2B's map of path to
   * volume (or name). Paths go in a folder inside the home, /tmp or /mnt.
   *
   * @example
   * await Sandbox.create({ volumeMounts: [{ name: 'data', path: '/mnt/data' }] });
   */
  volumeMounts?: VolumeMounts;
  /**
   * A folder of the daemon's host mounted copy-on-write (docs/workspaces.md): the sandbox sees it
   * at `path` (default `/home/user/workspace`), writable; its writes stay in a layer of its own
   * and the host folder is never written. Review them with `sandbox.workspace`. Local provider on
   * a root daemon, admin keys (or the daemon's own user) only, for now.
   *
   * @example
   * const box = await Sandbox.create({ workspace: { from: '/home/me/repo' } });
   * // … the agent works in /home/user/workspace …
   * console.log(await box.workspace.diff());
   */
  workspace?: WorkspaceRequest;
}

/** A sandbox's workspace, reviewed (see {@link SandboxCreateOptions.workspace}). */
export interface SandboxWorkspace {
  /** What changed against the host folder, sorted by path; `.git` left out. */
  changes(): Promise<WorkspaceChange[]>;
  /** The changes as a git patch (`git apply` takes it), decoded as UTF-8. */
  diff(): Promise<string>;
  /**
   * Writes the changes (or `paths` of them) into the host folder, each file atomically, as the
   * folder's owner; refused, naming each path, for what is never applied and (unless `force`)
   * for host edits made since the sandbox started. `dryRun`: check only.
   */
  apply(request?: WorkspaceApplyRequest): Promise<WorkspaceApplyResult>;
  /**
   * For a workspace uploaded from this machine (`workspace: { from, upload: true }`): writes the
   * changes into the folder here (`dir`, default the one uploaded), with the same refusals and
   * conflict rule as {@link apply} (an edit made there since the upload is a conflict unless
   * `force`). The changed files are downloaded; nothing else is.
   */
  applyLocal(request?: WorkspaceApplyLocalRequest): Promise<WorkspaceApplyResult>;
}

export type { SandboxListFilter };

function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new InvalidArgumentError(`port must be a TCP port (1-65535), not ${port}`);
  }
}

/** Exit code {@link Sandbox.execute} reports for a command killed by its timeout. */
const TIMEOUT_EXIT_CODE = 124;

/** How envd's follow stream marks output it no longer holds (see CommandHandle). */
const DROPPED_OUTPUT = /^\[abx: \d+ earlier bytes of (stdout|stderr) were dropped/;

/** What an errno (the `code` of envd's file errors) means for one file of a batch. */
const ERRNO_CODES: Record<string, FileOperationError | 'not_a_regular_file'> = {
  EISDIR: 'is_directory',
  not_a_regular_file: 'not_a_regular_file',
  EACCES: 'permission_denied',
  EPERM: 'permission_denied',
  EROFS: 'permission_denied',
  ENOENT: 'file_not_found',
  ENOTDIR: 'invalid_path',
  EEXIST: 'invalid_path',
  ENAMETOOLONG: 'invalid_path',
  EINVAL: 'invalid_path',
};

/**
 * The per-file error code of a failed envd file call, or undefined when the failure is not about
 * the file (the sandbox stopped, the network failed): decided by the error's class and `code`.
 */
function fileErrorCode(error: unknown): FileOperationError | 'not_a_regular_file' | undefined {
  if (!(error instanceof SandboxError) || error instanceof SandboxNotFoundError) return undefined;
  const byCode = error.code === undefined ? undefined : ERRNO_CODES[error.code];
  if (byCode) return byCode;
  if (error instanceof NotFoundError) return 'file_not_found';
  if (error instanceof PermissionDeniedError) return 'permission_denied';
  if (error instanceof InvalidPathError) return 'invalid_path';
  return undefined;
}

/**
 * A disposable, isolated Linux machine. Create one from a template, run commands and move files
 * in it, and kill it when done (or let it expire).
 *
 * It is a {@link BaseSandbox}: `read`, `write`, `edit`, `ls`, `grep`, `glob`, `delete`,
 * `execute`... give an agent its file tools on this sandbox. They are answered by envd itself
 * (one HTTP round trip, no process per call, no Node.js needed in the image); see
 * {@link fileTools}.
 *
 * @example
 * const sandbox = await Sandbox.create({ template: 'base' });
 * const { stdout } = await sandbox.commands.run('echo hello');
 * await sandbox.kill();
 */
export class Sandbox extends BaseSandbox {
  readonly sandboxId: string;
  readonly template: string;
  readonly files: Filesystem;
  readonly commands: Commands;
  /** Its workspace's changes, when it was created with one (`workspace: { from }`). */
  readonly workspace: SandboxWorkspace;
  /** The command server serving your decorated classes from inside this sandbox. */
  readonly server: ServerClient;
  private rootTools?: { commands: Commands; files: Filesystem };
  /** The sandbox's access token; the gateway wants it as `X-Access-Token`. */
  readonly accessToken: string;
  /**
   * How `read`, `edit`, `ls`, `grep`, `glob` and `delete` reach the sandbox: `'native'` (the
   * default) asks envd; `'execute'` runs a small node program per call through {@link execute},
   * as any {@link BaseSandbox} does. Both give the same results; `'execute'` is slower and needs
   * `node` in the sandbox (it is there for comparison and tests).
   */
  fileTools: 'native' | 'execute' = 'native';
  private readonly control: JsonClient;
  private readonly connection: ControlConnection;
  /** How this sandbox was reached, to reach the same control plane again (kill, templates). */
  private readonly options: ConnectionOptions;
  /** The gateway's origin as clients see it, its host the sandbox domain. */
  private readonly gatewayOrigin: string;
  private readonly envdTools: ToolRunner;

  private constructor(
    info: ConnectedSandbox,
    connection: ControlConnection,
    options: ConnectionOptions,
  ) {
    super();
    this.sandboxId = info.sandboxId;
    this.template = info.template;
    this.accessToken = info.accessToken;
    this.connection = connection;
    this.options = connection.home === undefined ? options : { ...options, home: connection.home };
    const local = connection.local;
    this.gatewayOrigin =
      local?.remote?.publicGatewayUrl ??
      info.gatewayUrl ??
      `http://${local?.domain ?? 'localhost'}:${new URL(local?.gatewayUrl ?? 'http://localhost').port}`;
    this.control = controlClient(connection, options);
    const envd = this.portClient(ENVD_PORT, options.requestTimeoutMs);
    this.files = new Filesystem(envd);
    this.envdTools = envdToolRunner(envd);
    this.commands = new Commands(envd);
    this.workspace = {
      changes: () => getWorkspaceChanges(this.control, this.sandboxId),
      diff: () => getWorkspaceDiff(this.control, this.sandboxId),
      apply: (request = {}) => applyWorkspace(this.control, this.sandboxId, request),
      applyLocal: async ({ dir, ...request } = {}) => {
        const uploaded = (options as SandboxCreateOptions).workspace;
        const folder = dir ?? (uploaded?.upload === true ? uploaded.from : undefined);
        if (folder === undefined) {
          throw new InvalidArgumentError(
            'applyLocal: name the folder to write (dir): this Sandbox object did not upload one',
          );
        }
        return applyLocal(
          {
            info: () => getWorkspaceInfo(this.control, this.sandboxId),
            changes: () => getWorkspaceChanges(this.control, this.sandboxId),
            read: (path) => this.files.read(path, { format: 'stream' }),
          },
          folder,
          request,
        );
      },
    };
    this.server = new ServerClient({
      sandboxId: this.sandboxId,
      capabilities: async () => (await this.getInfo()).capabilities,
      portClient: (port, timeoutMs) => this.portClient(port, timeoutMs),
      host: (port) => this.getHost(port),
      url: (port) => this.getUrl(port),
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

  /** The sandbox id ({@link sandboxId}), as {@link BaseSandbox} names it. */
  /**
   * Commands and files as root inside the sandbox, for a sandbox whose template allows root
   * (`allow_root: true`, an image template on the local provider with a root daemon): root of the
   * sandbox's own user namespace, an unprivileged uid on the host (docs/security.md). Elsewhere
   * each call is refused with a {@link PermissionDeniedError} saying why. Root's processes are
   * its own envd's: `sandbox.root.commands.list()` lists them, `sandbox.commands.list()` does not.
   *
   * @example
   * await sandbox.root.commands.run('apt-get install -y jq');
   * await sandbox.root.files.write('/etc/motd', 'hello');
   */
  get root(): { commands: Commands; files: Filesystem } {
    if (!this.rootTools) {
      const envd = this.portClient(ENVD_PORT, this.options.requestTimeoutMs, {
        [SANDBOX_USER_HEADER]: 'root',
      });
      this.rootTools = { commands: new Commands(envd), files: new Filesystem(envd) };
    }
    return this.rootTools;
  }

  get id(): string {
    return this.sandboxId;
  }

  /** envd's file tools, unless {@link fileTools} asks for the execute() path. */
  protected override toolRunner(): ToolRunner {
    return this.fileTools === 'execute' ? super.toolRunner() : this.envdTools;
  }

  /**
   * Runs a shell command in the sandbox (envd, `/bin/sh -c`, the template's workdir) and gives
   * stdout and stderr combined in arrival order. A non-zero exit is a result; a timeout (default
   * 60 s) kills the command's process group and gives exit code 124 with a note in the output.
   */
  async execute(command: string, options: ExecuteOptions = {}): Promise<ExecuteResponse> {
    let output = '';
    let truncated = false;
    const append = (data: string) => {
      if (DROPPED_OUTPUT.test(data)) truncated = true;
      output += data;
    };
    try {
      const result = await this.commands.run(command, {
        allowNonZeroExit: true,
        onStdout: append,
        onStderr: append,
        ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
      });
      return { output, exitCode: result.exitCode, truncated };
    } catch (error) {
      if (!(error instanceof CommandTimeoutError)) throw error;
      const note = `Error: command ${error.result.error ?? 'timed out'}`;
      output += `${output && !output.endsWith('\n') ? '\n' : ''}${note}`;
      return { output, exitCode: TIMEOUT_EXIT_CODE, truncated };
    }
  }

  /**
   * Writes files through envd (atomically, creating parents). Per-file failures come back as
   * error codes; a failure of the sandbox itself (it stopped) throws.
   */
  async uploadFiles(files: [string, Uint8Array][]): Promise<FileUploadResponse[]> {
    return perFile(
      files,
      ([path]) => path,
      (path) => ({ path, error: 'invalid_path' }),
      async ([, content], path): Promise<FileUploadResponse> => {
        try {
          await this.files.write(path, content);
          return { path, error: null };
        } catch (error) {
          const code = fileErrorCode(error);
          if (code === undefined) throw error;
          // A missing or non-directory parent means the path cannot name a file.
          const mapped =
            code === 'file_not_found' || code === 'not_a_regular_file' ? 'invalid_path' : code;
          return { path, error: mapped };
        }
      },
    );
  }

  /** Reads files through envd; per-file failures come back as error codes. */
  async downloadFiles(paths: string[]): Promise<FileDownloadResponse[]> {
    return perFile(
      paths,
      (path) => path,
      (path) => ({ path, content: null, error: 'invalid_path' }),
      async (path): Promise<FileDownloadResponse> => {
        try {
          return { path, content: await this.files.read(path, { format: 'bytes' }), error: null };
        } catch (error) {
          let code = fileErrorCode(error);
          if (code === undefined) {
            // An error without a file code (e.g. a stream cut mid-read): if the sandbox still
            // stats the same path, the file was the problem, not the sandbox.
            const type = await this.pathType(path);
            if (type === undefined) throw error;
            code = type === 'directory' ? 'is_directory' : 'permission_denied';
          }
          if (code === 'not_a_regular_file') {
            const type = await this.pathType(path);
            code = type === 'directory' ? 'is_directory' : 'invalid_path';
          }
          return { path, content: null, error: code };
        }
      },
    );
  }

  /** The type of a path as envd stats it, or undefined when that fails too. */
  private pathType(path: string): Promise<string | undefined> {
    return this.files.stat(path).then(
      (s) => s.type,
      () => undefined,
    );
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
    throw CommandNotFoundError.of(
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
    return (await Templates.get(this.template, this.options)).customCommands;
  }

  /** The decorated commands of the running command server; none when no server runs. */
  private async serverCommands(): Promise<CommandDescription[]> {
    try {
      return await this.server.commands();
    } catch (error) {
      if (error instanceof ServerNotRunningError) return [];
      throw error;
    }
  }

  /** This sandbox's custom commands and file tools as LLM tools (see {@link sandboxTools}). */
  tools(options?: SandboxToolsOptions): Promise<SandboxTool[]> {
    return sandboxTools(this, options);
  }

  /**
   * Creates a sandbox from a template: on the control plane of `apiUrl` / `ABX_API_URL`, else on
   * the local daemon (started first if none runs).
   */
  static async create(options: SandboxCreateOptions = {}): Promise<Sandbox> {
    const { connection, client } = await openControl(options);
    const { workspace } = options;
    // A folder of this machine goes first (docs/workspaces.md, "From a remote client").
    const uploaded =
      workspace?.upload === true
        ? {
            upload: (
              await uploadFolder(
                daemonClient(connection, UPLOAD_TIMEOUT_MS),
                workspace.from,
                workspace.gitignore === true,
              )
            ).uploadId,
            ...(workspace.path ? { path: workspace.path } : {}),
          }
        : workspace;
    const spec = {
      ...options,
      volumeMounts: volumeMountList(options.volumeMounts),
      ...(uploaded ? { workspace: uploaded } : {}),
    };
    return new Sandbox(await createSandbox(client, spec), connection, options);
  }

  /**
   * A running sandbox by id, e.g. one created by another process or on another host (with
   * `apiUrl` / `ABX_API_URL`, the gateway's address comes from the control plane). A paused one
   * is resumed first, as E2B's `connect` does.
   */
  static async connect(sandboxId: string, options: ConnectionOptions = {}): Promise<Sandbox> {
    const { connection, client } = await openControl(options);
    return new Sandbox(await connectSandbox(client, sandboxId), connection, options);
  }

  /**
   * Sandboxes of this installation, oldest first: the running and paused ones, or those of `state` (one or
   * several; `all: true` for every state, ended ones included), filtered by template and
   * metadata.
   *
   * @example
   * await Sandbox.list(); // running and paused
   * await Sandbox.list({ state: ['killed', 'expired', 'dead'] }); // ended
   * await Sandbox.list({ all: true, metadata: { user: 'alice' } });
   */
  static async list(filter: SandboxListFilter = {}): Promise<SandboxInfo[]> {
    return listSandboxes((await openControl(filter)).client, filter);
  }

  /** Kills a sandbox by id; false when it had already ended. */
  static async kill(sandboxId: string, options: ConnectionOptions = {}): Promise<boolean> {
    return killSandbox((await openControl(options)).client, sandboxId);
  }

  /** Kills this sandbox and every process in it; false when it had already ended. */
  kill(): Promise<boolean> {
    // Connects afresh: the daemon may have been restarted since this object was made.
    return Sandbox.kill(this.sandboxId, this.options);
  }

  /**
   * Kills the sandbox when an `await using box = await Sandbox.create()` goes out of scope, also
   * when the code in that scope throws. A sandbox already gone is no error.
   */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }

  /**
   * Replaces this internet sandbox's egress policy; new connections and DNS questions follow it
   * at once (open connections go on). The sandbox's info shows it as `network`.
   */
  async setNetwork(policy: NetworkPolicy): Promise<SandboxInfo> {
    return setSandboxNetwork(this.control, this.sandboxId, policy);
  }

  /**
   * This internet sandbox's policy and what its egress allowed and refused: counts of DNS
   * questions, HTTP requests and TLS dials, and the latest decisions with the rule of each.
   */
  async getNetwork(): Promise<NetworkInfo> {
    return getSandboxNetwork(this.control, this.sandboxId);
  }

  /**
   * This running sandbox's use over time, oldest first: CPU (a percent of its `cpuCount`),
   * memory, disk and processes, sampled by the daemon every 5 s (the last hour kept), between
   * `start` and `end` (Dates or ms since the epoch, both included). E2B's `getMetrics` with
   * ISO 8601 timestamps, as every time abx answers.
   *
   * @example
   * const [last] = (await sandbox.getMetrics()).slice(-1);
   * console.log(`${last.cpuUsedPct}% of ${last.cpuCount} cores, ${last.memUsed} bytes`);
   */
  async getMetrics(
    range: { start?: Date | number; end?: Date | number } = {},
  ): Promise<SandboxMetric[]> {
    return getSandboxMetrics(this.control, this.sandboxId, range);
  }

  /**
   * This sandbox's log: its template's start command's output (stdout `info`, stderr `error`),
   * envd's own lines and the processes it starts and ends, with a timestamp and a level each; the
   * newest 10 000 lines and 1 MiB are kept, also after it ends (E2B's sandbox logs; docs/logs.md).
   *
   * @example
   * for (const line of await sandbox.logs({ level: 'warn' })) console.log(line.message);
   */
  logs(options: SandboxLogsOptions = {}): Promise<SandboxLogLine[]> {
    return readSandboxLogs(this.control, this.sandboxId, options);
  }

  /**
   * This sandbox's audit trail, one page by `seq`: what the daemon saw done to and from it —
   * commands started (and, through E2B's face, their exit), files written and removed through the
   * API, port links issued, and every egress connection with its verdict and rule (docs/events.md,
   * "Audit trail"). Kept as long as lifecycle events; readable after the sandbox ends.
   *
   * @example
   * const { audit } = await sandbox.audit({ kind: 'egress' });
   * for (const row of audit) if (row.data.verdict === 'denied') console.log(row.data.name);
   */
  audit(options: SandboxAuditOptions = {}): Promise<SandboxAuditPage> {
    return readSandboxAudit(this.control, this.sandboxId, options);
  }

  /**
   * This sandbox's lifecycle events, one page by `seq`: created, updated (timeout, network),
   * paused, resumed, checkpointed (a snapshot), killed (with why), and abx's expiring (its
   * timeout is near); each written with the change it records (docs/events.md). Readable after
   * it ends, for the events' retention (7 days by default).
   *
   * @example
   * const { events } = await sandbox.events();
   * for (const e of events) console.log(e.at, e.type, e.data);
   */
  events(options: Omit<SandboxEventsOptions, 'sandboxId'> = {}): Promise<SandboxEventPage> {
    return readSandboxEvents(this.control, { ...options, sandboxId: this.sandboxId });
  }

  /**
   * Lifecycle events of the key's sandboxes (an admin key: every sandbox's), one page by `seq`;
   * `sandboxId` for one sandbox's (see {@link Sandbox.events}).
   *
   * @example
   * let cursor: number | undefined;
   * do {
   *   const page = await Sandbox.events({ type: 'sandbox.lifecycle.killed', cursor });
   *   for (const e of page.events) console.log(e.sandboxId, e.data.reason);
   *   cursor = page.more ? (page.cursor ?? undefined) : undefined;
   * } while (cursor !== undefined);
   */
  static async events(
    options: SandboxEventsOptions & ConnectionOptions = {},
  ): Promise<SandboxEventPage> {
    return readSandboxEvents((await openControl(options)).client, options);
  }

  /**
   * Lifecycle events of the key's sandboxes as they are recorded (from now, or after
   * `options.after`), resuming by itself where it was when the connection drops: none is missed
   * or repeated. Ends when `signal` aborts.
   *
   * @example
   * for await (const e of Sandbox.followEvents({ signal })) console.log(e.type, e.sandboxId);
   */
  static async *followEvents(
    options: FollowEventsOptions & ConnectionOptions = {},
  ): AsyncGenerator<SandboxLifecycleEvent> {
    yield* followSandboxEvents((await openControl(options)).connection, options);
  }

  /** This sandbox's lifecycle events as they are recorded (see {@link Sandbox.followEvents}). */
  followEvents(
    options: Omit<FollowEventsOptions, 'sandboxId'> = {},
  ): AsyncGenerator<SandboxLifecycleEvent> {
    return followSandboxEvents(this.connection, { ...options, sandboxId: this.sandboxId });
  }

  /** A sandbox's audit trail by id, running or ended (see {@link Sandbox.audit}). */
  static async audit(
    sandboxId: string,
    options: SandboxAuditOptions & ConnectionOptions = {},
  ): Promise<SandboxAuditPage> {
    return readSandboxAudit((await openControl(options)).client, sandboxId, options);
  }

  /** A sandbox's log by id, running or ended (see {@link Sandbox.logs}). */
  static async logs(
    sandboxId: string,
    options: SandboxLogsOptions & ConnectionOptions = {},
  ): Promise<SandboxLogLine[]> {
    return readSandboxLogs((await openControl(options)).client, sandboxId, options);
  }

  /**
   * The lines of this sandbox's log, the kept ones first, then each new one as it comes; ends
   * when the sandbox ends or `signal` aborts.
   *
   * @example
   * for await (const line of sandbox.followLogs({ signal })) console.log(line.message);
   */
  followLogs(
    options: Omit<SandboxLogsOptions, 'direction'> & { signal?: AbortSignal } = {},
  ): AsyncGenerator<SandboxLogLine> {
    return followSandboxLogs(this.connection, this.sandboxId, options);
  }

  /**
   * Pauses this sandbox. By default it is frozen: every process stops where it is, its memory
   * kept, using no CPU, until {@link resume} (open connections and code contexts included).
   * `{ memory: false }` hibernates it: its processes end and their memory is freed, while its
   * disk (home, /tmp, an image's changes) and environment are kept; a resume starts it again on
   * them. A paused sandbox keeps its id and token, counts against no key's limit, and is removed
   * after the daemon's paused timeout (30 days). Calls through this object (commands, files,
   * ports) resume it by themselves. False when it was paused already (as E2B's `pause`).
   *
   * @example
   * await sandbox.pause({ memory: false }); // back after lunch
   * await sandbox.resume();
   */
  async pause(options: { memory?: boolean } = {}): Promise<boolean> {
    try {
      await pauseSandbox(this.control, this.sandboxId, options);
      return true;
    } catch (error) {
      if (error instanceof SandboxPausedError && error.code === 'already_paused') return false;
      throw error;
    }
  }

  /**
   * Runs this paused sandbox again, for `timeoutMs` from now (default: its template's timeout).
   * False when it was running already.
   */
  async resume(options: { timeoutMs?: number } = {}): Promise<boolean> {
    return (await resumeSandbox(this.control, this.sandboxId, options)).resumed;
  }

  /**
   * Forks this sandbox (running or paused): `count` (1-10, default 1) new running sandboxes, each
   * on a copy of its disk (home, /tmp, an image's changes) taken in an instant while it was
   * frozen. Its processes are not copied: a fork starts with only envd running. Each fork has its
   * own id, token and lifetime (`timeoutMs`, default its template's) and this one's network
   * policy, environment and metadata (`metadata` added over it); it counts against the key's
   * limit. All start or none.
   *
   * @example
   * const [a, b] = await sandbox.fork({ count: 2 }); // try two ideas from the same files
   */
  async fork(
    options: { count?: number; timeoutMs?: number; metadata?: Record<string, string> } = {},
  ): Promise<Sandbox[]> {
    const forks = await forkSandbox(this.control, this.sandboxId, options);
    return forks.map((info) => new Sandbox(info, this.connection, this.options));
  }

  /** Sets the time left before the sandbox is reaped, counted from now. */
  async setTimeout(timeoutMs: number): Promise<void> {
    await setSandboxTimeout(this.control, this.sandboxId, timeoutMs);
  }

  /**
   * Saves this sandbox as the template `name`: new sandboxes of `name` start from its current
   * home folder (and, on a provider that runs images, its whole filesystem), with its template's
   * settings. Snapshots list with templates and are removed the same way. The snapshot belongs
   * to this client's API key: only that key and admin keys list it and create from it (an admin
   * shares it with `Templates.publish`). An existing template of that name that is the key's own
   * is replaced; another key's name is refused (`TemplateConflictError`).
   *
   * @example
   * await sandbox.commands.run('pip install pandas && python prepare.py');
   * await sandbox.snapshot({ name: 'prepared' });
   * const next = await Sandbox.create({ template: 'prepared' });
   */
  async snapshot(options: { name: string }): Promise<TemplateInfo> {
    return snapshotSandbox(this.control, this.sandboxId, options.name);
  }

  /**
   * Runs code in a stateful context (E2B Code Interpreter's shape): variables, imports and the
   * working directory persist from one call to the next in the same context; the default context
   * of each language is made on first use. The value of the last expression comes back as the
   * main result (its text, and HTML, PNG... when it has them); matplotlib figures as PNG results.
   * Output and results reach the callbacks while the code runs.
   *
   * @example
   * await sandbox.runCode('import pandas as pd; df = pd.DataFrame({"a": [1, 2]})');
   * const { text, results } = await sandbox.runCode('df.describe()');
   */
  runCode(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    return runCode((timeoutMs) => this.portClient(ENVD_PORT, timeoutMs), code, options);
  }

  /** A new code context (its own interpreter) of `language` (default python), in `cwd`. */
  createCodeContext(options: { language?: CodeLanguage; cwd?: string } = {}): Promise<CodeContext> {
    return CodeContexts.create(this.portClient(ENVD_PORT), options);
  }

  listCodeContexts(): Promise<CodeContext[]> {
    return CodeContexts.list(this.portClient(ENVD_PORT));
  }

  /** Starts the context's interpreter afresh: its state is gone, its id stays. */
  restartCodeContext(context: CodeContext | string): Promise<void> {
    return CodeContexts.restart(this.portClient(ENVD_PORT), context);
  }

  removeCodeContext(context: CodeContext | string): Promise<void> {
    return CodeContexts.remove(this.portClient(ENVD_PORT), context);
  }

  async getInfo(): Promise<SandboxInfo> {
    return getSandboxInfo(this.control, this.sandboxId);
  }

  async isRunning(): Promise<boolean> {
    return (await this.getInfo()).state === 'running';
  }

  /**
   * True when this sandbox's ports are named by path on the gateway rather than by host name: the
   * control plane has no domain of its own (`localhost`), and `*.localhost` names do not resolve
   * for Node (`getaddrinfo ENOTFOUND`) on most Linux hosts.
   */
  private get portsByPath(): boolean {
    return new URL(this.gatewayOrigin).hostname === 'localhost';
  }

  /**
   * Where a port of this sandbox is, without the scheme: `{port}-{sandboxId}.{domain}[:{gatewayPort}]`
   * with a real domain, else `{gatewayHost}:{gatewayPort}/sandboxes/{sandboxId}/ports/{port}` (the
   * path form, which needs no DNS). `http(s)://` + this + a path reaches that path of the port.
   */
  getHost(port: number): string {
    const url = new URL(this.getUrl(port));
    return this.portsByPath ? `${url.host}${url.pathname}` : url.host;
  }

  /**
   * The URL of a port of this sandbox, which `fetch` and curl reach from this machine with the
   * sandbox's token (`X-Access-Token: {accessToken}` or `Authorization: Bearer {accessToken}`):
   * `http://127.0.0.1:{gatewayPort}/sandboxes/{sandboxId}/ports/{port}` from a local daemon (no
   * DNS needed), `{scheme}://{port}-{sandboxId}.{domain}[:{gatewayPort}]` from a control plane
   * with a domain of its own. Append the path: `${sandbox.getUrl(8080)}/health`. For a browser,
   * see {@link getSignedUrl}.
   */
  getUrl(port: number): string {
    checkPort(port);
    if (!this.portsByPath) return sandboxUrl(this.gatewayOrigin, this.sandboxId, port);
    return `${this.gatewayBase(port).replace(/\/+$/, '')}/sandboxes/${this.sandboxId}/ports/${port}`;
  }

  /**
   * A link that opens a port of this sandbox in a browser without the token: it can be opened
   * once, within `expiresInMs` (default 60 s, at most 1 h). The gateway answers it by setting an
   * HttpOnly cookie for that port's own host name (`{port}-{sandboxId}.{domain}`, which Chromium
   * and Firefox resolve to loopback for `localhost`) that lasts `sessionMs` (default 1 h, at most
   * 24 h), and redirecting to `path` (default `/`) without the link, so nothing secret stays in
   * the address bar or history.
   *
   * @example
   * const url = await sandbox.getSignedUrl(3000, { path: '/dashboard' });
   * // http://3000-i1a2b3c4d5e6f7g8.localhost:49999/dashboard?abx_link=v1....
   */
  async getSignedUrl(
    port: number,
    options: { expiresInMs?: number; sessionMs?: number; path?: string } = {},
  ): Promise<string> {
    checkPort(port);
    const query = new URLSearchParams();
    if (options.expiresInMs !== undefined) query.set('expires_in_ms', String(options.expiresInMs));
    if (options.sessionMs !== undefined) query.set('session_ms', String(options.sessionMs));
    const path = options.path ?? '/';
    query.set('path', path);
    // Not portClient: its X-Sandbox-* headers would send this request to the port itself.
    const gateway = new HttpClient(
      this.gatewayBase(port),
      { [ACCESS_TOKEN_HEADER]: this.accessToken },
      DEFAULT_REQUEST_TIMEOUT_MS,
      `the gateway of sandbox ${this.sandboxId}`,
      undefined,
      undefined,
      { trust: this.connection.trust },
    );
    const { link } = await gateway.json<{ link: string }>(
      'POST',
      `/sandboxes/${this.sandboxId}/links/${port}?${query}`,
    );
    const sep = path.includes('?') ? '&' : '?';
    return `${sandboxUrl(this.gatewayOrigin, this.sandboxId, port)}${path}${sep}abx_link=${link}`;
  }

  /**
   * Where requests to a port go: the local daemon's loopback gateway; else the client's
   * `gatewayUrl`; else the sandbox's own host name, or, when the control plane has no domain of
   * its own (`localhost`), its gateway port on the API's host. Requests name the sandbox in
   * headers too, so any of them routes.
   */
  private gatewayBase(port: number): string {
    const { local, gatewayUrl, apiUrl } = this.connection;
    if (local) return local.gatewayUrl;
    if (gatewayUrl) return gatewayUrl;
    const origin = new URL(this.gatewayOrigin);
    if (origin.hostname === 'localhost') {
      return `${origin.protocol}//${new URL(apiUrl).hostname}${origin.port ? `:${origin.port}` : ''}`;
    }
    return sandboxUrl(this.gatewayOrigin, this.sandboxId, port);
  }

  /**
   * An HTTP client for a port inside the sandbox, through the gateway. It names the sandbox with
   * headers (no DNS needed for `*.localhost`) and explains a failed call by the sandbox's state.
   */
  portClient(
    port: number,
    timeoutMs = DEFAULT_REQUEST_TIMEOUT_MS,
    extraHeaders: Record<string, string> = {},
  ): HttpClient {
    return new HttpClient(
      this.gatewayBase(port),
      {
        [SANDBOX_ID_HEADER]: this.sandboxId,
        [SANDBOX_PORT_HEADER]: String(port),
        [ACCESS_TOKEN_HEADER]: this.accessToken,
        ...extraHeaders,
      },
      timeoutMs,
      `sandbox ${this.sandboxId}`,
      async (error) => {
        // A sandbox killed under the call may take a moment to be seen as ended (its processes
        // being reaped): ask a few times within a second before blaming the connection.
        for (let attempt = 0; attempt < 5; attempt++) {
          const info = await this.getInfo();
          if (info.state !== 'running') {
            return new NotFoundError(
              `sandbox ${this.sandboxId} stopped during the call (${info.state}: ${info.endReason})`,
              { cause: error },
            );
          }
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
        return error instanceof SandboxError ? error : undefined;
      },
      undefined,
      {
        trust: this.connection.trust,
        // A call to a paused sandbox resumes it and is sent once more.
        resume: async () => {
          await this.resume();
        },
      },
    );
  }
}
