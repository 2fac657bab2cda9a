import { resolve } from 'node:path';
import { ENV_NAME_PATTERN } from '../../runtime/protocol/arguments.js';
import { SANDBOX_HOME } from '../../runtime/protocol/constants.js';
import type { SetupStep, TemplateResources } from '../../runtime/protocol/wire.js';
import { type EgressPolicy, normalizePolicy, PolicyError } from '../egress/policy.js';
import { parseDuration } from '../util/duration.js';
import { envMilliseconds } from '../util/env-ms.js';
import { parseSize } from '../util/size.js';
import { readKubernetes, type TemplateKubernetes } from './template-kubernetes.js';
import { isRecord, type TemplateReader } from './template-reader.js';

export type { SetupStep, TemplateKubernetes, TemplateResources };

/** The template keys that shape the sandbox itself (the rest describe commands). */
export const RUNTIME_KEYS = [
  'image',
  'dockerfile',
  'user',
  'env',
  'workdir',
  'setup',
  'timeout',
  'resources',
  'network',
  'kubernetes',
  'runtime',
  'start',
  'allow_root',
  'workspace',
];
const STEP_KEYS = ['run', 'copy', 'to', 'user'];
const RESOURCE_KEYS = ['processes', 'open_files', 'file_size', 'memory', 'cpu', 'disk'];
const RUNTIME_NODE_KEYS = ['node'];
const START_KEYS = ['cmd', 'ready'];
const WORKSPACE_KEYS = ['from', 'path'];

/** The default lifetime of a sandbox whose template sets no `timeout`. */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 5 * 60_000;
export const DEFAULT_WORKDIR = SANDBOX_HOME;

/** The disk quota of a sandbox whose template sets none. */
export const DEFAULT_DISK_BYTES = 2 * 1024 ** 3;
/** Most CPU cores a template may ask for. */
export const MAX_CPU = 1024;

/** The sandbox's user when a template names none (uid 1000, created in an image that lacks it). */
export const DEFAULT_USER = 'user';
/** Who runs the `setup` steps of an image template unless a step says otherwise. */
export const IMAGE_SETUP_USER = 'root';
const USER_NAME = /^[a-z_][a-z0-9_-]{0,31}$/;
/** A container image reference: `python:3.12-slim`, `registry/x/y@sha256:...`. */
const IMAGE_REFERENCE = /^[A-Za-z0-9][A-Za-z0-9._\-/:@+]{0,254}$/;

/** How a template's sandboxes run. */
export interface TemplateRuntime {
  /** The container image the sandbox's root filesystem comes from; none: the host's own. */
  image?: string;
  /** A Dockerfile (absolute path) whose image the sandbox starts from. */
  dockerfile?: string;
  /** The user the sandbox's processes run as (`user`, uid 1000, by default). */
  user: string;
  /** Environment variables of every process in the sandbox (the host's never leak in). */
  env: Record<string, string>;
  /** The working directory of commands; default `/home/user`. */
  workdir: string;
  /** Steps run once when the template is built; sandboxes start from their result. */
  setup: SetupStep[];
  /** Default lifetime of a sandbox, in milliseconds. */
  timeoutMs: number;
  resources: TemplateResources;
  /**
   * `internet` (default): egress through abx's policy (`egress`); `none`: only the sandbox's own
   * loopback; `host`: the host's own network namespace.
   */
  network: 'none' | 'host' | 'internet';
  /**
   * The template did not name a network: `internet` by default, which a provider that cannot
   * enforce egress gives as `none` (denied rather than allowed). Named, it is refused there.
   */
  networkDefault?: true;
  /** The egress policy of an `internet` template (`network: { allow_out, deny_out }`). */
  egress?: EgressPolicy;
  /** Where and how the template's pods run on the kubernetes provider (others ignore it). */
  kubernetes?: TemplateKubernetes;
  /**
   * What the template's sandboxes must run on: `node` is the Node line (major version) that envd
   * and the command server need there. A build, and each create, fails when the sandboxes would
   * run another line (src/control/node-line.ts).
   */
  runtime?: { node: number };
  /**
   * A command every sandbox starts in the background as it is created (as the template's user, in
   * its workdir), and a `ready` command run until it exits 0 (`ABX_START_READY_TIMEOUT_MS`, 120 s, at most)
   * before the create answers.
   */
  start?: TemplateStart;
  /**
   * `allow_root: true` (image templates only): root inside the sandbox, uid 0 of its own user
   * namespace (never host root), for `user: 'root'` and `sudo`; where the provider can give it
   * (the local provider on a root daemon), else the template's sandboxes do not start.
   */
  allowRoot?: true;
  /**
   * `workspace: { from, path? }`: a host folder every sandbox of the template mounts
   * copy-on-write at `path` (default the home's `workspace`), as a create's `workspace` does and
   * with the same checks, made for the key that creates (docs/workspaces.md). A create's own
   * `workspace` replaces it.
   */
  workspace?: TemplateWorkspace;
}

