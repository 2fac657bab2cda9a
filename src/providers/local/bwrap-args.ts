import { lstatSync, readlinkSync } from 'node:fs';
import type { TemplateResources } from '../../commands/template-runtime.js';

/** Where things sit inside every local sandbox. */
export const SANDBOX_HOME = '/home/user';
export const SANDBOX_RUN_DIR = '/run/abx';
export const SANDBOX_RUNTIME_DIR = '/opt/abx';
export const SANDBOX_UID = 1000;

/** Host folders shared read-only with every sandbox; the host's merged-/usr links are kept. */
const SYSTEM_DIRS = ['/usr', '/etc', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32'];

export interface BwrapOptions {
  hostname: string;
  /** Host folder mounted read-write as /home/user. */
  homeDir: string;
  /** Host folder mounted read-write as /run/abx: envd's socket and the port sockets. */
  runDir: string;
  /** Host folder with envd.cjs, mounted read-only as /opt/abx. */
  runtimeDir: string;
  /** Host files replacing /etc/passwd and /etc/group, so the sandbox user has a name. */
  passwdFile: string;
  groupFile: string;
  env: Record<string, string>;
  workdir: string;
  network: 'none' | 'host';
  /** The sandbox's first process and its arguments. */
  command: string[];
}

function systemMounts(): string[] {
  const args: string[] = [];
  for (const dir of SYSTEM_DIRS) {
    let stat: ReturnType<typeof lstatSync>;
    try {
      stat = lstatSync(dir);
    } catch {
      continue;
    }
    if (stat.isSymbolicLink()) args.push('--symlink', readlinkSync(dir), dir);
    else if (stat.isDirectory()) args.push('--ro-bind', dir, dir);
  }
  return args;
}

/**
 * The bubblewrap command line of one sandbox: new user, pid, mount, ipc, uts (and, unless the
 * template asks for the host's, net) namespaces; read-only system folders; a private home, /tmp
 * and /proc; the host's environment cleared.
 */
export function bwrapArgs(options: BwrapOptions): string[] {
  const env = Object.entries(options.env).flatMap(([key, value]) => ['--setenv', key, value]);
  return [
    '--unshare-user',
    '--uid',
    String(SANDBOX_UID),
    '--gid',
    String(SANDBOX_UID),
    '--unshare-pid',
    '--unshare-ipc',
    '--unshare-uts',
    '--unshare-cgroup-try',
    ...(options.network === 'host' ? [] : ['--unshare-net']),
    '--hostname',
    options.hostname,
    // A new session: a process in the sandbox cannot push keystrokes into the host's terminal.
    '--new-session',
    ...systemMounts(),
    '--ro-bind',
    options.passwdFile,
    '/etc/passwd',
    '--ro-bind',
    options.groupFile,
    '/etc/group',
    '--proc',
    '/proc',
    '--dev',
    '/dev',
    '--tmpfs',
    '/tmp',
    '--dir',
    '/home',
    '--bind',
    options.homeDir,
    SANDBOX_HOME,
    '--bind',
    options.runDir,
    SANDBOX_RUN_DIR,
    '--ro-bind',
    options.runtimeDir,
    SANDBOX_RUNTIME_DIR,
    '--dir',
    options.workdir,
    '--chdir',
    options.workdir,
    '--clearenv',
    ...env,
    '--',
    ...options.command,
  ];
}

/** `prlimit` options for the template's per-process limits (empty when it sets none). */
export function prlimitArgs(resources: TemplateResources): string[] {
  const limits: string[] = [];
  if (resources.processes) limits.push(`--nproc=${resources.processes}`);
  if (resources.openFiles) limits.push(`--nofile=${resources.openFiles}`);
  if (resources.fileSize) limits.push(`--fsize=${resources.fileSize}`);
  return limits;
}
