import { X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { type AddressInfo, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect, TLSSocket } from 'node:tls';
import { afterAll, describe, expect, test } from 'vitest';
import { ensureEgressCa, LEAF_DAYS, LeafCertificates } from '../../src/egress/egress-ca.js';
import { trustBundle } from '../../src/egress/trust.js';

/**
 * The egress proxy's CA (issue 45): made once per folder, its key 0600; the host certificates it
 * signs verify against it for their name only, and a real TLS client that trusts the CA accepts
 * them (and one that does not, refuses).
 */
describe('the egress CA', () => {
  const dir = mkdtempSync(join(tmpdir(), 'abx-egress-ca-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test('made once: the same CA on every call, even at once; the key is 0600', async () => {
    const made = await Promise.all([0, 1, 2].map(() => ensureEgressCa(join(dir, 'ca'))));
    const again = await ensureEgressCa(join(dir, 'ca'));
    for (const ca of made) expect(ca.cert).toBe(again.cert);
    expect(statSync(again.keyFile).mode & 0o777).toBe(0o600);
    const cert = new X509Certificate(again.cert);
    expect(cert.ca).toBe(true);
    expect(new Date(cert.validTo).getTime() - Date.now()).toBeGreaterThan(9 * 365 * 86_400_000);
  });

  test("a host's certificate verifies for that name only, and a client that trusts the CA accepts it", async () => {
    const ca = await ensureEgressCa(join(dir, 'ca'));
    const leaves = new LeafCertificates({
      cert: ca.cert,
      key: readFileSync(ca.keyFile, 'utf8'),
    });
    const context = await leaves.contextFor('api.test');
    // The same context again (kept), and one for another name (not the same).
    expect(await leaves.contextFor('api.test')).toBe(context);
    expect(await leaves.contextFor('other.test')).not.toBe(context);

    const server = createServer((socket) => {
      const secure = new TLSSocket(socket, { isServer: true, secureContext: context });
      secure.on('error', () => socket.destroy());
      secure.on('secure', () => secure.end('hello'));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as AddressInfo).port;
    const handshake = (servername: string, trusted: string | undefined) =>
      new Promise<{ ok: true; peer: X509Certificate } | { ok: false; why: string }>((resolve) => {
        const socket = connect({
          host: '127.0.0.1',
          port,
          servername,
          ...(trusted ? { ca: trusted } : {}),
        });
        socket.once('secureConnect', () => {
          const peer = socket.getPeerX509Certificate() as X509Certificate;
          socket.destroy();
          resolve({ ok: true, peer });
        });
        socket.once('error', (error) => resolve({ ok: false, why: error.message }));
      });
    try {
      const good = await handshake('api.test', trustBundle('', ca.cert));
      expect(good.ok).toBe(true);
      if (good.ok) {
        expect(good.peer.subjectAltName).toBe('DNS:api.test');
        expect(good.peer.verify(new X509Certificate(ca.cert).publicKey)).toBe(true);
        const days = (new Date(good.peer.validTo).getTime() - Date.now()) / 86_400_000;
        expect(days).toBeGreaterThan(LEAF_DAYS - 1);
        expect(days).toBeLessThanOrEqual(LEAF_DAYS);
      }
      // Another name on the same certificate, or a client without the CA: refused.
      const wrongName = await handshake('evil.test', ca.cert);
      expect(wrongName).toMatchObject({ ok: false });
      expect((wrongName as { why: string }).why).toMatch(/evil\.test/);
      expect(await handshake('api.test', undefined)).toMatchObject({ ok: false });
    } finally {
      server.close();
    }
  });
});
