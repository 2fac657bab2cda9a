import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { HOST_ADDRESSES_REREAD_MS } from '../../src/egress/host-addresses.js';
import { orphanNetProcesses } from '../../src/egress/sandbox-net.js';
import { startDaemon, stopDaemon } from '../../src/installation/daemon-connection.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import { Templates } from '../../src/sandbox/templates.js';
import { CLI, runProgram } from '../cli/abx.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../helpers/internet.js';
import {
  type RootlessDaemon,
  startRootlessDaemon,
  startRootlessOnInternet,
} from '../helpers/rootless.js';

/**
 * Real sandboxes of a root daemon on `network: internet`, whose egress namespace is a test
 * "internet" (TEST-NET servers, no route out): what a process in the sandbox, as its own user,
 * can and cannot reach.
 */
const unavailable = internetUnavailable();

interface Installation {
  home: string;
  internet: TestInternet;
  close(): Promise<void>;
}

/**
 * The daemon modes: root, and rootless (an unprivileged uid, whose egress namespace is owned by a
 * user namespace of that uid, as it must be for a daemon without root to enter it).
 */
const modes: [string, () => Promise<Installation>][] = [
  [
    'root daemon',
    async () => {
      const internet = await makeInternet();
      const abx = await createAbxHome();
      process.env.ABX_EGRESS_NETNS = internet.path;
      process.env.ABX_EGRESS_HOSTS = internet.hostsFile;
      await startDaemon(abx.home);
      return {
        home: abx.home,
        internet,
        close: async () => {
          await abx.close();
          internet.remove();
        },
      };
    },
  ],
  [
    'rootless daemon',
    async () => {
      const { daemon, internet } = await startRootlessOnInternet();
      return {
        home: daemon.home,
        internet,
        close: async () => {
          await daemon.close();
          internet.remove();
        },
      };
    },
  ],
];

