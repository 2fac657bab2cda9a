import { readFileSync } from 'node:fs';
import { Sandbox, Secret } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  EgressRules,
  PolicyError,
  parseEgressProxy,
  publicPolicy,
} from '../../src/egress/policy.js';
import { NameResolver } from '../../src/egress/resolver.js';
import { sandboxRuleset } from '../../src/egress/sandbox-net.js';
import { proxyAddress } from '../../src/egress/socks-dial.js';
import { Sandbox as AbxSandbox } from '../../src/sandbox/sandbox.js';
import { CLI, runProgram } from '../cli/abx.js';
import { e2bOnTestInternet, outputOf } from '../helpers/e2b-internet.js';
import { HOST_ADDRESS, internetUnavailable } from '../helpers/internet.js';
import { type Socks5Server, startSocks5Server } from '../helpers/socks5-server.js';

/**
 * `network.egressProxy` (issue 45): a sandbox's allowed egress leaves through the user's own
 * SOCKS5 proxy. The proxy runs in the test internet's servers' namespace at other.test's address
 * (192.0.2.44:1080), resolves names by the internet's hosts file and logs each CONNECT as sent
 * (a name or an address). Real sandboxes of a root daemon, through E2B's unmodified SDK, the
 * native SDK and the CLI.
 */
const unavailable = internetUnavailable();
const USER = 'proxy-user';
const PASSWORD = 'pw-5d1e-never-shown';

describe('egress proxy settings (no sandbox)', () => {
  const where = 'network.egressProxy';

  test('an address is host:port with a name, an IPv4 or an [IPv6] address; credentials as RFC 1929 allows', () => {
    expect(parseEgressProxy({ address: 'Proxy.Example.com.:1080' }, where)).toEqual({
      address: 'proxy.example.com:1080',
      host: 'proxy.example.com',
      port: 1080,
    });
    expect(parseEgressProxy({ address: '[::1]:9' }, where)?.host).toBe('::1');
    expect(parseEgressProxy(null, where)).toBeUndefined();
    const refusals: [unknown, string][] = [
      ['x', `${where} must be an object`],
      [{}, `${where}.address must be a string host:port`],
      [{ address: 'proxy.example.com' }, "'proxy.example.com' is not host:port"],
      [{ address: 'proxy:0' }, 'port 0 is not between 1 and 65535'],
      [{ address: 'proxy:65536' }, 'port 65536 is not between 1 and 65535'],
      [{ address: '127.1:1080' }, 'not written as a.b.c.d'],
      [{ address: 'a b:1080' }, 'neither a domain name nor an IP address'],
      [{ address: '[zz]:1080' }, 'is not an IPv6 address'],
      [{ address: 'p:1', password: 'x' }, `${where}.password needs a username`],
      [{ address: 'p:1', username: '' }, `${where}.username is 0 bytes`],
      [{ address: 'p:1', username: 'u', password: 'é'.repeat(128) }, 'is 256 bytes'],
      [{ address: 'p:1', port: 1 }, `${where}.port is not an egress proxy key`],
    ];
    for (const [value, message] of refusals) {
      const error = (() => {
        try {
          parseEgressProxy(value, where);
        } catch (e) {
          return e;
        }
      })();
      expect(error, JSON.stringify(value)).toBeInstanceOf(PolicyError);
      expect((error as Error).message).toContain(message);
    }
    // A message never carries a credential's value.
    try {
      parseEgressProxy(
        { address: 'p:1', username: 'u', password: `${PASSWORD}${'x'.repeat(255)}` },
        where,
      );
    } catch (e) {
      expect((e as Error).message).not.toContain(PASSWORD);
    }
  });

  test('publicPolicy keeps the address and username, never the password', () => {
    const shown = publicPolicy({
      allowOut: ['a.test'],
      denyOut: [],
      egressProxy: { address: 'p.test:1080', username: USER, password: PASSWORD },
    });
    expect(shown).toEqual({
      allowOut: ['a.test'],
      denyOut: [],
      egressProxy: { address: 'p.test:1080', username: USER },
    });
    expect(JSON.stringify(shown)).not.toContain(PASSWORD);
  });

  test("the proxy's address: the always-denied ranges and the host's own refuse it, unless the operator permits the range", async () => {
    const resolver = new NameResolver();
    const host = new Set(['198.51.100.1']);
    const rules = new EgressRules({ hostAddresses: () => host });
    const at = (address: string, using = rules) =>
      proxyAddress(parseEgressProxy({ address }, where) as never, using, resolver).catch(
        (e: Error) => e.message,
      );
    expect(await at('203.0.113.9:1080')).toBe('203.0.113.9');
    expect(await at('127.0.0.1:1080')).toContain("always denied: the host's loopback");
    expect(await at('localhost:1080')).toContain("always denied: the host's loopback");
    expect(await at('10.1.2.3:1080')).toContain('private (RFC 1918)');
    expect(await at('198.51.100.1:1080')).toContain('an address of this host (198.51.100.1)');
    const permitting = new EgressRules({
      permit: ['10.1.0.0/16', '198.51.100.1/32'],
      hostAddresses: () => host,
    });
    expect(await at('10.1.2.3:1080', permitting)).toBe('10.1.2.3');
    expect(await at('198.51.100.1:1080', permitting)).toBe('198.51.100.1');
  });

  test('the ruleset resets TCP to ports but 80 and 443 while a proxy is set, and nothing without one', () => {
    const ports = { http: 1, tls: 2, dns: 3 };
    const rule = 'ip daddr @tunnel4 tcp dport != { 80, 443 } reject with tcp reset';
    const proxied = sandboxRuleset(
      { allowOut: [], denyOut: [], egressProxy: { address: 'p.test:1080' } },
      ports,
    );
    expect(proxied).toContain(
      'set tunnel4 { type ipv4_addr; flags interval; elements = { 0.0.0.0/0 } }',
    );
    // First in `decide`: after loopback, DNS and egress's own ports, before any allow.
    expect(proxied).toMatch(new RegExp(`chain decide \\{\\n\\s+${rule.replace(/[{}]/g, '\\$&')}`));
    const plain = sandboxRuleset({ allowOut: [], denyOut: [] }, ports);
    expect(plain).toContain('set tunnel4 { type ipv4_addr; flags interval; }');
  });
});

