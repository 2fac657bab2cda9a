import { constants } from 'node:os';
import { create } from '@bufbuild/protobuf';
import {
  Code,
  ConnectError,
  createContextKey,
  type HandlerContext,
  type ServiceImpl,
} from '@connectrpc/connect';
import { execLine, shellQuote } from '../../util/shell-quote.js';
import { type EnvdLines, type EnvdTarget, envdJson, envdLines } from './envd-client.js';
import {
  type ConnectResponse,
  type ProcessConfig,
  type ProcessEvent,
  ProcessEventSchema,
  type ProcessInfo,
  ProcessInfoSchema,
  type ProcessSelector,
  type Process as ProcessService,
  Signal,
  type StartResponse,
} from './gen/process/process_pb.js';

/** The sandbox an RPC is for, put in its context by the envd face once the gateway checked it. */
export const ENVD_TARGET = createContextKey<EnvdTarget | undefined>(undefined, {
  description: 'the checked sandbox envd of an E2B request',
});

/** E2B's default user; abx runs every process of a sandbox as its one unprivileged user. */
export const E2B_USER = 'user';

/** A process as envd's `GET /process` and `start` event show it. */
interface NativeProcess {
  id: string;
  pid: number | null;
  command: string;
  cwd: string;
  running: boolean;
}

interface NativeExit {
  code: number | null;
  signal: string | null;
  timed_out: boolean;
}

export function targetOf(context: HandlerContext): EnvdTarget {
  const target = context.values.get(ENVD_TARGET);
  if (!target) throw new ConnectError('no sandbox named for this request', Code.Internal);
  return target;
}

/**
 * The program and arguments of an E2B process, which envd runs as they are, without a shell (as
 * E2B's envd does). A NUL cannot be passed to a program: it is refused as E2B's envd refuses it.
 */
function argvOf(config: ProcessConfig): string[] {
  if (!config.cmd)
    throw new ConnectError('process.cmd is empty: name the program to run', Code.InvalidArgument);
  const argv = [config.cmd, ...config.args];
  if (argv.some((word) => word.includes('\0'))) {
    throw new ConnectError(
      'process.cmd and process.args cannot hold a NUL character',
      Code.InvalidArgument,
    );
  }
  return argv;
}

/** Reads back envd's listing of an argv ({@link execLine}); anything else is `/bin/sh -c LINE`. */
function configOf(command: string, cwd: string): ProcessConfig {
  const quoted = /^exec((?: '(?:[^']|'\\'')*')+)$/.exec(command);
  const words = quoted
    ? [...(quoted[1] as string).matchAll(/ '((?:[^']|'\\'')*)'/g)].map((m) =>
        (m[1] as string).replaceAll(`'\\''`, "'"),
      )
    : ['/bin/sh', '-c', command];
  return {
    $typeName: 'process.ProcessConfig',
    cmd: words[0] as string,
    args: words.slice(1),
    envs: {},
    cwd,
  };
}

/**
 * The envd a request goes to, by the user it names (`Authorization: Basic base64("<user>:")`):
 * the default user's (no user, or `user`); root's where the sandbox allows root (its template's
 * `allow_root`, see docs/security.md); any other name, or root elsewhere, is refused with
 * `permission_denied` saying why.
 */
export function userTarget(context: HandlerContext): EnvdTarget {
  const target = targetOf(context);
  const header = context.requestHeader.get('authorization');
  if (header === null) return target;
  const match = /^Basic\s+([A-Za-z0-9+/=]*)$/i.exec(header.trim());
  if (!match) {
    throw new ConnectError(
      'the Authorization header is not Basic base64("<user>:"): name the user as E2B does, or leave it out',
      Code.InvalidArgument,
    );
  }
  const decoded = Buffer.from(match[1] as string, 'base64').toString('utf8');
  const user = decoded.includes(':') ? decoded.slice(0, decoded.indexOf(':')) : decoded;
  if (user === '' || user === E2B_USER) return target;
  if (user === 'root') {
    if (target.rootSocketPath) return { ...target, socketPath: target.rootSocketPath };
    throw new ConnectError(
      `user 'root' is refused: abx never runs a sandbox's processes as root (they run as its unprivileged user '${E2B_USER}'); leave the user out or use '${E2B_USER}'`,
      Code.PermissionDenied,
    );
  }
  throw new ConnectError(
    `user ${JSON.stringify(user.slice(0, 64))} is refused: an abx sandbox runs every process as its one user '${E2B_USER}'; leave the user out or use '${E2B_USER}'`,
    Code.PermissionDenied,
  );
}

