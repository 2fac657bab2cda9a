import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, test, vi } from 'vitest';
import { HOST_ADDRESSES_REREAD_MS } from '../../src/egress/host-addresses.js';
import type { EgressPolicy } from '../../src/egress/policy.js';
import {
  allowResolved,
  applyRuleset,
  enterArgs,
  REOPEN_MARGIN_MS,
  ResolvedAddresses,
  type SandboxNet,
  sandboxRuleset,
  setHostAddresses,
  startSandboxNet,
  stopSandboxNet,
  updatePolicy,
} from '../../src/egress/sandbox-net.js';
import type { EgressPorts } from '../../src/egress/service.js';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../helpers/internet.js';

/**
 * The egress service and a sandbox's network, without a daemon: the service runs in a test
 * "internet" namespace (TEST-NET servers, no route out), and a namespace made by startSandboxNet
 * stands for a sandbox. Clients run in that namespace with nsenter (as root there: these tests
 * check what the rules decide; the attack tests with real sandboxes are in test/security).
 */
const unavailable = internetUnavailable();

function controlCall(
  socket: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<{ status: number; json: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: socket, method, path }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => {
        text += c.toString();
      });
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, json: text ? JSON.parse(text) : {} }),
      );
    });
    req.on('error', reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}

describe.skipIf(unavailable)('a sandbox network through the egress service', () => {
  let internet: TestInternet;
  let stopFirst: (() => void) | undefined;
  let dir: string;
  let socket: string;
  const nets: SandboxNet[] = [];

  beforeAll(async () => {
    ensureBuilt();
    internet = await makeInternet();
    dir = mkdtempSync(join(tmpdir(), 'abx-egress-'));
    const first = await startEgress([]);
    socket = first.socket;
    stopFirst = first.stop;
  }, 60_000);

  afterAll(() => {
    for (const net of nets) stopSandboxNet(net);
    stopFirst?.();
    internet?.remove();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** An egress process in the test internet, with more options; `stop` ends it. */
  async function startEgress(args: string[]): Promise<{ socket: string; stop(): void }> {
    const control = join(dir, `egress-${args.length}-${Date.now()}.sock`);
    const child = spawn(
      'ip',
      [
        'netns',
        'exec',
        internet.ns,
        process.execPath,
        join(ROOT, 'dist', 'egress.js'),
        '--control',
        control,
        '--hosts',
        internet.hostsFile,
        ...args,
      ],
      { stdio: ['pipe', 'pipe', 'inherit'] },
    );
    const stop = () => child.kill('SIGKILL');
    await new Promise<void>((resolve, reject) => {
      child.stdout?.once('data', () => resolve());
      child.once('exit', (code) => reject(new Error(`egress ended (exit code ${code})`)));
    }).catch((error) => {
      stop();
      throw error;
    });
    return { socket: control, stop };
  }

  async function sandbox(id: string, policy: EgressPolicy): Promise<SandboxNet> {
    const added = await controlCall(socket, 'PUT', `/sandboxes/${id}`, { policy });
    expect(added.status).toBe(201);
    const net = await startSandboxNet({
      id,
      rootless: false,
      policy,
      ports: added.json.ports as EgressPorts,
      egressNetns: internet.path,
    });
    nets.push(net);
    expect(
      (
        await controlCall(socket, 'PUT', `/sandboxes/${id}/net`, {
          holder: net.holder,
          userns: false,
        })
      ).status,
    ).toBe(204);
    return net;
  }

  /** Runs a shell command in the sandbox's namespace; curl's exit code and output. */
  function inside(net: SandboxNet, command: string): { status: number; out: string } {
    const [cmd, ...args] = [...enterArgs(net), 'sh', '-c', command];
    const result = spawnSync(cmd as string, args, { encoding: 'utf8', timeout: 30_000 });
    return { status: result.status ?? -1, out: `${result.stdout}${result.stderr}` };
  }

  const curl = (net: SandboxNet, args: string) =>
    inside(net, `curl -sS -m 10 --cacert ${internet.caCert} ${args}`);

  test('allowed names answer over HTTP and HTTPS; denied ones are refused with the rule, and never arrive', async () => {
    const net = await sandbox('names', {
      allowOut: ['allowed.test', '*.wild.test'],
      denyOut: ['denied.test'],
    });
    expect(curl(net, 'http://allowed.test/').out).toContain(
      'http hello from 203.0.113.10 for allowed.test',
    );
    expect(curl(net, 'https://allowed.test/').out).toContain('https hello from 203.0.113.10');
    expect(curl(net, 'https://api.wild.test/').out).toContain('https hello from 192.0.2.44');
    const before = internet.hits().length;
    // A client that knows the address itself: the proxy refuses by the Host header.
    const http = curl(
      net,
      `-i --resolve denied.test:80:${internet.addresses.denied} http://denied.test/`,
    );
    expect(http.out).toMatch(/HTTP\/1\.1 403/);
    expect(http.out).toContain(
      "denied.test is refused by the sandbox's network policy: denyOut denied.test",
    );
    // DNS refuses the name too: curl cannot even resolve it.
    expect(curl(net, 'https://denied.test/').status).not.toBe(0);
    expect(inside(net, 'getent hosts denied.test').status).not.toBe(0);
    expect(inside(net, 'getent hosts allowed.test').out).toContain('203.0.113.10');
    expect(internet.hits().slice(before).join('\n')).not.toContain('198.51.100.7');
    const counters = await controlCall(socket, 'GET', '/sandboxes/names');
    expect((counters.json.counters as { refused: number }).refused).toBeGreaterThanOrEqual(3);
  });

  test('TLS to an allowed name at a denied address, and a Host header that lies, are refused', async () => {
    const net = await sandbox('lies', { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] });
    const before = internet.hits().length;
    const sni = curl(
      net,
      `--connect-to allowed.test:443:${internet.addresses.denied}:443 https://allowed.test/`,
    );
    expect(sni.status).not.toBe(0);
    // The allowed name's address, once DNS gave it, with a Host header naming another.
    expect(inside(net, 'getent hosts allowed.test').out).toContain(internet.addresses.allowed);
    const host = curl(net, `-i -H 'Host: denied.test' http://${internet.addresses.allowed}/`);
    expect(host.out).toMatch(/403[\s\S]*denied.test is refused/);
    // A raw connection by address to what no rule allows: reset at once.
    const raw = inside(net, `curl -sS -m 10 telnet://${internet.addresses.denied}:7000 </dev/null`);
    expect(raw.status).not.toBe(0);
    expect(raw.out).toMatch(/couldn't connect|refused|reset/i);
    expect(internet.hits().slice(before).join('\n')).not.toContain(internet.addresses.denied);
  });

  test('allowInternetAccess false (deny 0.0.0.0/0): only allowed names, raw TCP to them after DNS, and CIDR allows', async () => {
    const net = await sandbox('closed', {
      allowOut: ['allowed.test', `${internet.addresses.other}/32`],
      denyOut: ['0.0.0.0/0', '::/0'],
    });
    expect(curl(net, 'http://allowed.test/').out).toContain('hello from 203.0.113.10');
    // Raw TCP by name: egress's DNS answer opened the address for a while.
    expect(
      inside(net, "printf 'ping\\n' | curl -sS -m 10 telnet://allowed.test:7000").out,
    ).toContain('echo ping');
    expect(
      inside(net, `printf 'cidr\\n' | curl -sS -m 10 telnet://${internet.addresses.other}:7000`)
        .out,
    ).toContain('echo cidr');
    expect(curl(net, '-i http://other.test/').out).toContain('hello from 192.0.2.44');
    expect(inside(net, 'getent hosts denied.test').status).not.toBe(0);
    expect(
      inside(net, `curl -sS -m 10 telnet://${internet.addresses.denied}:7000 </dev/null`).status,
    ).not.toBe(0);
  });

  test('allow wins over deny, and a policy change applies to the next connection', async () => {
    const policy = { allowOut: ['www.allowed.test'], denyOut: ['*.allowed.test', 'allowed.test'] };
    const net = await sandbox('live', policy);
    expect(curl(net, 'http://www.allowed.test/').out).toContain('hello from 203.0.113.10');
    expect(inside(net, 'getent hosts allowed.test').status).not.toBe(0);
    const claimed = `--resolve allowed.test:80:${internet.addresses.allowed}`;
    expect(curl(net, `-i ${claimed} http://allowed.test/`).out).toContain('denyOut allowed.test');
    const changed = { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] };
    expect(
      (await controlCall(socket, 'PUT', '/sandboxes/live/policy', { policy: changed })).status,
    ).toBe(204);
    await updatePolicy(net, changed);
    expect(curl(net, 'http://allowed.test/').out).toContain('hello from 203.0.113.10');
    expect(inside(net, 'getent hosts www.allowed.test').status).not.toBe(0);
  });

  test('the always-denied ranges: loopback, link-local, private, and the egress side of the link', async () => {
    const net = await sandbox('always', {
      allowOut: ['0.0.0.0/0', 'loopback.test', 'metadata.test', 'private.test'],
      denyOut: [],
    });
    for (const name of ['loopback.test', 'metadata.test', 'private.test']) {
      // DNS gives no such address, and a proxy asked by name refuses it (no rebinding inward).
      expect(inside(net, `getent hosts ${name}`).status, name).not.toBe(0);
      const answer = curl(net, `-i -H 'Host: ${name}' http://${internet.addresses.allowed}/`);
      expect(answer.out, name).toMatch(/403[\s\S]*always denied/);
    }
    for (const address of ['127.0.0.1', '169.254.169.254', '10.1.2.3', '10.0.2.2', '10.0.2.3']) {
      const raw = inside(net, `curl -sS -m 5 telnet://${address}:7000 </dev/null`);
      expect(raw.status, address).not.toBe(0);
    }
    // The egress namespace's loopback, where slirp4netns would take 10.0.2.2: only the proxy's ports.
    const control = inside(net, 'curl -sS -m 5 http://10.0.2.2:7000/');
    expect(control.status).not.toBe(0);
    expect(curl(net, 'http://allowed.test/').out).toContain('hello');
  });

  test('relayed downloads arrive whole: TLS by SNI, CONNECT, and a server that closes first', async () => {
    const net = await sandbox('relay', { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] });
    const size = 24 * 1024 * 1024 + 7;
    const expected = `${internet.patternSha256(size)}  -`;
    const fetch = (args: string) =>
      inside(net, `curl -sS -m 60 --cacert ${internet.caCert} ${args} | sha256sum`).out.trim();
    expect(fetch(`https://allowed.test/pattern/${size}`)).toBe(expected);
    // The server ends the connection after the body: what is still on its way arrives first.
    expect(fetch(`-H 'Connection: close' https://allowed.test/pattern/${size}`)).toBe(expected);
    // CONNECT, as a client with HTTPS_PROXY sends it, to the HTTP proxy's port.
    expect(fetch(`-p -x http://allowed.test:80 https://allowed.test/pattern/${size}`)).toBe(
      expected,
    );
  });

  test('a DNS answer renews the opening of an address already open (nft does not on a plain add)', async () => {
    const net = await sandbox('renew', { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] });
    const expires = () => {
      const listed = inside(net, 'nft list set inet abx resolved4').out;
      const [, s = '', ms = '0'] =
        /203\.0\.113\.10 timeout 30s expires (\d+)s(?:(\d+)ms)?/.exec(listed) ?? [];
      return Number(s) + Number(ms) / 1000;
    };
    await allowResolved(net, [internet.addresses.allowed], 30);
    await new Promise((r) => setTimeout(r, 2_100));
    expect(expires()).toBeLessThan(28.5);
    await allowResolved(net, [internet.addresses.allowed, internet.addresses.other], 30);
    expect(expires()).toBeGreaterThan(29);
    expect(inside(net, 'nft list set inet abx resolved4').out).toContain(internet.addresses.other);
  });

  test('bad policies are refused by the control route, naming the entry; nothing is served', async () => {
    const bad = await controlCall(socket, 'PUT', '/sandboxes/bad', {
      policy: { allowOut: ['ok.test', 'not a name'] },
    });
    expect(bad.status).toBe(400);
    expect(bad.json.error).toContain('allowOut[1]');
    expect((await controlCall(socket, 'GET', '/sandboxes/bad')).status).toBe(404);
  });

  /** Through the sandbox's egress proxy: as plain HTTP (`-x`) or a CONNECT tunnel (`-p -x`). */
  const proxied = (net: SandboxNet, args: string) =>
    inside(net, `curl -sS -m 10 -i -v --noproxy '' -x http://10.0.2.2:${net.ports.http} ${args}`);

  test("the egress namespace's own addresses (the host's): refused by address, by name, by proxy, CONNECT and raw TCP", async () => {
    // Everything allowed but the always-denied: the host's service on 0.0.0.0 answers on its
    // link address, which is neither loopback nor private.
    const net = await sandbox('host', { allowOut: [], denyOut: [] });
    const host = `${internet.hostAddress}:${internet.hostPort}`;
    const rule = `always denied: an address of this host (${internet.hostAddress})`;
    const before = internet.hits().length;
    const raw = inside(net, `curl -sS -m 5 http://${host}/`);
    expect(raw.status).not.toBe(0);
    expect(raw.out).toMatch(/couldn't connect|refused|reset/i);
    for (const target of [host, `host.test:${internet.hostPort}`]) {
      const http = proxied(net, `http://${target}/`);
      expect(http.out, target).toMatch(/HTTP\/1\.1 403/);
      expect(http.out, target).toContain(rule);
      const tunnel = proxied(net, `-p http://${target}/`);
      expect(tunnel.status, target).not.toBe(0);
      expect(tunnel.out, target).toMatch(/CONNECT[\s\S]*403/);
      expect(tunnel.out, target).toContain(rule);
    }
    // A name that resolves to it: DNS gives no address, the transparent proxy refuses by Host.
    expect(inside(net, 'getent hosts host.test').status).not.toBe(0);
    const byHost = curl(net, `-i -H 'Host: host.test' http://${internet.addresses.allowed}/`);
    expect(byHost.out).toContain(rule);
    expect(
      internet
        .hits()
        .slice(before)
        .filter((l) => l.startsWith('host ')),
    ).toEqual([]);
    // The servers beyond the link still answer.
    expect(curl(net, 'http://allowed.test/').out).toContain('hello from 203.0.113.10');
    const counters = await controlCall(socket, 'GET', '/sandboxes/host');
    expect(
      (counters.json.counters as { recent: Array<{ rule: string }> }).recent.some((e) =>
        e.rule.includes(rule),
      ),
    ).toBe(true);
  });

  test('an address the egress namespace gets after the sandbox started is refused too; --egress-permit opens one on purpose', async () => {
    const net = await sandbox('later', { allowOut: [], denyOut: [] });
    // A second egress process whose operator permits the host's range, as ABX_EGRESS_PERMIT does.
    const permitted = await startEgress(['--permit', '198.51.100.0/24']);
    try {
      const added = await controlCall(permitted.socket, 'PUT', '/sandboxes/open', {
        policy: { allowOut: [], denyOut: [] },
      });
      const open = await startSandboxNet({
        id: 'open',
        rootless: false,
        policy: { allowOut: [], denyOut: [] },
        ports: added.json.ports as EgressPorts,
        egressNetns: internet.path,
        permit: ['198.51.100.0/24'],
        hostAddresses: [internet.hostAddress],
      });
      nets.push(open);
      await controlCall(permitted.socket, 'PUT', '/sandboxes/open/net', {
        holder: open.holder,
        userns: false,
      });
      const host = `${internet.hostAddress}:${internet.hostPort}`;
      expect(inside(open, `curl -sS -m 5 http://${host}/`).out).toContain(
        'the host service answered',
      );
      expect(proxied(open, `http://host.test:${internet.hostPort}/`).out).toContain(
        'the host service answered',
      );
      // The permit opens that range only: the host's loopback stays shut.
      expect(proxied(open, `http://127.0.0.1:${internet.hostPort}/`).out).toContain(
        "always denied: the host's loopback",
      );

      const later = '198.51.100.77';
      execFileSync('ip', ['-n', internet.ns, 'addr', 'add', `${later}/32`, 'dev', 'lo']);
      const target = `${later}:${internet.hostPort}`;
      // The proxy reads the addresses at each decision: refused at once.
      expect(proxied(net, `http://${target}/`).out).toContain(
        `always denied: an address of this host (${later})`,
      );
      // Raw TCP: the namespace's set is refilled within the documented delay.
      const deadline = Date.now() + HOST_ADDRESSES_REREAD_MS + 500;
      while (!inside(net, 'nft list set inet abx host4').out.includes(later)) {
        expect(Date.now()).toBeLessThan(deadline);
        await new Promise((r) => setTimeout(r, 50));
      }
      const before = internet.hits().length;
      const raw = inside(net, `curl -sS -m 5 http://${target}/`);
      expect(raw.status).not.toBe(0);
      expect(raw.out).toMatch(/couldn't connect|refused|reset/i);
      expect(internet.hits().slice(before)).toEqual([]);
      // What was refused is there: the permitted sandbox reaches it.
      expect(inside(open, `curl -sS -m 5 http://${target}/`).out).toContain(
        `the host service answered on ${later}`,
      );
    } finally {
      execFileSync('ip', ['-n', internet.ns, 'addr', 'del', '198.51.100.77/32', 'dev', 'lo']);
      permitted.stop();
    }
  });

  test('a namespace an older daemon made, without the host set, gets the set and its rule when egress fills it', async () => {
    const net = await sandbox('older', { allowOut: [], denyOut: [] });
    const older = sandboxRuleset({ allowOut: [], denyOut: [] }, net.ports)
      .split('\n')
      .filter((line) => !line.includes('host4'))
      .join('\n');
    const file = join(dir, 'older.nft');
    writeFileSync(file, `delete table inet abx\n${older}`);
    expect(inside(net, `nft -f ${file}`).status).toBe(0);
    const target = `http://${internet.hostAddress}:${internet.hostPort}/`;
    expect(inside(net, `curl -sS -m 5 ${target}`).out).toContain('the host service answered');
    await setHostAddresses(net, [internet.hostAddress]);
    expect(inside(net, `curl -sS -m 5 ${target}`).status).not.toBe(0);
    // Filled again later: the set is replaced, the rule not added twice.
    await setHostAddresses(net, [internet.hostAddress, '198.51.100.99']);
    const rules = inside(net, 'nft list chain inet abx filter_out').out;
    expect(rules.match(/@host4/g)?.length).toBe(1);
    expect(inside(net, 'nft list set inet abx host4').out).toContain('198.51.100.99');
  });

  test('stopping a sandbox network leaves no process and no namespace', async () => {
    const net = await sandbox('gone', { allowOut: [], denyOut: [] });
    expect(existsSync(`/proc/${net.slirp}`)).toBe(true);
    stopSandboxNet(net);
    await controlCall(socket, 'DELETE', '/sandboxes/gone');
    for (
      let i = 0;
      i < 100 && (existsSync(`/proc/${net.slirp}`) || existsSync(`/proc/${net.holder}`));
      i++
    ) {
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(existsSync(`/proc/${net.slirp}`)).toBe(false);
    expect(existsSync(`/proc/${net.holder}`)).toBe(false);
  });
});

describe.runIf(process.getuid?.() === 0)(
  "a sandbox's rules never land in the host's namespace",
  () => {
    test("a holder still in this process's namespace (not unshared yet, or a wrong pid) is refused; the host's tables stay as they were", async () => {
      const tables = () => execFileSync('nft', ['list', 'tables'], { encoding: 'utf8' });
      const before = tables();
      const ruleset = sandboxRuleset({ allowOut: [], denyOut: [] }, { http: 1, tls: 2, dns: 3 });
      // This process, and a child that has not left its namespace: both the host's.
      const child = spawn('sleep', ['30'], { stdio: 'ignore' });
      try {
        for (const holder of [process.pid, child.pid as number]) {
          await expect(applyRuleset({ holder, userns: false }, ruleset)).rejects.toThrow(
            /network namespace, not a sandbox's of its own/,
          );
        }
      } finally {
        child.kill('SIGKILL');
      }
      expect(tables()).toBe(before);
    });
  },
);

/** Which DNS answers open their addresses again: a fake opener, a fake clock. */
describe('ResolvedAddresses', () => {
  const net = { holder: 1, userns: false };
  afterEach(() => {
    vi.useRealTimers();
  });

  test('many questions at once open an address once; later answers carry the TTL left', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const calls: string[][] = [];
    let release = () => {};
    const opened = new Promise<void>((r) => {
      release = r;
    });
    const resolved = new ResolvedAddresses(async (_net, addresses) => {
      calls.push(addresses);
      await opened;
    });
    const answers = Array.from({ length: 32 }, () =>
      resolved.allow('a', net, ['203.0.113.10'], 60),
    );
    release();
    expect(await Promise.all(answers)).toEqual(Array(32).fill(60));
    expect(calls).toEqual([['203.0.113.10']]);
    vi.setSystemTime(Date.now() + 20_000);
    expect(await resolved.allow('a', net, ['203.0.113.10'], 60)).toBe(40);
    // Another sandbox has a namespace of its own; a new address is opened with its TTL.
    expect(await resolved.allow('b', net, ['203.0.113.10'], 60)).toBe(60);
    expect(await resolved.allow('a', net, ['203.0.113.10', '192.0.2.44'], 60)).toBe(40);
    expect(calls).toEqual([['203.0.113.10'], ['203.0.113.10'], ['192.0.2.44']]);
  });

  test('an opening near its end is renewed; a forgotten sandbox (new policy) opens afresh', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const calls: string[][] = [];
    const resolved = new ResolvedAddresses(async (_net, addresses) => {
      calls.push(addresses);
    });
    await resolved.allow('a', net, ['203.0.113.10'], 30);
    vi.setSystemTime(Date.now() + 30_000 - REOPEN_MARGIN_MS + 1);
    expect(await resolved.allow('a', net, ['203.0.113.10'], 30)).toBe(30);
    resolved.forget('a');
    expect(await resolved.allow('a', net, ['203.0.113.10'], 30)).toBe(30);
    expect(calls.length).toBe(3);
  });

  test('a failed opening fails its question only', async () => {
    let fail = true;
    const resolved = new ResolvedAddresses(async () => {
      if (fail) throw new Error('nft refused');
    });
    await expect(resolved.allow('a', net, ['203.0.113.10'], 60)).rejects.toThrow('nft refused');
    fail = false;
    expect(await resolved.allow('a', net, ['203.0.113.10'], 60)).toBe(60);
  });
});
