import { closeSync, constants, fstatSync, openSync, unlinkSync, writeSync } from 'node:fs';
import { connect, Socket } from 'node:net';
import { basename, dirname, join } from 'node:path';

// Linux open(2) flags that node does not export.
const O_PATH = 0o10000000;
const O_NOFOLLOW = 0o400000;
const O_DIRECTORY = 0o200000;

/**
 * A sandbox can write in its `/run/abx` (envd's socket and the port sockets live there), so it
 * could replace a socket, or the `ports` folder, with a symlink to any socket of the host. The
 * daemon runs on the host: following such a link would hand the sandbox the host's sockets. So
 * these paths are walked from a trusted base down one component at a time with
 * O_PATH | O_NOFOLLOW, the last must be a socket, and the connection goes to that very inode
 * through /proc/self/fd — a swap between the check and the connect changes nothing.
 *
 * The base is the host-owned run folder, or, for a sandbox whose /run/abx lives inside it (a
 * tmpfs of its own, so it cannot fill the host's disk), its root as the kernel shows it at
 * `/proc/PID/root`: every component below that, `run` and `abx` included, is the sandbox's.
 */
/** `/proc/PID/root` is a magic link: the one component that must be followed. */
const PROC_ROOT = /^\/proc\/\d+\/root(?=\/)/;

function openBase(runDir: string): number {
  return openSync(runDir, O_PATH | O_DIRECTORY | (PROC_ROOT.test(`${runDir}/`) ? 0 : O_NOFOLLOW));
}

function openWithin(runDir: string, relative: string, kind: 'socket' | 'fifo' = 'socket'): number {
  const parts = relative.split('/').filter(Boolean);
  let fd = openBase(runDir);
  try {
    for (const [index, part] of parts.entries()) {
      if (part === '..' || part === '.')
        throw Object.assign(new Error(`bad path ${relative}`), { code: 'EINVAL' });
      const last = index === parts.length - 1;
      const next = openSync(
        `/proc/self/fd/${fd}/${part}`,
        O_PATH | O_NOFOLLOW | (last ? 0 : O_DIRECTORY),
      );
      closeSync(fd);
      fd = next;
    }
    const stats = fstatSync(fd);
    if (kind === 'fifo' ? !stats.isFIFO() : !stats.isSocket()) {
      throw Object.assign(new Error(`${runDir}/${relative} is not a ${kind}`), {
        code: kind === 'fifo' ? 'EINVAL' : 'ENOTSOCK',
      });
    }
    return fd;
  } catch (error) {
    closeSync(fd);
    throw error;
  }
}

/** Where a sandbox socket path sits: the run folder and the path below it. */
export function splitRunPath(socketPath: string): { runDir: string; relative: string } {
  const root = PROC_ROOT.exec(socketPath);
  if (root) return { runDir: root[0], relative: socketPath.slice(root[0].length + 1) };
  const ports = /\/ports\/[^/]+$/.exec(socketPath);
  if (ports) return { runDir: dirname(dirname(socketPath)), relative: ports[0].slice(1) };
  return {
    runDir: dirname(socketPath),
    relative: socketPath.slice(dirname(socketPath).length + 1),
  };
}

/** How a sandbox reached over TCP (a pod) names envd and its ports: `tcp://HOST:PORT`. */
const TCP_PREFIX = 'tcp://';

/** The `tcp://HOST:PORT` target of a sandbox's envd, or of one of its ports (IPv6 in brackets). */
export function tcpTarget(host: string, port: number): string {
  return `${TCP_PREFIX}${host.includes(':') ? `[${host}]` : host}:${port}`;
}

/** Host and port of a `tcp://HOST:PORT` target; undefined for a Unix socket path. */
export function parseTcpTarget(target: string): { host: string; port: number } | undefined {
  if (!target.startsWith(TCP_PREFIX)) return undefined;
  const found = /^tcp:\/\/(?:\[([0-9a-fA-F:.]+)\]|([^:/[\]]+)):(\d{1,5})$/.exec(target);
  const port = Number(found?.[3]);
  if (!found || port < 1 || port > 65535) return undefined;
  return { host: (found[1] ?? found[2]) as string, port };
}

