import { execFile, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { commandRegistry, Sandbox, Templates } from '../../src/index.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome, sandboxProcesses } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';

// A port of a sandbox reached with the sandbox's token alone: from Node's fetch and curl by the
// gateway's path form (no DNS), from a browser by a one-time link that sets a cookie. And the
// attacks on both: no or wrong token, another sandbox's token or cookie, forged, replayed or
// expired links, cross-site requests, another host user at the command server's socket.

const CHROMIUM = '/usr/bin/chromium';
const WEB = 8000;
const SERVER = 8080;

/** A page and an echo of what reached the sandbox, served by Python inside it. */
const ECHO_PY = `
import http.server, json, html, socket
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_GET(self): self.answer()
    def do_POST(self):
        self.rfile.read(int(self.headers.get('content-length') or 0)); self.answer()
    def answer(self):
        seen = {'sandbox': socket.gethostname(), 'method': self.command, 'path': self.path, 'headers': {k.lower(): v for k, v in self.headers.items()}}
        if self.path.startswith('/echo'):
            body, kind = json.dumps(seen).encode(), 'application/json'
        else:
            body = ('<!doctype html><html><body><h1>hello from the sandbox</h1><pre id="seen">' + html.escape(json.dumps(seen)) + '</pre><p id="where"></p><script>document.getElementById("where").textContent = "location=" + location.href + "=end"</script></body></html>').encode()
            kind = 'text/html'
        self.send_response(200)
        self.send_header('content-type', kind)
        self.send_header('content-length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(('127.0.0.1', ${WEB}), H).serve_forever()
`;

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let a: Sandbox;
let b: Sandbox;
const cacheDirBefore = process.env.ABX_CACHE_DIR;

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  text: string;
}

/** One request to the gateway at 127.0.0.1 with any Host (Node cannot resolve `*.localhost`). */
function raw(
  url: string,
  options: { method?: string; headers?: Record<string, string>; body?: string } = {},
): Promise<Answer> {
  const target = new URL(url);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port: target.port,
        method: options.method ?? 'GET',
        path: `${target.pathname}${target.search}`,
        headers: { host: target.host, ...options.headers },
        timeout: 60_000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            text: Buffer.concat(chunks).toString(),
          }),
        );
      },
    );
    req.on('timeout', () => req.destroy(new Error(`no answer from ${url}`)));
    req.on('error', reject);
    req.end(options.body);
  });
}

const json = (answer: Answer) => JSON.parse(answer.text);

/** What the echo server saw. */
interface Seen {
  sandbox: string;
  method: string;
  path: string;
  headers: Record<string, string>;
}

/** `name=value` of the session cookie a redeemed link set. */
function sessionOf(answer: Answer): string {
  const cookie = (answer.headers['set-cookie'] ?? [])[0] ?? '';
  return cookie.split(';')[0] as string;
}

