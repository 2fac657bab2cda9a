// What the benchmarks measure with: processes, their memory and CPU, the host's, the daemon's pool.
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { Sandbox } from 'abx-sandbox';
import { Client } from 'undici';
import { openSqlite } from '../src/control/sqlite.js';
import { isEnvdFront, NODE_ENVD_SOCKET } from '../src/providers/local/envd-sleep.js';
import { isEnvdCommandLine, nodeScriptAt } from '../src/providers/provider.js';
import { children, HOME } from './runner.js';
import { round } from './stats.js';

/** Starts a host process that prints `{"event":"listening","port":N}` and returns the port. */
export function startListening(
  command: string,
  args: string[],
  env: NodeJS.ProcessEnv = process.env,
) {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'inherit'], env });
  children.push(child);
  return new Promise<{ port: number; pid: number }>((resolve, reject) => {
    let buffer = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      buffer += chunk.toString();
      const line = buffer.split('\n').find((l) => l.includes('"listening"'));
      if (line) resolve({ port: JSON.parse(line).port, pid: child.pid as number });
    });
    child.once('exit', (code) => reject(new Error(`${command} exited (${code}) before listening`)));
  });
}

export function rssMiB(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return round(Number(/VmRSS:\s+(\d+)/.exec(status)?.[1]) / 1024, 1);
}

/** RSS of the node process inside the sandbox that runs `/opt/abx/<script>` (envd.cjs...). */
export async function sandboxRssMiB(sandbox: Sandbox, script: string): Promise<number> {
  // Compares the script exactly (the first argument after the program that is not one of Node's
  // options, as nodeScriptAt reads it): a pattern over whole command lines would match this loop.
  const { stdout } = await sandbox.commands.run(
    `for p in /proc/[0-9]*; do [ "$(tr '\\0' '\\n' < $p/cmdline 2>/dev/null | sed 1d | grep -m1 -v '^-')" = /opt/abx/${script} ] && grep VmRSS $p/status; done | head -1`,
  );
  return round(Number(/(\d+)/.exec(stdout)?.[1]) / 1024, 1);
}

/** VmRSS and the private pages (what the process itself adds: USS) of a sandbox process, MiB. */
export async function sandboxPidMemory(
  sandbox: Sandbox,
  pid: number,
): Promise<{ rssMiB: number; privateMiB: number }> {
  const { stdout } = await sandbox.commands.run(
    `grep -E '^VmRSS' /proc/${pid}/status; grep -E '^Private_(Clean|Dirty)' /proc/${pid}/smaps_rollup`,
  );
  const kib = (name: RegExp) =>
    stdout
      .split('\n')
      .filter((line) => name.test(line))
      .reduce((sum, line) => sum + Number(/(\d+)/.exec(line)?.[1] ?? Number.NaN), 0);
  return {
    rssMiB: round(kib(/^VmRSS/) / 1024, 1),
    privateMiB: round(kib(/^Private_/) / 1024, 1),
  };
}

/** The OS pid of the command server on `port` of a sandbox, from envd's process list. */
export async function serverOsPid(sandbox: Sandbox, port = 8080): Promise<number> {
  const server = (await sandbox.commands.list()).find(
    (p) => p.running && p.cmd.includes(`--port ${port} `),
  );
  if (!server?.osPid) throw new Error(`bench: no command server runs on port ${port}`);
  return server.osPid;
}

/** One JSON request to a sandbox's envd through the gateway (routes the SDK has no call for). */
export async function envdJson<T>(
  sandbox: Sandbox,
  method: 'GET' | 'POST',
  path: string,
): Promise<T> {
  const gateway = new Client(daemonInfo().gatewayUrl);
  try {
    const res = await gateway.request({
      path,
      method,
      headers: {
        'x-sandbox-id': sandbox.sandboxId,
        'x-sandbox-port': '49983',
        'x-access-token': sandbox.accessToken,
        ...(method === 'POST' ? { 'content-type': 'application/json' } : {}),
      },
      ...(method === 'POST' ? { body: '{}' } : {}),
    });
    const text = await res.body.text();
    if (res.statusCode !== 200)
      throw new Error(`bench: ${method} ${path}: ${res.statusCode} ${text}`);
    return JSON.parse(text) as T;
  } finally {
    await gateway.close();
  }
}

/** The idle pre-started command server process of a sandbox, started and ready: its OS pid. */
export async function idleServerPid(sandbox: Sandbox): Promise<number> {
  const { idle } = await envdJson<{ idle: { pid: number; ready: boolean } | null }>(
    sandbox,
    'POST',
    '/exec/server/prestart',
  );
  if (!idle?.ready) throw new Error('bench: envd has no idle command server process ready');
  return idle.pid;
}

export function daemonInfo(): { pid: number; gatewayUrl: string } {
  return JSON.parse(readFileSync(join(HOME, 'daemon.json'), 'utf8'));
}