describe.skipIf(unavailable)("a sandbox's egress through the user's SOCKS5 proxy", () => {
  const net = e2bOnTestInternet({ trustTestCa: true });
  let proxy: Socks5Server;

  beforeAll(async () => {
    proxy = await startSocks5Server({
      netns: net.internet.serversNs,
      host: net.internet.addresses.other,
      port: 1080,
      hostsFile: net.internet.hostsFile,
      username: USER,
      password: PASSWORD,
    });
  }, 30_000);
  afterAll(() => proxy?.close());

  const run = outputOf;
  const e2bHeaders = () => ({ 'x-api-key': net.opts.apiKey });
  const nativeHeaders = () => ({ authorization: `Bearer ${net.opts.apiKey}` });
  /** Every answer that shows the sandbox, as raw text. */
  const answers = async (id: string) =>
    Promise.all([
      fetch(`${net.info.apiUrl}/sandboxes/${id}`, { headers: e2bHeaders() }).then((r) => r.text()),
      fetch(`${net.info.apiUrl}/v2/sandboxes`, { headers: e2bHeaders() }).then((r) => r.text()),
      fetch(`${net.info.apiUrl}/v1/sandboxes/${id}`, { headers: nativeHeaders() }).then((r) =>
        r.text(),
      ),
      fetch(`${net.info.apiUrl}/v1/sandboxes/${id}/network`, { headers: nativeHeaders() }).then(
        (r) => r.text(),
      ),
      fetch(`${net.info.apiUrl}/v1/sandboxes`, { headers: nativeHeaders() }).then((r) => r.text()),
    ]);

  test('E2B SDK: HTTP and HTTPS to an allowed name leave through the proxy by name; a denied name never reaches it; raw TCP is refused until a live update clears the proxy', async () => {
    const allowOut = ['allowed.test', net.internet.addresses.allowed];
    const egressProxy = { address: proxy.address, username: USER, password: PASSWORD };
    const sandbox = await Sandbox.create({
      ...net.opts,
      network: { allowOut, denyOut: ['0.0.0.0/0'], egressProxy },
    });
    net.made.push(sandbox);
    await sandbox.files.write('/tmp/ca.pem', readFileSync(net.internet.caCert, 'utf8'));
    const logged = () => proxy.log().slice(before);
    let before = proxy.log().length;

    // HTTP_PROXY (absolute form, and CONNECT), and the same captured on 80 and 443.
    expect(await run(sandbox, 'curl -fsS -m 10 http://allowed.test/')).toContain(
      'http hello from 203.0.113.10 for allowed.test',
    );
    expect(await run(sandbox, "curl -fsS -m 10 --noproxy '*' http://allowed.test/")).toContain(
      'http hello from 203.0.113.10',
    );
    expect(
      await run(sandbox, 'curl -fsS -m 10 --cacert /tmp/ca.pem https://allowed.test/'),
    ).toContain('https hello from 203.0.113.10');
    expect(
      await run(
        sandbox,
        "curl -fsS -m 10 --noproxy '*' --cacert /tmp/ca.pem https://allowed.test/",
      ),
    ).toContain('https hello from 203.0.113.10');
    expect(logged()).toEqual([
      'connect name allowed.test:80',
      'connect name allowed.test:80',
      'connect name allowed.test:443',
      'connect name allowed.test:443',
    ]);
    // Asked by address, the proxy gets the address.
    before = proxy.log().length;
    expect(await run(sandbox, 'curl -fsS -m 10 http://203.0.113.10/')).toContain('http hello');
    expect(logged()).toEqual(['connect address 203.0.113.10:80']);

    // Refused by the policy: the usual 403, and the proxy never hears of it.
    before = proxy.log().length;
    const hits = net.internet.hits().length;
    expect(
      await run(sandbox, "curl -sS -m 10 -o /dev/null -w '%{http_code}' http://denied.test/"),
    ).toBe('403');
    expect(logged()).toEqual([]);
    expect(net.internet.hits().slice(hits).join('\n')).not.toContain('denied');

    // Raw TCP to an allowed address on another port would go round the proxy: reset. Through
    // HTTP_PROXY's CONNECT, the same port goes through the tunnel.
    const echo = (line: string) =>
      run(sandbox, `printf '${line}\\n' | curl -sS -m 10 telnet://203.0.113.10:7000`);
    expect(await echo('raw-one')).toMatch(/^exit [1-9]/);
    expect(net.internet.hits().join('\n')).not.toContain('raw-one');
    before = proxy.log().length;
    expect(
      await run(
        sandbox,
        `printf 'tunnelled\\n' | curl -sS -m 10 -p -x "$HTTP_PROXY" telnet://allowed.test:7000`,
      ),
    ).toContain('echo tunnelled');
    expect(logged()).toEqual(['connect name allowed.test:7000']);

    // Shown with its address and username; the password is in no answer.
    const info = await sandbox.getInfo();
    expect(info.network?.egressProxy).toEqual({ address: proxy.address, username: USER });
    for (const body of await answers(sandbox.sandboxId)) expect(body).not.toContain(PASSWORD);
    expect((await answers(sandbox.sandboxId))[0]).toContain(`"username":"${USER}"`);

    // A live update without it: out directly, raw TCP passes again.
    await sandbox.updateNetwork({ allowOut, denyOut: ['0.0.0.0/0'] });
    expect(await echo('raw-two')).toContain('echo raw-two');
    before = proxy.log().length;
    expect(await run(sandbox, 'curl -fsS -m 10 http://allowed.test/')).toContain('http hello');
    expect(logged()).toEqual([]);
    expect((await sandbox.getInfo()).network?.egressProxy).toBeUndefined();

    // And with it again: raw TCP is reset again, HTTP goes through it.
    await sandbox.updateNetwork({ allowOut, denyOut: ['0.0.0.0/0'], egressProxy });
    expect(await echo('raw-three')).toMatch(/^exit [1-9]/);
    expect(await run(sandbox, 'curl -fsS -m 10 http://allowed.test/')).toContain('http hello');
    expect(logged()).toEqual(['connect name allowed.test:80']);
  }, 240_000);

  test('header rules through the proxy: HTTPS egress terminates for the rule host leaves by the tunnel, by name, with the header', async () => {
    await Secret.create('proxied-token', 'via-socks-7c1', net.opts);
    const sandbox = await Sandbox.create({
      ...net.opts,
      network: {
        allowOut: ['allowed.test', 'other.test'],
        denyOut: ['0.0.0.0/0'],
        egressProxy: { address: proxy.address, username: USER, password: PASSWORD },
        rules: {
          'allowed.test': [{ transform: { headers: { 'X-Key': Secret.fill('proxied-token') } } }],
        },
      },
    });
    net.made.push(sandbox);
    const before = proxy.log().length;
    // Captured on 443 and through HTTPS_PROXY's CONNECT: both terminated, both tunnelled.
    for (const flags of ["--noproxy '*'", '']) {
      const got = JSON.parse(
        await run(sandbox, `curl -fsS -m 10 ${flags} https://allowed.test/headers`),
      ) as Record<string, string>;
      expect(got['x-key']).toBe('via-socks-7c1');
    }
    expect(proxy.log().slice(before)).toEqual([
      'connect name allowed.test:443',
      'connect name allowed.test:443',
    ]);
  }, 120_000);

  test('a wrong password: the connection fails, and nothing is reached', async () => {
    const sandbox = await Sandbox.create({
      ...net.opts,
      network: {
        allowOut: ['allowed.test'],
        denyOut: ['0.0.0.0/0'],
        egressProxy: { address: proxy.address, username: USER, password: 'wrong' },
      },
    });
    net.made.push(sandbox);
    const before = proxy.log().length;
    const hits = net.internet.hits().length;
    const answer = await run(sandbox, 'curl -sS -m 10 -w " %{http_code}" http://allowed.test/');
    expect(answer).toContain('502');
    expect(answer).toContain('Authentication failed');
    expect(answer).not.toContain('wrong');
    expect(await run(sandbox, "curl -sS -m 10 --noproxy '*' -k https://allowed.test/")).toMatch(
      /^exit [1-9]/,
    );
    expect(proxy.log().slice(before)).toEqual([`auth failed ${USER}`, `auth failed ${USER}`]);
    expect(net.internet.hits().slice(hits)).toEqual([]);
  }, 120_000);

  test("a proxy on the host's own addresses or loopback is refused at create and on update; a malformed one is a 400 naming the field", async () => {
    const create = (address: string) =>
      Sandbox.create({
        ...net.opts,
        network: { allowOut: ['allowed.test'], egressProxy: { address } },
      }).then(
        (made) => {
          net.made.push(made);
          return 'created';
        },
        (e: Error) => e.message,
      );
    for (const [address, why] of [
      ['127.0.0.1:1080', "always denied: the host's loopback"],
      ['loopback.test:1080', "always denied: the host's loopback"],
      [`${HOST_ADDRESS}:1080`, `an address of this host (${HOST_ADDRESS})`],
      ['host.test:1080', `an address of this host (${HOST_ADDRESS})`],
      ['metadata.test:1080', 'link-local'],
      // Not in the hosts file: egress's namespace has no route out, so it cannot be resolved.
      ['nowhere.test:1080', 'nowhere.test'],
    ]) {
      const message = await create(address as string);
      expect(message, address).toContain('network.egressProxy.address');
      expect(message, address).toContain(why);
    }
    const malformed = await fetch(`${net.info.apiUrl}/sandboxes`, {
      method: 'POST',
      headers: { ...e2bHeaders(), 'content-type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', network: { egressProxy: { address: 'nope' } } }),
    });
    expect(malformed.status).toBe(400);
    expect(await malformed.text()).toContain('network.egressProxy.address');

    // On a running sandbox, the same refusal leaves its policy as it was.
    const sandbox = await Sandbox.create({
      ...net.opts,
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    net.made.push(sandbox);
    const refused = await sandbox
      .updateNetwork({ allowOut: ['other.test'], egressProxy: { address: '127.0.0.1:1080' } })
      .catch((e: Error) => e.message);
    expect(refused).toContain('network.egressProxy.address');
    expect((await sandbox.getInfo()).network?.allowOut).toEqual(['allowed.test']);
    expect(await run(sandbox, 'curl -fsS -m 10 http://allowed.test/')).toContain('http hello');
  }, 180_000);

  test('native SDK and CLI: the proxy by name, shown without its password, cleared by setNetwork', async () => {
    const home = net.abx.home;
    const sandbox = await AbxSandbox.create({
      home,
      network: {
        allowOut: ['allowed.test'],
        denyOut: ['0.0.0.0/0'],
        egressProxy: { address: 'other.test:1080', username: USER, password: PASSWORD },
      },
    });
    try {
      const before = proxy.log().length;
      expect(await run(sandbox, 'curl -fsS -m 10 http://allowed.test/')).toContain('http hello');
      expect(proxy.log().slice(before)).toEqual(['connect name allowed.test:80']);
      const info = await sandbox.getInfo();
      expect(info.network?.egressProxy).toEqual({ address: 'other.test:1080', username: USER });
      expect(JSON.stringify(info)).not.toContain(PASSWORD);
      expect(JSON.stringify(await sandbox.getNetwork())).not.toContain(PASSWORD);
      const cli = await runProgram(CLI, ['info', sandbox.sandboxId], { env: { ABX_HOME: home } });
      expect(cli.stdout).toContain(`through socks5://${USER}@other.test:1080`);
      expect(cli.stdout + cli.stderr).not.toContain(PASSWORD);
      await sandbox.setNetwork({ allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] });
      expect((await sandbox.getInfo()).network?.egressProxy).toBeUndefined();
    } finally {
      await sandbox.kill();
    }

    // abx create --egress-proxy, the password from the environment rather than argv.
    const made = await runProgram(
      CLI,
      [
        'create',
        '-q',
        '--allow',
        'allowed.test',
        '--deny',
        '0.0.0.0/0',
        '--egress-proxy',
        `socks5://${USER}@${proxy.address}`,
      ],
      { env: { ABX_HOME: home, ABX_EGRESS_PROXY_PASSWORD: PASSWORD } },
    );
    expect(made.code, made.stderr).toBe(0);
    const id = made.stdout.trim();
    try {
      const shown = await runProgram(CLI, ['network', id, '--json'], { env: { ABX_HOME: home } });
      expect(JSON.parse(shown.stdout).egressProxy).toEqual({
        address: proxy.address,
        username: USER,
      });
      expect(shown.stdout).not.toContain(PASSWORD);
      const before = proxy.log().length;
      const connected = await AbxSandbox.connect(id, { home });
      expect(await run(connected, 'curl -fsS -m 10 http://allowed.test/')).toContain('http hello');
      expect(proxy.log().slice(before)).toEqual(['connect name allowed.test:80']);
      // A password in the URL is refused before anything is sent.
      const inUrl = await runProgram(
        CLI,
        ['create', '-q', '--egress-proxy', `socks5://${USER}:${PASSWORD}@${proxy.address}`],
        { env: { ABX_HOME: home } },
      );
      expect(inUrl.code).not.toBe(0);
      expect(inUrl.stderr).toContain('ABX_EGRESS_PROXY_PASSWORD');
    } finally {
      await runProgram(CLI, ['kill', id], { env: { ABX_HOME: home } });
    }
  }, 240_000);
});
