import {
  closeSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { homedir } from 'node:os';
import { join, resolve } from 'node:path';
import { DaemonUnavailableError } from '../errors.js';
import { packageInfo } from '../util/package-info.js';
import type { DaemonInfo } from './daemon-info.js';
import { exchange } from './json-client.js';
import { abxHome, abxPaths } from './paths.js';
import { readOrCreateSecret } from './secrets.js';

/** How the SDK finds the control plane. */
export interface ConnectionOptions {
  /** State folder of the installation; default `$ABX_HOME` or `~/.abx`. */
  home?: string;
  /** Start the daemon when none runs (default true). */
  autoStart?: boolean;
  /** Timeout of one API request; default 60 s. */
  requestTimeoutMs?: number;
  /**
   * A remote control plane's API, e.g. `https://abx.example.com:8443` (`abx daemon start
   * --listen`); default `$ABX_API_URL` (unless `home` is given). With it no local daemon is looked
   * for or started and `$ABX_HOME` is not read.
   */
  apiUrl?: string;
  /** The remote control plane's API key; default `$ABX_API_KEY`. */
  apiKey?: string;
  /**
   * A CA to trust for the remote control plane besides the system's (and `NODE_EXTRA_CA_CERTS`):
   * its PEM text or a file holding it; default `$ABX_CA_CERT`.
   */
  caCert?: string;
  /**
   * Where to reach the remote gateway when `{port}-{sandboxId}.{domain}` names do not resolve
   * here (no wildcard DNS), e.g. `https://10.0.0.5:8444`; requests name the sandbox in headers.
   * Default `$ABX_GATEWAY_URL`, else the sandbox's host name.
   */
  gatewayUrl?: string;
}

/** A running daemon and the key to its API. */
export interface DaemonConnection {
  home: string;
  info: DaemonInfo;
  apiKey: string;
}

const DAEMON_START_TIMEOUT_MS = 20_000;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function readInfo(file: string): DaemonInfo | undefined {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as DaemonInfo;
  } catch {
    return undefined;
  }
}

/** True while a process with this pid exists. */
export function isProcessAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  // A process that ended but was not yet waited for (a daemon this process started, killed) is a
  // zombie: signal 0 still reaches it, yet it serves nothing.
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat[stat.lastIndexOf(')') + 2] !== 'Z';
  } catch {
    // No /proc (or it ended meanwhile): signal 0 said it was there.
    return true;
  }
}

/**
 * How long a daemon that answered its health check is taken as answering without another: a
 * script's creates, lists and kills each connect, and a health round trip before every one of
 * them was a third of a warm create's own time (issue 49). Within this, the daemon's
 * `daemon.json` must still name the same process at the same address, and that process be
 * alive; a daemon that stops answering meanwhile fails the request itself, as one that stopped
 * after its check would.
 */
export const DAEMON_ANSWERED_TRUST_MS = 10_000;

/** Per home: the daemon that last answered its health check in this process, and when. */
const answered = new Map<string, { pid: number; apiUrl: string; at: number }>();

async function healthy(info: DaemonInfo, home: string): Promise<boolean> {
  try {
    const answer = await exchange(new URL('/v1/health', info.apiUrl), {
      method: 'GET',
      timeoutMs: 2000,
    });
    if (answer.status !== 200) return false;
    answered.set(home, { pid: info.pid, apiUrl: info.apiUrl, at: Date.now() });
    return true;
  } catch {
    return false;
  }
}

/** The running daemon of `home`, if there is one that answers. */
export async function findDaemon(home = abxHome()): Promise<DaemonInfo | undefined> {
  const info = readInfo(abxPaths(home).daemonInfo);
  if (info && isProcessAlive(info.pid) && (await healthy(info, home))) return info;
  return undefined;
}

/**
 * The daemon of `home` without a health round trip, when the same one answered within
 * {@link DAEMON_ANSWERED_TRUST_MS} and its process is still there; else undefined.
 */
function answeredLately(home: string): DaemonInfo | undefined {
  const seen = answered.get(home);
  if (!seen || Date.now() - seen.at >= DAEMON_ANSWERED_TRUST_MS) return undefined;
  const info = readInfo(abxPaths(home).daemonInfo);
  if (!info || info.pid !== seen.pid || info.apiUrl !== seen.apiUrl) return undefined;
  return isProcessAlive(info.pid) && !exiting(info.pid) ? info : undefined;
}

/** Forgets that the daemon of `home` answered lately: the next connection checks its health. */
export function forgetDaemonAnswer(home: string): void {
  answered.delete(home);
}

/**
 * Whether a process is on its way out: killed, its memory already gone (its command line reads
 * empty from then on), but not yet a zombie. Its sockets close next; it answers nothing more.
 * A live daemon (a Node process) always has a command line.
 */
function exiting(pid: number): boolean {
  try {
    return readFileSync(`/proc/${pid}/cmdline`).length === 0;
  } catch {
    return false;
  }
}

/**
 * Every daemon of this package running on the host as a user whose processes we can read, with
 * its home: processes running `dist/daemon.js` whose `$ABX_HOME` (else `~/.abx` of their `$HOME`)
 * holds a `daemon.json` naming them. Best effort: an unreadable process is left out.
 */
