import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';
import { call } from '../helpers/api-call.js';
import { MemoryProvider } from '../helpers/memory-provider.js';
import { until } from './plane.js';

// The dashboard's server side on a real daemon (memory provider: no sandbox runs here). The page
// itself is tested in a real browser by test/dashboard/.

let home: string;
let ui: string;
let daemon: Daemon;
let info: DaemonInfo;
let adminKey: string;
const provider = new MemoryProvider();

beforeAll(async () => {
  home = mkdtempSync(join(tmpdir(), 'abx-dash-'));
  // A page of its own, so these tests do not depend on the UI's build.
  ui = join(home, 'ui');
  mkdirSync(join(ui, 'assets'), { recursive: true });
  writeFileSync(
    join(ui, 'index.html'),
    `<!doctype html><script type="module" src="/assets/app-1.js"></script>${' '.repeat(600)}`,
  );
  writeFileSync(
    join(ui, 'assets', 'app-1.js'),
    `console.log(${JSON.stringify('x'.repeat(2000))});`,
  );
  daemon = new Daemon({
    home,
    provider,
    apiPort: 0,
    gatewayPort: 0,
    reapIntervalMs: 50,
    metricsIntervalMs: 100,
    warmPool: 0,
    dashboardDir: ui,
  });
  info = await daemon.start();
  adminKey = readFileSync(join(home, 'api-key'), 'utf8').trim();
});

afterAll(async () => {
  provider.releaseCreates();
  await daemon?.stop().catch(() => undefined);
  rmSync(home, { recursive: true, force: true });
});

const admin = () => ({ authorization: `Bearer ${adminKey}` });

/** Signs in with a key as the page does; the cookie and the CSRF token it gets. */
async function signIn(key: string): Promise<{ cookie: string; csrf: string; body: unknown }> {
  const response = await request(`${info.apiUrl}/ui/signin`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      origin: info.apiUrl,
      'sec-fetch-site': 'same-origin',
    },
    body: JSON.stringify({ key }),
  });
  const body = (await response.body.json()) as { csrf: string };
  expect(response.statusCode).toBe(200);
  const setCookie = String(response.headers['set-cookie']);
  return { cookie: setCookie.split(';')[0] as string, csrf: body.csrf, body };
}

describe('dashboard sign-in', () => {
  test('a key pasted on the page becomes an HttpOnly, SameSite=Strict cookie; the key is never sent back', async () => {
    const response = await request(`${info.apiUrl}/ui/signin`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', origin: info.apiUrl },
      body: JSON.stringify({ key: adminKey }),
    });
    const text = await response.body.text();
    expect(response.statusCode).toBe(200);
    const setCookie = String(response.headers['set-cookie']);
    expect(setCookie).toMatch(
      /^abx_dashboard=[A-Za-z0-9_-]{43}; Path=\/; Max-Age=\d+; HttpOnly; SameSite=Strict$/,
    );
    expect(text).not.toContain(adminKey);
    expect(setCookie).not.toContain(adminKey);
    expect(JSON.parse(text)).toMatchObject({ admin: true, name: 'the daemon key' });
  });

  test('a wrong key is refused with the API error shape, and sets no cookie', async () => {
    const response = await request(`${info.apiUrl}/ui/signin`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ key: 'abx_not-a-key-at-all' }),
    });
    expect(response.statusCode).toBe(401);
    expect(response.headers['set-cookie']).toBeUndefined();
    expect(await response.body.json()).toMatchObject({ type: 'AuthenticationError' });
  });

  test('malformed sign-in bodies get 400, not a crash', async () => {
    for (const body of ['{', '[]', '{"key": 5}', '{"key": ""}']) {
      const raw = await request(`${info.apiUrl}/ui/signin`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
      });
      expect(raw.statusCode).toBe(400);
      expect(await raw.body.json()).toMatchObject({ type: 'BadRequestError' });
    }
  });

  test('a page of another origin cannot sign the browser in (login CSRF)', async () => {
    const response = await request(`${info.apiUrl}/ui/signin`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        origin: info.gatewayUrl,
        'sec-fetch-site': 'same-site',
      },
      body: JSON.stringify({ key: adminKey }),
    });
    expect(response.statusCode).toBe(403);
    expect(response.headers['set-cookie']).toBeUndefined();
    await response.body.dump();
  });

  test('a one-time link signs in once, then redirects to the sign-in page', async () => {
    const minted = await call(`${info.apiUrl}/ui/links`, {
      method: 'POST',
      headers: admin(),
      body: {},
    });
    expect(minted.status).toBe(201);
    const url = minted.body.url as string;
    expect(url.startsWith(`${info.apiUrl}/ui/signin?code=`)).toBe(true);
    expect(url).not.toContain(adminKey);
    const first = await request(url);
    await first.body.dump();
    expect(first.statusCode).toBe(303);
    expect(first.headers.location).toBe('/');
    const cookie = String(first.headers['set-cookie']).split(';')[0] as string;
    const session = await call(`${info.apiUrl}/ui/session`, { headers: { cookie } });
    expect(session.status).toBe(200);
    expect(session.body).toMatchObject({ admin: true, name: 'the daemon key' });
    const again = await request(url);
    await again.body.dump();
    expect(again.statusCode).toBe(303);
    expect(again.headers.location).toBe('/#/signin?error=link');
    expect(again.headers['set-cookie']).toBeUndefined();
  });

  test('links are made only with a key', async () => {
    const response = await call(`${info.apiUrl}/ui/links`, { method: 'POST', body: {} });
    expect(response.status).toBe(401);
  });
});

