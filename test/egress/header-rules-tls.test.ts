import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox, Secret } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox as NativeSandbox } from '../../src/sandbox/sandbox.js';
import { Secret as NativeSecret } from '../../src/sandbox/secret.js';
import { e2bOnTestInternet, outputOf } from '../helpers/e2b-internet.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../helpers/internet.js';
import { type RootlessDaemon, rootlessUid, startRootlessDaemon } from '../helpers/rootless.js';
import { startSocks5Server } from '../helpers/socks5-server.js';

/**
 * Header rules on HTTPS (issue 45): egress terminates TLS for a host with rules only, with a
 * certificate from the daemon's egress CA that sandboxes trust, and opens its own TLS to the real
 * host, verified with Node's store plus the daemon's NODE_EXTRA_CA_CERTS (the test internet's CA).
 * Every other host stays passthrough: the sandbox sees the origin's own certificate. From inside
 * real sandboxes of a root daemon, with curl, Node, Python's urllib and requests.
 */
const unavailable = internetUnavailable();

describe.skipIf(unavailable)('header rules on egress (HTTPS)', () => {
  const net = e2bOnTestInternet({ trustTestCa: true });
  const VALUE = 'sk-tls-5b1e77';

  const run = outputOf;
  const json = async (sandbox: Sandbox, command: string) => {
    const out = await run(sandbox, command);
    try {
      return JSON.parse(out) as Record<string, string>;
    } catch {
      throw new Error(`not JSON from ${command}: ${out}`);
    }
  };
  /** Who issued the certificate a TLS client in the sandbox is shown for `host`. */
  const issuer = (sandbox: Sandbox, host: string) =>
    run(
      sandbox,
      `openssl s_client -connect ${host}:443 -servername ${host} </dev/null 2>/dev/null | openssl x509 -noout -issuer`,
    );

  async function ruledSandbox(name: string): Promise<Sandbox> {
    const sandbox = await Sandbox.create({
      ...net.opts,
      network: {
        allowOut: ['allowed.test', 'www.allowed.test', 'other.test'],
        denyOut: ['0.0.0.0/0'],
        rules: {
          'allowed.test': [
            { transform: { headers: { Authorization: `Bearer ${Secret.fill(name)}` } } },
          ],
        },
      },
    });
    net.made.push(sandbox);
    return sandbox;
  }

  test('curl, Node, urllib and requests: the rule host gets the secret over HTTPS; the other host keeps its own certificate and gets nothing', async () => {
    await Secret.create('tls-token', VALUE, net.opts);
    const sandbox = await ruledSandbox('tls-token');
    const bearer = `Bearer ${VALUE}`;

    expect(
      (await json(sandbox, `curl -fsS -m 10 https://allowed.test/headers`)).authorization,
    ).toBe(bearer);
    // Without the proxy variables: captured on port 443, read by its SNI.
    expect(
      (await json(sandbox, `curl --noproxy '*' -fsS -m 10 https://allowed.test/headers`))
        .authorization,
    ).toBe(bearer);
    const node = await json(
      sandbox,
      `node -e "fetch('https://allowed.test/headers').then(r => r.text()).then(t => process.stdout.write(t))"`,
    );
    expect(node.authorization).toBe(bearer);
    const urllib = await json(
      sandbox,
      `python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('https://allowed.test/headers', timeout=10).read().decode())"`,
    );
    expect(urllib.authorization).toBe(bearer);
    const requests = await json(
      sandbox,
      `python3 -c "import requests,sys; sys.stdout.write(requests.get('https://allowed.test/headers', timeout=10).text)"`,
    );
    expect(requests.authorization).toBe(bearer);

    // The rule host's certificate is the egress CA's; another host's is its own, untouched.
    expect(await issuer(sandbox, 'allowed.test')).toMatch(/abx egress proxy CA/);
    expect(await issuer(sandbox, 'other.test')).toMatch(/abx test CA/);
    // Verified against the origin's own CA (not the sandbox's bundle, which does not hold it).
    await sandbox.files.write('/tmp/origin-ca.pem', readFileSync(net.internet.caCert, 'utf8'));
    const other = await json(
      sandbox,
      `curl --noproxy '*' --cacert /tmp/origin-ca.pem -fsS -m 10 https://other.test/headers`,
    );
    expect(other.authorization).toBeUndefined();
    // www.allowed.test has no rule of its own: passthrough, nothing set.
    expect(await issuer(sandbox, 'www.allowed.test')).toMatch(/abx test CA/);

    // A placeholder the sandbox writes itself goes out as its text, to the rule host too.
    const literal = await json(
      sandbox,
      `curl -fsS -m 10 -H 'X-Mine: \${e2b.secrets.tls-token}' https://allowed.test/headers`,
    );
    expect(literal['x-mine']).toBe('${e2b.secrets.tls-token}');

    // The value is nowhere in the sandbox: not its environment, not its processes', not its files.
    // (The value is searched for reversed, so the search's own command line does not hold it.)
    const leak = await run(
      sandbox,
      `python3 -c "
import glob, os
v = '${[...VALUE].reverse().join('')}'[::-1].encode()
paths = glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline') + glob.glob('/run/abx/*') + ['/etc/ssl/certs/ca-certificates.crt']
found = [p for p in paths if os.path.isfile(p) and v in open(p, 'rb').read()]
found += ['env'] if v in ''.join(os.environ.values()).encode() else []
print(len(found))
"`,
    );
    expect(leak.trim()).toBe('0');
    // Nor in what the daemon keeps or serves: every file of its home (logs, the registry, the
    // sandboxes' folders), its metrics, the sandbox's info and network decisions.
    // (The sandboxes' disk images are left out: the sandbox's own files, checked above.)
    const files = readdirSync(net.abx.home, { recursive: true, withFileTypes: true })
      .filter((entry) => entry.isFile())
      .map((entry) => join(entry.parentPath, entry.name))
      .filter((file) => statSync(file).size < 64 * 1024 * 1024);
    expect(files.length).toBeGreaterThan(3);
    expect(files.filter((file) => readFileSync(file).includes(VALUE))).toEqual([]);
    const auth = { authorization: `Bearer ${net.opts.apiKey}` };
    for (const path of [
      '/metrics',
      `/v1/sandboxes/${sandbox.sandboxId}`,
      `/v1/sandboxes/${sandbox.sandboxId}/network`,
    ]) {
      const text = await fetch(`${net.info.apiUrl}${path}`, { headers: auth }).then((r) =>
        r.text(),
      );
      expect(text, path).not.toContain(VALUE);
    }
    // The CA's certificate is there; no private key is.
    expect(await run(sandbox, 'grep -c "BEGIN CERTIFICATE" /run/abx/egress-ca.pem')).toBe('1\n');
    expect(
      await run(
        sandbox,
        // -D skip: /run/abx/wake is a FIFO (envd's wake, docs/providers.md), which a read would wait on.
        `grep -D skip -l 'PRIVATE KEY' /run/abx/* /etc/ssl/certs/ca-certificates.crt 2>/dev/null | wc -l`,
      ),
    ).toBe('0\n');
  });

  test('leak paths: a lying Host, a redirect to another host, a rotated and a destroyed secret', async () => {
    await Secret.create('tls-rot', 'first-value', net.opts);
    const sandbox = await ruledSandbox('tls-rot');
    const before = net.internet.hits().length;

    // The TLS connection is for allowed.test; a request on it for other.test is refused, sent
    // nowhere (other.test never sees it), and says why.
    const lying = await run(
      sandbox,
      `curl -sS -m 10 -o /tmp/lying -w '%{http_code} ' -H 'Host: other.test' https://allowed.test/headers; cat /tmp/lying`,
    );
    expect(lying).toMatch(/421/);
    expect(lying).toMatch(/this TLS connection is for allowed\.test:443/);
    expect(
      net.internet
        .hits()
        .slice(before)
        .some((l) => l.includes('other.test')),
    ).toBe(false);

    // A redirect from the rule host to another host: the client follows it on a new connection,
    // which is that host's, and it carries nothing. (curl trusts both: the egress CA for the
    // rule host, the origin's CA for the other.)
    await sandbox.files.write(
      '/tmp/both.pem',
      `${readFileSync(net.internet.caCert, 'utf8')}\n${await sandbox.files.read('/run/abx/egress-ca.pem')}`,
    );
    const redirected = await json(
      sandbox,
      `curl --cacert /tmp/both.pem -fsSL -m 10 'https://allowed.test/redirect/${encodeURIComponent('https://other.test/headers')}'`,
    );
    expect(redirected.host).toBe('other.test');
    expect(redirected.authorization).toBeUndefined();

    // Rotation applies to the next request, on the same kept-alive connection too.
    const twice = `python3 -c "
import requests, sys, urllib.request
s = requests.Session()
a = s.get('https://allowed.test/headers', timeout=10).json()['authorization']
sys.stdout.write(a + '\\n'); sys.stdout.flush()
sys.stdin.readline()
b = s.get('https://allowed.test/headers', timeout=10).json()['authorization']
sys.stdout.write(b + '\\n')
"`;
    const lines: string[] = [];
    const handle = await sandbox.commands.run(twice, {
      background: true,
      stdin: true,
      onStdout: (data) => {
        lines.push(...data.split('\n').filter(Boolean));
      },
    });
    await expect.poll(() => lines.length, { timeout: 20_000 }).toBe(1);
    await Secret.update('tls-rot', 'second-value', net.opts);
    await sandbox.commands.sendStdin(handle.pid, '\n');
    await handle.wait();
    expect(lines).toEqual(['Bearer first-value', 'Bearer second-value']);

    // Destroyed: the request fails closed with a 403 naming the secret; nothing reaches the host.
    await Secret.destroy('tls-rot', net.opts);
    const hitsBefore = net.internet.hits().length;
    const refused = await run(
      sandbox,
      `curl -sS -m 10 -w '\\n%{http_code}' https://allowed.test/headers`,
    );
    expect(refused).toMatch(/names the secret tls-rot/);
    expect(refused).toMatch(/403$/m);
    expect(refused).not.toContain('${');
    expect(net.internet.hits().slice(hitsBefore)).toEqual([]);
  });
});