async function waitFor(check: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`${what} did not happen within 60 s`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

beforeAll(async () => {
  abx = await createAbxHome();
  process.env.ABX_CACHE_DIR = join(abx.home, 'bundle-cache');
  const home = abx.home;
  await Templates.build(join(ROOT, 'test', 'fixtures', 'templates', 'server-e2e.yaml'), { home });
  a = await Sandbox.create({ home, template: 'server-e2e' });
  b = await Sandbox.create({ home, template: 'server-e2e' });
  for (const box of [a, b]) {
    await box.files.write('/tmp/echo.py', ECHO_PY);
    await box.commands.start('python3 /tmp/echo.py', { timeoutMs: 0 });
  }
  commandRegistry().registerClass(SandboxCommands);
  await a.server.start({ commands: [SandboxCommands], port: SERVER });
  for (const box of [a, b]) {
    await waitFor(
      async () =>
        (await fetch(`${box.getUrl(WEB)}/echo`, { headers: { 'x-access-token': box.accessToken } }))
          .status === 200,
      `the echo server of ${box.sandboxId} answering`,
    );
  }
}, 300_000);

afterAll(async () => {
  await a?.kill().catch(() => undefined);
  await b?.kill().catch(() => undefined);
  await abx?.close();
  if (cacheDirBefore === undefined) delete process.env.ABX_CACHE_DIR;
  else process.env.ABX_CACHE_DIR = cacheDirBefore;
});

describe('a port from Node and curl, with the sandbox token only', () => {
  test('getUrl is the gateway path form on 127.0.0.1, which fetch reaches without DNS', async () => {
    const gateway = new URL(a.getUrl(WEB));
    expect(gateway.hostname).toBe('127.0.0.1');
    expect(a.getUrl(WEB)).toBe(`http://${gateway.host}/sandboxes/${a.sandboxId}/ports/${WEB}`);
    expect(a.getHost(WEB)).toBe(`${gateway.host}/sandboxes/${a.sandboxId}/ports/${WEB}`);

    const byHeader = await fetch(`${a.getUrl(WEB)}/echo/x?q=1&token=${a.accessToken}`, {
      headers: { 'x-access-token': a.accessToken, cookie: 'app=1' },
    });
    expect(byHeader.status).toBe(200);
    const seen = (await byHeader.json()) as Seen;
    // The prefix and the token are gone; the app's own cookie is not.
    expect(seen.path).toBe('/echo/x?q=1');
    expect(seen.headers['x-access-token']).toBeUndefined();
    expect(seen.headers.cookie).toBe('app=1');

    const byBearer = await fetch(`http://${a.getHost(WEB)}/echo`, {
      method: 'POST',
      headers: { authorization: `Bearer ${a.accessToken}` },
      body: 'hello',
    });
    expect(byBearer.status).toBe(200);
    const bearerSeen = (await byBearer.json()) as Seen;
    expect(bearerSeen).toMatchObject({ method: 'POST', path: '/echo' });
    // A port never sees the sandbox's token.
    expect(bearerSeen.headers.authorization).toBeUndefined();
    // With X-Access-Token for the gateway, the app's own Authorization passes.
    const appAuth = await fetch(`${a.getUrl(WEB)}/echo`, {
      headers: { 'x-access-token': a.accessToken, authorization: 'Basic YXBwOmFwcA==' },
    });
    expect(((await appAuth.json()) as Seen).headers.authorization).toBe('Basic YXBwOmFwcA==');

    // `?token=` for the gateway leaves the app's own Authorization alone too.
    const queryToken = await fetch(`${a.getUrl(WEB)}/echo?token=${a.accessToken}`, {
      headers: { authorization: 'Bearer app-token' },
    });
    expect(((await queryToken.json()) as Seen).headers.authorization).toBe('Bearer app-token');

    // The bare prefix is the port's root.
    const root = await fetch(a.getUrl(WEB), { headers: { 'x-access-token': a.accessToken } });
    expect(await root.text()).toContain('hello from the sandbox');
  });

  test("the dashboard's cookie never reaches a port; envd and the command server answer a page of any origin that holds the token", async () => {
    // A cookie goes to every port of its host: the API's (the dashboard's) reaches the gateway's.
    const seen = (await (
      await fetch(`${a.getUrl(WEB)}/echo`, {
        headers: {
          'x-access-token': a.accessToken,
          cookie: 'abx_dashboard=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA; app=2',
        },
      })
    ).json()) as Seen;
    expect(seen.headers.cookie).toBe('app=2');
    // A browser page (the dashboard) reads envd and the command server with the token.
    const origin = 'http://127.0.0.1:1';
    const gateway = new URL(a.getUrl(WEB)).origin;
    const preflight = await fetch(`${gateway}/files/list?path=/tmp`, {
      method: 'OPTIONS',
      headers: {
        origin,
        'access-control-request-method': 'GET',
        'access-control-request-headers': 'x-access-token,x-sandbox-id,x-sandbox-port',
      },
    });
    expect(preflight.status).toBe(204);
    expect(preflight.headers.get('access-control-allow-origin')).toBe(origin);
    const envd = await fetch(`${gateway}/files/list?path=/tmp`, {
      headers: {
        origin,
        'x-access-token': a.accessToken,
        'x-sandbox-id': a.sandboxId,
        'x-sandbox-port': '49983',
      },
    });
    expect(envd.status).toBe(200);
    expect(envd.headers.get('access-control-allow-origin')).toBe('*');
    expect(envd.headers.get('access-control-allow-credentials')).toBeNull();
    const commands = await fetch(`${a.getUrl(SERVER)}/commands`, {
      headers: { origin, 'x-access-token': a.accessToken },
    });
    expect(commands.status).toBe(200);
    expect(commands.headers.get('access-control-allow-origin')).toBe('*');
    // Without a browser's Origin nothing changes for the SDK.
    const plain = await fetch(`${gateway}/files/list?path=/tmp`, {
      headers: {
        'x-access-token': a.accessToken,
        'x-sandbox-id': a.sandboxId,
        'x-sandbox-port': '49983',
      },
    });
    expect(plain.headers.get('access-control-allow-origin')).toBeNull();
  });

  test('one keep-alive connection alternating between two sandboxes by path reaches each in turn', async () => {
    // A and B share the gateway's origin in the path form: fetch reuses one connection for both.
    const agent = new Agent({ connections: 1, pipelining: 1 });
    try {
      const seen: string[] = [];
      for (const box of [a, b, a, a, b]) {
        const answer = await undiciFetch(`${box.getUrl(WEB)}/echo`, {
          headers: { 'x-access-token': box.accessToken },
          dispatcher: agent,
        });
        seen.push(((await answer.json()) as Seen).sandbox);
      }
      expect(seen).toEqual([a, b, a, a, b].map((box) => box.sandboxId));
      // B's path with A's token on that same connection is refused, not sent along.
      const mixed = await undiciFetch(`${b.getUrl(WEB)}/echo`, {
        headers: { 'x-access-token': a.accessToken },
        dispatcher: agent,
      });
      expect(mixed.status).toBe(401);
    } finally {
      await agent.close();
    }
  });

  test('the command server answers with the sandbox token alone, from fetch and from curl', async () => {
    expect(a.server.url).toBe(a.getUrl(SERVER));
    const call = await fetch(`${a.getUrl(SERVER)}/commands/add`, {
      method: 'POST',
      headers: { 'x-access-token': a.accessToken, 'content-type': 'application/json' },
      body: JSON.stringify({ x: 1, y: 41 }),
    });
    expect(call.status).toBe(200);
    expect(await call.json()).toEqual({ result: 42 });

    const curl = spawnSync(
      'curl',
      [
        '-sS',
        '-H',
        `Authorization: Bearer ${a.accessToken}`,
        '-H',
        'Content-Type: application/json',
        '-d',
        '{"x": 2.5}',
        `${a.getUrl(SERVER)}/commands/add`,
      ],
      { encoding: 'utf8', timeout: 60_000 },
    );
    expect(curl.stderr).toBe('');
    expect(JSON.parse(curl.stdout)).toEqual({ result: 4.5 });

    const listed = spawnSync(
      'curl',
      ['-sS', '-H', `X-Access-Token: ${a.accessToken}`, `${a.getUrl(SERVER)}/commands`],
      { encoding: 'utf8', timeout: 60_000 },
    );
    expect(JSON.parse(listed.stdout).commands.map((c: { name: string }) => c.name)).toContain(
      'add',
    );
  });

  test('inside the sandbox, the command server on TCP still wants its own token', async () => {
    const probe = await a.commands.run(
      `python3 -c "import urllib.request,urllib.error
try: urllib.request.urlopen('http://127.0.0.1:${SERVER}/commands')
except urllib.error.HTTPError as e: print(e.code)"`,
    );
    expect(probe.stdout.trim()).toBe('401');
  });

  test('no token, a wrong token or another sandbox token is refused, and the port sees nothing', async () => {
    const url = `${a.getUrl(SERVER)}/commands/runshell`;
    const body = JSON.stringify({ cmd: 'touch /tmp/pwned' });
    const attempts: Record<string, string>[] = [
      {},
      { 'x-access-token': 'wrong' },
      { 'x-access-token': b.accessToken },
      { authorization: `Bearer ${b.accessToken}` },
    ];
    for (const headers of attempts) {
      const answer = await fetch(url, { method: 'POST', headers, body });
      expect(answer.status).toBe(401);
      expect(await answer.json()).toMatchObject({ type: 'AuthenticationError' });
    }
    // B's token on B's path form does not reach A either: the path names B.
    const other = await fetch(`${b.getUrl(SERVER)}/commands`, {
      headers: { 'x-access-token': b.accessToken },
    });
    expect(other.status).not.toBe(200);
    expect((await a.commands.run('test -e /tmp/pwned; echo $?')).stdout.trim()).toBe('1');

    const bad = await fetch(`${a.getUrl(WEB).replace(`/ports/${WEB}`, '/ports/99999')}/`, {
      headers: { 'x-access-token': a.accessToken },
    });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: string }).error).toContain('is not a TCP port');
    const missing = await fetch(`${a.getUrl(WEB).replace(a.sandboxId, 'inosuchsandbox00')}/`, {
      headers: { 'x-access-token': a.accessToken },
    });
    expect(missing.status).toBe(404);
  });

  test("another host user cannot open the command server's socket, another sandbox cannot see it", async () => {
    // The host reaches the sandbox's files through a process inside it (as the gateway does).
    const socket = sandboxProcesses(a.sandboxId)
      .map((pid) => `/proc/${pid}/root/run/abx/ports/${SERVER}.sock`)
      .find((path) => existsSync(path));
    expect(socket).toBeDefined();
    const asNobody = spawnSync(
      'setpriv',
      [
        '--reuid=65534',
        '--regid=65534',
        '--clear-groups',
        process.execPath,
        '-e',
        `require('node:net').connect(${JSON.stringify(socket)}).on('connect', () => { console.log('connected'); process.exit(0); }).on('error', (e) => { console.log(e.code); process.exit(0); })`,
      ],
      { encoding: 'utf8', timeout: 60_000 },
    );
    expect(asNobody.stdout.trim()).toBe('EACCES');
    const fromB = await b.commands.run(
      `python3 -c "import socket
s = socket.socket(socket.AF_UNIX)
try: s.connect('${socket}'); print('connected')
except OSError as e: print(type(e).__name__)"`,
    );
    // B's /proc shows its own processes only: A's host pid names nothing there.
    expect(fromB.stdout.trim()).toMatch(
      /^(FileNotFoundError|PermissionError|ConnectionRefusedError)$/,
    );
  });
});