/** The native process a selector names, by pid (E2B's ids are pids). */
async function findProcess(
  target: EnvdTarget,
  selector: ProcessSelector | undefined,
  signal: AbortSignal,
): Promise<NativeProcess> {
  const choice = selector?.selector;
  if (choice?.case === 'tag') {
    throw new ConnectError(
      'ProcessSelector.tag is not implemented by abx: select the process by pid',
      Code.Unimplemented,
    );
  }
  if (choice?.case !== 'pid') {
    throw new ConnectError(
      'process.pid is missing: name the process by its pid',
      Code.InvalidArgument,
    );
  }
  const pid = choice.value;
  const { processes } = await envdJson<{ processes: NativeProcess[] }>(
    target,
    'GET',
    '/process',
    undefined,
    signal,
  );
  // A pid can come back after its process ended: a running process wins.
  const found =
    processes.find((p) => p.pid === pid && p.running) ?? processes.find((p) => p.pid === pid);
  if (!found) {
    throw new ConnectError(
      `process with pid ${pid} not found in sandbox ${target.sandboxId}`,
      Code.NotFound,
    );
  }
  return found;
}

const SIGNAL_WORDS: Record<string, string> = {
  SIGKILL: 'killed',
  SIGTERM: 'terminated',
  SIGINT: 'interrupt',
  SIGHUP: 'hangup',
  SIGPIPE: 'broken pipe',
};

/** envd's `exit` event as E2B's end event (Go's wording of a wait status: `exit status 1`). */
function endEvent(exit: NativeExit): ProcessEvent['event'] {
  const signalled = exit.code === null;
  const status = signalled
    ? `signal: ${SIGNAL_WORDS[exit.signal ?? ''] ?? exit.signal ?? 'unknown'}`
    : `exit status ${exit.code}`;
  const exitCode = signalled
    ? -(constants.signals[exit.signal as NodeJS.Signals] ?? 1) || -1
    : (exit.code as number);
  return {
    case: 'end',
    value: {
      $typeName: 'process.ProcessEvent.EndEvent',
      exitCode: signalled ? -1 : exitCode,
      exited: !signalled,
      status,
      ...(exitCode === 0 ? {} : { error: status }),
    },
  };
}

function event(value: ProcessEvent['event']): ProcessEvent {
  return create(ProcessEventSchema, { event: value });
}

/** `Keepalive-Ping-Interval` (seconds) as milliseconds; none or nonsense: no keepalives. */
export function keepaliveMs(context: HandlerContext): number | undefined {
  const value = context.requestHeader.get('keepalive-ping-interval');
  if (value === null || !/^\d{1,6}$/.test(value.trim())) return undefined;
  const seconds = Number(value);
  return seconds > 0 ? seconds * 1000 : undefined;
}

/**
 * The process events of an envd NDJSON stream: `start` first (when the stream has one), output as
 * `pty` or stdout/stderr bytes, `end` last, and a keepalive whenever the process was silent for
 * the client's interval. Ends with the deadline's error when the RPC's deadline passed.
 */