describe.skipIf(unavailable).each(modes)(
  'sandboxes on the internet network (%s)',
  (mode, install) => {
    const rootDaemon = mode === 'root daemon';
    let internet: TestInternet;
    let abx: Installation;
    let templateDir: string;
    let box: Sandbox;

    const sh = (command: string) =>
      box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });

    beforeAll(async () => {
      abx = await install();
      internet = abx.internet;
      templateDir = mkdtempSync(join(tmpdir(), 'abx-internet-template-'));
      chmodSync(templateDir, 0o755);
      writeFileSync(
        join(templateDir, 'template.yaml'),
        [
          'name: web',
          'network:',
          '  allow_out: [allowed.test, "*.wild.test", 192.0.2.44/32]',
          '  deny_out: [0.0.0.0/0]',
          '',
        ].join('\n'),
      );
      await Templates.build(join(templateDir, 'template.yaml'), { home: abx.home });
      box = await Sandbox.create({ home: abx.home, template: 'web' });
      await box.files.write('/tmp/ca.pem', readFileSync(internet.caCert, 'utf8'));
    }, 180_000);

    afterAll(async () => {
      await box?.kill().catch(() => undefined);
      await abx?.close();
      if (templateDir) rmSync(templateDir, { recursive: true, force: true });
    });

    /** Without the proxy variables: what any program gets, captured in the sandbox's namespace. */
    const direct = 'env -u HTTP_PROXY -u HTTPS_PROXY -u http_proxy -u https_proxy ';

    test('allowed names answer over HTTP and HTTPS, as the sandbox user, with no proxy settings', async () => {
      expect((await sh('id -u')).stdout.trim()).toBe('1000');
      expect((await sh(`${direct}curl -sS -m 10 http://allowed.test/`)).stdout).toContain(
        'http hello from 203.0.113.10 for allowed.test',
      );
      expect(
        (await sh(`${direct}curl -sS -m 10 --cacert /tmp/ca.pem https://api.wild.test/`)).stdout,
      ).toContain('https hello from 192.0.2.44');
      // Any program: Python's own HTTP client.
      const python = await sh(
        `${direct}python3 -c "import urllib.request; print(urllib.request.urlopen('http://allowed.test/', timeout=10).read().decode())"`,
      );
      expect(python.stdout).toContain('hello from 203.0.113.10');
    });

    test('denied names fail at once: DNS refuses them, and the proxy names the rule', async () => {
      const before = internet.hits().length;
      expect((await sh('getent hosts denied.test')).exitCode).not.toBe(0);
      const claimed = await sh(
        `${direct}curl -sS -m 10 -i --resolve denied.test:80:${internet.addresses.denied} http://denied.test/`,
      );
      // The address is denied before any proxy: the connection is reset.
      expect(claimed.exitCode).not.toBe(0);
      const lying = await sh(
        `${direct}curl -sS -m 10 -i -H 'Host: denied.test' http://allowed.test/`,
      );
      expect(lying.stdout).toMatch(
        /403[\s\S]*denied.test is refused by the sandbox's network policy: denyOut 0\.0\.0\.0\/0/,
      );
      expect(internet.hits().slice(before).join('\n')).not.toContain(internet.addresses.denied);
    });

    test('tools that honour HTTP_PROXY go through the egress proxy: refusals name the rule', async () => {
      const variables = await sh('env | grep -i _proxy= | sort');
      expect(variables.stdout).toMatch(/^HTTPS_PROXY=http:\/\/10\.0\.2\.2:\d+$/m);
      expect(variables.stdout).toMatch(/^no_proxy=localhost,127\.0\.0\.1,::1$/m);
      const before = internet.hits().length;
      // HTTPS by CONNECT: allowed through, refused by name with the rule.
      expect(
        (await sh('curl -sS -m 10 --cacert /tmp/ca.pem https://allowed.test/')).stdout,
      ).toContain('https hello from 203.0.113.10 for allowed.test');
      const tunnel = await sh('curl -sS -m 10 -v https://denied.test/');
      expect(tunnel.exitCode).not.toBe(0);
      expect(tunnel.stderr).toMatch(/CONNECT[\s\S]*403/);
      expect(tunnel.stderr).toContain(
        "denied.test is refused by the sandbox's network policy: denyOut 0.0.0.0/0",
      );
      // A Host header that lies is replaced by the target's (RFC 9112): no other site at that address.
      expect((await sh(`curl -sS -m 10 -H 'Host: denied.test' http://allowed.test/`)).stdout).toBe(
        'http hello from 203.0.113.10 for allowed.test\n',
      );
      // Plain HTTP as an absolute URL: a 403 naming the rule rather than a DNS failure.
      const plain = await sh('curl -sS -m 10 -i http://denied.test/');
      expect(plain.stdout).toMatch(/^HTTP\/1\.1 403/);
      expect(plain.stdout).toContain('denyOut 0.0.0.0/0');
      const pip = await sh(
        `python3 -c "import urllib.request; print(urllib.request.urlopen('http://api.wild.test/', timeout=10).read().decode())"`,
      );
      expect(pip.stdout).toContain('hello from 192.0.2.44 for api.wild.test');
      expect(internet.hits().slice(before).join('\n')).not.toContain(internet.addresses.denied);
    });

    test('raw TCP: to an allowed CIDR and to an allowed name after DNS; nowhere else', async () => {
      expect(
        (await sh(`printf 'one\\n' | curl -sS -m 10 telnet://192.0.2.44:7000`)).stdout,
      ).toContain('echo one');
      expect(
        (await sh(`printf 'two\\n' | curl -sS -m 10 telnet://allowed.test:7000`)).stdout,
      ).toContain('echo two');
      const denied = await sh(
        `curl -sS -m 10 telnet://${internet.addresses.denied}:7000 </dev/null`,
      );
      expect(denied.exitCode).not.toBe(0);
    });

    test('the always-denied ranges and the egress side of the link stay shut', async () => {
      for (const address of ['10.0.2.2', '10.0.2.3', '169.254.169.254', '10.1.2.3']) {
        const raw = await sh(`curl -sS -m 5 telnet://${address}:7000 </dev/null`);
        expect(raw.exitCode, address).not.toBe(0);
      }
      expect((await sh('getent hosts loopback.test')).exitCode).not.toBe(0);
    });

    test('the sandbox cannot read or change its rules or its link', async () => {
      const list = await sh('nft list ruleset');
      expect(list.exitCode).not.toBe(0);
      const flush = await sh('nft flush ruleset');
      expect(flush.exitCode).not.toBe(0);
      const route = await sh('ip route del default');
      expect(route.exitCode).not.toBe(0);
      expect((await sh('curl -sS -m 10 http://allowed.test/')).stdout).toContain('hello');
    });

    test('a killed sandbox leaves no namespace holder, no slirp4netns and no egress ports', async () => {
      const other = await Sandbox.create({ home: abx.home, template: 'web' });
      expect(orphanNetProcesses((id) => id === other.sandboxId).length).toBe(2);
      await other.kill();
      expect(orphanNetProcesses((id) => id === other.sandboxId)).toEqual([]);
    });

    test('internet is the default: a sandbox of base reaches the internet, never the always-denied ranges', async () => {
      const plain = await Sandbox.create({ home: abx.home });
      try {
        const run = (command: string) =>
          plain.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });
        expect((await plain.getInfo()).network).toEqual({ allowOut: [], denyOut: [] });
        expect((await run('curl -sS -m 10 http://denied.test/')).stdout).toContain(
          'hello from 198.51.100.7',
        );
        expect((await run(`${direct}curl -sS -m 10 http://other.test/`)).stdout).toContain(
          'hello from 192.0.2.44',
        );
        for (const address of ['127.0.0.1', '10.0.2.2', '169.254.169.254', '10.1.2.3']) {
          const raw = await run(`curl -sS -m 5 telnet://${address}:7000 </dev/null`);
          expect(raw.exitCode, address).not.toBe(0);
        }
        expect((await run('curl -sS -m 5 -i http://metadata.test/')).stdout).toMatch(
          /403[\s\S]*always denied: link-local/,
        );
      } finally {
        await plain.kill();
      }
    });

    test("the host's own addresses: a service on 0.0.0.0 of the egress namespace is out of reach by address, name, proxy, CONNECT and raw TCP, and so is an address added later", async () => {
      const plain = await Sandbox.create({ home: abx.home });
      const later = '198.51.100.78';
      try {
        const run = (command: string) =>
          plain.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });
        const attack = async (address: string) => {
          const rule = `always denied: an address of this host (${address})`;
          const target = `${address}:${internet.hostPort}`;
          const raw = await run(`${direct}curl -sS -m 5 http://${target}/`);
          expect(raw.exitCode, `raw ${target}`).not.toBe(0);
          const proxied = await run(`curl -sS -m 10 -i http://${target}/`);
          expect(proxied.stdout, `proxy ${target}`).toMatch(/^HTTP\/1\.1 403/);
          expect(proxied.stdout, `proxy ${target}`).toContain(rule);
          const tunnel = await run(`curl -sS -m 10 -v -p http://${target}/`);
          expect(tunnel.exitCode, `CONNECT ${target}`).not.toBe(0);
          expect(tunnel.stderr, `CONNECT ${target}`).toMatch(/CONNECT[\s\S]*403/);
          expect(tunnel.stderr, `CONNECT ${target}`).toContain(rule);
        };
        const before = internet.hits().length;
        await attack(internet.hostAddress);
        // A name that resolves to it: no DNS answer, and the proxy refuses it by its address.
        expect((await run('getent hosts host.test')).exitCode).not.toBe(0);
        const named = await run(`curl -sS -m 10 -i http://host.test:${internet.hostPort}/`);
        expect(named.stdout).toContain(
          `always denied: an address of this host (${internet.hostAddress})`,
        );
        const stats = await plain.getNetwork();
        expect(stats.recent).toContainEqual(
          expect.objectContaining({
            kind: 'dns',
            target: 'host.test',
            allowed: false,
            rule: `always denied: an address of this host (${internet.hostAddress}) (host.test is ${internet.hostAddress})`,
          }),
        );
        // An address the host gets while the sandbox runs: refused once the documented delay
        // (HOST_ADDRESSES_REREAD_MS at most) has passed.
        execFileSync('ip', ['-n', internet.ns, 'addr', 'add', `${later}/32`, 'dev', 'lo']);
        await new Promise((r) => setTimeout(r, HOST_ADDRESSES_REREAD_MS + 500));
        await attack(later);
        expect(
          internet
            .hits()
            .slice(before)
            .filter((l) => l.startsWith('host ')),
        ).toEqual([]);
        // The servers beyond the host still answer.
        expect((await run('curl -sS -m 10 http://allowed.test/')).stdout).toContain(
          'hello from 203.0.113.10',
        );
      } finally {
        spawnSync('ip', ['-n', internet.ns, 'addr', 'del', `${later}/32`, 'dev', 'lo']);
        await plain.kill();
      }
    });

    test('a policy per sandbox: given at create (from base, whose network is none), shown, and changed live', async () => {
      const own = await Sandbox.create({
        home: abx.home,
        network: { allowOut: ['other.test'], denyOut: ['0.0.0.0/0'] },
      });
      try {
        const run = (command: string) =>
          own.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });
        expect((await own.getInfo()).network).toEqual({
          allowOut: ['other.test'],
          denyOut: ['0.0.0.0/0'],
        });
        expect((await run('curl -sS -m 10 http://other.test/')).stdout).toContain(
          'hello from 192.0.2.44',
        );
        expect((await run('getent hosts allowed.test')).exitCode).not.toBe(0);
        // Counted, each with its rule.
        const stats = await own.getNetwork();
        expect(stats.allowed).toBeGreaterThan(0);
        expect(stats.recent).toContainEqual(
          expect.objectContaining({
            kind: 'dns',
            target: 'allowed.test',
            allowed: false,
            rule: 'denyOut 0.0.0.0/0',
          }),
        );
        expect(stats.recent).toContainEqual(
          expect.objectContaining({
            kind: 'http',
            target: 'other.test',
            allowed: true,
            rule: 'allowOut other.test',
          }),
        );
        // The change applies to the next connection and DNS question.
        const info = await own.setNetwork({ allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] });
        expect(info.network).toEqual({ allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] });
        expect((await run('curl -sS -m 10 http://allowed.test/')).stdout).toContain(
          'hello from 203.0.113.10',
        );
        expect((await run('getent hosts other.test')).exitCode).not.toBe(0);
        expect((await run(`curl -sS -m 10 telnet://192.0.2.44:7000 </dev/null`)).exitCode).not.toBe(
          0,
        );
        // Kept with the sandbox: another client sees it.
        const seen = await Sandbox.connect(own.sandboxId, { home: abx.home });
        expect((await seen.getInfo()).network?.allowOut).toEqual(['allowed.test']);
      } finally {
        await own.kill();
      }
    });

    test.runIf(rootDaemon)(
      'bad network requests are refused, naming the problem, and change nothing',
      async () => {
        const bad = await Sandbox.create({
          home: abx.home,
          network: { allowOut: ['fine.test', 'not a name'] },
        }).catch((e: Error) => e);
        expect(String(bad)).toContain('network.allowOut[1]');
        const flag = await Sandbox.create({
          home: abx.home,
          allowInternetAccess: 'yes' as never,
        }).catch((e: Error) => e);
        expect(String(flag)).toContain('allowInternetAccess must be true or false');
        const change = await box.setNetwork({ denyOut: ['10.0.0.0/33'] }).catch((e: Error) => e);
        expect(String(change)).toContain('network.denyOut[0]');
        expect((await box.getInfo()).network?.allowOut).toContain('allowed.test');
        // A sandbox without the internet network (`network: none`, one word away) has no policy
        // to change; allowInternetAccess false keeps it offline.
        writeFileSync(join(templateDir, 'offline.yaml'), 'name: offline\nnetwork: none\n');
        await Templates.build(join(templateDir, 'offline.yaml'), { home: abx.home });
        const offline = await Sandbox.create({
          home: abx.home,
          template: 'offline',
          allowInternetAccess: false,
        });
        try {
          expect((await offline.getInfo()).network).toBeUndefined();
          const refused = await offline
            .setNetwork({ allowOut: ['allowed.test'] })
            .catch((e: Error) => e);
          expect(String(refused)).toContain('is not on the internet network');
          const link = await offline.commands.run('cat /proc/net/dev', { timeoutMs: 30_000 });
          expect(link.stdout).not.toContain('tap0');
        } finally {
          await offline.kill();
        }
      },
    );

    test.runIf(rootDaemon)(
      'abx create --allow/--deny and abx network show and change a policy',
      async () => {
        const abxCli = (...args: string[]) =>
          runProgram(process.execPath, [CLI, ...args], { env: { ABX_HOME: abx.home } });
        const created = await abxCli(
          'create',
          '-q',
          '--allow',
          'other.test',
          '--deny',
          '0.0.0.0/0',
        );
        expect(created.code, created.stderr).toBe(0);
        const id = created.stdout.trim();
        try {
          const shown = await abxCli('network', id);
          expect(shown.stdout).toContain(
            `sandbox ${id}: internet: allow other.test; deny 0.0.0.0/0`,
          );
          const changed = await abxCli(
            'network',
            id,
            '--allow',
            'allowed.test,*.wild.test',
            '--deny',
            '0.0.0.0/0',
            '--json',
          );
          expect(JSON.parse(changed.stdout)).toEqual({
            allowOut: ['allowed.test', '*.wild.test'],
            denyOut: ['0.0.0.0/0'],
          });
          const bad = await abxCli('network', id, '--allow', 'a b');
          expect(bad.code).not.toBe(0);
          expect(bad.stderr).toContain("network.allowOut[0]: 'a b'");
          const logged = await abxCli('network', id, '--log');
          expect(logged.stdout).toMatch(/egress: \d+ allowed, \d+ refused/);
          const status = await abxCli('daemon', 'status');
          expect(status.stdout).toMatch(/egress\s+enforced/);
          const info = await abxCli('info', id);
          expect(info.stdout).toMatch(
            /network:\s+internet: allow allowed\.test, \*\.wild\.test; deny 0\.0\.0\.0\/0/,
          );
        } finally {
          await abxCli('kill', id);
        }
      },
    );

    test.runIf(rootDaemon)(
      'a daemon SIGKILLed and restarted adopts the sandbox: its internet still works',
      async () => {
        const info = JSON.parse(readFileSync(join(abx.home, 'daemon.json'), 'utf8')) as {
          pid: number;
        };
        process.kill(info.pid, 'SIGKILL');
        for (let i = 0; i < 100 && existsSync(`/proc/${info.pid}`); i++)
          await new Promise((r) => setTimeout(r, 20));
        await startDaemon(abx.home);
        const again = await Sandbox.connect(box.sandboxId, { home: abx.home });
        const answer = await again.commands.run('curl -sS -m 10 http://allowed.test/', {
          timeoutMs: 30_000,
        });
        expect(answer.stdout).toContain('hello from 203.0.113.10');
        await stopDaemon(abx.home);
        await startDaemon(abx.home);
      },
    );
  },
);

