import { type ChildProcess, spawn } from 'node:child_process';
import { join } from 'node:path';
import { ENV_NAME_PATTERN } from '../protocol/arguments.js';
import { killGroup } from '../server/child-process.js';
import { BadRequestError } from '../server/errors.js';
import { type ManagedProcess, processInfo } from '../server/process-table.js';
import { defineGroup } from '../server/route-group.js';
import { ndjson } from './exec.js';
import { processEvents } from './process-events.js';

/**
 * How long after a server started from the idle process listens (or exits) the next idle process
 * is started: the caller's first calls come within milliseconds, and a Node process starting
 * beside them would take half of a small host's CPU from them.
 */
export const REFILL_DELAY_MS = 300;
/** How long a start waits for an idle process that is still loading before starting afresh. */
const READY_WAIT_MS = 10_000;
/** The most output an idle process may write before its `prestarted` line. */
const PREAMBLE_BYTES = 64 * 1024;
/**
 * Variables Node (or the C library, OpenSSL, ICU) reads when the process starts: an idle process
 * started with other values than a start asks for is not used (the server starts afresh), since
 * setting them later changes nothing.
 */
const STARTUP_ENV =
  /^(NODE_|UV_|LD_|MALLOC_|GLIBC_|OPENSSL_|SSL_CERT_|LC_)|^(LANG|LANGUAGE|TZ|PATH)$/;

/** A command server process started ahead of its command line (`server.cjs --prestart`). */
interface Idle {
  child: ChildProcess;
  /** The environment it was started with. */
  env: Record<string, string>;
  /** True once it printed its `prestarted` line; false when it exited (or failed) first. */
  ready: Promise<boolean>;
  isReady: boolean;
}

const isPrestartedLine = (line: string) => line.startsWith('{"event":"prestarted"');

/** Variables of `env` that only count at a process's start. */
function startupEnv(env: Record<string, string | undefined>): string {
  return JSON.stringify(
    Object.entries(env)
      .filter(([name, value]) => value !== undefined && STARTUP_ENV.test(name))
      .sort(([a], [b]) => (a < b ? -1 : 1)),
  );
}

/**
 * Keeps at most one idle command server process in the sandbox: started when asked
 * ({@link prestart}, the daemon's warm pool), and again a moment after a start took it. A start
 * ({@link take}) hands the idle process its command line, so the server skips Node's own start
 * and the loading of the runtime; without a usable one the server starts afresh, as
 * `node server.cjs ARGS`. The idle process runs as envd does (its user, its sandbox), in a
 * process group of its own; it is in no process list until a start takes it, and it exits with
 * envd (its stdin ends).
 */
export class ServerStarter {
  private idle: Idle | undefined;
  private refill: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(
    /** `server.cjs` of the runtime. */
    readonly script: string,
    /** The node to run: `node`, found on the sandbox's PATH as `exec node` in a shell would. */
    private readonly node = 'node',
  ) {}

  /** The idle process's OS pid and whether it is ready, if there is one. */
  status(): { pid: number; ready: boolean } | null {
    const idle = this.idle;
    return idle?.child.pid === undefined ? null : { pid: idle.child.pid, ready: idle.isReady };
  }

  /** Starts an idle process unless one is there or starting; resolves once it is ready. */
  async prestart(): Promise<{ pid: number; ready: boolean } | null> {
    clearTimeout(this.refill);
    if (this.stopped) return null;
    this.idle ??= this.spawnIdle();
    await this.idle.ready;
    return this.status();
  }

  /**
   * The idle process, ready, if there is one whose start-time environment matches `env` (one
   * still loading is waited for); it is then no longer idle. Undefined otherwise: start afresh.
   */
  async take(env: Record<string, string>): Promise<ChildProcess | undefined> {
    clearTimeout(this.refill);
    const idle = this.idle;
    if (!idle) return undefined;
    this.idle = undefined;
    if (startupEnv(idle.env) !== startupEnv(env)) {
      killGroup(idle.child);
      return undefined;
    }
    let timer: NodeJS.Timeout | undefined;
    const ready = await Promise.race([
      idle.ready,
      new Promise<false>((resolve) => {
        timer = setTimeout(() => resolve(false), READY_WAIT_MS);
      }),
    ]);
    clearTimeout(timer);
    const { child } = idle;
    if (!ready || child.exitCode !== null || child.signalCode !== null) {
      killGroup(child);
      return undefined;
    }
    return child;
  }

  /**
   * Starts the next idle process {@link REFILL_DELAY_MS} after `server` printed its `listening`
   * line (or exited): the sandbox runs servers, so another start is likely.
   */
  refillAfter(server: ManagedProcess): void {
    if (this.stopped) return;
    let seen = '';
    const started = () => {
      server.child.stdout?.off('data', onData);
      server.child.off('exit', started);
      clearTimeout(this.refill);
      this.refill = setTimeout(() => void this.prestart().catch(() => undefined), REFILL_DELAY_MS);
      this.refill.unref();
    };
    const onData = (chunk: Buffer) => {
      // Only the tail can hold the start of a line split across chunks.
      seen = (seen + chunk.toString('utf8')).slice(-4096);
      if (seen.includes('{"event":"listening"')) started();
    };
    server.child.stdout?.on('data', onData);
    server.child.once('exit', started);
  }

