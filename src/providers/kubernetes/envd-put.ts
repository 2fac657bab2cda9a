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