/** `workspace: { from, path? }` of a template: absolute paths, checked again at each create. */
export interface TemplateWorkspace {
  from: string;
  path?: string;
}

/** `start: { cmd, ready? }` of a template. */
export interface TemplateStart {
  cmd: string;
  ready?: string;
}

/** How long a create waits for a template's `start.ready` command to exit 0, by default. */
export const START_READY_TIMEOUT_MS = 120_000;

/**
 * How long a create waits for a template's `start.ready` command to exit 0
 * (`ABX_START_READY_TIMEOUT_MS`, 1000 or more; default {@link START_READY_TIMEOUT_MS}). Read once
 * when the daemon is made: a bad value stops its start, naming the variable.
 */
export function startReadyTimeoutMs(env: NodeJS.ProcessEnv = process.env): number {
  return envMilliseconds('ABX_START_READY_TIMEOUT_MS', START_READY_TIMEOUT_MS, 1000, env);
}

/** Reads the runtime keys of a template document, reporting problems to `reader`. */
export function readRuntime(
  reader: TemplateReader,
  root: Record<string, unknown>,
  /** Folder that relative paths (`dockerfile`, `copy`) are relative to: the template file's. */
  baseDir: string,
): TemplateRuntime {
  const image = readImage(reader, root, baseDir);
  const user = root.user ?? DEFAULT_USER;
  if (typeof user !== 'string' || !USER_NAME.test(user)) {
    reader.problem(
      ['user'],
      'must be a user name such as user (lower-case letters, digits, _ and -)',
    );
  } else if (!image.image && !image.dockerfile && user !== DEFAULT_USER) {
    reader.problem(
      ['user'],
      `only an image template (image: or dockerfile:) can name another user than ${DEFAULT_USER}`,
    );
  }
  const env: Record<string, string> = {};
  if (root.env !== undefined && root.env !== null) {
    if (!isRecord(root.env)) reader.problem(['env'], 'must be a mapping of NAME: value');
    else {
      for (const [name, value] of Object.entries(root.env)) {
        if (!ENV_NAME_PATTERN.test(name)) {
          reader.problem(['env', name], 'is not a valid variable name (letters, digits and _)');
        } else if (!['string', 'number', 'boolean'].includes(typeof value)) {
          reader.problem(['env', name], 'must be a string, number or boolean');
        } else env[name] = String(value);
      }
    }
  }

  const workdir = root.workdir ?? DEFAULT_WORKDIR;
  if (typeof workdir !== 'string' || !workdir.startsWith('/') || workdir.includes('\0')) {
    reader.problem(['workdir'], 'must be an absolute path such as /home/user/project');
  }

  const fromImage = image.image !== undefined || image.dockerfile !== undefined;
  const setup = readSetup(reader, root.setup, {
    baseDir,
    defaultUser: fromImage ? IMAGE_SETUP_USER : DEFAULT_USER,
    fromImage,
  });

  let timeoutMs = DEFAULT_SANDBOX_TIMEOUT_MS;
  if (root.timeout !== undefined) {
    const parsed =
      typeof root.timeout === 'string' || typeof root.timeout === 'number'
        ? parseDuration(root.timeout)
        : undefined;
    if (parsed === undefined)
      reader.problem(['timeout'], 'must be a duration such as 30s, 10m or 1h');
    else timeoutMs = parsed;
  }

  const resources = readResources(reader, root.resources);

  const { network, egress, networkDefault } = readNetwork(reader, root.network);
  const kubernetes = readKubernetes(reader, root.kubernetes);
  const runtime = readRuntimeNeeds(reader, root.runtime);
  const start = readStart(reader, root.start);
  const allowRoot = readAllowRoot(reader, root.allow_root, fromImage);
  const workspace = readWorkspace(reader, root.workspace);
  return {
    ...image,
    user: typeof user === 'string' ? user : DEFAULT_USER,
    env,
    workdir: String(workdir),
    setup,
    timeoutMs,
    resources,
    network,
    ...(networkDefault ? { networkDefault } : {}),
    ...(egress ? { egress } : {}),
    ...(kubernetes ? { kubernetes } : {}),
    ...(runtime ? { runtime } : {}),
    ...(start ? { start } : {}),
    ...(allowRoot ? { allowRoot } : {}),
    ...(workspace ? { workspace } : {}),
  };
}

