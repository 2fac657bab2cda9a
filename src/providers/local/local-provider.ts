import { execFile, spawn } from 'node:child_process';
import {
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { SandboxStartError } from '../../sandbox/errors.js';
import type { SandboxHandle, SandboxProvider, SandboxSpec } from '../provider.js';
import {
  bwrapArgs,
  prlimitArgs,
  SANDBOX_HOME,
  SANDBOX_RUN_DIR,
  SANDBOX_RUNTIME_DIR,
  SANDBOX_UID,
} from './bwrap-args.js';
import { createMemoryCgroup, removeMemoryCgroup } from './memory-cgroup.js';
import { isSameProcess, processStartTime } from './proc.js';

const execFileAsync = promisify(execFile);

export interface LocalProviderOptions {
  /** Host folder holding envd.cjs (the package's dist/runtime). */
  runtimeDir: string;
  /** How long a new sandbox's envd has to answer; default 15 s. */
  startTimeoutMs?: number;
  bwrapPath?: string;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** GET /health on envd's socket: true on 200. */
function envdHealthy(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request({ socketPath, path: '/health', method: 'GET', timeout: 1000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(false));
    req.end();
  });
}

function logTail(file: string, bytes = 2000): string {
  try {
    const text = readFileSync(file, 'utf8');
    return text.slice(-bytes).trim();
  } catch {
    return '';
  }
}

/**
 * Sandboxes as bubblewrap namespaces on this host. The sandbox's first process (the pid
 * namespace's init, which bwrap forks) is what the handle names: killing it makes the kernel kill
 * every process of the namespace. It is started in a session of its own, not tied to the daemon,
 * so sandboxes outlive a daemon restart.
 */
export class LocalProvider implements SandboxProvider {
  readonly name = 'local';

  constructor(private readonly options: LocalProviderOptions) {}

  async create(spec: SandboxSpec): Promise<SandboxHandle> {
    const homeDir = join(spec.dir, 'home');
    const runDir = join(spec.dir, 'run');
    const portsDir = join(runDir, 'ports');
    const logFile = join(spec.dir, 'sandbox.log');
    mkdirSync(portsDir, { recursive: true });
    if (spec.baseHome) {
      await execFileAsync('cp', ['-a', '--reflink=auto', spec.baseHome, homeDir]);
    } else {
      mkdirSync(homeDir, { recursive: true });
    }
    const passwdFile = join(spec.dir, 'passwd');
    const groupFile = join(spec.dir, 'group');
    writeFileSync(passwdFile, `user:x:${SANDBOX_UID}:${SANDBOX_UID}::${SANDBOX_HOME}:/bin/sh\n`);
    writeFileSync(groupFile, `user:x:${SANDBOX_UID}:\n`);

    const envdSocket = join(runDir, 'envd.sock');
    const env = {
      PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
      HOME: SANDBOX_HOME,
      USER: 'user',
      LANG: 'C.UTF-8',
      ...spec.env,
      ABX_SANDBOX_ID: spec.id,
    };
    // In a file, not the environment: a process's initial environment stays readable in
    // /proc/PID/environ by every process of the sandbox. envd reads the file and deletes it before
    // it serves anything, and no other process of the sandbox exists before envd.
    writeFileSync(join(runDir, 'token'), spec.accessToken, { mode: 0o600 });
    const bwrap = bwrapArgs({
      hostname: spec.id,
      homeDir,
      runDir,
      runtimeDir: this.options.runtimeDir,
      passwdFile,
      groupFile,
      env,
      workdir: spec.workdir,
      network: spec.network,
      command: [
        process.execPath.startsWith('/usr/') ? process.execPath : '/usr/bin/node',
        `${SANDBOX_RUNTIME_DIR}/envd.cjs`,
        '--socket',
        `${SANDBOX_RUN_DIR}/envd.sock`,
        '--ports-dir',
        `${SANDBOX_RUN_DIR}/ports`,
        '--token-file',
        `${SANDBOX_RUN_DIR}/token`,
      ],
    });
    const limits = prlimitArgs(spec.resources);
    let argv = [this.options.bwrapPath ?? 'bwrap', ...bwrap];
    if (limits.length > 0) argv = ['prlimit', ...limits, '--', ...argv];
    const cgroup = spec.resources.memory
      ? createMemoryCgroup(spec.id, spec.resources.memory)
      : undefined;
    if (spec.resources.memory && !cgroup) {
      writeFileSync(
        logFile,
        'abx: warning: no writable memory cgroup on this host; the memory limit is not enforced\n',
        { flag: 'a' },
      );
    }
    // The shell joins the cgroup before exec'ing bwrap, so every sandbox process is inside it.
    if (cgroup)
      argv = ['/bin/sh', '-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, ...argv];
    const [command, ...args] = argv as [string, ...string[]];

    const log = openSync(logFile, 'a');
    const child = spawn(command, args, {
      detached: true,
      stdio: ['ignore', log, log],
      // bwrap's own processes (the sandbox's pid 1) keep this environment: nothing of the host's.
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
    });
    closeSync(log);
    let exited: string | undefined;
    child.on('exit', (code, signal) => {
      exited = signal ? `signal ${signal}` : `exit code ${code}`;
    });
    child.on('error', (error) => {
      exited = error.message;
    });
    child.unref();

    const deadline = Date.now() + (this.options.startTimeoutMs ?? 15_000);
    const fail = (why: string) => {
      if (child.pid) this.killTree(child.pid);
      removeMemoryCgroup(cgroup);
      const tail = logTail(logFile);
      return new SandboxStartError(
        `sandbox ${spec.id} did not start: ${why}${tail ? `\n--- sandbox log ---\n${tail}` : ''}`,
      );
    };
    let init: number | undefined;
    while (Date.now() < deadline) {
      if (exited) throw fail(`bubblewrap ended (${exited})`);
      init ??= this.initPid(child.pid);
      if (init && (await envdHealthy(envdSocket))) {
        const startTime = processStartTime(init);
        if (startTime) {
          return {
            provider: this.name,
            pid: init,
            startTime,
            envdSocket,
            portsDir,
            ...(cgroup ? { cgroup } : {}),
          };
        }
      }
      await sleep(init ? 10 : 2);
    }
    throw fail(`envd did not answer within ${this.options.startTimeoutMs ?? 15_000} ms`);
  }

  isAlive(handle: SandboxHandle): boolean {
    return isSameProcess(handle.pid, handle.startTime);
  }

  async kill(handle: SandboxHandle): Promise<void> {
    if (this.isAlive(handle)) {
      try {
        process.kill(handle.pid, 'SIGKILL');
      } catch {
        // ended meanwhile
      }
      // The kernel kills the rest of the pid namespace once its init is gone; wait for that.
      for (let i = 0; i < 500 && isSameProcess(handle.pid, handle.startTime); i++) await sleep(10);
    }
    for (let i = 0; i < 100 && handle.cgroup && existsSync(handle.cgroup); i++) {
      removeMemoryCgroup(handle.cgroup);
      if (existsSync(handle.cgroup)) await sleep(10);
    }
  }

  async sweepOrphans(sandboxesDir: string, running: ReadonlySet<string>): Promise<string[]> {
    const prefix = `${sandboxesDir}/`;
    const orphans = new Map<string, number[]>();
    for (const entry of readdirSync('/proc')) {
      if (!/^\d+$/.test(entry)) continue;
      let argv: string[];
      try {
        argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      } catch {
        continue;
      }
      // Both bwrap processes of a sandbox carry its home folder in their arguments.
      if (!argv[0]?.endsWith('bwrap')) continue;
      const home = argv.find((arg) => arg.startsWith(prefix) && arg.endsWith('/home'));
      const id = home?.slice(prefix.length, -'/home'.length);
      if (!id || id.includes('/') || running.has(id)) continue;
      orphans.set(id, [...(orphans.get(id) ?? []), Number(entry)]);
    }
    for (const pids of orphans.values()) {
      for (const pid of pids) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone meanwhile
        }
      }
    }
    return [...orphans.keys()];
  }

  /** bwrap forks the namespace's init; it is the only child of the bwrap we started. */
  private initPid(bwrapPid: number | undefined): number | undefined {
    if (!bwrapPid) return undefined;
    try {
      const children = readFileSync(`/proc/${bwrapPid}/task/${bwrapPid}/children`, 'utf8')
        .trim()
        .split(/\s+/)
        .filter(Boolean)
        .map(Number);
      return children.length === 1 ? children[0] : undefined;
    } catch {
      return undefined;
    }
  }

  private killTree(bwrapPid: number): void {
    const init = this.initPid(bwrapPid);
    for (const pid of [init, bwrapPid]) {
      try {
        if (pid) process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }
}
