import 'reflect-metadata';
import { createPrivateKey, randomBytes, webcrypto } from 'node:crypto';

type CryptoKey = webcrypto.CryptoKey;
type CryptoKeyPair = webcrypto.CryptoKeyPair;

import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createSecureContext, type SecureContext } from 'node:tls';
import * as x509 from '@peculiar/x509';

/**
 * The egress proxy's certificate authority: what lets it read a sandbox's HTTPS to a host that
 * has header rules (docs/network.md, "HTTPS to a host with rules"). One per installation, made on
 * first use in `$ABX_HOME/egress-ca/` (`ca.pem`, and `ca.key` mode 0600, never readable by a
 * sandbox: it lives on the host, outside every sandbox's mounts). A sandbox on the `internet`
 * network trusts `ca.pem` (and only it): see trust.ts. Certificates it signs are made in
 * the egress process, for the hosts a rule names, and nowhere else.
 */
x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

const ALGORITHM = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
/** How long the CA is valid: a sandbox adopted by a later daemon keeps trusting the same one. */
const CA_YEARS = 10;
/** How long a host's certificate is valid; the egress process makes a new one a day before. */
export const LEAF_DAYS = 7;
const DAY_MS = 86_400_000;

export interface EgressCa {
  /** The CA's certificate, PEM. */
  cert: string;
  certFile: string;
  keyFile: string;
}

/** The CA in `dir`, made there first when it has none (the key with mode 0600). */
export async function ensureEgressCa(dir: string): Promise<EgressCa> {
  const certFile = join(dir, 'ca.pem');
  const keyFile = join(dir, 'ca.key');
  if (existsSync(certFile) && existsSync(keyFile)) {
    return { cert: readFileSync(certFile, 'utf8'), certFile, keyFile };
  }
  mkdirSync(dirname(dir), { recursive: true, mode: 0o700 });
  const keys = (await webcrypto.subtle.generateKey(ALGORITHM, true, [
    'sign',
    'verify',
  ])) as CryptoKeyPair;
  const now = Date.now();
  const ca = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: randomBytes(16)
      .toString('hex')
      .replace(/^[89a-f]/, '7'),
    name: `CN=abx egress proxy CA ${randomBytes(4).toString('hex')}, O=abx-sandbox`,
    notBefore: new Date(now - DAY_MS),
    notAfter: new Date(now + CA_YEARS * 365 * DAY_MS),
    keys,
    signingAlgorithm: ALGORITHM,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(
        x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign,
        true,
      ),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  const key = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey));
  const keyPem = `-----BEGIN PRIVATE KEY-----\n${key
    .toString('base64')
    .replace(/.{64}/g, '$&\n')
    .replace(/\n?$/, '\n')}-----END PRIVATE KEY-----\n`;
  const cert = ca.toString('pem').replace(/\r\n/g, '\n').replace(/\n?$/, '\n');
  // Made whole in a folder beside, then renamed into place: of two daemons starting at once, one
  // folder lands and the other finds it there (a rename onto a folder with files fails) and
  // uses it, so every egress process and every sandbox of the installation has the same CA.
  const staged = `${dir}.${process.pid}.${randomBytes(4).toString('hex')}`;
  mkdirSync(staged, { mode: 0o700 });
  try {
    writeFileSync(join(staged, 'ca.key'), keyPem, { mode: 0o600 });
    writeFileSync(join(staged, 'ca.pem'), cert, { mode: 0o644 });
    try {
      renameSync(staged, dir);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== 'ENOTEMPTY' && code !== 'EEXIST') throw error;
    }
  } finally {
    rmSync(staged, { recursive: true, force: true });
  }
  return { cert: readFileSync(certFile, 'utf8'), certFile, keyFile };
}

/** Most host certificates kept at once (each is a few hundred bytes and a TLS context). */
const MAX_LEAVES = 512;

/**
 * Signs host certificates with the CA, in the egress process: one key for all of them (made
 * once), one certificate per host name, kept until a day before it ends.
 */
export class LeafCertificates {
  private readonly caKey: Promise<CryptoKey>;
  private readonly caCert: x509.X509Certificate;
  private readonly caPem: string;
  private readonly leafKeys: Promise<CryptoKeyPair>;
  private readonly made = new Map<string, Promise<{ context: SecureContext; until: number }>>();

  constructor(ca: { cert: string; key: string }) {
    this.caPem = ca.cert;
    this.caCert = new x509.X509Certificate(ca.cert);
    const der = createPrivateKey(ca.key).export({ format: 'der', type: 'pkcs8' });
    this.caKey = webcrypto.subtle.importKey('pkcs8', der, ALGORITHM, false, ['sign']);
    this.leafKeys = webcrypto.subtle.generateKey(ALGORITHM, true, [
      'sign',
      'verify',
    ]) as Promise<CryptoKeyPair>;
  }

  /** A TLS context that presents a certificate for `name` (a canonical DNS name). */
  async contextFor(name: string): Promise<SecureContext> {
    const kept = this.made.get(name);
    if (kept) {
      const { context, until } = await kept;
      if (until - Date.now() > DAY_MS) return context;
      this.made.delete(name);
    }
    const making = this.issue(name);
    this.made.set(name, making);
    making.catch(() => this.made.delete(name));
    if (this.made.size > MAX_LEAVES) {
      this.made.delete(this.made.keys().next().value as string);
    }
    return (await making).context;
  }

  private async issue(name: string): Promise<{ context: SecureContext; until: number }> {
    const keys = await this.leafKeys;
    const now = Date.now();
    const until = Math.min(now + LEAF_DAYS * DAY_MS, this.caCert.notAfter.getTime());
    const cert = await x509.X509CertificateGenerator.create({
      serialNumber: randomBytes(16)
        .toString('hex')
        .replace(/^[89a-f]/, '7'),
      subject: `CN=${name}`,
      issuer: this.caCert.subject,
      notBefore: new Date(now - 3_600_000),
      notAfter: new Date(until),
      publicKey: keys.publicKey,
      signingKey: await this.caKey,
      signingAlgorithm: ALGORITHM,
      extensions: [
        new x509.BasicConstraintsExtension(false, undefined, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
        new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth], false),
        new x509.SubjectAlternativeNameExtension([{ type: 'dns', value: name }], false),
        await x509.AuthorityKeyIdentifierExtension.create(this.caCert, false),
      ],
    });
    const key = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey));
    const context = createSecureContext({
      cert: `${cert.toString('pem')}\n${this.caPem}`,
      key: createPrivateKey({ key, format: 'der', type: 'pkcs8' }).export({
        format: 'pem',
        type: 'pkcs8',
      }),
    });
    return { context, until };
  }
}