  /** Kills the idle process and starts no other. */
  stop(): void {
    this.stopped = true;
    clearTimeout(this.refill);
    if (this.idle) killGroup(this.idle.child);
    this.idle = undefined;
  }

  private spawnIdle(): Idle {
    const env = { ...process.env } as Record<string, string>;
    const child = spawn(this.node, [this.script, '--prestart'], {
      env,
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    child.stdin?.on('error', () => {});
    // A failed spawn (no node on the PATH) or signal says so here; ready then resolves false.
    child.on('error', () => {});
    let isReady = false;
    const ready = new Promise<boolean>((resolve) => {
      let text = '';
      let settled = false;
      // Once: after it, the process may be a server that no failure here may kill.
      const done = (value: boolean) => {
        if (settled) return;
        settled = true;
        child.stdout?.off('data', onData);
        child.off('exit', onExit).off('error', onExit);
        // What it writes from now on waits in the pipe for the start that takes it.
        child.stdout?.pause();
        if (!value) killGroup(child);
        isReady = value;
        resolve(value);
      };
      const onData = (chunk: Buffer) => {
        text += chunk.toString('utf8');
        const lines = text.split('\n');
        if (lines.slice(0, -1).some(isPrestartedLine)) done(true);
        else if (text.length > PREAMBLE_BYTES) done(false);
      };
      const onExit = () => done(false);
      child.stdout?.on('data', onData);
      child.once('exit', onExit).once('error', onExit);
    });
    const idle: Idle = {
      child,
      env,
      ready,
      get isReady() {
        return isReady;
      },
    };
    // One that dies (or never started) while idle leaves room for the next.
    const gone = () => {
      if (this.idle === idle) this.idle = undefined;
    };
    child.once('exit', gone).once('error', gone);
    return idle;
  }
}

/** What `POST /exec/server` takes. */
interface ServerRequest {
  args: string[];
  command: string;
  env: Record<string, string>;
}

function serverRequest(body: unknown, script: string): ServerRequest {
  const { args, command, env } = (body ?? {}) as Partial<Record<keyof ServerRequest, unknown>>;
  if (!Array.isArray(args) || !args.every((a) => typeof a === 'string' && !a.includes('\0'))) {
    throw new BadRequestError(
      'args must be a list of strings: the command server’s arguments (--port 8080 --load FILE ...)',
    );
  }
  if (command !== undefined && typeof command !== 'string') {
    throw new BadRequestError('command must be a string: the command line shown in listings');
  }
  if (env !== undefined && (typeof env !== 'object' || env === null || Array.isArray(env))) {
    throw new BadRequestError('env must be an object of strings');
  }
  const variables = (env ?? {}) as Record<string, unknown>;
  for (const [name, value] of Object.entries(variables)) {
    if (!ENV_NAME_PATTERN.test(name)) {
      throw new BadRequestError(`env: ${JSON.stringify(name)} is not a variable name`);
    }
    if (typeof value !== 'string' || value.includes('\0')) {
      throw new BadRequestError(`env.${name} must be a string without NUL bytes`);
    }
  }
  return {
    args,
    command: command ?? ['node', script, ...args].join(' '),
    env: variables as Record<string, string>,
  };
}

/**
 * The command server's start (`sandbox.server.start()`), in an idle pre-started process when
 * there is one ({@link ServerStarter}). Under `/exec`: it needs the shell capability, as a start
 * through `POST /exec` did.
 */
export function serverStartGroup(starter: ServerStarter) {
  return defineGroup(
    'SERVER_START',
    '/exec/server',
    'the command server, started from a pre-started runtime process',
    [
      {
        method: 'POST',
        path: '/exec/server',
        summary:
          'Starts the command server (`{ args, command?, env? }`: `node server.cjs ARGS`) in the idle pre-started process when there is one, else afresh; streams NDJSON as `POST /exec`, its `start` event with `prestarted`.',
        handler: async ({ body, ctx, closed }) => {
          const request = serverRequest(body, starter.script);
          const env = { ...process.env, ...request.env } as Record<string, string>;
          const cwd = process.cwd();
          const idle = await starter.take(env);
          let entry: ManagedProcess;
          if (idle) {
            entry = ctx.processes.adopt(idle, { command: request.command, cwd });
            idle.stdin?.end(`${JSON.stringify({ argv: request.args, env })}\n`);
          } else {
            entry = await ctx.processes.start('node', [starter.script, ...request.args], {
              command: request.command,
              cwd,
              env: request.env,
            });
            entry.child.stdin?.end();
          }
          starter.refillAfter(entry);
          return ndjson(processEvents(entry, { stdout: 0, stderr: 0 }, { follow: true, closed }), {
            start: processInfo(entry),
            prestarted: idle !== undefined,
          });
        },
      },
      {
        method: 'GET',
        path: '/exec/server',
        summary:
          'The idle pre-started command server process: `{ idle: { pid, ready } }`, or `{ idle: null }`.',
        handler: () => ({ idle: starter.status() }),
      },
      {
        method: 'POST',
        path: '/exec/server/prestart',
        summary:
          'Starts an idle command server process unless one is there; answers once it is ready: `{ idle: { pid, ready } }`.',
        // The daemon calls it on a sandbox it puts in its warm pool, whose template has ports.
        handler: async () => ({ idle: await starter.prestart() }),
      },
    ],
  );
}

/** `server.cjs` beside envd. */
export function runtimeServerScript(runtimeDir: string): string {
  return join(runtimeDir, 'server.cjs');
}
