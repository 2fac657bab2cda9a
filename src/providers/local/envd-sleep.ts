import { execFile } from 'node:child_process';
import { lstatSync } from 'node:fs';
import { lstat, readlink } from 'node:fs/promises';
import { posix } from 'node:path';
import { promisify } from 'node:util';
import {
  ENVD_FRONT_NAME,
  SANDBOX_RUN_DIR,
  SANDBOX_RUNTIME_DIR,
} from '../../../runtime/protocol/constants.js';
import { envMilliseconds } from '../../util/env-ms.js';
import { elfRunsHere } from '../portable-runtime.js';

/**
 * How long a local sandbox's envd waits with nothing to do before it sleeps (exits, 75), unless
 * `ABX_ENVD_IDLE_MS` says otherwise (0: never). An idle sandbox then costs its bwrap, a shell and
 * its network's processes, not a resident Node; the next request wakes envd (docs/providers.md).
 */
export const DEFAULT_ENVD_IDLE_MS = 60_000;

/** `ABX_ENVD_IDLE_MS`, or {@link DEFAULT_ENVD_IDLE_MS}. */
export function envdIdleMs(env: NodeJS.ProcessEnv = process.env): number {
  return envMilliseconds('ABX_ENVD_IDLE_MS', DEFAULT_ENVD_IDLE_MS, 0, env);
}

/** The FIFO a sleeping envd's shell loop waits on, in the sandbox's /run/abx. */
export const WAKE_FIFO = `${SANDBOX_RUN_DIR}/wake`;
const TOKEN_FILE = `${SANDBOX_RUN_DIR}/token`;

/**
 * The shell loop envd runs under (`$0` is `abx-envd`, then envd's command line). It reads the
 * token file once (it is the sandbox's first process: nothing else can have read it) and empties
 * it, then hands the tokens to each envd on its stdin (`--token-file -`): a builtin's pipe, never
 * an argument or the environment. envd exiting 75 is asleep: the loop waits for a line on the
 * wake FIFO (whatever opens it for writing wakes it: at worst a process of the sandbox wakes its
 * own envd) and starts envd again; any other exit ends the sandbox with envd's code. A FIFO
 * that is gone (the sandbox removed it) starts envd again after a second. One line, so that a
 * listing of the sandbox's processes shows it as one. It makes the wake FIFO first, mode 0600
 * as the sandbox's user, before any process of the sandbox runs; where the image has no
 * `mkfifo`, the daemon makes it once envd answers ({@link makeWakeFifo}).
 */
const LOOP = [
  `mkfifo -m 600 ${WAKE_FIFO} 2>/dev/null;`,
  `{ IFS= read -r c; IFS= read -r k; } < ${TOKEN_FILE}; : > ${TOKEN_FILE}; while :; do`,
  `printf '%s\\n%s\\n' "$c" "$k" | "$@"; s=$?; [ "$s" -eq 75 ] || exit "$s";`,
  `read -r _ < ${WAKE_FIFO} || sleep 1; done`,
].join(' ');

/** The sandbox's `/bin/sh`, which runs the loop. */
const SHELL = '/bin/sh';

/**
 * envd's command line (`command`: its program and arguments, with `--token-file /run/abx/token`)
 * under the sleep loop, with `--idle-exit-ms`; unchanged when `idleMs` is 0.
 */
export function sleepingEnvd(command: readonly string[], idleMs: number): string[] {
  if (idleMs <= 0) return [...command];
  const args = [...command];
  const at = args.indexOf('--token-file');
  if (at < 0 || args[at + 1] !== TOKEN_FILE) {
    throw new Error(`envd's command line has no --token-file ${TOKEN_FILE} to hand on`);
  }
  args[at + 1] = '-';
  return [SHELL, '-c', LOOP, 'abx-envd', ...args, '--idle-exit-ms', String(idleMs)];
}

const FRONT = `${SANDBOX_RUNTIME_DIR}/${ENVD_FRONT_NAME}`;
/** Node's envd's own socket under its front; the front holds envd.sock. */
export const NODE_ENVD_SOCKET = `${SANDBOX_RUN_DIR}/envd-node.sock`;
const ENVD_SOCKET = `${SANDBOX_RUN_DIR}/envd.sock`;

/**
 * envd's command line (as for {@link sleepingEnvd}) under its front, which holds envd's socket
 * for the sandbox's whole life, runs commands itself while Node's envd sleeps and starts Node's
 * envd (on {@link NODE_ENVD_SOCKET}, the tokens on its stdin, its log lines on its stdout) for
 * any other request: docs/providers.md, "envd's front".
 */