/**
 * A rootless daemon's internet sandbox, its egress the daemon's own namespace (the host's), as
 * when no egress namespace is given. Only
 * a policy that denies every address is used, so no packet can leave this machine: DNS refuses
 * names without a lookup, and every address is reset in the sandbox's own namespace.
 */
describe.skipIf(unavailable)('sandboxes on the internet network (rootless daemon)', () => {
  let daemon: RootlessDaemon;
  let templateDir: string;
  let box: Sandbox;
  const sh = (command: string) =>
    box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });

  beforeAll(async () => {
    daemon = await startRootlessDaemon({ delegateCgroups: true, hostEgress: true });
    templateDir = mkdtempSync(join(tmpdir(), 'abx-internet-template-'));
    chmodSync(templateDir, 0o755);
    writeFileSync(
      join(templateDir, 'template.yaml'),
      'name: closed\nnetwork:\n  allow_out: []\n  deny_out: [0.0.0.0/0]\n',
    );
    await Templates.build(join(templateDir, 'template.yaml'), { home: daemon.home });
    box = await Sandbox.create({ home: daemon.home, template: 'closed' });
  }, 180_000);

  afterAll(async () => {
    await box?.kill().catch(() => undefined);
    await daemon?.close();
    if (templateDir) rmSync(templateDir, { recursive: true, force: true });
  });

  test('the sandbox runs in a namespace of its own, with the egress link and rules in place', async () => {
    const link = await sh(
      'cat /proc/net/route; ls /sys/class/net 2>/dev/null || cat /proc/net/dev',
    );
    expect(link.stdout).toContain('tap0');
    expect((await sh('getent hosts example.test')).exitCode).not.toBe(0);
    for (const address of ['10.0.2.2', '127.0.0.1', '203.0.113.10']) {
      const raw = await sh(`curl -sS -m 5 telnet://${address}:7000 </dev/null`);
      expect(raw.exitCode, address).not.toBe(0);
    }
    expect((await sh('nft list ruleset')).exitCode).not.toBe(0);
  });

  test('kill leaves no holder and no slirp4netns of the daemon uid', async () => {
    const id = box.sandboxId;
    expect(orphanNetProcesses((x) => x === id).length).toBe(2);
    await box.kill();
    expect(orphanNetProcesses((x) => x === id)).toEqual([]);
  });
});