async function* processEvents(
  lines: EnvdLines,
  context: HandlerContext,
  pty: boolean,
  startPid: number | undefined,
): AsyncGenerator<ProcessEvent> {
  if (startPid !== undefined) {
    yield event({
      case: 'start',
      value: { $typeName: 'process.ProcessEvent.StartEvent', pid: startPid },
    });
  }
  const every = keepaliveMs(context);
  let pending: Promise<IteratorResult<unknown>> | undefined;
  let exited = false;
  try {
    for (;;) {
      pending ??= lines.next();
      let timer: NodeJS.Timeout | undefined;
      let next: IteratorResult<unknown> | 'keepalive';
      try {
        next = await (every === undefined
          ? pending
          : Promise.race([
              pending,
              new Promise<'keepalive'>((resolve) => {
                timer = setTimeout(() => resolve('keepalive'), every);
              }),
            ]));
      } catch (error) {
        // envd's socket failed under the stream: the sandbox went away (not the client leaving).
        if (!context.signal.aborted && !(error instanceof ConnectError)) {
          targetOf(context).lost = true;
        }
        throw error;
      } finally {
        clearTimeout(timer);
      }
      if (next === 'keepalive') {
        yield event({ case: 'keepalive', value: { $typeName: 'process.ProcessEvent.KeepAlive' } });
        continue;
      }
      pending = undefined;
      if (next.done) break;
      const line = next.value as {
        start?: NativeProcess;
        stream?: 'stdout' | 'stderr';
        data?: string;
        encoding?: string;
        exit?: NativeExit;
      };
      if (line.start) {
        yield event({
          case: 'start',
          value: { $typeName: 'process.ProcessEvent.StartEvent', pid: line.start.pid ?? 0 },
        });
      } else if (line.stream && typeof line.data === 'string' && line.data.length > 0) {
        // The face asks envd for base64: the bytes as the process wrote them, UTF-8 or not.
        const bytes = Buffer.from(line.data, line.encoding === 'base64' ? 'base64' : 'utf8');
        yield event({
          case: 'data',
          value: {
            $typeName: 'process.ProcessEvent.DataEvent',
            output: { case: pty ? 'pty' : line.stream, value: bytes },
          },
        });
      } else if (line.exit) {
        exited = true;
        yield event(endEvent(line.exit));
        return;
      }
    }
  } finally {
    pending?.catch(() => {});
    if (exited) {
      // envd's stream ends right after `exit`: it is read to its end in the background, which
      // keeps the connection to envd for the next call.
      lines.finish();
    } else {
      // The stream to envd goes with the RPC (a client that leaves does not stop the process).
      // Not awaited: the end-stream message leaves at once, not after the socket closed.
      lines.return?.().catch(() => {});
    }
  }
  if (context.signal.aborted) throw context.signal.reason;
  // envd ended the stream with no exit: the sandbox (and envd with it) went away.
  targetOf(context).lost = true;
  throw new ConnectError('the process stream ended before the process did', Code.Unavailable);
}

/** The deadline of the RPC (Connect-Timeout-Ms) passed, as opposed to the RPC ending otherwise. */
function deadlinePassed(context: HandlerContext): boolean {
  const reason = context.signal.reason;
  return reason instanceof ConnectError && reason.code === Code.DeadlineExceeded;
}

async function kill(target: EnvdTarget, id: string, signal = 'SIGKILL'): Promise<void> {
  await envdJson(target, 'POST', `/process/${encodeURIComponent(id)}/kill`, { signal }).catch(
    () => {},
  );
}