/**
 * The same from a rootless daemon (an unprivileged uid, its egress namespace owned by a user
 * namespace of that uid), natively: `${secrets.NAME}` rules through abx's own SDK. The sandbox
 * here is the daemon's uid: the CA's key must still be out of its reach.
 */
describe.skipIf(unavailable)('header rules on egress (HTTPS), rootless daemon, native SDK', () => {
  let internet: TestInternet;
  let daemon: RootlessDaemon;
  let box: NativeSandbox;

  beforeAll(async () => {
    const uid = rootlessUid();
    internet = await makeInternet({ owner: uid });
    daemon = await startRootlessDaemon({
      uid,
      env: {
        ABX_EGRESS_NETNS: internet.path,
        ABX_EGRESS_USERNS: internet.userns as string,
        ABX_EGRESS_HOSTS: internet.hostsFile,
        NODE_EXTRA_CA_CERTS: internet.caCert,
      },
    }).catch((error) => {
      internet.remove();
      throw error;
    });
  }, 180_000);
  afterAll(async () => {
    await box?.kill().catch(() => undefined);
    await daemon?.close();
    internet?.remove();
  });

  test('curl and requests get the header over HTTPS; the CA key is not readable from the sandbox', async () => {
    await NativeSecret.create('rl-token', 'rootless-v1', { home: daemon.home });
    box = await NativeSandbox.create({
      home: daemon.home,
      network: {
        allowOut: ['allowed.test', 'other.test'],
        denyOut: ['0.0.0.0/0'],
        rules: {
          'allowed.test': [{ transform: { headers: { 'X-Api-Key': '${secrets.rl-token}' } } }],
        },
      },
    });
    const sh = async (command: string) =>
      (await box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true })).stdout;
    expect(JSON.parse(await sh('curl -fsS -m 10 https://allowed.test/headers'))['x-api-key']).toBe(
      'rootless-v1',
    );
    const viaRequests = await sh(
      `python3 -c "import requests,sys; sys.stdout.write(requests.get('https://allowed.test/headers', timeout=10).text)"`,
    );
    expect(JSON.parse(viaRequests)['x-api-key']).toBe('rootless-v1');
    // The key is in the daemon's home, which the sandbox (the same uid) cannot name or reach.
    const key = join(daemon.home, 'egress-ca', 'ca.key');
    expect(existsSync(key)).toBe(true);
    expect(statSync(key).mode & 0o077).toBe(0);
    expect(await sh(`cat '${key}' 2>&1 || echo unreadable`)).toMatch(/unreadable/);
    expect(await sh('grep -rl "PRIVATE KEY" /run/abx /etc/ssl/certs 2>/dev/null | wc -l')).toBe(
      '0\n',
    );
    // The certificate the sandbox trusts is the one in the daemon's home.
    expect(await sh('cat /run/abx/egress-ca.pem')).toBe(
      readFileSync(join(daemon.home, 'egress-ca', 'ca.pem'), 'utf8'),
    );
  });
  test("egressProxy from a rootless daemon: the rule host's HTTPS leaves through the SOCKS5 tunnel, raw TCP to other ports is refused", async () => {
    const proxy = await startSocks5Server({
      netns: internet.serversNs,
      host: internet.addresses.other,
      port: 1080,
      hostsFile: internet.hostsFile,
    });
    try {
      const sh = async (command: string) =>
        (await box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true })).stdout;
      await box.setNetwork({
        allowOut: ['allowed.test', internet.addresses.allowed],
        denyOut: ['0.0.0.0/0'],
        egressProxy: { address: proxy.address },
        rules: {
          'allowed.test': [{ transform: { headers: { 'X-Api-Key': '${secrets.rl-token}' } } }],
        },
      });
      const got = JSON.parse(
        await sh("curl -fsS -m 10 --noproxy '*' https://allowed.test/headers"),
      );
      expect(got['x-api-key']).toBe('rootless-v1');
      expect(proxy.log()).toContain('connect name allowed.test:443');
      const raw = await sh(
        `printf 'raw\\n' | curl -sS -m 10 telnet://${internet.addresses.allowed}:7000 || echo refused`,
      );
      expect(raw).toMatch(/refused/);
      expect(internet.hits().join('\n')).not.toMatch(/tcp .* raw/);
    } finally {
      proxy.close();
    }
  });
});
