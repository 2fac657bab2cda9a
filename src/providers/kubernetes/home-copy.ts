import { statSync } from 'node:fs';
import { request } from 'node:http';
import { Readable } from 'node:stream';
import { packTree } from '../../../runtime/envd/tar-pack.js';
import { SandboxError } from '../../errors.js';
import { connectSandboxSocket } from '../sandbox-socket.js';

/**
 * Copies a built template's home folder (on the daemon's host) into a new pod's home through its
 * envd (`PUT /files/archive`, a tar packed here): a pod cannot mount the daemon's folders.
 */
export function copyHome(
  envdTarget: string,
  token: string,
  from: string,
  to: string,
  timeoutMs: number,
): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        createConnection: () => connectSandboxSocket(envdTarget),
        method: 'PUT',
        path: `/files/archive?path=${encodeURIComponent(to)}`,
        timeout: timeoutMs,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/octet-stream' },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          text += chunk;
        });
        res.on('error', reject);
        res.on('end', () => {
          if (res.statusCode === 200) return resolve();
          reject(new SandboxError(`envd answered ${res.statusCode}: ${text.slice(0, 300)}`));
        });
      },
    );
    req.on('timeout', () =>
      req.destroy(new SandboxError(`envd did not take ${from} within ${timeoutMs} ms`)),
    );
    req.on('error', reject);
    const body = Readable.from(packTree(from, statSync(from)));
    body.on('error', (error) => req.destroy(error));
    body.pipe(req);
  });
}
