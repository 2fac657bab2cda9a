import { request } from 'node:http';
import { SandboxError } from '../../errors.js';
import { connectSandboxSocket } from '../sandbox-socket.js';

/**
 * One request to a pod's envd with `token` (a JSON `body` when given): its answer's text, or a
 * rejection unless envd answers 200 within `timeoutMs`.
 */
function envdCall(
  envdTarget: string,
  token: string,
  method: 'GET' | 'PUT',
  path: string,
  timeoutMs: number,
  body?: unknown,
): Promise<string> {
  const text = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        createConnection: () => connectSandboxSocket(envdTarget),
        method,
        path,
        timeout: timeoutMs,
        headers: {
          authorization: `Bearer ${token}`,
          ...(text === undefined
            ? {}
            : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }),
        },
      },
      (res) => {
        let answer = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          answer += chunk;
        });
        res.on('error', reject);
        res.on('end', () => {
          if (res.statusCode === 200) return resolve(answer);
          reject(
            new SandboxError(
              `envd answered ${res.statusCode} to ${method} ${path}: ${answer.slice(0, 300)}`,
            ),
          );
        });
      },
    );
    req.on('timeout', () =>
      req.destroy(new SandboxError(`envd did not answer ${method} ${path} within ${timeoutMs} ms`)),
    );
    req.on('error', reject);
    req.end(text);
  });
}

/** A `PUT` of a JSON body to a pod's envd with `token`; rejects unless envd answers 200. */
export async function envdPut(
  envdTarget: string,
  token: string,
  path: string,
  body: unknown,
  timeoutMs: number,
): Promise<void> {
  await envdCall(envdTarget, token, 'PUT', path, timeoutMs, body);
}

/** A `GET` of `path` from a pod's envd with `token`: its JSON answer, or a rejection unless 200. */
export async function envdGet<T>(
  envdTarget: string,
  token: string,
  path: string,
  timeoutMs: number,
): Promise<T> {
  return JSON.parse(await envdCall(envdTarget, token, 'GET', path, timeoutMs)) as T;
}
