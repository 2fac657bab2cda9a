import { createReadStream } from 'node:fs';
import { type IncomingMessage, request } from 'node:http';
import { Readable } from 'node:stream';
import { packTree } from '../../runtime/envd/tar-pack.js';
import { errorFromBody, TimeoutError, UpstreamError } from '../errors.js';
import { connectSandboxSocket } from '../providers/sandbox-socket.js';
import { copySource } from '../util/copy-source.js';
import { ndjsonLines } from '../util/ndjson.js';

/** One JSON request to an envd over its Unix socket, from the host side. */
export function envdRequest<T>(
  socketPath: string,
  token: string,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = 30_000,
  signal?: AbortSignal,
): Promise<{ status: number; body: T }> {
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = request(
      {
        socketPath,
        ...(signal ? { signal } : {}),
        // Never follow a symlink the sandbox may have put in place of its envd socket. The
        // daemon's read of envd's log does not wake a sleeping envd (it would never sleep).
        createConnection: () =>
          connectSandboxSocket(socketPath, {
            wake: !(method === 'GET' && path.startsWith('/logs')),
          }),
        method,
        path,
        timeout: timeoutMs,
        headers: {
          authorization: `Bearer ${token}`,
          ...(payload
            ? { 'content-type': 'application/json', 'content-length': payload.length }
            : {}),
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('error', reject);
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          try {
            resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as T });
          } catch {
            reject(
              new UpstreamError(
                `envd answered ${res.statusCode} with non-JSON: ${text.slice(0, 200)}`,
              ),
            );
          }
        });
      },
    );
    req.on('timeout', () =>
      req.destroy(new TimeoutError(`envd did not answer ${method} ${path} within ${timeoutMs} ms`)),
    );
    req.on('error', reject);
    req.end(payload);
  });
}

/**
 * One GET to an envd whose answer is a stream (an archive): resolves with the response once its
 * headers arrive; `timeoutMs` bounds each wait for bytes, not the whole transfer.
 */
export function envdStream(
  socketPath: string,
  token: string,
  path: string,
  timeoutMs = 60_000,
): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        socketPath,
        createConnection: () => connectSandboxSocket(socketPath),
        method: 'GET',
        path,
        timeout: timeoutMs,
        headers: { authorization: `Bearer ${token}` },
      },
      resolve,
    );
    req.on('timeout', () =>
      req.destroy(new TimeoutError(`envd sent nothing for ${timeoutMs} ms on GET ${path}`)),
    );
    req.on('error', reject);
    req.end();
  });
}

/**
 * Warms a fresh sandbox's envd with `POST /exec/warmup` (a `true` run exactly as a command would
 * be, unlisted): the warm pool does it before it offers a sandbox, so the caller's first command
 * does not pay for envd's code running for the first time. Best effort: resolves false when envd
 * refused it (an older runtime) or did not answer within `timeoutMs`.
 */
export function warmSandbox(
  handle: { envdSocket: string },
  token: string,
  timeoutMs = 10_000,
): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request(
      {
        createConnection: () => connectSandboxSocket(handle.envdSocket),
        method: 'POST',
        path: '/exec/warmup',
        timeout: timeoutMs,
        headers: { authorization: `Bearer ${token}`, 'content-length': 0 },
      },
      (res) => {
        res.on('error', () => resolve(false));
        res.on('end', () => resolve(res.statusCode === 200));
        res.resume();
      },
    );
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(false));
    req.on('close', () => resolve(false));
    req.end();
  });
}

/**
 * Holds a connection open to a local sandbox's envd: an open connection keeps envd from sleeping
 * when idle (runtime/envd/idle.ts, docs/providers.md "envd sleeps when idle"), so the warm pool's
 * sandboxes answer their claim's first call at once. The function returned closes it. Another
 * provider's envd never sleeps: nothing is held.
 */
export function holdEnvdAwake(handle: { provider: string; envdSocket: string }): () => void {
  if (handle.provider !== 'local') return () => {};
  const socket = connectSandboxSocket(handle.envdSocket);
  // A sandbox killed while held ends the connection: nothing to report.
  socket.on('error', () => undefined);
  socket.unref();
  return () => socket.destroy();
}

/** What a failed step's error keeps of its output (its end). */
const STEP_OUTPUT_KEPT = 64 * 1024;

/**
 * Starts the command server's idle process in a fresh sandbox (`POST /exec/server/prestart`) and
 * resolves once it is ready: the warm pool does it in a pooled sandbox whose template has ports
 * once it has waited unclaimed, so the caller's `server.start()` skips Node's start and the
 * runtime's loading. Best
 * effort: false when envd refused it (an older runtime) or it was not ready within `timeoutMs`.
 */
