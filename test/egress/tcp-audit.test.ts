import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { type EgressAuditRow, OPEN_ROW_INTERVAL_MS } from '../../src/egress/audit-queue.js';
import { type EgressPolicy, EgressRules, parsePolicy } from '../../src/egress/policy.js';
import {
  type HarvestOptions,
  TCP_AUDIT_ELEMENT_TIMEOUT_S,
  TCP_AUDIT_RESET_SET_SIZE,
  TcpAudit,
} from '../../src/egress/tcp-audit.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import type { SandboxAuditEntry } from '../../src/sandbox/sandbox-audit.js';
import { until } from '../control/plane.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { apiAs } from '../helpers/api-call.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../helpers/internet.js';
import { startRootlessOnInternet } from '../helpers/rootless.js';

/**
 * Raw TCP in the audit trail (src/egress/tcp-audit.ts): from inside a real sandbox whose egress
 * namespace is a test "internet" (TEST-NET servers, no route out), a connection its own nft rules
 * let through, with bytes both ways, and connections they reset (a denyOut range, an always-denied
 * address), each one audit row with address, port, bytes, verdict and rule; on a root daemon
 * (where a second key reads none of it) and a rootless one (nft in a user namespace).
 */
const unavailable = internetUnavailable();

const NETWORK = { allowOut: ['allowed.test'], denyOut: ['192.0.2.0/24'] };
/** What the client sends: a line of this many bytes, newline included; the echo adds `echo `. */
const SENT = 2001;

/** One connection from the sandbox, in Python: its exit says how it went; prints what came back. */
function client(host: string, port: number): string {
  return [
    'python3 -c "',
    'import socket,sys',
    'try:',
    `  s=socket.create_connection(('${host}',${port}),timeout=10)`,
    'except OSError as e:',
    '  print(type(e).__name__); sys.exit(3)',
    `s.sendall(b'x'*${SENT - 1}+b'\\n')`,
    "got=b''",
    'while True:',
    '  d=s.recv(65536)',
    '  if not d: break',
    '  got+=d',
    's.close()',
    'print(len(got))',
    '"',
  ].join('\n');
}

interface Installation {
  box: Sandbox;
  internet: TestInternet;
  /** Reads the sandbox's audit with another key: its status (root daemon only). */
  otherKeyStatus?: () => Promise<{ asOther: number; unknown: number }>;
  close(): Promise<void>;
}

const modes: [string, () => Promise<Installation>][] = [
  [
    'root daemon',
    async () => {
      const internet = await makeInternet();
      const abx = await createAbxHome();
      const close = async () => {
        await abx.close();
        internet.remove();
      };
      try {
        process.env.ABX_EGRESS_NETNS = internet.path;
        process.env.ABX_EGRESS_HOSTS = internet.hostsFile;
        const info = await startDaemon(abx.home);
        const admin = apiAs(info, readFileSync(join(abx.home, 'api-key'), 'utf8').trim());
        const keyA = (await admin.post('/v1/keys', { name: 'tcp-a' })).body.key as string;
        const keyB = (await admin.post('/v1/keys', { name: 'tcp-b' })).body.key as string;
        const box = await Sandbox.create({ apiUrl: info.apiUrl, apiKey: keyA, network: NETWORK });
        return {
          box,
          internet,
          otherKeyStatus: async () => ({
            asOther: (await apiAs(info, keyB).get(`/v1/sandboxes/${box.sandboxId}/audit`)).status,
            unknown: (await apiAs(info, keyB).get('/v1/sandboxes/sbx_nosuch/audit')).status,
          }),
          close: async () => {
            await box.kill().catch(() => undefined);
            await close();
          },
        };
      } catch (error) {
        await close();
        throw error;
      }
    },
  ],
  [
    'rootless daemon',
    async () => {
      const { daemon, internet } = await startRootlessOnInternet();
      const close = async () => {
        await daemon.close();
        internet.remove();
      };
      const box = await Sandbox.create({ home: daemon.home, network: NETWORK }).catch(
        async (error) => {
          await close();
          throw error;
        },
      );
      return {
        box,
        internet,
        close: async () => {
          await box.kill().catch(() => undefined);
          await close();
        },
      };
    },
  ],
];

