/**
 * The shapes that cross the wire: the daemon's API resources, the command server's command
 * descriptions and envd's process events. Types only; both sides import them, so a field added on
 * one side is seen by the compiler on the other.
 */
import type { ArgSpec, ArgType } from './arguments.js';

// ---------------------------------------------------------------- daemon API (/v1)

/**
 * Where a sandbox is in its life. `pooled`: started ahead of demand, not handed out yet.
 * `paused`: frozen (its memory kept) or hibernated (its processes ended, its disk kept) until a
 * resume; it keeps its id, tokens and files.
 */
export type SandboxState = 'pooled' | 'running' | 'paused' | 'killed' | 'expired' | 'dead';

/** How a paused sandbox is kept (see docs/lifecycle.md). */
export interface PausedInfo {
  /** True: frozen, every process kept in memory; false: hibernated, only the disk kept. */
  memory: boolean;
  /** ISO 8601 time of the pause. */
  pausedAt: string;
}

/** What happens at a sandbox's timeout: it is killed (the default) or paused. */
export interface SandboxLifecycle {
  onTimeout: 'kill' | 'pause';
  /** With `pause`: keep its memory (freeze) or only its disk (hibernate). */
  keepMemory: boolean;
  /** With `pause`: a request for it through the gateway resumes it (E2B's `autoResume`). */
  autoResume?: boolean;
}

/** A sandbox as `GET /v1/sandboxes/:id` shows it (never its token). */
export interface SandboxInfo {
  sandboxId: string;
  template: string;
  state: SandboxState;
  metadata: Record<string, string>;
  capabilities: string[];
  /** ISO 8601 times. */
  createdAt: string;
  expiresAt: string;
  endedAt: string | null;
  /** How it ended: `killed`, `expired`, `dead: oom`... */
  endReason: string | null;
  /** The port envd answers on through the gateway. */
  envdPort: number;
  /** An `internet` sandbox's egress policy (docs/network.md); absent on other networks. */
  network?: {
    allowOut: string[];
    denyOut: string[];
    /** The SOCKS5 proxy its allowed traffic leaves through: its address and username, never its password. */
    egressProxy?: { address: string; username?: string };
  };
  /** A paused sandbox's pause; absent otherwise. */
  paused?: PausedInfo;
  /** What its timeout does: `{ onTimeout: 'kill' }` unless it was created with `autoPause`. */
  lifecycle: SandboxLifecycle;
  /** The volumes it mounts (docs/volumes.md); empty when none. */
  volumeMounts: VolumeMount[];
  /** Its workspace (docs/workspaces.md): where the sandbox sees it; absent when it has none. */
  workspace?: { path: string };
}

/** A volume mounted in a sandbox. */
export interface VolumeMount {
  name: string;
  path: string;
  readOnly: boolean;
}

/** A volume as the API shows it (docs/volumes.md). */
export interface VolumeInfo {
  volumeId: string;
  name: string;
  /** Its size limit, in bytes. */
  sizeBytes: number;
  /** ISO 8601. */
  createdAt: string;
  /** What it holds now, in bytes (one volume's answer; lists leave it out). */
  usedBytes?: number;
  totalBytes?: number;
  /** False where the size is only reported, not enforced (docs/volumes.md says where). */
  quotaEnforced?: boolean;
  /** Ids of the live sandboxes that mount it. */
  usedBy?: string[];
}

/** Limits applied to every process of a sandbox (see the README for which are enforced). */
export interface TemplateResources {
  /** Most processes (threads count) the sandbox user may run: RLIMIT_NPROC. */
  processes?: number;
  /** Most open files per process: RLIMIT_NOFILE. */
  openFiles?: number;
  /** Largest file a process may write, in bytes: RLIMIT_FSIZE. */
  fileSize?: number;
  /** Memory of the whole sandbox, in bytes (a memory cgroup, where the host allows one). */
  memory?: number;
  /** CPU time of the whole sandbox, in cores (`0.5`, `2`): a CPU cgroup quota. */
  cpu?: number;
  /** Disk space of the sandbox's home and /tmp together, in bytes; default 2 GiB. */
  disk?: number;
}

