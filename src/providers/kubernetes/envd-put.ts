import { request } from 'node:http';
import { SandboxError } from '../../errors.js';
import { connectSandboxSocket } from '../sandbox-socket.js';

/** A `PUT` of a JSON body to a pod's envd with `token`; rejects unless envd answers 200. */
export function envdPut(
  envdTarget: string,
  token: string,
  path: string,
  body: unknown,
  timeoutMs: number,
): Promise<void> {
  const text = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        createConnection: () => connectSandboxSocket(envdTarget),
        method: 'PUT',
        path,
        timeout: timeoutMs,
        headers: {
          authorization: `Bearer ${token}`,
          'content-type': 'application/json',
          'content-length': Buffer.byteLength(text),
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
          if (res.statusCode === 200) return resolve();
          reject(
            new SandboxError(
              `envd answered ${res.statusCode} to PUT ${path}: ${answer.slice(0, 300)}`,
            ),
          );
        });
      },
    );
    req.on('timeout', () =>
      req.destroy(new SandboxError(`envd did not answer PUT ${path} within ${timeoutMs} ms`)),
    );
    req.on('error', reject);
    req.end(text);
  });
}

/** A `GET` of `path` from a pod's envd with `token`: its JSON answer, or a rejection unless 200. */
export function envdGet<T>(
  envdTarget: string,
  token: string,
  path: string,
  timeoutMs: number,
): Promise<T> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        createConnection: () => connectSandboxSocket(envdTarget),
        method: 'GET',
        path,
        timeout: timeoutMs,
        headers: { authorization: `Bearer ${token}` },
      },
      (res) => {
        let answer = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          answer += chunk;
        });
        res.on('error', reject);
        res.on('end', () => {
          if (res.statusCode !== 200) {
            reject(
              new SandboxError(
                `envd answered ${res.statusCode} to GET ${path}: ${answer.slice(0, 300)}`,
              ),
            );
            return;
          }
          try {
            resolve(JSON.parse(answer) as T);
          } catch (error) {
            reject(error);
          }
        });
      },
    );
    req.on('timeout', () =>
      req.destroy(new SandboxError(`envd did not answer GET ${path} within ${timeoutMs} ms`)),
    );
    req.on('error', reject);
    req.end();
  });
}
