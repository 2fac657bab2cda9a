import { type IncomingMessage, request } from 'node:http';
import { createInterface } from 'node:readline';
import { Code, ConnectError } from '@connectrpc/connect';
import { connectSandboxSocket } from '../../providers/sandbox-socket.js';

/** The envd of one sandbox, as the gateway checked it: its socket and its access token. */
export interface EnvdTarget {
  sandboxId: string;
  socketPath: string;
  token: string;
}

/** envd's statuses as Connect codes: the E2B SDK branches on the code, not the status. */
function codeOf(status: number): Code {
  switch (status) {
    case 400:
    case 413:
      return Code.InvalidArgument;
    case 401:
      return Code.Unauthenticated;
    case 403:
      return Code.PermissionDenied;
    case 404:
      return Code.NotFound;
    case 409:
      return Code.AlreadyExists;
    case 503:
      return Code.Unavailable;
    case 504:
      return Code.DeadlineExceeded;
    default:
      return Code.Internal;
  }
}

/** An envd error answer (`{error, type}`) as a Connect error with envd's own message. */
function envdError(status: number, text: string, what: string): ConnectError {
  let message = text.slice(0, 500);
  try {
    const body = JSON.parse(text) as { error?: unknown; type?: unknown };
    if (typeof body.error === 'string') message = body.error;
  } catch {
    // not JSON: the text itself
  }
  return new ConnectError(`${what}: ${message}`, codeOf(status));
}

/** The sandbox could not be reached at all (it stopped meanwhile). */
function unreachable(error: unknown, target: EnvdTarget): ConnectError {
  const reason = error instanceof Error ? error.message : String(error);
  return new ConnectError(
    `sandbox ${target.sandboxId} cannot be reached: ${reason}`,
    Code.Unavailable,
  );
}

function send(
  target: EnvdTarget,
  method: string,
  path: string,
  body: unknown,
  signal: AbortSignal | undefined,
): Promise<IncomingMessage> {
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = request({
      socketPath: target.socketPath,
      // Never follow a symlink the sandbox may have put in place of its envd socket.
      createConnection: () => connectSandboxSocket(target.socketPath),
      method,
      path,
      signal,
      headers: {
        authorization: `Bearer ${target.token}`,
        ...(payload
          ? { 'content-type': 'application/json', 'content-length': payload.length }
          : {}),
      },
    });
    req.on('response', resolve);
    req.on('error', (error) => reject(signal?.aborted ? error : unreachable(error, target)));
    req.end(payload);
  });
}

async function readText(res: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of res) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/** One JSON call to envd's native API; a non-2xx answer throws the matching Connect error. */
export async function envdJson<T>(
  target: EnvdTarget,
  method: string,
  path: string,
  body?: unknown,
  signal?: AbortSignal,
): Promise<T> {
  const res = await send(target, method, path, body, signal);
  const text = await readText(res);
  const status = res.statusCode ?? 500;
  if (status < 200 || status > 299)
    throw envdError(status, text, `${method} ${path.split('?')[0]}`);
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new ConnectError(`envd answered ${method} ${path} with non-JSON`, Code.Internal);
  }
}

/**
 * A call to one of envd's NDJSON streams (`/exec`, `/exec/{id}/events`): the parsed lines, in
 * order. A non-2xx answer throws the matching Connect error before the first line.
 */
export async function envdLines(
  target: EnvdTarget,
  method: string,
  path: string,
  body: unknown,
  signal: AbortSignal,
): Promise<AsyncIterator<unknown>> {
  const res = await send(target, method, path, body, signal);
  const status = res.statusCode ?? 500;
  if (status < 200 || status > 299) {
    throw envdError(status, await readText(res), `${method} ${path.split('?')[0]}`);
  }
  const lines = createInterface({ input: res, crlfDelay: Number.POSITIVE_INFINITY });
  const source = lines[Symbol.asyncIterator]();
  return {
    async next() {
      const item = await source.next();
      if (item.done) return { done: true, value: undefined };
      return { done: false, value: JSON.parse(item.value) as unknown };
    },
    async return() {
      lines.close();
      res.destroy();
      return { done: true, value: undefined };
    },
  };
}