describe('the cookie on the API', () => {
  test('reads work with the cookie; changes need the CSRF token and the same origin', async () => {
    const { cookie, csrf } = await signIn(adminKey);
    const listed = await call(`${info.apiUrl}/v1/sandboxes`, { headers: { cookie } });
    expect(listed.status).toBe(200);
    // Without the CSRF token: refused, nothing made.
    const refused = await call(`${info.apiUrl}/v1/sandboxes`, {
      method: 'POST',
      headers: { cookie },
      body: {},
    });
    expect(refused.status).toBe(403);
    expect(refused.body).toMatchObject({ type: 'PermissionDeniedError', code: 'csrf_failed' });
    expect(
      (await call(`${info.apiUrl}/v1/sandboxes`, { headers: { cookie } })).body.sandboxes,
    ).toEqual([]);
    // A wrong token, or the right one from another origin's page: refused too.
    for (const headers of <Record<string, string>[]>[
      { cookie, 'x-csrf-token': `${csrf}x` },
      { cookie, 'x-csrf-token': csrf, origin: info.gatewayUrl },
      { cookie, 'x-csrf-token': csrf, 'sec-fetch-site': 'same-site' },
    ]) {
      const response = await call(`${info.apiUrl}/v1/sandboxes`, {
        method: 'POST',
        headers,
        body: {},
      });
      expect(response.status).toBe(403);
    }
    const made = await call(`${info.apiUrl}/v1/sandboxes`, {
      method: 'POST',
      headers: {
        cookie,
        'x-csrf-token': csrf,
        origin: info.apiUrl,
        'sec-fetch-site': 'same-origin',
      },
      body: {},
    });
    expect(made.status).toBe(200);
    const killed = await call(`${info.apiUrl}/v1/sandboxes/${made.body.sandboxId}`, {
      method: 'DELETE',
      headers: { cookie, 'x-csrf-token': csrf },
    });
    expect(killed.status).toBe(200);
  });

  test('a non-admin key signed in sees only its own sandboxes', async () => {
    const created = await call(`${info.apiUrl}/v1/keys`, {
      method: 'POST',
      headers: admin(),
      body: { name: 'dash-user' },
    });
    const userKey = created.body.key as string;
    const mine = await call(`${info.apiUrl}/v1/sandboxes`, {
      method: 'POST',
      headers: { authorization: `Bearer ${userKey}` },
      body: { metadata: { who: 'user' } },
    });
    const theirs = await call(`${info.apiUrl}/v1/sandboxes`, {
      method: 'POST',
      headers: admin(),
      body: {},
    });
    const { cookie } = await signIn(userKey);
    const listed = await call(`${info.apiUrl}/v1/sandboxes`, { headers: { cookie } });
    expect(listed.body.sandboxes.map((s: { sandboxId: string }) => s.sandboxId)).toEqual([
      mine.body.sandboxId,
    ]);
    expect((await call(`${info.apiUrl}/v1/keys`, { headers: { cookie } })).status).toBe(403);
    // Revoking the key ends its dashboard session at the next request.
    await call(`${info.apiUrl}/v1/keys/${created.body.id}`, { method: 'DELETE', headers: admin() });
    expect((await call(`${info.apiUrl}/v1/sandboxes`, { headers: { cookie } })).status).toBe(401);
    expect((await call(`${info.apiUrl}/ui/session`, { headers: { cookie } })).status).toBe(401);
    for (const id of [mine.body.sandboxId, theirs.body.sandboxId]) {
      await call(`${info.apiUrl}/v1/sandboxes/${id}`, { method: 'DELETE', headers: admin() });
    }
  });

  test('signing out ends the session', async () => {
    const { cookie, csrf } = await signIn(adminKey);
    const out = await call(`${info.apiUrl}/ui/signout`, {
      method: 'POST',
      headers: { cookie, 'x-csrf-token': csrf },
    });
    expect(out.status).toBe(204);
    expect((await call(`${info.apiUrl}/v1/sandboxes`, { headers: { cookie } })).status).toBe(401);
  });

  test('the gateway never passes the dashboard cookie on: through it the API refuses the cookie', async () => {
    const { cookie } = await signIn(adminKey);
    const through = await call(`${info.gatewayUrl}/v1/sandboxes`, {
      headers: { cookie, host: new URL(info.gatewayUrl).host },
    });
    expect(through.status).toBe(401);
    // The page and sign-in are not served on the gateway's origin at all.
    const page = await call(`${info.gatewayUrl}/`);
    expect(page.status).not.toBe(200);
    const session = await call(`${info.gatewayUrl}/ui/session`, { headers: { cookie } });
    expect(session.status).not.toBe(200);
    // Nor on its `api.{domain}` host, which passes every other path to the API.
    const apiHost = await call(`${info.gatewayUrl}/ui/session`, {
      headers: { cookie, host: `api.${info.domain}` },
    });
    expect(apiHost.status).toBe(404);
    expect(apiHost.body.error).toContain("the API's own listener serves");
  });
});

