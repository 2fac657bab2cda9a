import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox as E2bSandbox } from 'e2b';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import type { SandboxAuditEntry } from '../../src/sandbox/sandbox-audit.js';
import { abxIn } from '../cli/abx.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { apiAs, call } from '../helpers/api-call.js';
import { internetUnavailable, makeInternet, type TestInternet } from '../helpers/internet.js';

/**
 * The audit trail of one sandbox of key A on a root daemon whose egress namespace is a test
 * "internet" (nothing leaves the machine): commands and files through abx's SDK and E2B's
 * unmodified one, a port link, an allowed and a denied connection; key B reads none of it; and a
 * process in the sandbox, which reaches the daemon only through the gateway, cannot add a row.
 */
const unavailable = internetUnavailable();

describe.skipIf(unavailable)('the audit trail', () => {
  let internet: TestInternet;
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let info: DaemonInfo;
  let keyA: string;
  let keyB: string;
  let e2b: E2bSandbox | undefined;
  let box: Sandbox;

  beforeAll(async () => {
    internet = await makeInternet();
    abx = await createAbxHome();
    process.env.ABX_EGRESS_NETNS = internet.path;
    process.env.ABX_EGRESS_HOSTS = internet.hostsFile;
    info = await startDaemon(abx.home);
    const admin = apiAs(info, readFileSync(join(abx.home, 'api-key'), 'utf8').trim());
    keyA = (await admin.post('/v1/keys', { name: 'audit-a' })).body.key;
    keyB = (await admin.post('/v1/keys', { name: 'audit-b' })).body.key;
    // Ports too: a link is for a port the sandbox serves.
    const built = await admin.post('/v1/templates', {
      yaml: 'name: audited\ncapabilities: [shell, files, code, ports]\n',
    });
    expect(built.status).toBe(200);
    expect((await admin.post('/v1/templates/audited/publish', {})).status).toBe(200);
    e2b = await E2bSandbox.create('audited', {
      apiKey: keyA,
      apiUrl: info.apiUrl,
      sandboxUrl: info.gatewayUrl,
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
      requestTimeoutMs: 60_000,
    });
    // abx's own SDK on the same sandbox, with the same key.
    box = await Sandbox.connect(e2b.sandboxId, { apiUrl: info.apiUrl, apiKey: keyA });
  }, 120_000);

  afterAll(async () => {
    await e2b?.kill().catch(() => undefined);
    await abx?.close();
    internet?.remove();
  });

  /** The sandbox's rows as `key` reads them, waiting (up to 10 s) until `until` holds. */
  async function rows(
    until: (rows: SandboxAuditEntry[]) => boolean = () => true,
  ): Promise<SandboxAuditEntry[]> {
    const deadline = Date.now() + 10_000;
    for (;;) {
      const { audit } = await box.audit({ limit: 1000 });
      if (until(audit) || Date.now() > deadline) return audit;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  }

  test('commands through both SDKs: who and what, and the exit E2B’s face served', async () => {
    const native = await box.commands.run('echo native-$((6*7))', { cwd: '/tmp' });
    expect(native.stdout.trim()).toBe('native-42');
    const e2bRun = await (e2b as E2bSandbox).commands
      .run('exit 3', { envs: { SECRET_X: 'v' } })
      .catch((error: { exitCode?: number }) => error);
    expect((e2bRun as { exitCode?: number }).exitCode).toBe(3);
    const all = await rows((r) => r.filter((row) => row.kind === 'command.exited').length >= 2);
    const started = all.filter((row) => row.kind === 'command.started');
    expect(started.find((row) => row.data.face === 'native')?.data).toMatchObject({
      cmd: 'echo native-$((6*7))',
      cwd: '/tmp',
      user: 'user',
      via: 'header',
    });
    const fromE2b = started.find((row) => row.data.face === 'e2b');
    expect(fromE2b?.data).toMatchObject({ cmd: '/bin/bash', args: ['-l', '-c', 'exit 3'] });
    // The environment's names, never its values.
    expect(fromE2b?.data.env).toContain('SECRET_X');
    expect(JSON.stringify(all)).not.toContain('"v"');
    const exited = all.find((row) => row.kind === 'command.exited' && row.data.face === 'e2b');
    expect(exited?.data).toMatchObject({ face: 'e2b', exitCode: 3, pid: fromE2b?.data.pid });
    expect(exited?.seq).toBeGreaterThan(fromE2b?.seq as number);
    // The native command's exit, read from the end of envd's stream as it passed the gateway.
    const nativeExit = all.find(
      (row) => row.kind === 'command.exited' && row.data.face === 'native',
    );
    expect(nativeExit?.data).toMatchObject({ exitCode: 0 });
    expect(nativeExit?.data.pid).toEqual(expect.any(Number));
    // Every row is the sandbox's, of its owner.
    const ownerA = all[0]?.owner;
    expect(ownerA).toMatch(/^key_/);
    expect(all.every((row) => row.sandboxId === box.sandboxId && row.owner === ownerA)).toBe(true);
  }, 60_000);

  test('files written and removed through the API, a port link issued', async () => {
    await box.files.write('/tmp/native.txt', 'hello');
    await box.files.write([
      { path: '/tmp/batch-1.txt', data: 'one' },
      { path: '/tmp/batch-2.txt', data: 'three' },
    ]);
    await box.files.remove('/tmp/native.txt');
    await (e2b as E2bSandbox).files.write('/tmp/e2b.txt', 'from e2b, 20 bytes.');
    await (e2b as E2bSandbox).files.remove('/tmp/e2b.txt');
    await box.getSignedUrl(8000, { path: '/app' });
    const all = await rows((r) => r.some((row) => row.kind === 'link.issued'));
    const written = all.filter((row) => row.kind === 'file.written');
    expect(written.map((row) => [row.data.face, row.data.paths])).toEqual(
      expect.arrayContaining([
        ['native', ['/tmp/native.txt']],
        ['e2b', ['/tmp/e2b.txt']],
      ]),
    );
    expect(written.find((row) => row.data.face === 'native')?.data.bytes).toBe(5);
    const batch = written.find((row) => Array.isArray(row.data.sizes));
    expect(batch?.data).toMatchObject({
      paths: ['/tmp/batch-1.txt', '/tmp/batch-2.txt'],
      sizes: [3, 5],
    });
    const removed = all.filter((row) => row.kind === 'file.removed').map((row) => row.data.path);
    expect(removed).toEqual(expect.arrayContaining(['/tmp/native.txt', '/tmp/e2b.txt']));
    const link = all.find((row) => row.kind === 'link.issued');
    expect(link?.data).toMatchObject({ port: 8000, path: '/app' });
  }, 60_000);

  test('egress: an allowed and a denied connection, with destination, port, bytes, verdict and rule', async () => {
    const sh = (command: string) =>
      box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });
    const fetched = await sh('curl -sS -m 10 http://allowed.test/bytes/1000');
    expect(fetched.stdout.length).toBe(1000);
    const refused = await sh('curl -fsS -m 10 http://denied.test/');
    expect(refused.exitCode).not.toBe(0);
    const egress = (
      await rows(
        (r) =>
          r.some((row) => row.data.protocol === 'http' && row.data.verdict === 'allowed') &&
          r.some((row) => row.kind === 'egress' && row.data.name === 'denied.test'),
      )
    ).filter((row) => row.kind === 'egress');
    const allowed = egress.find(
      (row) => row.data.protocol === 'http' && row.data.name === 'allowed.test',
    );
    expect(allowed?.data).toMatchObject({
      verdict: 'allowed',
      port: 80,
      address: internet.addresses.allowed,
    });
    expect(allowed?.data.rule).toContain('allowed.test');
    expect(allowed?.data.down).toBe(1000);
    const denied = egress.find((row) => row.data.name === 'denied.test');
    expect(denied?.data.verdict).toBe('denied');
    expect(denied?.data.rule).toContain('0.0.0.0/0');
    expect(typeof denied?.data.port).toBe('number');
    // The filter the dashboard's egress tab reads.
    const page = await call(
      `${info.apiUrl}/v1/sandboxes/${box.sandboxId}/audit?kind=egress&limit=1000`,
      { headers: { authorization: `Bearer ${keyA}` } },
    );
    expect(page.status).toBe(200);
    expect(page.body.audit.every((row: SandboxAuditEntry) => row.kind === 'egress')).toBe(true);
    // The CLI, as the daemon's own (admin) key: the denied destination, with its rule.
    const cli = abxIn(abx.home);
    const printed = await cli.abx(['audit', box.sandboxId, '--kind', 'egress']);
    expect(printed.code).toBe(0);
    expect(printed.stdout).toMatch(/egress +denied +(dns|http) denied\.test.*0\.0\.0\.0\/0/);
    const lines = await cli.abx(['audit', box.sandboxId, '--kind', 'egress', '--jsonl']);
    expect(
      lines.stdout
        .trim()
        .split('\n')
        .map((line) => JSON.parse(line).seq),
    ).toEqual(page.body.audit.map((row: SandboxAuditEntry) => row.seq));
    expect((await cli.abx(['audit', box.sandboxId, '--kind', 'nope'])).stderr).toContain(
      "'nope' is not a kind of row",
    );
  }, 60_000);

  test('a TLS connection still open when the trail is read: in it, open, with its bytes so far; its end adds the rest', async () => {
    const sh = (command: string) =>
      box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });
    const before = Math.max(0, ...(await rows()).map((row) => row.seq));
    // A TLS connection egress passes through (the ClientHello names allowed.test), held open.
    const script = [
      'python3 -c "',
      'import os,socket,ssl,time',
      'c=ssl.create_default_context(); c.check_hostname=False; c.verify_mode=ssl.CERT_NONE',
      "s=c.wrap_socket(socket.create_connection(('allowed.test',443),timeout=30),server_hostname='allowed.test')",
      "open('/tmp/tls-open','w').close()",
      "while not os.path.exists('/tmp/tls-go'): time.sleep(0.05)",
      "s.sendall(b'GET /bytes/3000 HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n')",
      'n=0',
      'while True:',
      '  d=s.recv(65536)',
      '  if not d: break',
      '  n+=len(d)',
      'print(n)',
      '"',
    ].join('\n');
    const running = sh(script);
    const tls = (all: SandboxAuditEntry[]) =>
      all.filter((row) => row.seq > before && row.kind === 'egress' && row.data.protocol === 'tls');
    try {
      const open = tls(await rows((all) => tls(all).length > 0));
      expect(open).toHaveLength(1);
      expect(open[0]?.data).toMatchObject({
        name: 'allowed.test',
        port: 443,
        verdict: 'allowed',
        open: true,
      });
      // The handshake went both ways.
      expect(open[0]?.data.up as number).toBeGreaterThan(0);
      expect(open[0]?.data.down as number).toBeGreaterThan(0);
      expect(tls(await rows())).toHaveLength(1);
    } finally {
      await box.files.write('/tmp/tls-go', '');
    }
    const run = await running;
    expect(Number(run.stdout.trim()), run.stderr).toBeGreaterThan(3000);
    const both = tls(await rows((all) => tls(all).length >= 2));
    expect(both).toHaveLength(2);
    expect(both[1]?.data.open).toBeUndefined();
    expect(both[1]?.data.down as number).toBeGreaterThan(3000);
  }, 60_000);

  test('an export as JSON lines; key B gets 404 as for an unknown id; bad input is a 400 naming it', async () => {
    const url = `${info.apiUrl}/v1/sandboxes/${box.sandboxId}/audit`;
    const exported = await request(`${url}?format=jsonl`, {
      headers: { authorization: `Bearer ${keyA}` },
    });
    expect(exported.statusCode).toBe(200);
    expect(exported.headers['content-type']).toMatch(/application\/x-ndjson/);
    const lines = (await exported.body.text())
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line));
    expect(lines.length).toBe((await box.audit({ limit: 1000 })).audit.length);
    const asB = await call(url, { headers: { authorization: `Bearer ${keyB}` } });
    const unknown = await call(`${info.apiUrl}/v1/sandboxes/i0000000000000000/audit`, {
      headers: { authorization: `Bearer ${keyB}` },
    });
    expect(asB.status).toBe(404);
    expect(unknown.status).toBe(404);
    expect(asB.body.error).toBe(unknown.body.error.replace('i0000000000000000', box.sandboxId));
    const bad = await call(`${url}?kind=nope`, { headers: { authorization: `Bearer ${keyA}` } });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toContain('kind "nope"');
  }, 30_000);

  test('a process in the sandbox cannot write a row: the daemon is the only writer', async () => {
    const before = (await box.audit({ limit: 1000 })).audit.length;
    // The sandbox reaches nothing of the daemon but through egress, which refuses the host; even
    // a request shaped as the audit route's is a GET, and no route takes rows.
    const tried = await box.commands.run(
      `curl -sS -m 5 -X POST -H 'content-type: application/json' -d '{"kind":"egress"}' ${info.apiUrl}/v1/sandboxes/${box.sandboxId}/audit; echo " exit=$?"`,
      { timeoutMs: 30_000, allowNonZeroExit: true },
    );
    expect(tried.stdout).not.toMatch(/exit=0$/m);
    const direct = await call(`${info.apiUrl}/v1/sandboxes/${box.sandboxId}/audit`, {
      method: 'POST',
      headers: { authorization: `Bearer ${keyA}` },
      body: { kind: 'egress', data: { name: 'forged' } },
    });
    expect(direct.status).toBe(405);
    const after = (await box.audit({ limit: 1000 })).audit;
    expect(JSON.stringify(after)).not.toContain('forged');
    // Only what the daemon saw of that attempt: its command and exit, and egress's refusal.
    expect(
      after
        .slice(before)
        .every((row) => ['command.started', 'command.exited', 'egress'].includes(row.kind)),
    ).toBe(true);
  }, 60_000);
});