/**
 * `workspace: { from: /abs/host/folder, path?: /home/user/repo }`: both absolute. Whether the
 * folder exists, where `path` may be and who may mount it are a create's checks (the key that
 * creates, not the one that built).
 */
function readWorkspace(reader: TemplateReader, value: unknown): TemplateWorkspace | undefined {
  if (value === undefined || value === null) return undefined;
  if (!isRecord(value)) {
    reader.problem(
      ['workspace'],
      'must be a mapping such as { from: /home/me/repo, path: /home/user/repo }',
    );
    return undefined;
  }
  reader.checkKeys(value, WORKSPACE_KEYS, ['workspace']);
  const absolute = (key: 'from' | 'path', what: string) => {
    const text = value[key];
    if (typeof text === 'string' && text.startsWith('/') && !text.includes('\0')) return text;
    reader.problem(['workspace', key], `must be an absolute path: ${what}`);
    return undefined;
  };
  if (value.from === undefined || value.from === null) {
    reader.problem(['workspace'], 'missing `from:`, the host folder to mount (an absolute path)');
    return undefined;
  }
  const from = absolute('from', "a folder of the daemon's host, such as /home/me/repo");
  const path =
    value.path === undefined || value.path === null
      ? undefined
      : absolute('path', 'where the sandbox sees it, such as /home/user/repo');
  if (from === undefined || (value.path !== undefined && value.path !== null && !path)) {
    return undefined;
  }
  return { from, ...(path ? { path } : {}) };
}

/** `allow_root: true|false`: only an image template may allow root. */
function readAllowRoot(
  reader: TemplateReader,
  value: unknown,
  fromImage: boolean,
): true | undefined {
  if (value === undefined || value === null || value === false) return undefined;
  if (value !== true) {
    reader.problem(['allow_root'], 'must be true or false');
    return undefined;
  }
  if (!fromImage) {
    reader.problem(
      ['allow_root'],
      "only an image template (image: or dockerfile:) can allow root: a sandbox without an image runs on the host's own /usr and /etc, which root inside would own",
    );
    return undefined;
  }
  return true;
}

/** `start: { cmd, ready? }`: shell command lines, neither empty. */
function readStart(reader: TemplateReader, value: unknown): TemplateStart | undefined {
  if (value === undefined || value === null) return undefined;
  if (!isRecord(value)) {
    reader.problem(
      ['start'],
      'must be a mapping such as { cmd: ./serve.sh, ready: test -f /tmp/up }',
    );
    return undefined;
  }
  reader.checkKeys(value, START_KEYS, ['start']);
  const line = (key: 'cmd' | 'ready') => {
    const text = value[key];
    if (text === undefined || text === null) return undefined;
    if (typeof text !== 'string' || text.trim() === '' || text.includes('\0')) {
      reader.problem(['start', key], 'must be a shell command line');
      return undefined;
    }
    return text;
  };
  const cmd = line('cmd');
  const ready = line('ready');
  if (cmd === undefined) {
    if (value.cmd === undefined) reader.problem(['start'], 'missing `cmd:`, the command to start');
    return undefined;
  }
  return { cmd, ...(ready === undefined ? {} : { ready }) };
}