describe('the page', () => {
  test('is served with a CSP that allows no inline script, and gzip when asked', async () => {
    const response = await request(`${info.apiUrl}/`, { headers: { 'accept-encoding': 'gzip' } });
    await response.body.dump();
    expect(response.statusCode).toBe(200);
    expect(response.headers['content-type']).toBe('text/html; charset=utf-8');
    const csp = String(response.headers['content-security-policy']);
    expect(csp).toContain("script-src 'self'");
    expect(csp).not.toMatch(/script-src[^;]*unsafe/);
    expect(csp).toContain("frame-ancestors 'none'");
    // The gateway as clients are told to reach it (the origin sandboxes' answers come from).
    const health = await call(`${info.apiUrl}/v1/health`);
    expect(csp).toContain(`connect-src 'self' ${new URL(health.body.gatewayUrl).origin};`);
    expect(response.headers['x-frame-options']).toBe('DENY');
    expect(response.headers['content-encoding']).toBe('gzip');
  });

  test('its hashed files are cached for good; a page without gzip gets the plain bytes', async () => {
    const response = await request(`${info.apiUrl}/assets/app-1.js`);
    const text = await response.body.text();
    expect(response.statusCode).toBe(200);
    expect(response.headers['cache-control']).toContain('immutable');
    expect(response.headers['content-encoding']).toBeUndefined();
    expect(text).toContain('console.log');
    const missing = await request(`${info.apiUrl}/assets/nope-2.js`);
    await missing.body.dump();
    expect(missing.statusCode).toBe(404);
  });

  test('hostile paths serve nothing outside dist/ui', async () => {
    for (const path of [
      '/assets/../../package.json',
      '/assets/%2e%2e/%2e%2e/package.json',
      '/.env.svg',
      '/assets/.hidden.js',
    ]) {
      const response = await request(`${info.apiUrl}${path}`);
      const text = await response.body.text();
      expect(response.statusCode).not.toBe(200);
      expect(text).not.toContain('"name": "abx-sandbox"');
    }
  });

  test('--no-dashboard serves no page and no sign-in', async () => {
    const other = mkdtempSync(join(tmpdir(), 'abx-dash-off-'));
    const off = new Daemon({
      home: other,
      provider: new MemoryProvider(),
      apiPort: 0,
      gatewayPort: 0,
      warmPool: 0,
      dashboard: false,
    });
    try {
      const offInfo = await off.start();
      const page = await call(`${offInfo.apiUrl}/`);
      expect(page.status).not.toBe(200);
      expect(JSON.stringify(page.body)).not.toContain('<html');
      const signin = await call(`${offInfo.apiUrl}/ui/signin`, {
        method: 'POST',
        body: { key: 'x' },
      });
      expect(signin.status).not.toBe(200);
      expect(signin.body).toMatchObject({ type: expect.stringMatching(/NotFound|Authentication/) });
    } finally {
      await off.stop();
      rmSync(other, { recursive: true, force: true });
    }
  });
});

