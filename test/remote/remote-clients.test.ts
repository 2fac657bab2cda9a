import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { type AbxResult, CLI, runProgram } from '../cli/abx.js';
import { sandboxProcesses } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { makeTwoHosts, netnsUnavailable, type TestHost } from '../helpers/netns.js';
import { writeResolvePreload } from '../helpers/resolve-preload.js';
import { makeTestCertificates, type TestCertificates } from '../helpers/test-ca.js';

// A control plane on one "host" (a network namespace) serving TLS on its veth address, driven by
// the SDK and the CLI from another: the remote-client path as a user on another machine has it.
// Clients run as child processes inside `ip netns exec`; nothing resolves names here, so the SDK
// gets `*.abx.test` from a preload that answers DNS lookups, and the CLI reaches the gateway by
// address (ABX_GATEWAY_URL).

const why = netnsUnavailable();
const DOMAIN = 'abx.test';
const API_PORT = 8443;
const GATEWAY_PORT = 8444;

/** Runs node with `args` inside network namespace `ns`, with exactly `env` (plus PATH). */
function nodeIn(ns: string, args: string[], env: Record<string, string>): Promise<AbxResult> {
  return runProgram(process.execPath, args, {
    netns: ns,
    inheritEnv: false,
    env: { NO_COLOR: '1', ...env },
  });
}

/** Pids of `dist/daemon.js` processes whose environment has `HOME` or `ABX_HOME` under `dir`. */
function daemonsUnder(dir: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (!argv.includes('daemon.js')) continue;
      const env = readFileSync(`/proc/${entry}/environ`, 'utf8').split('\0');
      if (env.some((pair) => /^(ABX_)?HOME=/.test(pair) && pair.includes(dir))) {
        found.push(Number(entry));
      }
    } catch {
      // ended meanwhile
    }
  }
  return found;
}