describe.skipIf(unavailable).each(modes)('raw TCP in the audit trail (%s)', (mode, install) => {
  let abx: Installation;
  const sh = (command: string) =>
    abx.box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });
  const tcpRows = async (): Promise<SandboxAuditEntry[]> =>
    (await abx.box.audit({ kind: ['egress'], limit: 1000 })).audit.filter(
      (row) => row.data.protocol === 'tcp',
    );

  beforeAll(async () => {
    abx = await install();
  }, 180_000);

  afterAll(async () => {
    await abx?.close();
  });

  test('an allowed connection: one row with its name, address, port, bytes both ways and rule', async () => {
    const run = await sh(client('allowed.test', 7000));
    expect(run.stdout.trim(), run.stderr).toBe(String(SENT + 'echo '.length));
    // The read asks egress for the sandbox's raw TCP first: the row is there at once.
    const rows = (await tcpRows()).filter((row) => row.data.port === 7000);
    expect(rows).toHaveLength(1);
    const row = rows[0] as SandboxAuditEntry;
    expect(row.data).toMatchObject({
      protocol: 'tcp',
      name: 'allowed.test',
      address: abx.internet.addresses.allowed,
      port: 7000,
      verdict: 'allowed',
      rule: 'allowOut allowed.test',
    });
    // Bytes as the IP packets carried them: the payload and, per packet, 40 to 60 bytes of headers.
    const { up, down } = row.data as { up: number; down: number };
    expect(up).toBeGreaterThanOrEqual(SENT);
    expect(up).toBeLessThan(SENT + 10 * 60);
    expect(down).toBeGreaterThanOrEqual(SENT + 5);
    expect(down).toBeLessThan(SENT + 5 + 10 * 60);
    // Read again (and after egress's next reads): still one row.
    expect((await tcpRows()).filter((r) => r.data.port === 7000)).toHaveLength(1);
  });

  test('a connection to a denyOut range: reset, one denied row naming the range', async () => {
    const address = abx.internet.addresses.other;
    const run = await sh(client(address, 7001));
    expect(run.exitCode).toBe(3);
    expect(run.stdout).toContain('ConnectionRefusedError');
    const rows = (await tcpRows()).filter((row) => row.data.port === 7001);
    expect(rows).toHaveLength(1);
    expect((rows[0] as SandboxAuditEntry).data).toMatchObject({
      name: address,
      address,
      verdict: 'denied',
      rule: 'denyOut 192.0.2.0/24',
      up: 0,
      down: 0,
    });
    expect(abx.internet.hits().some((hit) => hit.startsWith(`tcp ${address}`))).toBe(false);
  });

  test('a connection to an always-denied address: one denied row naming that rule', async () => {
    const run = await sh(client('10.1.2.3', 22));
    expect(run.exitCode).toBe(3);
    const rows = (await tcpRows()).filter((row) => row.data.address === '10.1.2.3');
    expect(rows).toHaveLength(1);
    expect((rows[0] as SandboxAuditEntry).data).toMatchObject({
      port: 22,
      verdict: 'denied',
      rule: 'always denied: private (RFC 1918) (10.0.0.0/8)',
    });
  });

  test.runIf(mode === 'root daemon')(
    'a connection open across a policy change is named by the rule that let it through',
    async () => {
      const script = [
        'python3 -c "',
        'import socket,time',
        "s=socket.create_connection(('allowed.test',7000),timeout=10)",
        'time.sleep(4)',
        'try:',
        "  s.sendall(b'late\\n'); print('answer', len(s.recv(100)))",
        'except OSError as e:',
        '  print(type(e).__name__)',
        '"',
      ].join('\n');
      const running = sh(script);
      await new Promise((resolve) => setTimeout(resolve, 2500));
      // The address is denied from now on: the open connection's next packet is reset.
      let run: Awaited<typeof running>;
      try {
        await abx.box.setNetwork({ allowOut: [], denyOut: ['203.0.113.0/24'] });
        run = await running;
      } finally {
        await abx.box.setNetwork(NETWORK);
      }
      expect(run.stdout).toMatch(/ConnectionResetError|answer 0|BrokenPipeError/);
      const rows = (await tcpRows()).filter(
        (row) => row.data.port === 7000 && row.data.verdict === 'allowed',
      );
      expect(rows).toHaveLength(2);
      expect((rows[1] as SandboxAuditEntry).data).toMatchObject({
        name: 'allowed.test',
        rule: 'allowOut allowed.test',
      });
    },
  );

  test.runIf(mode === 'root daemon')(
    'another key gets 404 for these rows, as for an unknown sandbox',
    async () => {
      expect(await abx.otherKeyStatus?.()).toEqual({ asOther: 404, unknown: 404 });
    },
  );

  test('a connection still open when the trail is read is in it, open, with its bytes so far; its end adds the rest', async () => {
    const before = Math.max(0, ...(await tcpRows()).map((row) => row.seq));
    // Connected, then silent until told: the echo server answers (and closes) only once it reads.
    const script = [
      'python3 -c "',
      'import os,socket,time',
      "s=socket.create_connection(('allowed.test',7000),timeout=30)",
      "open('/tmp/connected','w').close()",
      "while not os.path.exists('/tmp/go'): time.sleep(0.05)",
      "s.sendall(b'late\\n'); print(len(s.recv(100)))",
      '"',
    ].join('\n');
    const running = sh(script);
    try {
      await until(
        async () => (await sh('test -e /tmp/connected')).exitCode === 0,
        "the sandbox's connection",
        20_000,
      );
      const open = (await tcpRows()).filter((row) => row.seq > before && row.data.port === 7000);
      expect(open).toHaveLength(1);
      expect((open[0] as SandboxAuditEntry).data).toMatchObject({
        name: 'allowed.test',
        verdict: 'allowed',
        rule: 'allowOut allowed.test',
        open: true,
      });
      expect((open[0] as SandboxAuditEntry).data.up).toBeGreaterThan(0);
      // Read again with nothing sent meanwhile: still that one row.
      expect(
        (await tcpRows()).filter((row) => row.seq > before && row.data.port === 7000),
      ).toHaveLength(1);
    } finally {
      await abx.box.files.write('/tmp/go', '');
    }
    const run = await running;
    expect(run.stdout.trim(), run.stderr).toBe(String('echo late\n'.length));
    const rows = (await tcpRows()).filter((row) => row.seq > before && row.data.port === 7000);
    expect(rows).toHaveLength(2);
    const rest = (rows[1] as SandboxAuditEntry).data;
    expect(rest.open).toBeUndefined();
    // The rest: the 5 bytes sent and the 10 echoed, with their packets' headers.
    expect(rest.up as number).toBeGreaterThanOrEqual(5);
    expect(rest.down as number).toBeGreaterThanOrEqual(10);
  });

  test('more resets than the set holds: an audit.dropped row says so, naming the set', async () => {
    const address = abx.internet.addresses.other;
    const burst = [
      'python3 -c "',
      'import socket',
      `for p in range(${TCP_AUDIT_RESET_SET_SIZE + 40}):`,
      '  try:',
      `    socket.create_connection(('${address}',20000+p),timeout=5).close()`,
      '  except OSError: pass',
      '"',
    ].join('\n');
    expect((await sh(burst)).exitCode).toBe(0);
    const dropped = (await abx.box.audit({ kind: ['audit.dropped'], limit: 100 })).audit;
    expect(dropped.map((row) => row.data)).toEqual([
      {
        count: null,
        reason: `raw TCP: the sandbox's rst_deny set was full (${TCP_AUDIT_RESET_SET_SIZE} resets within ${TCP_AUDIT_ELEMENT_TIMEOUT_S} s): resets past it are not in the trail`,
      },
    ]);
    // What the set held is in the trail, one row each.
    const denied = (await tcpRows()).filter(
      (row) => row.data.address === address && (row.data.port as number) >= 20000,
    );
    expect(denied.length).toBeGreaterThanOrEqual(TCP_AUDIT_RESET_SET_SIZE - 10);
    expect(denied.length).toBeLessThanOrEqual(TCP_AUDIT_RESET_SET_SIZE);
  });

  test('HTTP to port 80 stays egress’s own row, not a raw one; the sandbox cannot read its sets', async () => {
    const http = await sh('curl -sS -m 10 http://allowed.test/');
    expect(http.stdout).toContain('hello from');
    const egress = (await abx.box.audit({ kind: ['egress'], limit: 1000 })).audit;
    expect(egress.some((row) => row.data.protocol === 'http' && row.data.port === 80)).toBe(true);
    expect(egress.some((row) => row.data.protocol === 'tcp' && row.data.port === 80)).toBe(false);
    expect((await sh('nft list set inet abx raw_out')).exitCode).not.toBe(0);
    expect((await sh('nft flush set inet abx rst_deny')).exitCode).not.toBe(0);
  });
});