/** `runtime: { node: 24 }`: the Node line the sandboxes need (a major version, 18 or newer). */
function readRuntimeNeeds(reader: TemplateReader, value: unknown): { node: number } | undefined {
  if (value === undefined || value === null) return undefined;
  if (!isRecord(value)) {
    reader.problem(['runtime'], 'must be a mapping such as { node: 24 }');
    return undefined;
  }
  reader.checkKeys(value, RUNTIME_NODE_KEYS, ['runtime']);
  if (value.node === undefined) {
    reader.problem(['runtime'], 'missing `node:`, the Node line the sandboxes need, such as 24');
    return undefined;
  }
  const node = typeof value.node === 'string' ? Number(value.node) : value.node;
  if (typeof node !== 'number' || !Number.isInteger(node) || node < 18 || node > 999) {
    reader.problem(
      ['runtime', 'node'],
      'must be a Node line: its major version as a whole number, such as 22, 24 or 26',
    );
    return undefined;
  }
  return { node };
}

/**
 * `network:` is `none`, `internet` or `host`, or a mapping `{ allow_out, deny_out, rules }`
 * (lists of CIDRs, domain names and `*.` wildcards; per-host header rules in E2B's shape, with
 * `${secrets.NAME}` placeholders) that means `internet` with that policy.
 */
function readNetwork(
  reader: TemplateReader,
  value: unknown,
): { network: TemplateRuntime['network']; egress?: EgressPolicy; networkDefault?: true } {
  const modes = 'internet (the default: egress by policy), none (no network) or host';
  if (value === undefined || value === null) return { network: 'internet', networkDefault: true };
  if (typeof value === 'string') {
    if (value === 'none' || value === 'host' || value === 'internet') return { network: value };
    reader.problem(['network'], `must be ${modes}, or a mapping with allow_out and deny_out`);
    return { network: 'none' };
  }
  if (!isRecord(value)) {
    reader.problem(['network'], `must be ${modes}, or a mapping with allow_out and deny_out`);
    return { network: 'none' };
  }
  for (const key of Object.keys(value)) {
    if (key !== 'allow_out' && key !== 'deny_out' && key !== 'rules') {
      reader.problem(['network', key], 'is not a network key (allow_out, deny_out, rules)');
    }
  }
  try {
    const egress = normalizePolicy(
      {
        allowOut: (value.allow_out ?? []) as string[],
        denyOut: (value.deny_out ?? []) as string[],
        ...(value.rules === undefined || value.rules === null
          ? {}
          : { rules: value.rules as never }),
      },
      'network',
    );
    return { network: 'internet', egress };
  } catch (error) {
    if (!(error instanceof PolicyError)) throw error;
    reader.problem(
      ['network'],
      error.message
        .replace(/^network\.?/, '')
        .replace('allowOut', 'allow_out')
        .replace('denyOut', 'deny_out')
        .trim(),
    );
    return { network: 'none' };
  }
}

function readImage(
  reader: TemplateReader,
  root: Record<string, unknown>,
  baseDir: string,
): { image?: string; dockerfile?: string } {
  if (root.image !== undefined && root.dockerfile !== undefined) {
    reader.problem(['dockerfile'], 'give image: or dockerfile:, not both');
    return {};
  }
  if (root.image !== undefined) {
    if (typeof root.image !== 'string' || !IMAGE_REFERENCE.test(root.image)) {
      reader.problem(['image'], 'must be an image reference such as python:3.12-slim');
      return {};
    }
    return { image: root.image };
  }
  if (root.dockerfile !== undefined) {
    if (
      typeof root.dockerfile !== 'string' ||
      root.dockerfile === '' ||
      root.dockerfile.includes('\0')
    ) {
      reader.problem(
        ['dockerfile'],
        'must be the path of a Dockerfile, relative to the template file',
      );
      return {};
    }
    return { dockerfile: resolve(baseDir, root.dockerfile) };
  }
  return {};
}