describe.skipIf(why !== undefined)(
  `remote clients across two network namespaces${why ? ` (skipped: ${why})` : ''}`,
  () => {
    let hosts: ReturnType<typeof makeTwoHosts> | undefined;
    let server: TestHost;
    let client: TestHost;
    let dir: string;
    let home: string;
    let certs: TestCertificates;
    let apiKey: string;
    let apiUrl: string;
    /** What a client on the other host needs, without a local installation. */
    let clientEnv: Record<string, string>;
    /** A HOME for clients that must never get an `.abx`. */
    let clientHome: string;
    const daemonEnv = () => ({ HOME: dir, ABX_HOME: home, ABX_WARM_POOL: '0' });

    beforeAll(async () => {
      if (!existsSync(CLI)) throw new Error(`${CLI} is missing: build first (npx tsup)`);
      dir = mkdtempSync(join(tmpdir(), 'abx-remote-'));
      home = join(dir, 'server-home');
      clientHome = join(dir, 'client-home');
      mkdirSync(clientHome);
      hosts = makeTwoHosts();
      ({ server, client } = hosts);
      certs = makeTestCertificates(dir, [`*.${DOMAIN}`, DOMAIN], [server.ip]);
      const started = await nodeIn(
        server.ns,
        [
          CLI,
          'daemon',
          'start',
          '--listen',
          `${server.ip}:${API_PORT}`,
          '--tls-cert',
          certs.cert,
          '--tls-key',
          certs.key,
          '--domain',
          DOMAIN,
          '--json',
        ],
        daemonEnv(),
      );
      expect(started.stderr).toBe('');
      expect(started.code).toBe(0);
      const info = JSON.parse(started.stdout);
      apiUrl = `https://${server.ip}:${API_PORT}`;
      expect(info.remote).toEqual({
        apiUrl,
        gatewayUrl: `https://${server.ip}:${GATEWAY_PORT}`,
        publicGatewayUrl: `https://${DOMAIN}:${GATEWAY_PORT}`,
        tls: true,
      });
      apiKey = readFileSync(join(home, 'api-key'), 'utf8').trim();
      clientEnv = {
        HOME: clientHome,
        ABX_API_URL: apiUrl,
        ABX_API_KEY: apiKey,
        ABX_CA_CERT: certs.caCert,
      };
    });

    afterAll(async () => {
      try {
        if (server && home && existsSync(join(home, 'daemon.json'))) {
          await nodeIn(server.ns, [CLI, 'kill', '--all'], daemonEnv());
          await nodeIn(server.ns, [CLI, 'daemon', 'stop'], daemonEnv());
        }
      } finally {
        const ids =
          home && existsSync(join(home, 'sandboxes')) ? readdirSync(join(home, 'sandboxes')) : [];
        for (const pid of [...ids.flatMap(sandboxProcesses), ...(dir ? daemonsUnder(dir) : [])]) {
          try {
            process.kill(pid, 'SIGKILL');
          } catch {
            // gone
          }
        }
        hosts?.remove();
        if (dir) rmSync(dir, { recursive: true, force: true });
      }
    });

    test('the SDK on the other host creates, runs, writes, reads, connects and kills over TLS, by sandbox host names', async () => {
      // The SDK reaches `{port}-{id}.abx.test:8444` by name: this preload is the wildcard DNS.
      const preload = join(dir, 'resolve-abx-test.cjs');
      writeResolvePreload(preload, DOMAIN, server.ip);
      const script = join(dir, 'sdk-client.mjs');
      writeFileSync(
        script,
        `import { Sandbox } from ${JSON.stringify(join(ROOT, 'dist', 'index.js'))};
const out = {};
const sandbox = await Sandbox.create({ timeoutMs: 300000, metadata: { from: 'remote-sdk' } });
out.id = sandbox.sandboxId;
out.host = sandbox.getHost(8080);
out.run = (await sandbox.commands.run('echo hello from $(hostname)')).stdout;
await sandbox.files.write('/home/user/note.txt', 'written from the other host');
out.read = await sandbox.files.read('/home/user/note.txt');
const again = await Sandbox.connect(sandbox.sandboxId);
out.again = (await again.commands.run('cat /home/user/note.txt')).stdout;
out.listed = (await Sandbox.list({ metadata: { from: 'remote-sdk' } })).map((s) => [s.sandboxId, s.state]);
out.killed = await again.kill();
out.after = (await Sandbox.list({ all: true, metadata: { from: 'remote-sdk' } })).map((s) => s.state);
console.log(JSON.stringify(out));
`,
      );
      const result = await nodeIn(client.ns, ['-r', preload, script], clientEnv);
      expect(result.stderr).toBe('');
      expect(result.code).toBe(0);
      const out = JSON.parse(result.stdout);
      expect(out.host).toBe(`8080-${out.id}.${DOMAIN}:${GATEWAY_PORT}`);
      expect(out.run).toBe(`hello from ${out.id}\n`);
      expect(out.read).toBe('written from the other host');
      expect(out.again).toBe('written from the other host');
      expect(out.listed).toEqual([[out.id, 'running']]);
      expect(out.killed).toBe(true);
      expect(out.after).toEqual(['killed']);
      // Nothing of a local installation on the client's side.
      expect(existsSync(join(clientHome, '.abx'))).toBe(false);
    }, 120_000);

    test('the CLI on the other host: create, exec, cp, cat, ls, list, info, run, template list, kill', async () => {
      // No wildcard DNS for the CLI: it reaches the gateway by address and names the sandbox in headers.
      const env = { ...clientEnv, ABX_GATEWAY_URL: `https://${server.ip}:${GATEWAY_PORT}` };
      const abx = (...args: string[]) => nodeIn(client.ns, [CLI, ...args], env);

      const created = await abx('create', '-q', '--meta', 'from=remote-cli');
      expect(created.stderr).toBe('');
      expect(created.code).toBe(0);
      const id = created.stdout.trim();
      expect(id).toMatch(/^[a-z0-9]+$/);

      const exec = await abx('exec', id, '--', 'sh', '-c', 'echo out; echo err >&2; exit 3');
      expect([exec.code, exec.stdout, exec.stderr]).toEqual([3, 'out\n', 'err\n']);

      const local = join(dir, 'upload.txt');
      writeFileSync(local, 'copied across hosts\n');
      const cp = await abx('cp', local, `${id}:/home/user/upload.txt`);
      expect(cp.code).toBe(0);
      const cat = await abx('cat', id, '/home/user/upload.txt');
      expect([cat.code, cat.stdout]).toEqual([0, 'copied across hosts\n']);
      const back = join(dir, 'downloaded.txt');
      expect((await abx('cp', `${id}:/home/user/upload.txt`, back)).code).toBe(0);
      expect(readFileSync(back, 'utf8')).toBe('copied across hosts\n');
      const ls = await abx('ls', id, '/home/user', '--json');
      expect(ls.code).toBe(0);
      expect(JSON.parse(ls.stdout).map((e: { name: string }) => e.name)).toContain('upload.txt');

      const listed = await abx('list', '--meta', 'from=remote-cli', '--json');
      expect(JSON.parse(listed.stdout).map((s: { sandboxId: string }) => s.sandboxId)).toEqual([
        id,
      ]);
      const info = await abx('info', id, '--json');
      expect(JSON.parse(info.stdout)).toMatchObject({ sandboxId: id, state: 'running' });
      // `run` finds the template's commands through the remote API (base has none).
      const run = await abx('run', id, 'nothing');
      expect(run.code).toBe(1);
      expect(run.stderr).toContain("no command 'nothing' in this sandbox");
      const templates = await abx('template', 'list', '--json');
      expect(JSON.parse(templates.stdout).map((t: { name: string }) => t.name)).toContain('base');

      const killed = await abx('kill', id, '--json');
      expect(JSON.parse(killed.stdout)).toEqual([{ sandboxId: id, killed: true }]);
      const gone = await abx('exec', id, '--', 'true');
      expect(gone.code).toBe(1);
      expect(gone.stderr).toContain(id);
      expect(existsSync(join(clientHome, '.abx'))).toBe(false);
    }, 120_000);

    test('the gateway routes by {port}-{id}.abx.test Host (TLS name checked) and refuses hostile Host headers in the error shape', async () => {
      const created = await nodeIn(client.ns, [CLI, 'create', '-q'], {
        ...clientEnv,
        ABX_GATEWAY_URL: `https://${server.ip}:${GATEWAY_PORT}`,
      });
      expect(created.code).toBe(0);
      const id = created.stdout.trim();
      const script = join(dir, 'gateway-client.mjs');
      writeFileSync(
        script,
        `import { readFileSync } from 'node:fs';
import https from 'node:https';
import { Agent, request } from ${JSON.stringify(join(ROOT, 'node_modules', 'undici', 'index.js'))};
const [apiUrl, apiKey, caFile, address, id] = process.argv.slice(2);
const ca = readFileSync(caFile, 'utf8');
const api = await request(apiUrl + '/v1/sandboxes/' + id + '/connect', {
  method: 'POST',
  headers: { authorization: 'Bearer ' + apiKey },
  dispatcher: new Agent({ connect: { ca } }),
});
const { accessToken, gatewayUrl } = await api.body.json();
// No DNS: connect to the address, name the sandbox host in TLS (SNI, certificate check) and Host.
// Hostile Host headers come over a connection whose TLS name is valid (the gateway's wildcard):
// node:https checks the certificate against servername, not against the Host header.
const call = (host, token, servername = 'gateway.abx.test') =>
  new Promise((resolve, reject) => {
    const [hostname, port] = address.split(':');
    const req = https.request(
      { hostname, port, path: '/health', ca, servername, agent: false,
        headers: { host, ...(token ? { 'x-access-token': token } : {}) } },
      (res) => {
        let text = '';
        res.setEncoding('utf8').on('data', (d) => { text += d; });
        res.on('end', () => resolve([res.statusCode, JSON.parse(text)]));
      },
    );
    req.on('error', reject);
    req.end();
  });
const port = address.split(':')[1];
const out = {
  gatewayUrl,
  ok: await call('49983-' + id + '.abx.test:' + port, accessToken, '49983-' + id + '.abx.test'),
  noToken: await call('49983-' + id + '.abx.test:' + port, undefined, '49983-' + id + '.abx.test'),
  otherDomain: await call('49983-' + id + '.evil.example:' + port, accessToken),
  badPort: await call('99999-' + id + '.abx.test:' + port, accessToken),
  badId: await call('49983-NOT_AN_ID.abx.test', accessToken),
  noPort: await call(id + '.abx.test', accessToken),
  unknown: await call('49983-zzzzzzzzzzzzzzzz.abx.test', accessToken),
  oversized: await call('a'.repeat(300) + '.abx.test', accessToken),
};
console.log(JSON.stringify(out));
`,
      );
      const result = await nodeIn(
        client.ns,
        [script, apiUrl, apiKey, certs.caCert, `${server.ip}:${GATEWAY_PORT}`, id],
        { HOME: clientHome },
      );
      expect(result.stderr).toBe('');
      expect(result.code).toBe(0);
      const out = JSON.parse(result.stdout);
      expect(out.gatewayUrl).toBe(`https://${DOMAIN}:${GATEWAY_PORT}`);
      expect(out.ok).toEqual([200, { status: 'ok' }]);
      expect(out.noToken[0]).toBe(401);
      expect(out.noToken[1].type).toBe('AuthenticationError');
      expect(out.otherDomain).toEqual([
        400,
        {
          type: 'BadRequestError',
          error: `Host "49983-${id}.evil.example" is not a sandbox host of this gateway: use Host {port}-{sandboxId}.${DOMAIN}, the path /sandboxes/{sandboxId}/ports/{port}/… or the X-Sandbox-Id and X-Sandbox-Port headers`,
        },
      ]);
      expect(out.badPort).toEqual([
        400,
        { type: 'BadRequestError', error: 'port 99999 is not a TCP port' },
      ]);
      expect(out.badId[0]).toBe(400);
      expect(out.badId[1].error).toContain(
        'names no sandbox port: sandbox hosts are {port}-{sandboxId}.abx.test',
      );
      expect(out.noPort[0]).toBe(400);
      expect(out.unknown).toEqual([
        404,
        { type: 'SandboxNotFoundError', error: 'sandbox zzzzzzzzzzzzzzzz does not exist' },
      ]);
      expect(out.oversized).toEqual([
        400,
        {
          type: 'BadRequestError',
          error: "the Host header is 309 characters long, over a host name's 253",
        },
      ]);
      await nodeIn(client.ns, [CLI, 'kill', id], clientEnv);
    }, 120_000);

    test('a wrong API key is refused with 401, naming the URL and ABX_API_KEY', async () => {
      const result = await nodeIn(client.ns, [CLI, 'list'], {
        ...clientEnv,
        ABX_API_KEY: 'not-the-key',
      });
      expect(result.code).toBe(1);
      expect(result.stderr).toContain(
        `AuthenticationError: the API key was refused (401) by the abx control plane at ${apiUrl}: check ABX_API_KEY`,
      );
    });

    test('a client that does not trust the CA gets a TLS error naming the URL and ABX_CA_CERT', async () => {
      const { ABX_CA_CERT: _, ...untrusting } = clientEnv;
      const result = await nodeIn(client.ns, [CLI, 'list'], untrusting);
      expect(result.code).toBe(1);
      expect(result.stderr).toContain(
        `DaemonUnavailableError: the abx control plane at ${apiUrl} could not be reached (GET /v1/sandboxes): its TLS certificate is not trusted here`,
      );
      expect(result.stderr).toContain('set ABX_CA_CERT');
      expect(existsSync(join(clientHome, '.abx'))).toBe(false);
    });

    test('an unreachable ABX_API_URL is a clear error and starts no local daemon', async () => {
      const fresh = mkdtempSync(join(dir, 'fresh-home-'));
      const url = `https://${server.ip}:1`;
      const result = await nodeIn(client.ns, [CLI, 'list'], {
        ...clientEnv,
        HOME: fresh,
        ABX_API_URL: url,
      });
      expect(result.code).toBe(1);
      expect(result.stderr).toContain(`the abx control plane at ${url} could not be reached`);
      expect(result.stderr).toContain(`hint: check that ABX_API_URL (--api-url) ${url} is right`);
      expect(readdirSync(fresh)).toEqual([]);
      expect(daemonsUnder(fresh)).toEqual([]);
    });

    test('plain HTTP beyond loopback: refused without --insecure (naming it), served with it', async () => {
      const other = join(dir, 'plain-home');
      const env = { HOME: dir, ABX_HOME: other, ABX_WARM_POOL: '0' };
      const listen = `${server.ip}:9443`;
      const refused = await nodeIn(server.ns, [CLI, 'daemon', 'start', '--listen', listen], env);
      expect(refused.code).toBe(2);
      expect(refused.stderr).toContain(
        `refusing to serve plain HTTP on ${server.ip}, which is not a loopback address`,
      );
      expect(refused.stderr).toContain('--insecure');
      // The daemon itself refuses the same, from its environment.
      const direct = await nodeIn(server.ns, [join(ROOT, 'dist', 'daemon.js')], {
        ...env,
        ABX_LISTEN: listen,
      });
      expect(direct.code).toBe(1);
      expect(direct.stderr).toContain('--insecure');
      expect(existsSync(join(other, 'daemon.json'))).toBe(false);

      const served = await nodeIn(
        server.ns,
        [CLI, 'daemon', 'start', '--listen', listen, '--insecure', '--json'],
        env,
      );
      try {
        expect(served.code).toBe(0);
        expect(JSON.parse(served.stdout).remote).toMatchObject({
          apiUrl: `http://${listen}`,
          tls: false,
        });
        const key = readFileSync(join(other, 'api-key'), 'utf8').trim();
        const listed = await nodeIn(client.ns, [CLI, 'list', '--json'], {
          HOME: clientHome,
          ABX_API_URL: `http://${listen}`,
          ABX_API_KEY: key,
        });
        expect([listed.code, JSON.parse(listed.stdout)]).toEqual([0, []]);
      } finally {
        await nodeIn(server.ns, [CLI, 'daemon', 'stop'], env);
      }
    }, 60_000);
  },
);
