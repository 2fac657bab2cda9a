import { existsSync, lstatSync, readlinkSync } from 'node:fs';
import {
  SANDBOX_HOME,
  SANDBOX_RUN_DIR,
  SANDBOX_RUNTIME_DIR,
} from '../../../runtime/protocol/constants.js';
import type { TemplateResources } from '../../commands/template-runtime.js';
import { SANDBOX_BUNDLE_FILE, SANDBOX_CA_FILE } from '../../egress/trust.js';
import { rootBwrapArgs } from './root-userns.js';

/** The uid of the sandbox's user, inside its user namespace. */
export const SANDBOX_UID = 1000;
/** Size of the tmpfs at /run/abx: sockets and a token take no room. */
const RUN_DIR_BYTES = 1024 * 1024;
/** Where a rootless sandbox sees its template's home, read-only, for envd to copy. */
export const SANDBOX_HOME_TEMPLATE = '/run/abx-template';

/** Host folders shared read-only with every sandbox; the host's merged-/usr links are kept. */
const SYSTEM_DIRS = ['/usr', '/etc', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32'];

/**
 * Kernel surfaces under /proc that a sandbox must not write (Docker's `readonlyPaths`): sysctls,
 * the SysRq trigger, IRQ affinities, bus and filesystem tunables.
 */
const PROC_READ_ONLY = ['/proc/sys', '/proc/sysrq-trigger', '/proc/irq', '/proc/bus', '/proc/fs'];
/** Files that leak host state (kernel memory, keys, timers, scheduler): hidden behind /dev/null. */
const PROC_MASKED_FILES = [
  '/proc/kcore',
  '/proc/keys',
  '/proc/timer_list',
  '/proc/sched_debug',
  '/proc/latency_stats',
];
/** Folders of host hardware state: hidden behind an empty read-only tmpfs. */
const PROC_MASKED_DIRS = ['/proc/acpi', '/proc/scsi', '/proc/asound'];

/** Where the sandbox's home or /tmp comes from: a folder of its disk, or a size-limited tmpfs. */
export type DiskSource = { bind: string } | { tmpfsBytes: number };

function mountAt(source: DiskSource, dest: string, perms: string): string[] {
  return 'bind' in source
    ? ['--bind', source.bind, dest]
    : ['--size', String(source.tmpfsBytes), '--perms', perms, '--tmpfs', dest];
}

export interface BwrapOptions {
  hostname: string;
  home: DiskSource;
  tmp: DiskSource;
  /** A host folder bound read-only at {@link SANDBOX_HOME_TEMPLATE}, for envd to fill a tmpfs home. */
  homeTemplate?: string;
  /** Host folder with envd.cjs, mounted read-only as /opt/abx. */
  runtimeDir: string;
  /**
   * The sandbox's own root file system (an image's, under an overlay): bound as `/` instead of
   * the host's system folders, with the image's /etc/passwd and /etc/group.
   */
  rootfs?: string;
  /** Where the home is mounted; default /home/user. */
  homePath?: string;
  /**
   * Open file descriptors (in bwrap) whose contents become the sandbox's /etc/passwd and
   * /etc/group (so its user has a name) and /run/abx/token (envd's token, 0600).
   */
  fds: {
    passwd: number;
    group: number;
    token: number;
    resolv?: number;
    /**
     * An internet sandbox's trust (egress-ca.ts): the egress CA alone and the bundle with it, at
     * /run/abx; `systemBundle`, the bundle again, over the system's
     * /etc/ssl/certs/ca-certificates.crt (where that is a file to bind over).
     */
    egressCa?: number;
    bundle?: number;
    systemBundle?: number;
  };
  /**
   * The bundles as files every sandbox with the same one shares (trust.ts, sharedBundle), bound
   * read-only in place of `fds.bundle` and `fds.systemBundle`: one copy in memory for all.
   */
  trustFiles?: { bundle: string; systemBundle?: string };
  env: Record<string, string>;
  workdir: string;
  /**
   * `internet`: the sandbox joins a namespace made for it (bwrap runs inside it, see
   * sandbox-net.ts), and reads `fds.resolv` as /etc/resolv.conf.
   */
  network: 'none' | 'host' | 'internet';
  /** An open file descriptor (in bwrap) holding the compiled seccomp filter. */
  seccompFd?: number;
  /** The sandbox's first process and its arguments. */
  command: string[];
  /** Volumes: host folders bound at their paths (after the home and /tmp, which may hold them). */
  volumes?: readonly { source: string; dest: string; readOnly: boolean }[];
  /**
   * A root-allowing image sandbox (root-userns.ts): bwrap's user namespace maps 0 and 1000, the
   * daemon writes the maps while bwrap waits on `blockFd`, and `command` starts as uid 0 with
   * ROOT_CAPS; `sudo` (a host file, the runtime's shim) is bound at /usr/bin/sudo.
   */
  rootUserns?: { blockFd: number; infoFd: number; sudo: string };
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

let procMountsCache: string[] | undefined;

/**
 * bwrap options that harden the sandbox's own /proc. bwrap cannot bind onto a path its new proc
 * lacks, so only entries this host has are named (read once: /proc's layout is the kernel's).
 */
export function procMounts(): string[] {
  if (procMountsCache) return procMountsCache;
  const args: string[] = [];
  for (const path of PROC_READ_ONLY) {
    if (existsSync(path)) args.push('--ro-bind', path, path);
  }
  for (const path of PROC_MASKED_FILES) {
    if (existsSync(path)) args.push('--ro-bind', '/dev/null', path);
  }
  for (const path of PROC_MASKED_DIRS) {
    if (existsSync(path)) args.push('--tmpfs', path, '--remount-ro', path);
  }
  procMountsCache = args;
  return args;
}

/**
 * The bubblewrap command line of one sandbox: new user, pid, mount, ipc, uts, cgroup (and, unless
 * the template asks for the host's, net) namespaces, and no further user namespaces inside;
 * read-only system folders; no /sys; a hardened /proc; a private home and /tmp; the host's
 * environment cleared; the seccomp filter.
 */
export function bwrapArgs(options: BwrapOptions): string[] {
  const env = Object.entries(options.env).flatMap(([key, value]) => ['--setenv', key, value]);
  const root = options.rootUserns;
  return [
    ...(root
      ? rootBwrapArgs(root.blockFd, root.infoFd)
      : [
          '--unshare-user',
          '--uid',
          String(SANDBOX_UID),
          '--gid',
          String(SANDBOX_UID),
          // `unshare -r` and friends fail inside: a nested user namespace would give the sandbox
          // capabilities over new mount namespaces (cgroupfs, and whatever a kernel bug exposes).
          // A root sandbox's namespace gets max_user_namespaces 0 instead (root-userns.ts).
          '--disable-userns',
        ]),
    '--unshare-pid',
    '--unshare-ipc',
    '--unshare-uts',
    '--unshare-cgroup-try',
    ...(options.network === 'none' ? ['--unshare-net'] : []),
    '--hostname',
    options.hostname,
    // A new session: a process in the sandbox cannot push keystrokes into the host's terminal.
    '--new-session',
    ...(options.rootfs
      ? [
          '--bind',
          options.rootfs,
          '/',
          // An image's resolv.conf is the engine's placeholder: use the host's on its network.
          ...(options.network === 'host'
            ? ['--ro-bind', '/etc/resolv.conf', '/etc/resolv.conf']
            : []),
        ]
      : [
          ...systemMounts(),
          '--ro-bind-data',
          String(options.fds.passwd),
          '/etc/passwd',
          '--ro-bind-data',
          String(options.fds.group),
          '/etc/group',
        ]),
    ...(root ? ['--ro-bind', root.sudo, '/usr/bin/sudo'] : []),
    ...(options.network === 'internet' && options.fds.resolv !== undefined
      ? ['--ro-bind-data', String(options.fds.resolv), '/etc/resolv.conf']
      : []),
    '--proc',
    '/proc',
    ...procMounts(),
    '--dev',
    '/dev',
    ...mountAt(options.tmp, '/tmp', '1777'),
    ...(options.rootfs ? [] : ['--dir', '/home']),
    ...mountAt(options.home, options.homePath ?? SANDBOX_HOME, '0700'),
    ...(options.homeTemplate ? ['--ro-bind', options.homeTemplate, SANDBOX_HOME_TEMPLATE] : []),
    ...(options.volumes ?? []).flatMap((volume) => [
      volume.readOnly ? '--ro-bind' : '--bind',
      volume.source,
      volume.dest,
    ]),
    // envd's and the ports' sockets: a small tmpfs of the sandbox's own, which the host reaches
    // through /proc/PID/root (nothing the sandbox writes lands on the host's disk).
    '--size',
    String(RUN_DIR_BYTES),
    '--perms',
    '0755',
    '--tmpfs',
    SANDBOX_RUN_DIR,
    '--dir',
    `${SANDBOX_RUN_DIR}/ports`,
    '--perms',
    '0600',
    '--file',
    String(options.fds.token),
    `${SANDBOX_RUN_DIR}/token`,
    ...trustMounts(options.fds, options.trustFiles),
    '--ro-bind',
    options.runtimeDir,
    SANDBOX_RUNTIME_DIR,
    // In an image's root the launcher made it (bwrap may not write there).
    ...(options.rootfs ? [] : ['--dir', options.workdir]),
    '--chdir',
    options.workdir,
    '--clearenv',
    ...env,
    ...(options.seccompFd === undefined ? [] : ['--seccomp', String(options.seccompFd)]),
    '--',
    ...options.command,
  ];
}

/** bwrap options that give a sandbox the egress CA and the bundle with it (see BwrapOptions.fds). */
function trustMounts(fds: BwrapOptions['fds'], files: BwrapOptions['trustFiles']): string[] {
  const args: string[] = [];
  if (fds.egressCa !== undefined) {
    args.push('--perms', '0444', '--ro-bind-data', String(fds.egressCa), SANDBOX_CA_FILE);
  }
  if (files) {
    args.push('--ro-bind', files.bundle, SANDBOX_BUNDLE_FILE);
    if (files.systemBundle) args.push('--ro-bind', files.systemBundle, SYSTEM_BUNDLE);
    return args;
  }
  if (fds.bundle !== undefined) {
    args.push('--perms', '0444', '--ro-bind-data', String(fds.bundle), SANDBOX_BUNDLE_FILE);
  }
  if (fds.systemBundle !== undefined) {
    args.push('--ro-bind-data', String(fds.systemBundle), SYSTEM_BUNDLE);
  }
  return args;
}

/** Where Debian (and Alpine, Ubuntu) keep the system's CA bundle, which OpenSSL reads. */
export const SYSTEM_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';

/**
 * `prlimit` options for the template's per-process limits (empty when it sets none).
 * RLIMIT_NPROC counts every process of the real uid: right for a sandbox with a uid of its own,
 * wrong for a rootless one, which shares the daemon's (its pids cgroup limits it instead).
 */
export function prlimitArgs(resources: TemplateResources, ownUid: boolean): string[] {
  const limits: string[] = [];
  if (resources.processes && ownUid) limits.push(`--nproc=${resources.processes}`);
  if (resources.openFiles) limits.push(`--nofile=${resources.openFiles}`);
  if (resources.fileSize) limits.push(`--fsize=${resources.fileSize}`);
  return limits;
}