/** The sandbox's envd socket on the host, from the daemon's registry: the direct hop's target. */
export function envdSocketOf(sandboxId: string): string {
  const db = openSqlite(join(HOME, 'abx.db'), { readOnly: true });
  try {
    const row = db.prepare('SELECT handle FROM sandboxes WHERE id = ?').get(sandboxId) as
      | { handle: string }
      | undefined;
    if (!row) throw new Error(`bench: sandbox ${sandboxId} is not in the registry`);
    return JSON.parse(row.handle).envdSocket;
  } finally {
    db.close();
  }
}

/** The host's busy and total CPU time so far, in clock ticks (the first line of /proc/stat). */
export function hostCpuTicks(): { busy: number; total: number } {
  const fields = (readFileSync('/proc/stat', 'utf8').split('\n')[0] as string)
    .trim()
    .split(/\s+/)
    .slice(1)
    .map(Number);
  const total = fields.reduce((sum, n) => sum + n, 0);
  // idle and iowait are the 4th and 5th.
  return { busy: total - (fields[3] ?? 0) - (fields[4] ?? 0), total };
}

/** The share (0-1) of the host's CPU busy during `ms` from now. */
export async function hostBusyShare(ms: number): Promise<number> {
  const before = hostCpuTicks();
  await new Promise((resolve) => setTimeout(resolve, ms));
  const after = hostCpuTicks();
  return (after.busy - before.busy) / Math.max(1, after.total - before.total);
}

/**
 * The CPU time (ms) the processes of some local sandboxes used so far: the members of each one's
 * pids cgroup (a root daemon's), from /proc. Other load on the host does not count.
 */
export function sandboxesCpuMs(ids: readonly string[]): number {
  let total = 0;
  for (const id of ids) {
    let pids: string[] = [];
    try {
      pids = readFileSync(`/sys/fs/cgroup/pids/abx/${id}/cgroup.procs`, 'utf8').split('\n');
    } catch {
      // not a root daemon's local sandbox
    }
    for (const pid of pids) if (pid) total += cpuMs(Number(pid));
  }
  return total;
}

/** The share (0-1) of the host's cores the processes of `ids` used during `ms` from now. */
export async function sandboxesCpuShare(ids: readonly string[], ms: number): Promise<number> {
  const before = sandboxesCpuMs(ids);
  await new Promise((resolve) => setTimeout(resolve, ms));
  return (sandboxesCpuMs(ids) - before) / (ms * cpus().length);
}

/**
 * {@link memAvailable} once it stops growing after memory was freed (a 2 s window within 1% of
 * `held`, at most 15 s). Also the reading after 1 s.
 */
export async function settledMemAvailable(
  held: number,
): Promise<{ value: number; atOneSecond: number; ms: number }> {
  const readings: number[] = [];
  const start = performance.now();
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 500));
    readings.push(memAvailable());
    const window = readings.slice(-5);
    const grew = (window.at(-1) as number) - (window[0] as number);
    if (window.length === 5 && grew < 0.01 * Math.max(1, held)) break;
    if (performance.now() - start > 15_000) break;
  }
  return {
    value: Math.max(...readings),
    atOneSecond: readings[1] as number,
    ms: performance.now() - start,
  };
}

/** A field of /proc/meminfo (`MemAvailable`, `AnonPages`...), in bytes. */
export function meminfo(field: string): number {
  const match = new RegExp(`^${field}:\\s+(\\d+) kB$`, 'm').exec(
    readFileSync('/proc/meminfo', 'utf8'),
  );
  return Number(match?.[1] ?? 0) * 1024;
}

/**
 * Free pages the kernel keeps in its per-CPU lists (`count:` of each pageset in /proc/zoneinfo),
 * in bytes. Linux 6.7+ tunes those lists' size to what a CPU frees: when a sandbox's processes
 * end, hundreds of MiB wait there, free to any allocation but counted in neither MemFree nor
 * MemAvailable, and drain into the free lists over about 30 s.
 */
export function perCpuFreeBytes(): number {
  const zoneinfo = readFileSync('/proc/zoneinfo', 'utf8');
  let pages = 0;
  for (const match of zoneinfo.matchAll(/\n\s+count:\s+(\d+)/g)) pages += Number(match[1]);
  return pages * 4096;
}

/** MemAvailable and the free pages of the per-CPU lists: what a new allocation could get. */
export const memAvailable = () => meminfo('MemAvailable') + perCpuFreeBytes();

