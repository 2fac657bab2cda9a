import { Sandbox, Secret } from 'e2b';
import { describe, expect, test } from 'vitest';
import { e2bOnTestInternet, outputOf } from '../helpers/e2b-internet.js';
import { internetUnavailable } from '../helpers/internet.js';

/**
 * Per-host header rules on plain HTTP (issue 45), from inside real sandboxes of a root daemon
 * whose egress namespace is a test "internet": `allowed.test` (203.0.113.10) and
 * `www.allowed.test` (the same address) and `other.test` echo the headers they got at
 * `/headers`. Secrets are made and rules set through E2B's unmodified SDK, and natively.
 */
const unavailable = internetUnavailable();

describe.skipIf(unavailable)('header rules on egress (plain HTTP)', () => {
  const net = e2bOnTestInternet();
  const VALUE = 'sk-live-7f3a9c';

  const run = outputOf;
  /** The headers a server got, as curl (through HTTP_PROXY) fetched them. */
  const curlHeaders = async (sandbox: Sandbox, url: string, extra = '') =>
    JSON.parse(await run(sandbox, `curl -fsS -m 10 ${extra} '${url}'`)) as Record<string, string>;

  test('through the e2b SDK: the rule host gets the secret, other hosts and literal placeholders do not, rotation and removal apply to the next request', async () => {
    await Secret.create('hr-token', VALUE, net.opts);
    const sandbox = await Sandbox.create({
      ...net.opts,
      network: {
        allowOut: ['allowed.test', 'www.allowed.test', 'other.test'],
        denyOut: ['0.0.0.0/0'],
        rules: {
          'allowed.test': [
            { transform: { headers: { Authorization: `Bearer ${Secret.fill('hr-token')}` } } },
          ],
        },
      },
    });
    net.made.push(sandbox);

    // curl honours HTTP_PROXY (absolute form); Node's fetch does not, so it is captured on port 80.
    expect((await curlHeaders(sandbox, 'http://allowed.test/headers')).authorization).toBe(
      `Bearer ${VALUE}`,
    );
    const viaFetch = await run(
      sandbox,
      `node -e "fetch('http://allowed.test/headers').then(r => r.text()).then(t => process.stdout.write(t))"`,
    );
    expect(JSON.parse(viaFetch).authorization).toBe(`Bearer ${VALUE}`);
    // The sandbox's own Authorization is replaced, not sent beside it.
    expect(
      (await curlHeaders(sandbox, 'http://allowed.test/headers', "-H 'Authorization: mine'"))
        .authorization,
    ).toBe(`Bearer ${VALUE}`);

    // Another host, even at the same address, or a lying Host on the rule host's address.
    expect(
      (await curlHeaders(sandbox, 'http://www.allowed.test/headers')).authorization,
    ).toBeUndefined();
    expect((await curlHeaders(sandbox, 'http://other.test/headers')).authorization).toBeUndefined();
    expect(
      (
        await curlHeaders(
          sandbox,
          'http://other.test/headers',
          `--noproxy '*' --resolve other.test:80:${net.internet.addresses.allowed}`,
        )
      ).authorization,
    ).toBeUndefined();
    // A redirect from the rule host to another: the client follows, the header does not.
    const redirected = await curlHeaders(
      sandbox,
      `http://allowed.test/redirect/${encodeURIComponent('http://other.test/headers')}`,
      '-L',
    );
    expect(redirected.host).toBe('other.test');
    expect(redirected.authorization).toBeUndefined();

    // Placeholders the sandbox writes go out as written, to the rule's host too.
    const literal = await curlHeaders(
      sandbox,
      'http://allowed.test/headers',
      `-H 'X-Mine: \${e2b.secrets.hr-token} \${secrets.hr-token}'`,
    );
    expect(literal['x-mine']).toBe('${e2b.secrets.hr-token} ${secrets.hr-token}');
    expect(
      (
        await curlHeaders(
          sandbox,
          'http://other.test/headers',
          "-H 'Authorization: ${e2b.secrets.hr-token}'",
        )
      ).authorization,
    ).toBe('${e2b.secrets.hr-token}');

    // HTTPS to the rule host is read by egress (header-rules-tls.test.ts), which opens its own
    // TLS to the origin. This daemon does not trust the origin's CA: the secret is not sent to a
    // server egress cannot verify; the sandbox gets a 502 that says why, and no request arrives.
    const hitsBefore = net.internet.hits().length;
    const unverified = await run(
      sandbox,
      `curl -sS -m 10 -w '\\n%{http_code}' https://allowed.test/headers 2>&1`,
    );
    expect(unverified).toMatch(/abx egress: allowed\.test: unable to verify the first certificate/);
    expect(unverified).toMatch(/502$/);
    expect(
      net.internet
        .hits()
        .slice(hitsBefore)
        .filter((l) => l.startsWith('https')),
    ).toEqual([]);

    // The value is nowhere the sandbox or the API can read.
    const env = await run(sandbox, 'env; cat /proc/self/environ /proc/1/environ 2>/dev/null');
    expect(env).not.toContain(VALUE);
    const details = await sandbox.getInfo();
    expect(details.network?.rules).toEqual({
      'allowed.test': [
        { transform: { headers: { Authorization: 'Bearer ${e2b.secrets.hr-token}' } } },
      ],
    });
    expect(JSON.stringify(details)).not.toContain(VALUE);

    // A rotation applies to the next request.
    await Secret.update('hr-token', 'sk-rotated-2', net.opts);
    expect((await curlHeaders(sandbox, 'http://allowed.test/headers')).authorization).toBe(
      'Bearer sk-rotated-2',
    );

    // Removed: 403 naming the secret, and nothing reaches the server.
    await Secret.destroy('hr-token', net.opts);
    const before = net.internet.hits().length;
    const refused = await run(
      sandbox,
      "curl -sS -m 10 -o - -w ' %{http_code}' http://allowed.test/headers/after-destroy",
    );
    expect(refused).toContain('403');
    expect(refused).toContain('hr-token');
    expect(refused).not.toContain('${');
    const fetched = await run(
      sandbox,
      `node -e "fetch('http://allowed.test/headers/after-destroy').then(async r => process.stdout.write(r.status + ' ' + await r.text()))"`,
    );
    expect(fetched).toMatch(/^403 .*hr-token/);
    expect(
      net.internet
        .hits()
        .slice(before)
        .filter((line) => line.includes('after-destroy')),
    ).toEqual([]);

    // The egress decisions name the rule, never a value.
    const network = await fetch(`${net.info.apiUrl}/v1/sandboxes/${sandbox.sandboxId}/network`, {
      headers: { authorization: `Bearer ${net.opts.apiKey}` },
    }).then((r) => r.text());
    expect(network).toContain('names the secret hr-token');
    expect(network).not.toContain(VALUE);
    expect(network).not.toContain('sk-rotated-2');
  }, 240_000);

  test('natively: ${secrets.NAME} on create, and a live network update sets and clears rules', async () => {
    const headers = {
      authorization: `Bearer ${net.opts.apiKey}`,
      'content-type': 'application/json',
    };
    const created = await fetch(`${net.info.apiUrl}/v1/secrets`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ name: 'native-token', value: 'native-value-1' }),
    });
    expect(created.status).toBe(201);
    const sandbox = await Sandbox.create({ ...net.opts, allowInternetAccess: true });
    net.made.push(sandbox);
    const id = sandbox.sandboxId;
    expect((await curlHeaders(sandbox, 'http://other.test/headers'))['x-token']).toBeUndefined();

    const set = await fetch(`${net.info.apiUrl}/v1/sandboxes/${id}/network`, {
      method: 'PUT',
      headers,
      body: JSON.stringify({
        rules: { '*.test': [{ transform: { headers: { 'X-Token': '${secrets.native-token}' } } }] },
      }),
    });
    expect(set.status).toBe(200);
    expect((await curlHeaders(sandbox, 'http://other.test/headers'))['x-token']).toBe(
      'native-value-1',
    );
    const shown = (await (
      await fetch(`${net.info.apiUrl}/v1/sandboxes/${id}`, { headers })
    ).json()) as { network: { rules: unknown } };
    expect(shown.network.rules).toEqual({
      '*.test': [{ transform: { headers: { 'X-Token': '${secrets.native-token}' } } }],
    });

    // A bad rule is a 400 naming it; the rules in place stay.
    const bad = await fetch(`${net.info.apiUrl}/v1/sandboxes/${id}/network`, {
      method: 'PUT',
      headers,
      body: JSON.stringify({ rules: { 'a.test': [{ transform: { headers: { 'X Y': 'v' } } }] } }),
    });
    expect(bad.status).toBe(400);
    expect(await bad.text()).toContain("'X Y' is not a header name");

    // E2B's updateNetwork replaces the whole configuration: rules left out are cleared.
    await sandbox.updateNetwork({ allowOut: ['other.test'] });
    expect((await curlHeaders(sandbox, 'http://other.test/headers'))['x-token']).toBeUndefined();
  }, 240_000);
  test("a revoked key's secrets are used no more, even by the sandbox it leaves running", async () => {
    const admin = {
      authorization: `Bearer ${net.opts.apiKey}`,
      'content-type': 'application/json',
    };
    const made = await fetch(`${net.info.apiUrl}/v1/keys`, {
      method: 'POST',
      headers: admin,
      body: JSON.stringify({ name: 'carol' }),
    });
    const carol = (await made.json()) as { id: string; key: string };
    const opts = { ...net.opts, apiKey: carol.key };
    await Secret.create('carol-token', 'carol-value', opts);
    const sandbox = await Sandbox.create({
      ...opts,
      network: {
        rules: {
          'other.test': [{ transform: { headers: { 'X-Carol': Secret.fill('carol-token') } } }],
        },
      },
    });
    net.made.push(sandbox);
    expect((await curlHeaders(sandbox, 'http://other.test/headers'))['x-carol']).toBe(
      'carol-value',
    );
    const revoked = await fetch(`${net.info.apiUrl}/v1/keys/${carol.id}`, {
      method: 'DELETE',
      headers: admin,
    });
    expect(revoked.status).toBe(200);
    // Its sandbox runs on (no --kill), but its requests that need the secret fail closed.
    const after = await run(
      sandbox,
      "curl -s -m 10 -o /dev/null -w '%{http_code}' http://other.test/headers",
    );
    expect(after).toBe('403');
  }, 240_000);
});