export async function prestartServer(
  handle: { envdSocket: string },
  token: string,
  timeoutMs = 30_000,
): Promise<boolean> {
  try {
    const { status, body } = await envdRequest<{ idle?: { ready?: boolean } | null }>(
      handle.envdSocket,
      token,
      'POST',
      '/exec/server/prestart',
      undefined,
      timeoutMs,
    );
    return status === 200 && body.idle?.ready === true;
  } catch {
    return false;
  }
}

/**
 * Runs one template `setup` step through a sandbox's envd (`POST /exec`, 1 h at most): its exit
 * code and the end of its output (stdout and stderr as they came). `onOutput` gets the output as
 * it arrives, for a build's log.
 */
export async function runSetupStep(
  handle: { envdSocket: string },
  token: string,
  command: string,
  user?: string,
  onOutput?: (text: string, stream: 'stdout' | 'stderr') => void,
  timeoutSeconds = 3600,
): Promise<{ exitCode: number; output: string }> {
  const payload = Buffer.from(
    JSON.stringify({
      cmd: command,
      timeout: timeoutSeconds,
      stdin: false,
      ...(user === undefined ? {} : { user }),
    }),
  );
  const response = await postExec(
    handle.envdSocket,
    token,
    payload,
    // envd sends a keepalive line every 5 s while a step is silent.
    60_000,
    'envd sent nothing for 60 s while running a setup step',
  );
  let output = '';
  const keep = (text: string) => {
    output += text;
    if (output.length > 2 * STEP_OUTPUT_KEPT) output = output.slice(-STEP_OUTPUT_KEPT);
  };
  if (response.statusCode !== 200) {
    const chunks: Buffer[] = [];
    for await (const chunk of response) chunks.push(chunk as Buffer);
    const text = Buffer.concat(chunks).toString('utf8');
    let message = text;
    try {
      message = (JSON.parse(text) as { error?: string }).error ?? text;
    } catch {
      // not JSON: the text itself
    }
    return { exitCode: 1, output: message };
  }
  type Event = {
    stream?: 'stdout' | 'stderr';
    data?: string;
    exit?: { code: number | null; signal: string | null; timed_out?: boolean };
  };
  for await (const event of ndjsonLines<Event>(response)) {
    if (event.stream && typeof event.data === 'string') {
      keep(event.data);
      onOutput?.(event.data, event.stream);
    } else if (event.exit) {
      const { code, signal, timed_out: timedOut } = event.exit;
      if (timedOut) keep(`\n(the step ran for ${timeoutSeconds} s and was stopped)`);
      else if (code === null) keep(`\n(ended by ${signal ?? 'a signal'})`);
      return { exitCode: code ?? 1, output: output.slice(-STEP_OUTPUT_KEPT) };
    }
  }
  return {
    exitCode: 1,
    output: `${output.slice(-STEP_OUTPUT_KEPT)}\n(envd's stream ended before the step did)`,
  };
}

/** Adds variables to a running sandbox's environment (envd's `PUT /env`). */
export async function setSandboxEnv(
  handle: { envdSocket: string },
  token: string,
  env: Record<string, string>,
): Promise<void> {
  const { status, body } = await envdRequest(handle.envdSocket, token, 'PUT', '/env', { env });
  if (status !== 200) throw errorFromBody(status, body);
}

/** A running sandbox's environment, as its next process would get it (envd's `GET /env`). */
export async function sandboxEnv(
  handle: { envdSocket: string },
  token: string,
): Promise<Record<string, string>> {
  const { status, body } = await envdRequest(handle.envdSocket, token, 'GET', '/env');
  if (status !== 200) throw errorFromBody(status, body);
  return (body as { env: Record<string, string> }).env;
}

/**
 * Copies a host file or folder into a running sandbox at `to` through its envd: a file with
 * `PUT /files/write`, a folder as a tar stream (packed here, unpacked by envd) with
 * `PUT /files/archive`. Rejects with the sandbox's error (errno as `code`) if envd refuses.
 */
