import { closeSync, fstatSync, openSync, unlinkSync } from 'node:fs';
import { connect, Socket } from 'node:net';
import { dirname, join } from 'node:path';

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

function openWithin(runDir: string, relative: string): number {
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
    if (!fstatSync(fd).isSocket()) {
      throw Object.assign(new Error(`${runDir}/${relative} is not a socket`), { code: 'ENOTSOCK' });
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
 * a socket, a refused connection) come as the socket's 'error'.
 */
export function connectSandboxSocket(socketPath: string): Socket {
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
    process.nextTick(() => socket.destroy(error as Error));
    return socket;
  }
  const socket = connect(`/proc/self/fd/${fd}`);
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