/**
 * One build step: a shell command, or a copy of a host file or folder into the image. `user` runs
 * it: `root` by default in an image template (like a Dockerfile's `RUN`), the sandbox's user in a
 * template without an image (which can only write its home).
 */
export type SetupStep =
  | { run: string; user: string }
  | {
      /** The host path (absolute once the template is loaded). */
      copy: string;
      /** Where it lands in the sandbox (absolute). */
      to: string;
      user: string;
    };

/** A custom command as a template carries it. */
export interface CustomCommandInfo extends CommandDescription {
  template: string;
  source: 'yaml' | 'decorator';
  /** The shell command of a YAML command. */
  command?: string;
  timeoutMs?: number;
}

/** A built template as `GET /v1/templates/:name` shows it. */
export interface TemplateInfo {
  name: string;
  description: string;
  /** The image its sandboxes start from (none: the host's system). */
  image: string | null;
  /** The Dockerfile it was built from, if any. */
  dockerfile: string | null;
  /** The image its sandboxes start from: its build's (or snapshot's) image, on the engine. */
  builtImage: string | null;
  /** The user its sandboxes run as. */
  user: string;
  capabilities: string[];
  /** `none`, `internet` (egress by `egress`, its policy) or `host`. */
  network: 'none' | 'host' | 'internet';
  egress?: { allowOut: string[]; denyOut: string[] };
  timeoutMs: number;
  workdir: string;
  env: Record<string, string>;
  resources: TemplateResources;
  setup: SetupStep[];
  customCommands: CustomCommandInfo[];
  /** What its sandboxes must run on (`runtime:` in template.yaml): `node`, a Node line such as 24. */
  runtime?: { node: number };
  builtAt: string | null;
  /** The template file it was built from; null for base and for templates built from code. */
  path: string | null;
  /**
   * In the shared catalogue: every key lists it and creates sandboxes from it (base, an admin's
   * builds, what an admin published). False: only its owner and admin keys see it.
   */
  shared: boolean;
  /**
   * The id of the API key that built it or took it as a snapshot, shown to admins and to that
   * key; null for the daemon's own key, templates made before owners, and to other keys.
   */
  owner: string | null;
}

/**
 * One line of a template build's progress (`POST /v1/templates` with `progress: true`, NDJSON):
 * `{progress}` lines as the build goes, then `{template}` or `{error, status}` last.
 */
export interface BuildProgress {
  /**
   * `prepare`: getting the image ready; `step`: a setup step starts; `output`: a line the running
   * step printed (stdout or stderr); `commit`: saving the result; `push`: sending it to the
   * registry the cluster pulls from.
   */
  phase: 'prepare' | 'step' | 'output' | 'commit' | 'push';
  /** The setup step (0-based) and how many there are, for `step` and `output`. */
  step?: number;
  of?: number;
  /**
   * What happens, for a person: the step's command, the image being prepared, or (`output`) one
   * line of the step's output without its newline (at most 4000 characters).
   */
  text: string;
}

// ---------------------------------------------------------------- command server

/** One command in `GET /commands` (an `env` argument is listed as `str`). */
export interface CommandDescription {
  name: string;
  description: string;
  args: (Omit<ArgSpec, 'type'> & { type: ArgType })[];
}

// ---------------------------------------------------------------- envd processes

/** A process as envd's `GET /process` and `start` event describe it. */
export interface ProcessInfoWire {
  id: string;
  pid: number | null;
  command: string;
  cwd: string;
  started_at: string;
  running: boolean;
  exit_code: number | null;
  signal: string | null;
}

