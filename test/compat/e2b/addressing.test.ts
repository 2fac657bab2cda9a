import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startDaemon } from '../../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../../src/installation/daemon-info.js';
import { unmountUnder } from '../../../src/providers/local/volumes.js';
import { CLI } from '../../cli/abx.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { ROOT } from '../../helpers/build.js';
import { writeResolvePreload } from '../../helpers/resolve-preload.js';
import { makeTestCertificates } from '../../helpers/test-ca.js';

// The two ways a self-hoster points E2B's unmodified SDK at abx (docs/e2b.md, "Addressing"):
// - one URL: E2B_API_URL and E2B_SANDBOX_URL are both the daemon's gateway URL; the API's paths
//   go to the API, requests naming a sandbox (E2b-Sandbox-Id) to the sandbox;
// - a domain over TLS: E2B_DOMAIN, with `api.{domain}` and `{port}-{id}.{domain}` routed by Host.
//   Nothing resolves names here, so the client process gets `*.abx.test` from a preload that
//   answers DNS lookups (the wildcard record an operator would add), and trusts the test CA
//   through NODE_EXTRA_CA_CERTS, as a user would.

const run = promisify(execFile);

describe('one URL for the API and every sandbox', () => {
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let info: DaemonInfo;
  let apiKey: string;

  beforeAll(async () => {
    abx = await createAbxHome();
    info = await startDaemon(abx.home);
    apiKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  }, 120_000);

  afterAll(async () => {
    // A volume the client left (it destroys its own): its disk unmounted before the home goes.
    if (abx) await unmountUnder(join(abx.home, 'volumes')).catch(() => undefined);
    await abx?.close();
  }, 120_000);

  test('the SDK with apiUrl and sandboxUrl both the gateway URL: create, run, files, list, info, kill', async () => {
    const opts = {
      apiKey,
      apiUrl: info.gatewayUrl,
      sandboxUrl: info.gatewayUrl,
      requestTimeoutMs: 60_000,
    };
    const sandbox = await Sandbox.create({ ...opts, metadata: { url: 'one' } });
    try {
      const ran = await sandbox.commands.run('echo "$((6 * 7))" from $(hostname)');
      expect(ran.stdout).toBe(`42 from ${sandbox.sandboxId}\n`);
      await sandbox.files.write('/home/user/one.txt', 'through one URL');
      expect(await sandbox.files.read('/home/user/one.txt')).toBe('through one URL');
      const listed = await Sandbox.list({ ...opts, query: { metadata: { url: 'one' } } });
      expect((await listed.nextItems()).map((s) => s.sandboxId)).toEqual([sandbox.sandboxId]);
      expect((await sandbox.getInfo()).state).toBe('running');
    } finally {
      expect(await sandbox.kill()).toBe(true);
    }
    expect(await Sandbox.kill(sandbox.sandboxId, opts)).toBe(false);
  }, 120_000);

  test('one keep-alive connection carries native API, E2B API and envd calls in turn', async () => {
    const { sandboxID, envdAccessToken } = (await (
      await fetch(`${info.gatewayUrl}/v2/sandboxes`, {
        method: 'POST',
        headers: { 'x-api-key': apiKey, 'content-type': 'application/json' },
        body: JSON.stringify({ templateID: 'base', timeout: 120 }),
      })
    ).json()) as { sandboxID: string; envdAccessToken: string };
    const url = new URL(info.gatewayUrl);
    const socket = connect(Number(url.port), url.hostname);
    try {
      const answers: string[] = [];
      let text = '';
      socket.on('data', (chunk) => {
        text += chunk.toString('latin1');
      });
      /** Sends one request and waits for its whole answer (content-length or chunked). */
      const send = async (request: string) => {
        const start = text.length;
        socket.write(request);
        for (let i = 0; i < 600; i++) {
          const answer = text.slice(start);
          const end = answer.indexOf('\r\n\r\n');
          if (end >= 0) {
            const length = /content-length: (\d+)/i.exec(answer.slice(0, end))?.[1];
            if (length !== undefined && answer.length >= end + 4 + Number(length)) break;
            if (/transfer-encoding: chunked/i.test(answer) && answer.endsWith('0\r\n\r\n')) break;
          }
          await new Promise((r) => setTimeout(r, 50));
        }
        answers.push(text.slice(start));
      };
      await send('GET /v1/health HTTP/1.1\r\nhost: localhost\r\n\r\n');
      const rpc = '{}';
      await send(
        `POST /process.Process/List HTTP/1.1\r\nhost: localhost\r\ne2b-sandbox-id: ${sandboxID}\r\ne2b-sandbox-port: 49983\r\nx-access-token: ${envdAccessToken}\r\ncontent-type: application/json\r\ncontent-length: ${rpc.length}\r\n\r\n${rpc}`,
      );
      await send(
        `GET /sandboxes/${sandboxID} HTTP/1.1\r\nhost: localhost\r\nx-api-key: ${apiKey}\r\n\r\n`,
      );
      await send(`GET /v1/sandboxes HTTP/1.1\r\nhost: localhost\r\n\r\n`);
      expect(answers.map((answer) => answer.slice(0, 12))).toEqual([
        'HTTP/1.1 200',
        'HTTP/1.1 200',
        'HTTP/1.1 200',
        // The native API checks its own key: none was sent.
        'HTTP/1.1 401',
      ]);
      // Connect's JSON for a List with nothing started, no processes field at all, with its length.
      expect(answers[1]).toMatch(/\r\ncontent-length: 2\r\n(?:.*\r\n)*\r\n\{\}$/);
      expect(answers[2]).toContain(`"sandboxID":"${sandboxID}"`);
      expect(answers[3]).toContain('"type":"AuthenticationError"');
    } finally {
      socket.destroy();
      await fetch(`${info.gatewayUrl}/sandboxes/${sandboxID}`, {
        method: 'DELETE',
        headers: { 'x-api-key': apiKey },
      });
    }
  }, 120_000);

  test('abx e2b env: a program configured by its export lines alone, with a key it made', async () => {
    const script = join(abx.home, 'env-client.mjs');
    writeFileSync(
      script,
      `import { Sandbox, Volume } from ${JSON.stringify(join(ROOT, 'node_modules', 'e2b', 'dist', 'index.mjs'))};
const sandbox = await Sandbox.create();
const ran = await sandbox.commands.run('echo from $(hostname)');
await sandbox.kill();
// A volume's files at E2B_VOLUME_API_URL.
const volume = await Volume.create('from-env');
await volume.writeFile('/v.txt', 'by the export lines');
const read = await volume.readFile('/v.txt');
await Volume.destroy(volume.volumeId);
console.log(JSON.stringify({ id: sandbox.sandboxId, out: ran.stdout, key: process.env.E2B_API_KEY, url: process.env.E2B_SANDBOX_URL, volume: [process.env.E2B_VOLUME_API_URL, read] }));
`,
    );
    const { stdout, stderr } = await run(
      '/bin/sh',
      [
        '-c',
        `eval "$("$0" "$1" e2b env --key-name from-env)" && exec "$0" "$2"`,
        process.execPath,
        CLI,
        script,
      ],
      { env: { PATH: process.env.PATH, HOME: abx.home, ABX_HOME: abx.home }, timeout: 120_000 },
    );
    expect(stderr).toMatch(/^made API key 'from-env' \(key_\w+\) for E2B_API_KEY/);
    const out = JSON.parse(stdout);
    expect(out.out).toBe(`from ${out.id}\n`);
    expect(out.key).toMatch(/^e2b_[0-9a-f]{64}$/);
    expect(out.url).toBe(info.gatewayUrl);
    expect(out.volume).toEqual([info.gatewayUrl, 'by the export lines']);
  }, 180_000);

  test('a request that names no sandbox and no API path keeps the gateway’s own error', async () => {
    const answer = await fetch(`${info.gatewayUrl}/process.Process/List`, { method: 'POST' });
    expect(answer.status).toBe(400);
    expect(((await answer.json()) as { error: string }).error).toMatch(
      /^no sandbox named: use Host \{port\}-\{sandboxId\}/,
    );
  });
});