export async function copyIntoSandbox(
  handle: { envdSocket: string },
  token: string,
  from: string,
  to: string,
  /** Who owns what lands (envd as root only; its own user otherwise). */
  user?: string,
  timeoutMs = 600_000,
): Promise<void> {
  const stats = copySource(from);
  const route = stats.isDirectory() ? '/files/archive' : '/files/write';
  const body: Readable = stats.isDirectory()
    ? Readable.from(packTree(from, stats))
    : createReadStream(from);
  const { status, text } = await new Promise<{ status: number; text: string }>(
    (resolve, reject) => {
      const req = request(
        {
          socketPath: handle.envdSocket,
          createConnection: () => connectSandboxSocket(handle.envdSocket),
          method: 'PUT',
          path: `${route}?path=${encodeURIComponent(to)}${user === undefined ? '' : `&user=${encodeURIComponent(user)}`}`,
          timeout: timeoutMs,
          headers: { authorization: `Bearer ${token}`, 'content-type': 'application/octet-stream' },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (chunk: Buffer) => chunks.push(chunk));
          res.on('error', reject);
          res.on('end', () =>
            resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }),
          );
        },
      );
      req.on('timeout', () =>
        req.destroy(new TimeoutError(`envd did not take ${from} within ${timeoutMs} ms`)),
      );
      req.on('error', reject);
      body.on('error', (error) => req.destroy(error));
      body.pipe(req);
    },
  );
  if (status !== 200) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = { error: `envd answered ${status}: ${text.slice(0, 200)}` };
    }
    throw errorFromBody(status, parsed);
  }
}

/** How long one run of a template's `start.ready` command may take before it counts as failed. */
const READY_CHECK_SECONDS = 10;
/** The pause between two runs of a `start.ready` command that did not exit 0. */
const READY_RETRY_MS = 250;

/**
 * Starts a template's start command in a fresh sandbox (`POST /exec`, no time limit, as the
 * sandbox's user in its workdir) and leaves it running; then runs `ready` until it exits 0. A
 * start envd refuses, or a `ready` that has not passed within `readyTimeoutMs`, rejects, naming
 * the command and the last output.
 */
export async function startTemplateCommand(
  handle: { envdSocket: string },
  token: string,
  start: { cmd: string; ready?: string },
  readyTimeoutMs: number,
): Promise<void> {
  // `log`: its output goes to the sandbox's log too (stdout info, stderr error), as at E2B.
  const payload = Buffer.from(
    JSON.stringify({ cmd: start.cmd, timeout: 0, stdin: false, log: true }),
  );
  const response = await postExec(
    handle.envdSocket,
    token,
    payload,
    30_000,
    'envd did not start the start command within 30 s',
  );
  // The process lives on in envd's table once started; only its event stream is left here.
  const status = response.statusCode;
  const first = await new Promise<string>((resolve) => {
    let text = '';
    response.on('data', (chunk: Buffer) => {
      text += chunk;
      if (status === 200 && text.includes('\n')) resolve(text);
    });
    response.on('end', () => resolve(text));
    response.on('error', () => resolve(text));
  });
  response.destroy();
  if (status !== 200 || !first.startsWith('{"start"')) {
    throw new UpstreamError(
      `the template's start command \`${start.cmd}\` did not start (envd answered ${status}: ${first.slice(0, 500)})`,
    );
  }
  if (start.ready === undefined) return;
  const deadline = Date.now() + readyTimeoutMs;
  let last = { exitCode: 1, output: '' };
  while (Date.now() < deadline) {
    last = await runSetupStep(
      handle,
      token,
      start.ready,
      undefined,
      undefined,
      READY_CHECK_SECONDS,
    );
    if (last.exitCode === 0) return;
    await new Promise((resolve) => setTimeout(resolve, READY_RETRY_MS));
  }
  throw new TimeoutError(
    `the template's ready command \`${start.ready}\` did not exit 0 within ${readyTimeoutMs / 1000} s of the start command \`${start.cmd}\` (last exit code ${last.exitCode}${last.output ? `, output: ${last.output.slice(-500)}` : ''})`,
  );
}

/**
 * `POST /exec` to envd at `socket` with `payload` (JSON); the response once its head arrives. A
 * socket silent for `timeoutMs` is cut with a TimeoutError saying `silence`.
 */
function postExec(
  socket: string,
  token: string,
  payload: Buffer,
  timeoutMs: number,
  silence: string,
): Promise<IncomingMessage> {
  return new Promise<IncomingMessage>((resolve, reject) => {
    const req = request(
      {
        createConnection: () => connectSandboxSocket(socket),
        method: 'POST',
        path: '/exec',
        timeout: timeoutMs,
        headers: {
          authorization: `Bearer ${token}`,
          'content-type': 'application/json',
          'content-length': payload.length,
        },
      },
      resolve,
    );
    req.on('timeout', () => req.destroy(new TimeoutError(silence)));
    req.on('error', reject);
    req.end(payload);
  });
}