/**
 * Where the gateway dials port `port` of a sandbox: `{portsDir}/{port}.sock` on the host, or,
 * for a sandbox reached over TCP (`portsDir` is `tcp://HOST`, a pod's address), `tcp://HOST:port`.
 */
export function sandboxPortTarget(handle: { portsDir: string }, port: number): string {
  if (handle.portsDir.startsWith(TCP_PREFIX)) {
    const host = handle.portsDir.slice(TCP_PREFIX.length).replace(/^\[(.*)\]$/, '$1');
    return tcpTarget(host, port);
  }
  return join(handle.portsDir, `${port}.sock`);
}

/**
 * Connects to a sandbox's envd or port: a `tcp://HOST:PORT` target over TCP (a pod: its address
 * comes from the cluster's API, not from anything the sandbox writes; envd there checks the token
 * on every request as on its socket), anything else as a socket of the sandbox's run folder,
 * without following any symlink inside it (see above). Failures (a missing socket, a symlink, not
 * a socket, a refused connection) come as the socket's 'error'. A local sandbox's envd that sleeps
 * (its socket gone, a wake FIFO beside it: envd-sleep.ts) is woken and connected to once it is
 * back, within {@link ENVD_WAKE_TIMEOUT_MS}: every connection to envd comes through here.
 */
export function connectSandboxSocket(
  socketPath: string,
  options: {
    /** A sleeping envd is woken (the default); false: fail as for a missing socket (its log). */
    wake?: boolean;
  } = {},
): Socket {
  if (socketPath.startsWith(TCP_PREFIX)) {
    const tcp = parseTcpTarget(socketPath);
    if (tcp) return connect({ host: tcp.host, port: tcp.port, noDelay: true });
    const socket = new Socket();
    const error = Object.assign(new Error(`bad sandbox address ${socketPath}`), { code: 'EINVAL' });
    process.nextTick(() => socket.destroy(error));
    return socket;
  }
  const { runDir, relative } = splitRunPath(socketPath);
  let fd: number;
  try {
    fd = openWithin(runDir, relative);
  } catch (error) {
    const socket = new Socket();
    const fifo = join(dirname(relative), WAKE_FIFO_NAME);
    const poked =
      options.wake !== false &&
      (error as NodeJS.ErrnoException).code === 'ENOENT' &&
      basename(relative) === ENVD_SOCKET_NAME
        ? poke(runDir, fifo)
        : 'none';
    if (poked !== 'none') {
      wakeAndConnect(socket, runDir, relative, fifo, poked === 'woken');
      return socket;
    }
    process.nextTick(() => socket.destroy(error as Error));
    return socket;
  }
  return connectFd(new Socket(), fd);
}

/** Connects `socket` to the socket open as O_PATH `fd` (closed once the connect is done). */
function connectFd(socket: Socket, fd: number): Socket {
  socket.connect(`/proc/self/fd/${fd}`);
  let open = true;
  const release = () => {
    if (open) closeSync(fd);
    open = false;
  };
  socket.once('connect', release);
  socket.once('error', release);
  socket.once('close', release);
  return socket;
}

/** envd's socket in a sandbox's /run/abx, and the FIFO its sleep loop waits on beside it. */
const ENVD_SOCKET_NAME = 'envd.sock';
const WAKE_FIFO_NAME = 'wake';

/**
 * How long a connect to a sleeping envd waits for it to wake (a Node start: ~0.1-0.5 s on an idle
 * host) before it fails; docs/providers.md, "envd sleeps when idle".
 */
export const ENVD_WAKE_TIMEOUT_MS = 10_000;
/**
 * The longest wait between two looks for a waking envd's socket (2, 4, then every 5 ms): a look
 * is a few system calls, and a wider step would add half of it to every wake on average.
 */
