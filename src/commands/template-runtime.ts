import { ENV_NAME_PATTERN } from '../../runtime/protocol/arguments.js';
import { SANDBOX_HOME } from '../../runtime/protocol/constants.js';
import { parseDuration } from '../util/duration.js';
import { parseSize } from '../util/size.js';
import { isRecord, type TemplateReader } from './template-reader.js';

/** The template keys that shape the sandbox itself (the rest describe commands). */
export const RUNTIME_KEYS = ['env', 'workdir', 'setup', 'timeout', 'resources', 'network'];
const RESOURCE_KEYS = ['processes', 'open_files', 'file_size', 'memory', 'cpu', 'disk'];

/** The default lifetime of a sandbox whose template sets no `timeout`. */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 5 * 60_000;
export const DEFAULT_WORKDIR = SANDBOX_HOME;

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

/** The disk quota of a sandbox whose template sets none. */
export const DEFAULT_DISK_BYTES = 2 * 1024 ** 3;
/** Most CPU cores a template may ask for. */
export const MAX_CPU = 1024;

/** How a template's sandboxes run. */
export interface TemplateRuntime {
  /** Environment variables of every process in the sandbox (the host's never leak in). */
  env: Record<string, string>;
  /** The working directory of commands; default `/home/user`. */
  workdir: string;
  /** Shell steps run once when the template is built; sandboxes start from their result. */
  setup: string[];
  /** Default lifetime of a sandbox, in milliseconds. */
  timeoutMs: number;
  resources: TemplateResources;
  /** `none` (default): only the sandbox's own loopback; `host`: the host's network. */
  network: 'none' | 'host';
}

/** Reads the runtime keys of a template document, reporting problems to `reader`. */
export function readRuntime(
  reader: TemplateReader,
  root: Record<string, unknown>,
): TemplateRuntime {
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

  const setup: string[] = [];
  if (root.setup !== undefined && root.setup !== null) {
    const steps = typeof root.setup === 'string' ? [root.setup] : root.setup;
    if (!Array.isArray(steps)) reader.problem(['setup'], 'must be a list of shell commands');
    else {
      steps.forEach((step, index) => {
        if (typeof step !== 'string' || step.trim() === '') {
          reader.problem(['setup', index], 'must be a non-empty shell command');
        } else setup.push(step);
      });
    }
  }

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

  const network = root.network ?? 'none';
  if (network !== 'none' && network !== 'host') {
    reader.problem(['network'], 'must be none (the default: no network) or host');
  }
  return {
    env,
    workdir: String(workdir),
    setup,
    timeoutMs,
    resources,
    network: network as 'none' | 'host',
  };
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