/** Sandboxes of a template waiting in the warm pool, once its refills are done (up to 10 s). */
export async function poolSize(template: string): Promise<number> {
  let last = -1;
  for (let waited = 0; waited < 10_000; waited += 250) {
    const n = (await Sandbox.list({ state: 'pooled', template })).length;
    if (n === last) return n;
    last = n;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return last;
}

/**
 * Host pids of the processes inside a local sandbox (below its bwrap, which carries the sandbox
 * id as `--hostname`) whose command line `matches`.
 */
export function sandboxPids(sandboxId: string, matches: (argv: string[]) => boolean): number[] {
  const parents = new Map<number, number>();
  const argvs = new Map<number, string[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      parents.set(Number(entry), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
      argvs.set(Number(entry), readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0'));
    } catch {
      // ended meanwhile
    }
  }
  const inSandbox = (pid: number): boolean => {
    for (let at = pid; at > 1; at = parents.get(at) ?? 0) {
      const argv = argvs.get(at) ?? [];
      const i = argv.indexOf('--hostname');
      if (argv[0]?.endsWith('bwrap') && i > 0 && argv[i + 1] === sandboxId) return true;
    }
    return false;
  };
  return [...argvs].filter(([pid, argv]) => matches(argv) && inSandbox(pid)).map(([pid]) => pid);
}

/**
 * Whether a sandbox (local provider) has envd's idle `server.cjs --prestart` process ready:
 * waiting in `read(0, ...)` for its command line (x86-64's syscall 0 on fd 0).
 */
export function hasIdleServer(sandboxId: string): boolean {
  const waitingOnStdin = (pid: number) => {
    try {
      return readFileSync(`/proc/${pid}/syscall`, 'utf8').startsWith('0 0x0 ');
    } catch {
      return false;
    }
  };
  return sandboxPids(sandboxId, (argv) => {
    const at = nodeScriptAt(argv);
    return argv[at] === '/opt/abx/server.cjs' && argv[at + 1] === '--prestart';
  }).some(waitingOnStdin);
}

/**
 * The host pid of a local sandbox's resident envd: its front (native/envd-front), which holds
 * envd's socket, or Node's envd where it runs without one.
 */
export function envdPidOf(sandboxId: string): number {
  const [pid] = sandboxPids(
    sandboxId,
    (argv) =>
      isEnvdFront(argv) ||
      (isEnvdCommandLine(argv) && argv[argv.indexOf('--socket') + 1] === '/run/abx/envd.sock'),
  );
  if (!pid) throw new Error(`bench: no envd process found in sandbox ${sandboxId}`);
  return pid;
}

/** The host pid of a local sandbox's Node envd (the user's, not root's), if it runs. */
export function nodeEnvdPidOf(sandboxId: string): number | undefined {
  // Its script after Node's options (ENVD_NODE_OPTIONS); its socket under a front or not.
  return sandboxPids(sandboxId, (argv) => {
    const socket = argv[argv.indexOf('--socket') + 1];
    return (
      isEnvdCommandLine(argv) && (socket === '/run/abx/envd.sock' || socket === NODE_ENVD_SOCKET)
    );
  })[0];
}

/**
 * Waits until the warm pool of a template holds a sandbox again, its refills are done, and each
 * has its idle command server process (the pool starts it once a sandbox waited unclaimed).
 */
export async function poolRefilled(template: string): Promise<void> {
  for (let waited = 0; waited < 30_000; waited += 100) {
    const pooled = await Sandbox.list({ state: 'pooled', template });
    if (pooled.length > 0 && pooled.every((s) => hasIdleServer(s.sandboxId))) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await poolSize(template);
}

/** Pids of the processes whose environment holds `ABX_SANDBOX_NET=<id>` (a sandbox's holder and slirp4netns). */
export function sandboxNetProcesses(id: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (
        readFileSync(`/proc/${entry}/environ`, 'utf8').split('\0').includes(`ABX_SANDBOX_NET=${id}`)
      )
        found.push(Number(entry));
    } catch {
      // ended meanwhile, or not ours to read
    }
  }
  return found;
}

/**
 * A process's CPU time so far, in ms, summed over its threads (V8's GC helpers and libuv's pool
 * included) from the scheduler's nanosecond counters: fine enough for a fraction of a ms per call,
 * where /proc/PID/stat counts 10 ms ticks. A thread that ended meanwhile is not counted.
 */
export function threadsCpuMs(pid: number): number {
  let ns = 0;
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${task}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      // ended meanwhile
    }
  }
  return ns / 1e6;
}

/**
 * A process's CPU time so far (user + system), in ms; 0 when it is gone. In 10 ms ticks, but
 * counting threads that ended too: for seconds of work (a download, an idle sandbox), where
 * {@link threadsCpuMs} is for fractions of a ms per call.
 */
export function cpuMs(pid: number | undefined): number {
  if (!pid) return 0;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) * (1000 / 100);
  } catch {
    return 0;
  }
}

/** The first process whose parent is `parent` and whose command line contains `text`. */
export function childMentioning(parent: number, text: string): number | undefined {
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === parent && readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(text))
        return Number(entry);
    } catch {
      // ended meanwhile
    }
  }
  return undefined;
}