/** How a process ended, as envd's `exit` event says. */
export interface ExitWire {
  code: number | null;
  signal: string | null;
  timed_out: boolean;
}

/** The two output streams of a process. */
export type StreamName = 'stdout' | 'stderr';

/** Byte offsets to read (or resume) each stream from. */
export type StreamOffsets = Record<StreamName, number>;

/**
 * How output events carry their bytes: `text` (the default) as UTF-8 text, a character split
 * across reads held back until whole and bytes that are not UTF-8 as U+FFFD; `base64` as the raw
 * bytes, base64-encoded, byte for byte.
 */
export const OUTPUT_ENCODINGS = ['text', 'base64'] as const;
export type OutputEncoding = (typeof OUTPUT_ENCODINGS)[number];

/**
 * One line of an envd event stream (NDJSON; see docs/envd-api.md):
 * - `{"start": {...}}` first, for a new process;
 * - `{"stream","data","offset","next"}`: `data` starts at byte `offset`; resume from `next`
 *   (with `"encoding":"base64"` when the stream was asked for `output: 'base64'`);
 * - `{"stream","dropped","offset"}`: the `dropped` bytes before `offset` are gone;
 * - `{"keepalive":true}` while a followed process is silent;
 * - `{"exit": {...}}`, always the last line.
 */
export type ProcessEvent =
  /** `prestarted` (`POST /exec/server` only): the server runs in a process started ahead. */
  | { start: ProcessInfoWire; prestarted?: boolean }
  | { stream: StreamName; data: string; encoding?: 'base64'; offset: number; next: number }
  | { stream: StreamName; dropped: number; offset: number }
  | { keepalive: true }
  | { exit: ExitWire };

/** The languages of envd's code contexts (`POST /contexts`, `POST /execute`). */
export const CODE_LANGUAGES = ['python', 'javascript', 'bash'] as const;
export type CodeLanguage = (typeof CODE_LANGUAGES)[number];

/** A code context as `POST /contexts` and `GET /contexts` show it. */
export interface CodeContextWire {
  id: string;
  language: CodeLanguage;
  cwd: string;
  /** False once its interpreter died; `POST /contexts/{id}/restart` starts a new one. */
  alive: boolean;
}

/** The formats a cell's result may carry (Jupyter's display-data model), in listing order. */
export const RESULT_FORMATS = [
  'text',
  'html',
  'markdown',
  'svg',
  'png',
  'jpeg',
  'pdf',
  'latex',
  'json',
  'javascript',
] as const;

/** One rich output of a cell: `text` (repr) and any of the formats the value knows. */
export interface CodeResultWire {
  type: 'result';
  /** True for the value of the cell's last expression; false for figures and `display()`. */
  is_main_result: boolean;
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  /** Base64. */
  png?: string;
  /** Base64. */
  jpeg?: string;
  /** Base64. */
  pdf?: string;
  latex?: string;
  json?: unknown;
  javascript?: string;
}

/** One line of `POST /execute` (NDJSON); `end` is always the last. */
export type CodeEvent =
  | { type: 'stdout' | 'stderr'; text: string }
  | CodeResultWire
  | { type: 'error'; name: string; value: string; traceback: string }
  | { type: 'end'; execution_count: number };

/** An API key of the control plane as its API shows it: never the key itself, nor its hash. */
export interface ApiKeyInfo {
  /** `key_…`: how `abx keys revoke` names it. */
  id: string;
  name: string;
  /** The key's first characters (`abx_Xy3kQ9`), to recognise it; not secret. */
  prefix: string;
  /** Sees and controls every sandbox, builds templates, manages keys. */
  admin: boolean;
  /** The most sandboxes it may have running at once; null: no limit. */
  maxRunning: number | null;
  createdAt: string;
  /** When it was last used (recorded at most once a minute), or null. */
  lastUsedAt: string | null;
  revokedAt: string | null;
  /** Sandboxes it has running now (in lists). */
  running?: number;
}
