import { type IncomingMessage, request } from 'node:http';
import { errorFromBody, TimeoutError, UpstreamError } from '../errors.js';
import { connectSandboxSocket } from '../providers/sandbox-socket.js';

/** One JSON request to an envd over its Unix socket, from the host side. */
export function envdRequest<T>(
  socketPath: string,
  token: string,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = 30_000,
): Promise<{ status: number; body: T }> {
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = request(
      {
        socketPath,
        // Never follow a symlink the sandbox may have put in place of its envd socket.
        createConnection: () => connectSandboxSocket(socketPath),
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
 * Runs one template `setup` step through a sandbox's envd (1 h at most): its exit code and its
 * output, stdout then stderr.
 */
export async function runSetupStep(
  handle: { envdSocket: string },
  token: string,
  command: string,
): Promise<{ exitCode: number; output: string }> {
  const { status, body } = await envdRequest<{
    stdout?: string;
    stderr?: string;
    exit_code?: number;
    error?: string;
  }>(handle.envdSocket, token, 'POST', '/process/exec', { cmd: command, timeout: 3600 }, 3_700_000);
  return {
    exitCode: status === 200 ? (body.exit_code ?? 1) : 1,
    output: `${body.stdout ?? ''}${body.stderr ?? ''}${body.error ?? ''}`,
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