const WAKE_POLL_MAX_MS = 5;
/** A wake is sent again this often while envd's socket is still missing (a lost one, a busy host). */
const WAKE_AGAIN_MS = 500;

/**
 * Writes a line to a sandbox's wake FIFO, never following a symlink to it: `woken` when a reader
 * had it open (its shell loop, or a process of the sandbox: at worst that one wakes its own envd),
 * `waiting` when none had yet (envd is still on its way out: try again shortly), `none` when the
 * sandbox has no FIFO there (its envd does not sleep).
 */
function poke(runDir: string, fifo: string): 'woken' | 'waiting' | 'none' {
  let at: number;
  try {
    at = openWithin(runDir, fifo, 'fifo');
  } catch {
    return 'none';
  }
  try {
    const fd = openSync(`/proc/self/fd/${at}`, constants.O_WRONLY | constants.O_NONBLOCK);
    try {
      writeSync(fd, '\n');
    } catch {
      // Full (a process of the sandbox writes and nobody reads): the line there wakes it anyway.
    } finally {
      closeSync(fd);
    }
    return 'woken';
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'ENXIO' ? 'waiting' : 'none';
  } finally {
    closeSync(at);
  }
}

/**
 * Connects `socket` once envd's socket is back, polling every few ms and waking envd again every
 * {@link WAKE_AGAIN_MS}, for {@link ENVD_WAKE_TIMEOUT_MS} at most. Until then the socket is
 * `connecting`: what is written waits for the connection, as on any socket.
 */
function wakeAndConnect(
  socket: Socket,
  runDir: string,
  relative: string,
  fifo: string,
  woken: boolean,
): void {
  (socket as unknown as { connecting: boolean }).connecting = true;
  const started = Date.now();
  let pokedAt = started;
  let wait = 2;
  const attempt = () => {
    if (socket.destroyed) return;
    let fd: number;
    try {
      fd = openWithin(runDir, relative);
    } catch (error) {
      const now = Date.now();
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT' || now - started >= ENVD_WAKE_TIMEOUT_MS) {
        socket.destroy(
          code === 'ENOENT'
            ? Object.assign(
                new Error(
                  `the sandbox's envd (${runDir}) did not wake within ${ENVD_WAKE_TIMEOUT_MS} ms of its wake: its sandbox may be ending; try again`,
                ),
                { code: 'ETIMEDOUT' },
              )
            : (error as Error),
        );
        return;
      }
      // Until a reader took a line (the loop may not wait yet), then every WAKE_AGAIN_MS.
      if ((!woken || now - pokedAt >= WAKE_AGAIN_MS) && poke(runDir, fifo) === 'woken') {
        woken = true;
        pokedAt = now;
      }
      setTimeout(attempt, wait);
      wait = Math.min(wait * 2, WAKE_POLL_MAX_MS);
      return;
    }
    (socket as unknown as { connecting: boolean }).connecting = false;
    connectFd(socket, fd);
  };
  setTimeout(attempt, 1);
}

/** Removes a stale socket of a sandbox's run folder, never following a symlink to get there. */
export function unlinkSandboxSocket(socketPath: string): void {
  if (socketPath.startsWith(TCP_PREFIX)) return; // an address, not a file
  const { runDir, relative } = splitRunPath(socketPath);
  const parts = relative.split('/');
  const name = parts.pop() as string;
  try {
    let fd = openBase(runDir);
    for (const part of parts) {
      const next = openSync(`/proc/self/fd/${fd}/${part}`, O_PATH | O_DIRECTORY | O_NOFOLLOW);
      closeSync(fd);
      fd = next;
    }
    try {
      unlinkSync(`/proc/self/fd/${fd}/${name}`);
    } finally {
      closeSync(fd);
    }
  } catch {
    // already gone, or not ours to remove
  }
}
