import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { call } from '../helpers/api-call.js';
import { type Answer, RawConnection } from '../helpers/raw-http.js';

// An attacker's view of a signed file URL (issue 43): key A hands key B a one-file download link
// made by E2B's unmodified SDK. B uses it once, then, on the same keep-alive connection, tries it
// for another file, as an upload, after it expired, and its signature as a token for every RPC.
// Each must be refused exactly as on a fresh connection. A real daemon, gateway and sandbox.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let info: DaemonInfo;
let sandbox: Sandbox;
let gatewayPort: number;

beforeAll(async () => {
  abx = await createAbxHome();
  info = await startDaemon(abx.home);
  const admin = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  const made = await call(`${info.apiUrl}/v1/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${admin}` },
    body: { name: 'alice' },
  });
  expect(made.status).toBe(200);
  sandbox = await Sandbox.create({
    apiKey: made.body.key,
    apiUrl: info.gatewayUrl,
    sandboxUrl: info.gatewayUrl,
    requestTimeoutMs: 60_000,
  });
  await sandbox.files.write('/home/user/public.txt', 'for anyone with the link');
  await sandbox.files.write('/home/user/secret.txt', 'alice only');
  gatewayPort = Number(new URL(info.gatewayUrl).port);
}, 180_000);

afterAll(async () => {
  await sandbox?.kill().catch(() => undefined);
  await abx?.close();
}, 120_000);

/** The query of a link the SDK made (its host is the one URL the SDK was given). */
const queryOf = (url: string) => new URL(url).search;

describe('a signed URL on a reused connection opens no more than on a fresh one', () => {
  const host = () => `Host: 49983-${sandbox.sandboxId}.localhost`;
  const get = (query: string) => `GET /files${query} HTTP/1.1\r\n${host()}\r\n\r\n`;
  const upload = (query: string) => {
    const form =
      '--b\r\nContent-Disposition: form-data; name="file"; filename="planted.txt"\r\n\r\nfrom bob\r\n--b--\r\n';
    return `POST /files${query} HTTP/1.1\r\n${host()}\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: ${form.length}\r\n\r\n${form}`;
  };
  const rpc = (method: string, signature: string) => {
    const body = JSON.stringify(
      method.endsWith('Start') ? { process: { cmd: 'id' } } : { path: '/home/user/secret.txt' },
    );
    return `POST /${method} HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: ${sandbox.sandboxId}\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: signature ${signature}\r\nContent-Type: application/json\r\nConnect-Protocol-Version: 1\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
  };

  async function alone(text: string): Promise<Answer> {
    const fresh = new RawConnection(gatewayPort);
    try {
      fresh.write(text);
      return await fresh.answer();
    } finally {
      fresh.socket.destroy();
    }
  }

  test('another file, an upload, an expired link, the signature as a token: refused after a good use', async () => {
    const link = queryOf(
      await sandbox.downloadUrl('/home/user/public.txt', { useSignatureExpiration: 600 }),
    );
    const signature = new URLSearchParams(link).get('signature') as string;
    const attempts = [
      get(link.replace('public.txt', 'secret.txt')),
      upload(link.replace('public.txt', 'planted.txt')),
      upload(link),
      rpc('filesystem.Filesystem/Stat', signature),
      rpc('process.Process/List', signature),
      rpc('process.Process/Start', signature),
    ];
    for (const attempt of attempts) {
      // One connection per attempt: a refused request with a body ends its connection.
      const client = new RawConnection(gatewayPort);
      try {
        client.write(get(link));
        const first = await client.answer();
        expect(first.status).toBe(200);
        expect(first.body).toBe('for anyone with the link');
        client.write(attempt);
        const reused = await client.answer();
        const fresh = await alone(attempt);
        expect(reused.status, attempt.split('\r\n')[0]).toBe(401);
        expect(reused.body).toBe(fresh.body);
      } finally {
        client.socket.destroy();
      }
    }
    // Nothing was written into alice's sandbox.
    expect(await sandbox.files.exists('/home/user/planted.txt')).toBe(false);
    // A link, after it expired, on a connection that used it while it was good.
    const brief = queryOf(
      await sandbox.downloadUrl('/home/user/public.txt', { useSignatureExpiration: 2 }),
    );
    const client = new RawConnection(gatewayPort);
    try {
      client.write(get(brief));
      expect((await client.answer()).status).toBe(200);
      await new Promise((resolve) => setTimeout(resolve, 3500));
      client.write(get(brief));
      const expired = await client.answer();
      expect(expired.status).toBe(401);
      expect(expired.body).toContain('signature is already expired');
    } finally {
      client.socket.destroy();
    }
  }, 120_000);
});