describe('GET /v1/events', () => {
  test('a snapshot, then each sandbox made and its end', async () => {
    const controller = new AbortController();
    // As a browser's EventSource asks (without it, /v1/events answers a page of JSON).
    const response = await request(`${info.apiUrl}/v1/events`, {
      headers: { ...admin(), accept: 'text/event-stream' },
      signal: controller.signal,
    });
    expect(response.statusCode).toBe(200);
    expect(response.headers['content-type']).toContain('text/event-stream');
    const events: { event: string; data: Record<string, unknown> }[] = [];
    let buffer = '';
    const reading = (async () => {
      try {
        for await (const chunk of response.body) {
          buffer += chunk.toString();
          let end = buffer.indexOf('\n\n');
          while (end >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            const event = /^event: (.+)$/m.exec(block)?.[1];
            const data = /^data: (.+)$/m.exec(block)?.[1];
            if (event && data) events.push({ event, data: JSON.parse(data) });
            end = buffer.indexOf('\n\n');
          }
        }
      } catch {
        // aborted at the end of the test
      }
    })();
    try {
      await until(() => events.some((e) => e.event === 'snapshot'), 'the snapshot', 10_000);
      const made = await call(`${info.apiUrl}/v1/sandboxes`, {
        method: 'POST',
        headers: admin(),
        body: { metadata: { label: '<b>x</b>' } },
      });
      const id = made.body.sandboxId as string;
      await until(
        () =>
          events.some(
            (e) =>
              e.event === 'sandbox' && (e.data.sandbox as { sandboxId: string }).sandboxId === id,
          ),
        'the new sandbox',
        10_000,
      );
      await call(`${info.apiUrl}/v1/sandboxes/${id}`, { method: 'DELETE', headers: admin() });
      await until(
        () => events.some((e) => e.event === 'ended' && e.data.sandboxId === id),
        'its end',
        10_000,
      );
      expect(events.find((e) => e.event === 'ended')?.data).toMatchObject({
        sandboxId: id,
        state: 'killed',
      });
    } finally {
      controller.abort();
      await reading;
    }
  });

  test('needs a key or a session', async () => {
    expect((await call(`${info.apiUrl}/v1/events`)).status).toBe(401);
  });
});

describe('the gateway and browsers', () => {
  test('answers a CORS preflight for a request that will carry X-Access-Token, with no credentials allowed', async () => {
    const response = await request(`${info.gatewayUrl}/files/list`, {
      method: 'OPTIONS',
      headers: {
        origin: info.apiUrl,
        'access-control-request-method': 'GET',
        'access-control-request-headers': 'x-access-token, x-sandbox-id, x-sandbox-port',
      },
    });
    await response.body.dump();
    expect(response.statusCode).toBe(204);
    expect(response.headers['access-control-allow-origin']).toBe(info.apiUrl);
    expect(response.headers['access-control-allow-headers']).toBe(
      'x-access-token, x-sandbox-id, x-sandbox-port',
    );
    expect(response.headers['access-control-allow-credentials']).toBeUndefined();
  });

  test('its refusals are readable by a page (the dashboard shows why)', async () => {
    const response = await request(`${info.gatewayUrl}/files/list`, {
      headers: {
        origin: info.apiUrl,
        'x-sandbox-id': 'inosuchsandbox00',
        'x-sandbox-port': '49983',
        'x-access-token': 'x',
      },
    });
    expect(response.statusCode).toBe(404);
    expect(response.headers['access-control-allow-origin']).toBe('*');
    expect(await response.body.json()).toMatchObject({ type: 'SandboxNotFoundError' });
  });
});