function readSetup(
  reader: TemplateReader,
  value: unknown,
  context: { baseDir: string; defaultUser: string; fromImage: boolean },
): SetupStep[] {
  const setup: SetupStep[] = [];
  if (value === undefined || value === null) return setup;
  const steps = typeof value === 'string' ? [value] : value;
  if (!Array.isArray(steps)) {
    reader.problem(
      ['setup'],
      'must be a list of steps: shell commands, { run, user } or { copy, to }',
    );
    return setup;
  }
  steps.forEach((step, index) => {
    const path = ['setup', index];
    if (typeof step === 'string') {
      if (step.trim() === '') reader.problem(path, 'must be a non-empty shell command');
      else setup.push({ run: step, user: context.defaultUser });
      return;
    }
    if (!isRecord(step)) {
      reader.problem(
        path,
        'must be a shell command, { run: ..., user: ... } or { copy: ..., to: ... }',
      );
      return;
    }
    reader.checkKeys(step, STEP_KEYS, path);
    const user = step.user ?? context.defaultUser;
    if (typeof user !== 'string' || !USER_NAME.test(user)) {
      reader.problem([...path, 'user'], 'must be a user name such as root or user');
      return;
    }
    if (!context.fromImage && user !== DEFAULT_USER) {
      reader.problem(
        [...path, 'user'],
        `steps run as ${DEFAULT_USER} unless the template starts from an image (image: or dockerfile:)`,
      );
      return;
    }
    if ('run' in step === 'copy' in step) {
      reader.problem(path, 'needs either run: (a shell command) or copy: with to:');
      return;
    }
    if ('run' in step) {
      if (typeof step.run !== 'string' || step.run.trim() === '') {
        reader.problem([...path, 'run'], 'must be a non-empty shell command');
      } else setup.push({ run: step.run, user });
      return;
    }
    const { copy, to } = step;
    if (typeof copy !== 'string' || copy === '' || copy.includes('\0')) {
      reader.problem([...path, 'copy'], 'must be a host path, relative to the template file');
    } else if (typeof to !== 'string' || !to.startsWith('/') || to.includes('\0')) {
      reader.problem(
        [...path, 'to'],
        'must be an absolute path in the sandbox, such as /home/user/data',
      );
    } else if (!context.fromImage && to !== SANDBOX_HOME && !to.startsWith(`${SANDBOX_HOME}/`)) {
      reader.problem(
        [...path, 'to'],
        `must be under ${SANDBOX_HOME}: only the home folder is kept in a template without an image`,
      );
    } else setup.push({ copy: resolve(context.baseDir, copy), to, user });
  });
  return setup;
}

function readResources(reader: TemplateReader, value: unknown): TemplateResources {
  const resources: TemplateResources = {};
  if (value === undefined || value === null) return resources;
  if (!isRecord(value)) {
    reader.problem(
      ['resources'],
      'must be a mapping such as { processes: 256, memory: 512M, cpu: 1, disk: 2G }',
    );
    return resources;
  }
  reader.checkKeys(value, RESOURCE_KEYS, ['resources']);
  const count = (key: 'processes' | 'open_files') => {
    const n = value[key];
    if (n === undefined) return undefined;
    if (typeof n !== 'number' || !Number.isSafeInteger(n) || n <= 0) {
      reader.problem(['resources', key], 'must be a positive whole number');
      return undefined;
    }
    return n;
  };
  const size = (key: 'file_size' | 'memory' | 'disk') => {
    const n = value[key];
    if (n === undefined) return undefined;
    const bytes = typeof n === 'string' || typeof n === 'number' ? parseSize(n) : undefined;
    if (bytes === undefined) reader.problem(['resources', key], 'must be a size such as 64M or 2G');
    return bytes;
  };
  const cores = () => {
    const n = value.cpu;
    if (n === undefined) return undefined;
    const parsed = typeof n === 'string' && n.trim() !== '' ? Number(n) : n;
    // The kernel's CFS quota has a 1 ms floor per 100 ms period: 0.01 core is the least.
    if (
      typeof parsed !== 'number' ||
      !Number.isFinite(parsed) ||
      parsed < 0.01 ||
      parsed > MAX_CPU
    ) {
      reader.problem(
        ['resources', 'cpu'],
        `must be a number of cores from 0.01 to ${MAX_CPU}, such as 0.5 or 2`,
      );
      return undefined;
    }
    return parsed;
  };
  const entries = {
    processes: count('processes'),
    openFiles: count('open_files'),
    fileSize: size('file_size'),
    memory: size('memory'),
    cpu: cores(),
    disk: size('disk'),
  };
  for (const [key, n] of Object.entries(entries)) {
    if (n !== undefined) resources[key as keyof TemplateResources] = n;
  }
  return resources;
}