describe('a port in a browser, from a one-time link', () => {
  test('a link sets a host-only HttpOnly cookie for that port, redirects to the clean path, and opens once', async () => {
    const link = await a.getSignedUrl(WEB, { path: '/echo/page?x=1' });
    const url = new URL(link);
    expect(url.hostname).toBe(`${WEB}-${a.sandboxId}.localhost`);
    expect(url.searchParams.get('abx_link')).toMatch(/^v1\./);
    expect(link).not.toContain(a.accessToken);

    const opened = await raw(link);
    expect(opened.status).toBe(303);
    expect(opened.headers.location).toBe('/echo/page?x=1');
    const setCookie = (opened.headers['set-cookie'] ?? [])[0] as string;
    expect(setCookie).toMatch(
      /^abx_session=v1\.[^;]+; Path=\/; Max-Age=3600; HttpOnly; SameSite=Lax$/,
    );
    expect(setCookie).not.toMatch(/Domain=/i);
    const cookie = sessionOf(opened);

    const page = await raw(`http://${url.host}/echo/page?x=1`, {
      headers: { cookie: `app=1; ${cookie}` },
    });
    expect(page.status).toBe(200);
    const seen = json(page);
    expect(seen.path).toBe('/echo/page?x=1');
    // The cookie is the gateway's: the sandbox sees the app's cookies only.
    expect(seen.headers.cookie).toBe('app=1');

    const replay = await raw(link);
    expect(replay.status).toBe(401);
    expect(json(replay).error).toContain('was used already');
  });

  test('forged, expired, misplaced links and cookies are refused', async () => {
    const link = new URL(await a.getSignedUrl(WEB));
    const value = link.searchParams.get('abx_link') as string;
    const forged = new URL(link);
    forged.searchParams.set('abx_link', `${value.slice(0, -4)}AAAA`);
    expect((await raw(forged.href)).status).toBe(401);
    // A later expiry with the same signature.
    const parts = value.split('.');
    parts[1] = String(Number(parts[1]) + 3_600_000);
    forged.searchParams.set('abx_link', parts.join('.'));
    expect((await raw(forged.href)).status).toBe(401);
    // A's link on B's host, and on A's other port.
    const onB = new URL(link);
    onB.hostname = `${WEB}-${b.sandboxId}.localhost`;
    expect((await raw(onB.href)).status).toBe(401);
    const onOtherPort = new URL(link);
    onOtherPort.hostname = `${SERVER}-${a.sandboxId}.localhost`;
    expect((await raw(onOtherPort.href)).status).toBe(401);
    // The genuine link still opens once (the failures did not use it up).
    const opened = await raw(link.href);
    expect(opened.status).toBe(303);
    const cookie = sessionOf(opened);

    const expiring = await a.getSignedUrl(WEB, { expiresInMs: 1000 });
    await new Promise((resolve) => setTimeout(resolve, 1500));
    const late = await raw(expiring);
    expect(late.status).toBe(401);
    expect(json(late).error).toContain('expired');

    // A's cookie on B's host, or on A's command server port, authorizes nothing.
    const bHost = `http://${WEB}-${b.sandboxId}.localhost:${link.port}/echo`;
    expect((await raw(bHost, { headers: { cookie } })).status).toBe(401);
    const serverHost = `http://${SERVER}-${a.sandboxId}.localhost:${link.port}/commands`;
    expect((await raw(serverHost, { headers: { cookie } })).status).toBe(401);
    // Nor does it work on the path form (no cookie is ever set for it).
    const pathForm = await raw(`${a.getUrl(WEB)}/echo`, { headers: { cookie } });
    expect(pathForm.status).toBe(401);
    // A tampered cookie.
    expect(
      (await raw(`http://${link.host}/echo`, { headers: { cookie: `${cookie.slice(0, -3)}AAA` } }))
        .status,
    ).toBe(401);

    // Another site's page posting with the cookie (a page of sandbox B, say) is refused...
    const crossSite = await raw(`http://${link.host}/echo`, {
      method: 'POST',
      headers: { cookie, 'sec-fetch-site': 'same-site', 'sec-fetch-mode': 'no-cors' },
      body: 'x',
    });
    expect(crossSite.status).toBe(403);
    expect(json(crossSite).type).toBe('PermissionDeniedError');
    // ...while a navigation to it, and the page's own requests, pass.
    const navigation = await raw(`http://${link.host}/echo`, {
      headers: { cookie, 'sec-fetch-site': 'cross-site', 'sec-fetch-mode': 'navigate' },
    });
    expect(navigation.status).toBe(200);
    const own = await raw(`http://${link.host}/echo`, {
      method: 'POST',
      headers: { cookie, 'sec-fetch-site': 'same-origin', 'sec-fetch-mode': 'cors' },
      body: 'x',
    });
    expect(own.status).toBe(200);

    // No links for envd, none to another site, none without the token.
    await expect(a.getSignedUrl(49983)).rejects.toMatchObject({ status: 403 });
    await expect(a.getSignedUrl(WEB, { path: '//evil.example/' })).rejects.toMatchObject({
      status: 400,
    });
    const gateway = new URL(a.getUrl(WEB)).origin;
    const anonymous = await fetch(`${gateway}/sandboxes/${a.sandboxId}/links/${WEB}`, {
      method: 'POST',
    });
    expect(anonymous.status).toBe(401);
    const withB = await fetch(`${gateway}/sandboxes/${a.sandboxId}/links/${WEB}`, {
      method: 'POST',
      headers: { 'x-access-token': b.accessToken },
    });
    expect(withB.status).toBe(401);
    // A link whose own path would leave the host redirects on the host.
    const sneaky = new URL(await a.getSignedUrl(WEB));
    const onHost = await raw(`http://${sneaky.host}//evil.example/${sneaky.search}`);
    expect(onHost.status).toBe(303);
    expect(onHost.headers.location).toBe('/evil.example/');
  }, 60_000);

  test.skipIf(!existsSync(CHROMIUM))(
    'headless Chromium opens the link, sees the page, and keeps no token in the address',
    async () => {
      const link = await a.getSignedUrl(WEB, { path: '/' });
      const profile = await mkdtemp(join(tmpdir(), 'abx-chromium-'));
      try {
        const dom = await new Promise<string>((resolve, reject) => {
          execFile(
            CHROMIUM,
            [
              '--headless',
              '--no-sandbox',
              '--disable-gpu',
              '--disable-quic',
              '--no-first-run',
              '--disable-background-networking',
              '--disable-component-update',
              '--disable-sync',
              `--user-data-dir=${profile}`,
              '--virtual-time-budget=5000',
              '--dump-dom',
              link,
            ],
            { timeout: 120_000, killSignal: 'SIGKILL', maxBuffer: 8 * 1024 * 1024 },
            (error, stdout) => (error ? reject(error) : resolve(stdout)),
          );
        });
        expect(dom).toContain('hello from the sandbox');
        const where = /location=(.*?)=end/.exec(dom)?.[1];
        expect(where).toBe(`http://${WEB}-${a.sandboxId}.localhost:${new URL(link).port}/`);
        expect(dom).not.toContain('abx_link');
        expect(dom).not.toContain(a.accessToken);
        // The page's request carried the session cookie to the gateway, not to the sandbox.
        expect(dom).not.toContain('abx_session');
      } finally {
        await rm(profile, { recursive: true, force: true });
      }
    },
    180_000,
  );
});