/** `process.Process` over envd's native EXEC and PROCESS routes. */
export const processService: Partial<ServiceImpl<typeof ProcessService>> = {
  async *start(request, context): AsyncGenerator<StartResponse> {
    const target = userTarget(context);
    const config = request.process;
    if (!config) throw new ConnectError('StartRequest.process is missing', Code.InvalidArgument);
    if (request.tag !== undefined) {
      throw new ConnectError(
        'StartRequest.tag is not implemented by abx: processes are named by pid',
        Code.Unimplemented,
      );
    }
    const argv = argvOf(config);
    // The program itself (no shell in between, as E2B's envd runs it), or a shell line for a PTY.
    let command: { argv: string[] } | { cmd: string } = { argv };
    const size = request.pty?.size;
    let initialSize: { cols: number; rows: number } | undefined;
    if (request.pty) {
      const cols = size?.cols || 80;
      const rows = size?.rows || 24;
      // util-linux `script` gives the command a pty, as envd's terminals do (no native addon);
      // envd's stdin and stdout of the process are then the pty's. A new pty is 0x0: the command
      // waits (up to 3 s) until the face has set the size below, before the start event goes
      // out, so a resize sent right after the start can never be undone by the initial size.
      command = {
        cmd: `exec script -qefc ${shellQuote(`i=0; while [ "$(stty size 2>/dev/null)" = "0 0" ] && [ $i -lt 300 ]; do sleep 0.01; i=$((i+1)); done; ${execLine(argv)}`)} /dev/null`,
      };
      initialSize = { cols, rows };
    }
    const lines = await envdLines(
      target,
      'POST',
      '/exec',
      {
        ...command,
        ...(config.cwd === undefined || config.cwd === '' ? {} : { cwd: config.cwd }),
        env: config.envs,
        stdin: request.stdin ?? true,
        output: 'base64',
      },
      context.signal,
    );
    let id: string | undefined;
    const onAbort = () => {
      // Connect-Timeout-Ms is the process's lifetime: past it, the process is gone.
      if (id !== undefined && deadlinePassed(context)) void kill(target, id);
    };
    context.signal.addEventListener('abort', onAbort, { once: true });
    try {
      const first = await lines.next();
      const start = (first.value as { start?: NativeProcess } | undefined)?.start;
      if (first.done || !start) {
        throw new ConnectError('envd did not start the process', Code.Internal);
      }
      id = start.id;
      // What was asked, as the client sent it (not envd's listing): the daemon's audit trail.
      target.audit?.('command.started', {
        cmd: config.cmd,
        args: config.args,
        ...(config.cwd ? { cwd: config.cwd } : {}),
        env: Object.keys(config.envs ?? {}),
        user:
          target.rootSocketPath && target.socketPath === target.rootSocketPath ? 'root' : E2B_USER,
        ...(request.pty ? { pty: true } : {}),
        pid: start.pid ?? 0,
      });
      if (context.signal.aborted) onAbort();
      if (initialSize && start.pid) {
        // Best effort: an image without stty keeps the 0x0 size, as before.
        await setPtySize(target, start.pid, initialSize, context.signal).catch(() => undefined);
      }
      for await (const e of processEvents(
        lines,
        context,
        request.pty !== undefined,
        start.pid ?? 0,
      )) {
        if (e.event.case === 'end') {
          const end = e.event.value;
          target.audit?.('command.exited', {
            pid: start.pid ?? 0,
            exitCode: end.exitCode,
            status: end.status,
            ...(end.error ? { error: end.error } : {}),
          });
        }
        yield { $typeName: 'process.StartResponse', event: e };
      }
    } finally {
      context.signal.removeEventListener('abort', onAbort);
      if (deadlinePassed(context)) onAbort();
    }
  },

  async *connect(request, context): AsyncGenerator<ConnectResponse> {
    const target = userTarget(context);
    const found = await findProcess(target, request.process, context.signal);
    const lines = await envdLines(
      target,
      'GET',
      `/exec/${encodeURIComponent(found.id)}/events?output=base64`,
      undefined,
      context.signal,
    );
    const pty = /^exec script -qefc /.test(found.command);
    for await (const e of processEvents(lines, context, pty, found.pid ?? 0)) {
      yield { $typeName: 'process.ConnectResponse', event: e };
    }
  },

  async list(_request, context) {
    const target = userTarget(context);
    const { processes } = await envdJson<{ processes: NativeProcess[] }>(
      target,
      'GET',
      '/process',
      undefined,
      context.signal,
    );
    return {
      processes: processes
        .filter((p) => p.running && p.pid !== null)
        .map(
          (p): ProcessInfo =>
            create(ProcessInfoSchema, { pid: p.pid ?? 0, config: configOf(p.command, p.cwd) }),
        ),
    };
  },

  async sendInput(request, context) {
    const target = userTarget(context);
    const input = request.input?.input;
    if (!input?.case)
      throw new ConnectError('SendInputRequest.input is empty', Code.InvalidArgument);
    const found = await findProcess(target, request.process, context.signal);
    await envdJson(target, 'POST', `/process/${encodeURIComponent(found.id)}/stdin`, {
      data: Buffer.from(input.value).toString('base64'),
      encoding: 'base64',
    });
    return {};
  },

  async closeStdin(request, context) {
    const target = userTarget(context);
    const found = await findProcess(target, request.process, context.signal);
    await envdJson(target, 'POST', `/process/${encodeURIComponent(found.id)}/stdin`, {
      data: '',
      eof: true,
    });
    return {};
  },

  async sendSignal(request, context) {
    const target = userTarget(context);
    const name =
      request.signal === Signal.SIGKILL
        ? 'SIGKILL'
        : request.signal === Signal.SIGTERM
          ? 'SIGTERM'
          : undefined;
    if (!name) {
      throw new ConnectError(
        `signal ${request.signal} is not one E2B names: use SIGNAL_SIGKILL or SIGNAL_SIGTERM`,
        Code.InvalidArgument,
      );
    }
    const found = await findProcess(target, request.process, context.signal);
    if (!found.running) {
      throw new ConnectError(`process with pid ${found.pid} has already ended`, Code.NotFound);
    }
    await envdJson(target, 'POST', `/process/${encodeURIComponent(found.id)}/kill`, {
      signal: name,
    });
    return {};
  },

  async update(request, context) {
    const target = userTarget(context);
    const size = request.pty?.size;
    if (!size)
      throw new ConnectError(
        'UpdateRequest.pty.size is missing: nothing to change',
        Code.InvalidArgument,
      );
    if (size.cols < 1 || size.rows < 1 || size.cols > 1000 || size.rows > 1000) {
      throw new ConnectError(
        'pty.size cols and rows must be between 1 and 1000',
        Code.InvalidArgument,
      );
    }
    const found = await findProcess(target, request.process, context.signal);
    if (!/^exec script -qefc /.test(found.command) || found.pid === null) {
      throw new ConnectError(
        `process with pid ${found.pid} has no pty to resize`,
        Code.InvalidArgument,
      );
    }
    await setPtySize(target, found.pid, size, context.signal);
    return {};
  },

  // connect-web (the JS SDK) cannot send a client stream; Python's SDK does not use it either.
  streamInput() {
    throw new ConnectError(
      'process.Process/StreamInput is not implemented by abx: send input with SendInput',
      Code.Unimplemented,
    );
  },
};