export function frontedEnvd(command: readonly string[], idleMs: number): string[] {
  const args = [...command];
  const at = args.indexOf('--token-file');
  const socketAt = args.indexOf('--socket');
  if (at < 0 || args[at + 1] !== TOKEN_FILE || socketAt < 0 || args[socketAt + 1] !== ENVD_SOCKET) {
    throw new Error(
      `envd's command line has no --token-file ${TOKEN_FILE} and --socket ${ENVD_SOCKET} to hand on`,
    );
  }
  args[at + 1] = '-';
  args[socketAt + 1] = NODE_ENVD_SOCKET;
  const own = (name: string) => {
    const i = args.indexOf(name);
    return i < 0 ? [] : [name, args[i + 1] as string];
  };
  return [
    FRONT,
    '--socket',
    ENVD_SOCKET,
    '--token-file',
    TOKEN_FILE,
    ...own('--capabilities'),
    ...own('--template'),
    '--runtime-shell',
    `${SANDBOX_RUNTIME_DIR}/bin/sh`,
    '--',
    ...args,
    '--idle-exit-ms',
    String(Math.max(1, idleMs)),
    '--log-stdout',
  ];
}

/**
 * Whether a command line is envd's front ({@link frontedEnvd}); it runs as envd does (the same
 * user and umask), and holds envd's socket.
 */
export function isEnvdFront(argv: readonly string[]): boolean {
  return argv[0] === FRONT && argv[1] === '--socket' && argv[2] === ENVD_SOCKET;
}

/**
 * Whether a runtime folder on the host has a front this machine runs: an ELF executable for this
 * machine's architecture. Without one, envd sleeps under the shell loop as before.
 */
export function frontIn(runtimeDir: string): boolean {
  return process.env.ABX_ENVD_FRONT !== '0' && elfRunsHere(`${runtimeDir}/${ENVD_FRONT_NAME}`);
}

/** The loop as daemons before the loop made the FIFO itself started it (a sandbox they left running). */
const LOOP_BEFORE_FIFO = LOOP.slice(LOOP.indexOf('{'));

/** Whether a command line (`/proc/PID/cmdline` split at NUL) is the loop of {@link sleepingEnvd}. */
export function isEnvdLoop(argv: readonly string[]): boolean {
  return (
    argv[0] === SHELL &&
    argv[1] === '-c' &&
    (argv[2] === LOOP || argv[2] === LOOP_BEFORE_FIFO) &&
    argv[3] === 'abx-envd'
  );
}

/**
 * Whether an image's root file system has a `/bin/sh` to run the loop: its symlinks followed
 * inside the image (an absolute one from the image's root), at most 20.
 */
export async function imageHasShell(rootfs: string): Promise<boolean> {
  let path = SHELL;
  for (let hops = 0; hops < 20; hops++) {
    const parts = posix.normalize(path).split('/').filter(Boolean);
    let at = '';
    let followed = false;
    for (const [index, part] of parts.entries()) {
      at = `${at}/${part}`;
      let stats: Awaited<ReturnType<typeof lstat>>;
      try {
        stats = await lstat(`${rootfs}${at}`);
      } catch {
        return false;
      }
      if (stats.isSymbolicLink()) {
        const target = await readlink(`${rootfs}${at}`);
        const rest = parts.slice(index + 1).join('/');
        const base = target.startsWith('/') ? target : posix.join(posix.dirname(at), target);
        path = rest ? `${base}/${rest}` : base;
        followed = true;
        break;
      }
      if (index === parts.length - 1) return stats.isFile() && (stats.mode & 0o111) !== 0;
      if (!stats.isDirectory()) return false;
    }
    if (!followed) return false;
  }
  return false;
}

/**
 * Makes the wake FIFO in a sandbox that runs the loop (`init`: its init's pid; reached through
 * `/proc/INIT/root`) where the loop did not (an image without `mkfifo`): mode 0600, its user's
 * (made as `uid` on the host in root mode; rootless, the daemon's own uid is the sandbox's): only
 * the daemon and the sandbox's user open it. Called before the sandbox is handed out, when no
 * process of the sandbox but envd runs. A FIFO there already is left as it is: the loop made it,
 * and the daemon saves a process (a fork of itself) on every create.
 */
export async function makeWakeFifo(init: number, uid: number | undefined): Promise<void> {
  const path = `/proc/${init}/root${WAKE_FIFO}`;
  if (lstatSync(path, { throwIfNoEntry: false })?.isFIFO()) return;
  // As the sandbox's uid: host root is not mapped in the sandbox's user namespace, and its tmpfs
  // refuses a file root would own (EOVERFLOW).
  const asUid =
    uid === undefined
      ? []
      : ['setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', '--no-new-privs'];
  const argv = [...asUid, 'mkfifo', '-m', '600', path];
  await promisify(execFile)(argv[0] as string, argv.slice(1));
}
