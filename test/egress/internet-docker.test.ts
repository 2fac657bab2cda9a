import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { orphanNetProcesses } from '../../src/egress/sandbox-net.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import { Secret } from '../../src/sandbox/secret.js';
import { type DockerHome, dockerHome } from '../compat/e2b/docker-home.js';
import { dockerEngine } from '../helpers/docker-images.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../helpers/internet.js';

/**
 * The internet network on the Docker provider (a root daemon): the container starts with no
 * network, gets its rules and slirp4netns before create returns, and egress decides as on the
 * local provider. The Debian image has no curl: the sandbox's clients are bash's /dev/tcp and the
 * runtime's node.
 */
const engine = await dockerEngine();
const unavailable = internetUnavailable() ?? engine.reason;

describe.skipIf(unavailable)('internet sandboxes on docker', () => {
  let internet: TestInternet;
  let abx: DockerHome;
  let box: Sandbox;
  const sh = (command: string) =>
    box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });
  /** An HTTP(S) GET from the sandbox with node's own client (no proxy settings). */
  const get = (url: string, extra = '') =>
    sh(
      `node -e "${extra}fetch('${url}').then(async r => console.log(r.status, await r.text())).catch(e => { console.log('failed', e.cause?.code ?? e.message); process.exit(1) })"`,
    );

  const before = process.env.ABX_EGRESS_NETNS;

  beforeAll(async () => {
    internet = await makeInternet();
    process.env.ABX_EGRESS_NETNS = internet.path;
    process.env.ABX_EGRESS_HOSTS = internet.hostsFile;
    // Read by this file's daemon: a metrics sample every 200 ms.
    process.env.ABX_METRICS_INTERVAL_MS = '200';
    // Its egress verifies the test internet's origins (HTTPS to a host with header rules).
    process.env.NODE_EXTRA_CA_CERTS = internet.caCert;
    abx = await dockerHome(engine.docker as NonNullable<typeof engine.docker>).finally(() => {
      delete process.env.ABX_METRICS_INTERVAL_MS;
      delete process.env.NODE_EXTRA_CA_CERTS;
    });
    box = await Sandbox.create({
      home: abx.home,
      network: { allowOut: ['allowed.test', '192.0.2.44/32'], denyOut: ['0.0.0.0/0'] },
    });
    await box.files.write('/tmp/ca.pem', readFileSync(internet.caCert, 'utf8'));
  }, 300_000);

  afterAll(async () => {
    await box?.kill().catch(() => undefined);
    await abx?.close();
    if (before) process.env.ABX_EGRESS_NETNS = before;
    else delete process.env.ABX_EGRESS_NETNS;
    delete process.env.ABX_EGRESS_HOSTS;
    internet?.remove();
  });

  test('allowed names answer over HTTP and HTTPS; denied names and addresses do not', async () => {
    expect((await get('http://allowed.test/')).stdout).toContain(
      '200 http hello from 203.0.113.10',
    );
    const tls = await sh(
      `NODE_EXTRA_CA_CERTS=/tmp/ca.pem node -e "fetch('https://allowed.test/').then(async r => console.log(r.status, await r.text()))"`,
    );
    expect(tls.stdout).toContain('200 https hello from 203.0.113.10');
    const before = internet.hits().length;
    expect((await get('http://denied.test/')).stdout).toContain('failed');
    expect((await sh('getent hosts denied.test')).exitCode).not.toBe(0);
    const raw = await sh(`bash -c 'exec 3<>/dev/tcp/${internet.addresses.denied}/7000'`);
    expect(raw.exitCode).not.toBe(0);
    const lying = await sh(
      `bash -c 'exec 3<>/dev/tcp/allowed.test/80; printf "GET / HTTP/1.0\\r\\nHost: denied.test\\r\\n\\r\\n" >&3; cat <&3'`,
    );
    expect(lying.stdout).toMatch(/403[\s\S]*denied.test is refused/);
    expect(internet.hits().slice(before).join('\n')).not.toContain(internet.addresses.denied);
    expect(
      (await sh(`bash -c 'exec 3<>/dev/tcp/192.0.2.44/7000; echo cidr >&3; head -1 <&3'`)).stdout,
    ).toContain('echo cidr');
  });

  test("the proxy variables name the sandbox's egress proxy, which refuses by name with the rule", async () => {
    /** A GET of an absolute URL from the proxy that HTTP_PROXY names, as proxy clients send it. */
    const ask = (url: string) =>
      sh(
        `node -e "const p = new URL(process.env.HTTP_PROXY); require('http').get({ host: p.hostname, port: p.port, path: '${url}', headers: { host: new URL('${url}').host } }, (r) => { let b = ''; r.on('data', (c) => (b += c)); r.on('end', () => console.log(r.statusCode, b)); })"`,
      );
    expect((await sh('echo $HTTPS_PROXY $no_proxy')).stdout.trim()).toMatch(
      /^http:\/\/10\.0\.2\.2:\d+ localhost,127\.0\.0\.1,::1$/,
    );
    expect((await ask('http://allowed.test/')).stdout).toContain('http hello from 203.0.113.10');
    expect((await ask('http://denied.test/')).stdout).toMatch(
      /^403 abx egress: denied.test is refused by the sandbox's network policy: denyOut 0\.0\.0\.0\/0/,
    );
  });

  test('the always-denied ranges stay shut, and the sandbox cannot touch its rules', async () => {
    for (const address of ['10.0.2.2', '169.254.169.254', '127.0.0.53', '10.1.2.3']) {
      const raw = await sh(`bash -c 'exec 3<>/dev/tcp/${address}/7000'`);
      expect(raw.exitCode, address).not.toBe(0);
    }
    expect((await sh('nft list ruleset')).exitCode).not.toBe(0);
  });

  test("a download and an upload show in the sandbox's netRxBytes and netTxBytes", async () => {
    const N = 8 * 1024 ** 2;
    /** The newest sample once one taken from now on passes `ok`; fails after 60 s. */
    const sampleWhere = async (what: string, ok: (rx: number, tx: number) => boolean) => {
      const since = Date.now();
      for (;;) {
        const samples = await box.getMetrics({ start: since });
        const found = samples.find((m) => ok(m.netRxBytes as number, m.netTxBytes as number));
        if (found) return found;
        if (Date.now() > since + 60_000) {
          throw new Error(`no sample with ${what}; the last: ${JSON.stringify(samples.at(-1))}`);
        }
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    };
    const start = await sampleWhere('network counters', (rx) => typeof rx === 'number');
    const [rx0, tx0] = [start.netRxBytes as number, start.netTxBytes as number];
    const down = await sh(
      `node -e "fetch('http://allowed.test/bytes/${N}').then(r => r.arrayBuffer()).then(b => console.log(b.byteLength))"`,
    );
    expect(down.stdout.trim()).toBe(String(N));
    const downloaded = await sampleWhere(`${N} bytes more in`, (rx) => rx >= rx0 + N);
    expect((downloaded.netTxBytes as number) - tx0).toBeLessThan(N / 4);
    const up = await sh(
      `node -e "fetch('http://allowed.test/sink', { method: 'POST', body: Buffer.alloc(${N}) }).then(r => r.text()).then(console.log)"`,
    );
    expect(up.stdout.trim()).toBe(String(N));
    await sampleWhere(
      `${N} bytes more out`,
      (_rx, tx) => tx >= (downloaded.netTxBytes as number) + N,
    );
  });

  test('HTTPS to a host with header rules is read by egress with the CA the container trusts', async () => {
    await Secret.create('docker-tls', 'dk-9f2c41', { home: abx.home });
    await box.setNetwork({
      allowOut: ['allowed.test', '192.0.2.44/32'],
      denyOut: ['0.0.0.0/0'],
      rules: {
        'allowed.test': [
          { transform: { headers: { Authorization: 'Bearer ${secrets.docker-tls}' } } },
        ],
      },
    });
    // Node's own client, trusting what NODE_EXTRA_CA_CERTS names: the egress CA.
    const got = await sh(
      `node -e "fetch('https://allowed.test/headers').then(r => r.json()).then(h => console.log(h.authorization))"`,
    );
    expect(got.stdout.trim(), got.stderr).toBe('Bearer dk-9f2c41');
    expect((await sh('echo $SSL_CERT_FILE $REQUESTS_CA_BUNDLE $NODE_EXTRA_CA_CERTS')).stdout).toBe(
      '/run/abx/ca-certificates.crt /run/abx/ca-certificates.crt /run/abx/egress-ca.pem\n',
    );
    expect((await sh('grep -c "PRIVATE KEY" /run/abx/*.pem /run/abx/*.crt')).stdout).not.toMatch(
      /:[1-9]/,
    );
  });

  test('a policy change applies at once; kill leaves no slirp4netns', async () => {
    await box.setNetwork({ allowOut: ['other.test'], denyOut: ['0.0.0.0/0'] });
    expect((await get('http://other.test/')).stdout).toContain('200 http hello from 192.0.2.44');
    expect((await get('http://allowed.test/')).stdout).toContain('failed');
    const id = box.sandboxId;
    expect(orphanNetProcesses((x) => x === id).length).toBe(1);
    await box.kill();
    expect(orphanNetProcesses((x) => x === id)).toEqual([]);
  });
});