describe('a domain over TLS: api.{domain} and {port}-{id}.{domain}', () => {
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let info: DaemonInfo;
  let ca: string;
  let apiKey: string;
  const DOMAIN = 'abx.test';

  beforeAll(async () => {
    abx = await createAbxHome();
    const certs = makeTestCertificates(abx.home, [`*.${DOMAIN}`, DOMAIN]);
    ca = certs.caCert;
    const env = { ...process.env, ABX_HOME: abx.home, ABX_WARM_POOL: '0' };
    const started = await run(
      process.execPath,
      [
        CLI,
        'daemon',
        'start',
        '--listen',
        '127.0.0.1:0',
        '--tls-cert',
        certs.cert,
        '--tls-key',
        certs.key,
        '--domain',
        DOMAIN,
        '--json',
      ],
      { env, timeout: 60_000 },
    );
    info = JSON.parse(started.stdout);
    apiKey = readFileSync(join(abx.home, 'api-key'), 'utf8').trim();
  }, 120_000);

  afterAll(async () => {
    // A volume the client left (it destroys its own): its disk unmounted before the home goes.
    if (abx) await unmountUnder(join(abx.home, 'volumes')).catch(() => undefined);
    await abx?.close();
  }, 120_000);

  test('E2B_DOMAIN alone: the SDK creates, runs, writes, reads, lists and kills by host names', async () => {
    const port = new URL(info.remote?.gatewayUrl as string).port;
    const preload = join(abx.home, 'resolve-abx-test.cjs');
    writeResolvePreload(preload, DOMAIN, '127.0.0.1');
    const script = join(abx.home, 'e2b-client.mjs');
    writeFileSync(
      script,
      `import { Sandbox, Volume } from ${JSON.stringify(join(ROOT, 'node_modules', 'e2b', 'dist', 'index.mjs'))};
const out = {};
const sandbox = await Sandbox.create({ metadata: { url: 'domain' }, requestTimeoutMs: 60000 });
out.id = sandbox.sandboxId;
out.host = sandbox.getHost(8080);
out.run = (await sandbox.commands.run('echo hello from $(hostname)')).stdout;
await sandbox.files.write('/home/user/note.txt', 'over TLS by name');
out.read = await sandbox.files.read('/home/user/note.txt');
out.listed = (await (await Sandbox.list({ query: { metadata: { url: 'domain' } } })).nextItems()).map((s) => s.sandboxId);
// Output in a burst, then silence, then more, over TLS: the stream's socket fills and drains
// while the process is quiet, and the stream goes on after (it once waited for a second drain).
out.burst = (await sandbox.commands.run('head -c 3000000 /dev/zero | tr -c x x; sleep 1; echo end', { timeoutMs: 30000 })).stdout.length;
await sandbox.files.write('/home/user/big.txt', 'x'.repeat(4_000_000));
out.big = (await sandbox.files.read('/home/user/big.txt')).length;
// Signed file URLs: no header, the signature stands for the token.
const down = await sandbox.downloadUrl('/home/user/note.txt');
out.download = await (await fetch(down)).text();
const form = new FormData();
form.append('file', new Blob(['uploaded by URL']), 'up.txt');
const up = await fetch(await sandbox.uploadUrl('/home/user/up.txt', { useSignatureExpiration: 60 }), { method: 'POST', body: form });
out.upload = [up.status, await up.json()];
out.uploaded = await sandbox.files.read('/home/user/up.txt');
const refused = async (url, init) => { const r = await fetch(url, init); return [r.status, (await r.json()).message]; };
out.expired = await refused(await sandbox.downloadUrl('/home/user/note.txt', { useSignatureExpiration: -60 }));
out.otherPath = await refused(down.replace('note.txt', 'other.txt'));
out.asUpload = await refused(down, { method: 'POST', body: form });
out.unsigned = await refused(down.replace(/&signature=[^&]*/, ''));
// A watch over a Connect server stream, by host name.
const seen = [];
const watch = await sandbox.files.watchDir('/home/user', (e) => seen.push([e.type, e.name]));
await sandbox.files.write('/home/user/watched.txt', 'x');
for (let i = 0; i < 100 && !seen.some(([, name]) => name === 'watched.txt'); i++) await new Promise((r) => setTimeout(r, 50));
await watch.stop();
out.watched = seen.some(([, name]) => name === 'watched.txt');
out.killed = await sandbox.kill();
// A volume: its files at https://api.{domain}, the domain its create answered.
const volume = await Volume.create('by-domain');
await volume.writeFile('/v.txt', 'a volume by name');
out.volume = [volume.domain, await volume.readFile('/v.txt'), await Volume.destroy(volume.volumeId)];
// The code interpreter (port 49999) by host name too, with its own package.
const { Sandbox: CodeSandbox } = await import(${JSON.stringify(join(ROOT, 'node_modules', '@e2b', 'code-interpreter', 'dist', 'index.mjs'))});
const code = await CodeSandbox.create({ requestTimeoutMs: 60000 });
await code.runCode('x = 6 * 7');
out.cell = (await code.runCode('x')).text;
await code.kill();
console.log(JSON.stringify(out));
`,
    );
    // What `abx e2b env --domain` prints, with the CA a client of this daemon trusts.
    const printed = await run(process.execPath, [CLI, 'e2b', 'env', '--domain', '--json'], {
      env: { PATH: process.env.PATH, HOME: abx.home, ABX_HOME: abx.home },
      timeout: 60_000,
    });
    const e2bEnv = JSON.parse(printed.stdout);
    expect(e2bEnv).toEqual({ E2B_DOMAIN: `${DOMAIN}:${port}`, E2B_API_KEY: apiKey });
    const result = await run(process.execPath, ['-r', preload, script], {
      env: { PATH: process.env.PATH, HOME: abx.home, NODE_EXTRA_CA_CERTS: ca, ...e2bEnv },
      timeout: 120_000,
    });
    const out = JSON.parse(result.stdout);
    expect(out.host).toBe(`8080-${out.id}.${DOMAIN}:${port}`);
    expect(out.run).toBe(`hello from ${out.id}\n`);
    expect(out.read).toBe('over TLS by name');
    expect(out.listed).toEqual([out.id]);
    expect(out.burst).toBe(3_000_004);
    expect(out.big).toBe(4_000_000);
    expect(out.download).toBe('over TLS by name');
    expect(out.upload).toEqual([
      200,
      [{ name: 'up.txt', type: 'file', path: '/home/user/up.txt' }],
    ]);
    expect(out.uploaded).toBe('uploaded by URL');
    expect(out.expired).toEqual([401, 'signature is already expired']);
    expect(out.otherPath).toEqual([
      401,
      expect.stringMatching(
        /^invalid signature: it does not match this download of "\/home\/user\/other.txt"/,
      ),
    ]);
    expect(out.asUpload).toEqual([
      401,
      expect.stringMatching(/^invalid signature: it does not match this upload/),
    ]);
    expect(out.unsigned).toEqual([401, expect.stringMatching(/access token/)]);
    expect(out.killed).toBe(true);
    expect(out.volume).toEqual([`${DOMAIN}:${port}`, 'a volume by name', true]);
    expect(out.watched).toBe(true);
    expect(out.cell).toBe('42');
  }, 180_000);
});
