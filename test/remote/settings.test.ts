import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, test } from 'vitest';
import { Daemon } from '../../src/control/daemon.js';
import { InvalidArgumentError } from '../../src/errors.js';
import { remoteControlPlane } from '../../src/installation/control-connection.js';
import {
  checkPublicListen,
  gatewayOrigin,
  parseListenAddress,
  sandboxUrl,
} from '../../src/installation/public-listen.js';
import { MemoryProvider } from '../helpers/memory-provider.js';

describe('daemon listen settings', () => {
  test('HOST:PORT, [IPv6]:PORT and :PORT parse; anything else names the option and an example', () => {
    expect(parseListenAddress('10.0.0.5:8443', '--listen')).toEqual({
      host: '10.0.0.5',
      port: 8443,
    });
    expect(parseListenAddress('[::]:8443', '--listen')).toEqual({ host: '::', port: 8443 });
    expect(parseListenAddress(':8443', '--listen')).toEqual({ host: '0.0.0.0', port: 8443 });
    for (const bad of ['8443', 'host', 'a:b', '1.2.3.4:70000', '[nope]:1', '::1:80']) {
      expect(() => parseListenAddress(bad, '--gateway-listen')).toThrow(
        /--gateway-listen must be HOST:PORT|--gateway-listen: 'nope' in brackets/,
      );
    }
  });

  test('plain HTTP beyond loopback needs insecure; loopback and TLS do not; the gateway defaults to port + 1', () => {
    const api = { host: '0.0.0.0', port: 8443 };
    expect(() => checkPublicListen({ api })).toThrow(
      /refusing to serve plain HTTP on 0\.0\.0\.0, which is not a loopback address.*--insecure/,
    );
    expect(() =>
      checkPublicListen({
        api: { host: '127.0.0.1', port: 8080 },
        gateway: { host: '10.1.1.1', port: 80 },
      }),
    ).toThrow(/plain HTTP on 10\.1\.1\.1/);
    expect(checkPublicListen({ api, insecure: true }).gateway).toEqual({
      host: '0.0.0.0',
      port: 8444,
    });
    expect(checkPublicListen({ api: { host: '127.0.0.1', port: 8080 } }).gateway.port).toBe(8081);
    expect(checkPublicListen({ api, tls: { cert: 'c', key: 'k' } }).gateway.port).toBe(8444);
    expect(() => checkPublicListen({ api, insecure: true, publicUrl: 'ftp://x' })).toThrow(
      /--public-url/,
    );
  });

  test('gateway URLs: the scheme of TLS, the port unless standard, or what --public-url says', () => {
    expect(gatewayOrigin({ domain: 'sb.example.com', tls: true, port: 8444 })).toBe(
      'https://sb.example.com:8444',
    );
    expect(gatewayOrigin({ domain: 'sb.example.com', tls: true, port: 443 })).toBe(
      'https://sb.example.com',
    );
    expect(gatewayOrigin({ domain: 'sb.example.com', tls: false, port: 80 })).toBe(
      'http://sb.example.com',
    );
    expect(
      gatewayOrigin({
        domain: 'sb.example.com',
        tls: false,
        port: 8081,
        publicUrl: 'https://sb.example.com',
      }),
    ).toBe('https://sb.example.com');
    expect(sandboxUrl('https://sb.example.com', 'i1', 3000)).toBe('https://3000-i1.sb.example.com');
    expect(sandboxUrl('http://localhost:4000', 'i1', 49983)).toBe('http://49983-i1.localhost:4000');
  });

  test('a daemon refuses plain HTTP beyond loopback and a bad domain before touching its home', () => {
    const home = join(mkdtempSync(join(tmpdir(), 'abx-listen-')), 'home');
    try {
      const provider = new MemoryProvider();
      expect(
        () => new Daemon({ home, provider, listen: { api: { host: '10.9.9.9', port: 8443 } } }),
      ).toThrow(/--insecure/);
      expect(() => new Daemon({ home, provider, domain: 'bad_domain!' })).toThrow(
        /--domain must be a DNS name/,
      );
      expect(() => new Daemon({ home, provider, domain: 'x'.repeat(250) })).toThrow(
        InvalidArgumentError,
      );
      expect(existsSync(home)).toBe(false);
    } finally {
      rmSync(join(home, '..'), { recursive: true, force: true });
    }
  });
});

describe('client settings', () => {
  test('no API URL: the local installation', () => {
    expect(remoteControlPlane({}, {})).toBeUndefined();
    // An explicit home is the local installation, whatever the environment says.
    expect(
      remoteControlPlane({ home: '/tmp/x' }, { ABX_API_URL: 'https://a.example' }),
    ).toBeUndefined();
  });

  test('an API URL needs a key, and is an origin', () => {
    expect(() => remoteControlPlane({}, { ABX_API_URL: 'https://abx.example.com:8443' })).toThrow(
      'ABX_API_URL names the abx control plane at https://abx.example.com:8443, but no API key is given: set ABX_API_KEY',
    );
    expect(() => remoteControlPlane({ apiUrl: 'abx.example.com', apiKey: 'k' }, {})).toThrow(
      "apiUrl must be a URL such as https://abx.example.com:8443, not 'abx.example.com'",
    );
    expect(() =>
      remoteControlPlane({}, { ABX_API_URL: 'https://a.example/v1', ABX_API_KEY: 'k' }),
    ).toThrow(/ABX_API_URL must be an http\(s\) URL with no path/);
    expect(
      remoteControlPlane({}, { ABX_API_URL: 'https://a.example:8443/', ABX_API_KEY: 'k' }),
    ).toEqual({
      apiUrl: 'https://a.example:8443',
      apiKey: 'k',
      peer: 'the abx control plane at https://a.example:8443',
    });
  });

  test('a CA file that is missing or holds no certificate is named', () => {
    const dir = mkdtempSync(join(tmpdir(), 'abx-ca-'));
    try {
      const env = { ABX_API_URL: 'https://a.example', ABX_API_KEY: 'k' };
      expect(() => remoteControlPlane({}, { ...env, ABX_CA_CERT: join(dir, 'none.pem') })).toThrow(
        `ABX_CA_CERT names ${join(dir, 'none.pem')}, which does not exist`,
      );
      writeFileSync(join(dir, 'junk.pem'), 'not a certificate');
      expect(() => remoteControlPlane({ caCert: join(dir, 'junk.pem') }, env)).toThrow(
        'which holds no PEM certificate',
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