/**
 * Sets the size of the pty a `script` process (pid) made; the kernel sends SIGWINCH. The pty's
 * slave is the stdin of `script`'s child, which it opens just after the fork: the script waits
 * up to 2 s for it to be there, so a resize sent right after the start is not lost.
 */
async function setPtySize(
  target: EnvdTarget,
  pid: number,
  size: { cols: number; rows: number },
  signal: AbortSignal,
): Promise<void> {
  const script = [
    'i=0',
    'while [ $i -lt 200 ]; do',
    `  c=$(cut -d' ' -f1 /proc/${pid}/task/${pid}/children 2>/dev/null); t=`,
    '  [ -n "$c" ] && t=$(readlink "/proc/$c/fd/0" 2>/dev/null)',
    `  case "$t" in /dev/pts/*) exec stty -F "$t" cols ${size.cols} rows ${size.rows} ;; esac`,
    '  sleep 0.01; i=$((i+1))',
    'done',
    `echo "the pty of pid ${pid} is not open (has the process ended?)" >&2; exit 1`,
  ].join('\n');
  const result = await envdJson<{ exit_code: number; stderr: string }>(
    target,
    'POST',
    '/process/exec',
    { cmd: script, timeout: 10 },
    signal,
  );
  if (result.exit_code !== 0) {
    throw new ConnectError(
      `cannot resize the pty of pid ${pid}: ${result.stderr.trim()}`,
      Code.FailedPrecondition,
    );
  }
}