/**
 * The harvest's bookkeeping on sets as `nft -j` lists them (no namespace): what is written when,
 * once, with which rule.
 */
describe('the raw TCP harvest', () => {
  type Conn = [address: string, port: number, sport: number, expires?: number];
  const elem = ([address, port, sport, expires]: Conn, bytes?: number) => ({
    elem: {
      val: { concat: [address, port, sport] },
      expires: expires ?? TCP_AUDIT_ELEMENT_TIMEOUT_S - 1,
      ...(bytes === undefined ? {} : { counter: { packets: 1, bytes } }),
    },
  });
  function setup(first: EgressPolicy) {
    let policy = first;
    const sets: Record<string, Array<ReturnType<typeof elem>>> = {};
    const rows: Array<Omit<EgressAuditRow, 'seq'>> = [];
    const drops: string[] = [];
    let clock = Date.now();
    const audit = new TcpAudit(
      {
        now: () => clock,
        rules: new EgressRules(),
        policy: () => parsePolicy(policy),
        push: (row) => rows.push(row),
        dropped: (_id, reason) => drops.push(reason),
        list: async () =>
          JSON.stringify({
            nftables: Object.entries(sets).map(([name, elem]) => ({ set: { name, elem } })),
          }),
      },
      10_000,
    );
    const net = { holder: 1, userns: false };
    return {
      rows,
      drops,
      tick: (ms: number) => {
        clock += ms;
      },
      sets,
      setPolicy: (next: EgressPolicy) => {
        policy = next;
      },
      harvest: (options?: HarvestOptions) => audit.harvest('s1', net, options),
      audit,
    };
  }
  const open: Conn = ['203.0.113.10', 22, 40000];

  test('an open connection waits; ended, it is one row; its last ACKs are not another', async () => {
    const t = setup({ allowOut: [], denyOut: [] });
    t.sets.raw_out = [elem(open, 500)];
    t.sets.raw_in = [elem(open, 900)];
    await t.harvest();
    expect(t.rows).toEqual([]);
    t.sets.raw_out = [elem(open, 700)];
    t.sets.raw_end = [elem(open)];
    await t.harvest();
    expect(t.rows).toMatchObject([
      { kind: 'tcp', address: '203.0.113.10', name: '203.0.113.10', port: 22, up: 700, down: 900 },
    ]);
    expect(t.rows[0]?.rule).toBe('default (no entry names it)');
    t.sets.raw_out = [elem(open, 752)];
    await t.harvest();
    await t.harvest({ final: true });
    expect(t.rows).toHaveLength(1);
  });

  test('the rule is the one that let it through, though a new policy applies before it ends', async () => {
    const t = setup({ allowOut: ['203.0.113.0/24'], denyOut: ['0.0.0.0/0'] });
    t.audit.noteAnswer('s1', 'allowed.test', ['203.0.113.10'], 60);
    t.sets.raw_out = [elem(open, 100)];
    await t.harvest();
    t.setPolicy({ allowOut: [], denyOut: ['203.0.113.0/24'] });
    t.sets.raw_end = [elem(open)];
    await t.harvest();
    expect(t.rows).toMatchObject([
      { name: 'allowed.test', allowed: true, rule: 'allowOut 203.0.113.0/24' },
    ]);
  });

  test('an idle connection is written before its count expires, and what follows as its own row', async () => {
    const t = setup({ allowOut: [], denyOut: [] });
    t.sets.raw_out = [elem(['203.0.113.10', 22, 40000, 20], 300)];
    await t.harvest();
    expect(t.rows).toMatchObject([{ up: 300, down: 0 }]);
    t.sets.raw_out = [elem(open, 1300)];
    t.sets.raw_end = [elem(open)];
    await t.harvest();
    expect(t.rows).toMatchObject([{ up: 300 }, { up: 1000 }]);
  });

  test('a reset is one row naming its rule; a namespace adopted writes nothing it holds', async () => {
    const t = setup({ allowOut: [], denyOut: ['192.0.2.0/24'] });
    t.sets.raw_out = [];
    t.sets.rst_deny = [elem(['192.0.2.44', 5432, 41000])];
    t.sets.rst_always = [elem(['169.254.169.254', 80, 41001])];
    await t.harvest();
    await t.harvest();
    expect(t.rows.map((r) => [r.allowed, r.port, r.rule])).toEqual([
      [false, 80, 'always denied: link-local (cloud metadata at 169.254.169.254) (169.254.0.0/16)'],
      [false, 5432, 'denyOut 192.0.2.0/24'],
    ]);
    const adopted = setup({ allowOut: [], denyOut: [] });
    adopted.sets.raw_out = [elem(open, 10)];
    adopted.sets.raw_end = [elem(open)];
    adopted.sets.rst_deny = [elem(['192.0.2.44', 5432, 41000])];
    await adopted.harvest({ baseline: true });
    await adopted.harvest({ final: true });
    expect(adopted.rows).toEqual([]);
  });

  test('a read writes an open connection so far, marked open; its end writes only the rest', async () => {
    const t = setup({ allowOut: [], denyOut: [] });
    t.sets.raw_out = [elem(open, 500)];
    t.sets.raw_in = [elem(open, 900)];
    await t.harvest({ open: true });
    expect(t.rows).toMatchObject([{ port: 22, up: 500, down: 900, open: true }]);
    // Read again at once, though it carried more: no row; a timer's harvest writes nothing open.
    t.sets.raw_out = [elem(open, 600)];
    t.tick(1000);
    await t.harvest({ open: true });
    await t.harvest();
    expect(t.rows).toHaveLength(1);
    // A read OPEN_ROW_INTERVAL_MS after its row: what it carried since.
    t.tick(OPEN_ROW_INTERVAL_MS);
    await t.harvest({ open: true });
    expect(t.rows).toHaveLength(2);
    expect(t.rows[1]).toMatchObject({ up: 100, down: 0, open: true });
    t.sets.raw_out = [elem(open, 700)];
    t.sets.raw_end = [elem(open)];
    await t.harvest();
    expect(t.rows).toHaveLength(3);
    expect(t.rows[2]).toMatchObject({ up: 100, down: 0 });
    expect(t.rows[2]?.open).toBeUndefined();
  });

  test('a full set is told once as a drop, and again once it filled again after having room', async () => {
    const t = setup({ allowOut: [], denyOut: ['192.0.2.0/24'] });
    const resets = (n: number) =>
      Array.from({ length: n }, (_, i) => elem(['192.0.2.44', 5432, 30000 + i]));
    t.sets.raw_out = [];
    t.sets.rst_deny = resets(TCP_AUDIT_RESET_SET_SIZE);
    await t.harvest();
    await t.harvest({ open: true });
    expect(t.drops).toEqual([
      `raw TCP: the sandbox's rst_deny set was full (${TCP_AUDIT_RESET_SET_SIZE} resets within ${TCP_AUDIT_ELEMENT_TIMEOUT_S} s): resets past it are not in the trail`,
    ]);
    // Every reset it held is still written once.
    expect(t.rows).toHaveLength(TCP_AUDIT_RESET_SET_SIZE);
    t.sets.rst_deny = resets(3);
    await t.harvest();
    t.sets.rst_deny = resets(TCP_AUDIT_RESET_SET_SIZE);
    await t.harvest();
    expect(t.drops).toHaveLength(2);
  });

  test('a table without the sets (an older daemon made it) is left alone', async () => {
    const t = setup({ allowOut: [], denyOut: [] });
    t.sets.allow4 = [];
    await t.harvest({ final: true });
    expect(t.rows).toEqual([]);
  });
});