export function runningDaemons(): { pid: number; home: string }[] {
  const found: { pid: number; home: string }[] = [];
  let entries: string[];
  try {
    entries = readdirSync('/proc').filter((name) => /^\d+$/.test(name));
  } catch {
    return found;
  }
  for (const entry of entries) {
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      if (!argv.slice(1, 3).some((arg) => /[/\\]dist[/\\]daemon\.js$/.test(arg))) continue;
      const env = new Map(
        readFileSync(`/proc/${entry}/environ`, 'utf8')
          .split('\0')
          .map((pair) => [pair.slice(0, pair.indexOf('=')), pair.slice(pair.indexOf('=') + 1)]),
      );
      const home = resolve(env.get('ABX_HOME') || join(env.get('HOME') || homedir(), '.abx'));
      if (readInfo(abxPaths(home).daemonInfo)?.pid === Number(entry)) {
        found.push({ pid: Number(entry), home });
      }
    } catch {
      // gone, or not ours to read
    }
  }
  return found;
}

/** Takes the start lock (a file created exclusively); a lock older than the start timeout is stale. */
function tryLock(file: string): boolean {
  try {
    closeSync(openSync(file, 'wx'));
    return true;
  } catch {
    try {
      if (Date.now() - statSync(file).mtimeMs > DAEMON_START_TIMEOUT_MS)
        rmSync(file, { force: true });
    } catch {
      // gone meanwhile
    }
    return false;
  }
}

/** Starts the daemon of `home` in the background and waits until it answers. */
export async function startDaemon(home = abxHome()): Promise<DaemonInfo> {
  const paths = abxPaths(home);
  readOrCreateSecret(paths.apiKey);
  const deadline = Date.now() + DAEMON_START_TIMEOUT_MS;
  while (Date.now() < deadline) {
    const running = await findDaemon(home);
    if (running) return running;
    if (tryLock(paths.startLock)) {
      try {
        const again = await findDaemon(home);
        if (again) return again;
        writeFileSync(paths.daemonLog, '', { flag: 'a' });
        const logStart = statSync(paths.daemonLog).size;
        const log = openSync(paths.daemonLog, 'a');
        // node:child_process (and the dgram and net it loads) only to start a daemon.
        const { spawn } = process.getBuiltinModule('node:child_process');
        const child = spawn(process.execPath, [join(packageInfo().root, 'dist', 'daemon.js')], {
          detached: true,
          stdio: ['ignore', log, log],
          env: { ...process.env, ABX_HOME: home },
        });
        closeSync(log);
        child.unref();
        while (Date.now() < deadline) {
          const info = readInfo(paths.daemonInfo);
          if (info && info.pid === child.pid && (await healthy(info, home))) return info;
          if (child.exitCode !== null) break;
          await sleep(25);
        }
        // What this start wrote: a daemon that refuses to start says why in one `abx daemon:` line.
        const written = readFileSync(paths.daemonLog).subarray(logStart).toString('utf8');
        const reason = written
          .split('\n')
          .reverse()
          .find((line) => line.startsWith('abx daemon: '));
        if (reason && child.exitCode !== null) {
          throw new DaemonUnavailableError(
            `the abx daemon did not start: ${reason.slice('abx daemon: '.length)}`,
          );
        }
        throw new DaemonUnavailableError(
          `the abx daemon did not start; its log (${paths.daemonLog}) ends:\n${written.slice(-2000)}`,
        );
      } finally {
        rmSync(paths.startLock, { force: true });
      }
    }
    await sleep(50);
  }
  throw new DaemonUnavailableError(
    `the abx daemon did not start within ${DAEMON_START_TIMEOUT_MS} ms`,
  );
}

/** The daemon to talk to, started if needed (unless `autoStart: false`). */
export async function connectDaemon(options: ConnectionOptions = {}): Promise<DaemonConnection> {
  const home = options.home ?? abxHome();
  const info =
    answeredLately(home) ??
    (await findDaemon(home)) ??
    (options.autoStart === false ? undefined : await startDaemon(home));
  if (!info) {
    throw new DaemonUnavailableError(
      `no abx daemon runs for ${home}; start one with \`abx daemon start\``,
    );
  }
  return { home, info, apiKey: readFileSync(abxPaths(home).apiKey, 'utf8').trim() };
}

/** Asks the daemon of `home` to stop and waits for its process to end. */
export async function stopDaemon(home = abxHome(), timeoutMs = 15_000): Promise<boolean> {
  answered.delete(home);
  const info = readInfo(abxPaths(home).daemonInfo);
  if (!info || !isProcessAlive(info.pid)) return false;
  const apiKey = readFileSync(abxPaths(home).apiKey, 'utf8').trim();
  try {
    await exchange(new URL('/v1/shutdown', info.apiUrl), {
      method: 'POST',
      headers: { authorization: `Bearer ${apiKey}` },
      timeoutMs: 5000,
    });
  } catch {
    process.kill(info.pid, 'SIGTERM');
  }
  const deadline = Date.now() + timeoutMs;
  while (isProcessAlive(info.pid) && Date.now() < deadline) await sleep(25);
  if (isProcessAlive(info.pid)) process.kill(info.pid, 'SIGKILL');
  return true;
}
