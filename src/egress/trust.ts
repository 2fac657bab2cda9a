import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * What a sandbox on `internet` trusts beside its system's CAs: the egress proxy's CA
 * (egress-ca.ts), which lets egress read HTTPS to a host with header rules. The CA's key is
 * never here: only its certificate, and the files and variables that point tools at it.
 */

/** The system CA bundles a Linux distribution keeps, in the order tools look for them. */
const SYSTEM_BUNDLES = [
  '/etc/ssl/certs/ca-certificates.crt',
  '/etc/pki/tls/certs/ca-bundle.crt',
  '/etc/ssl/ca-bundle.pem',
  '/etc/ssl/cert.pem',
];

/** The host's system CA bundle (PEM), empty when it has none. */
export function hostBundle(): string {
  for (const path of SYSTEM_BUNDLES) {
    try {
      return readFileSync(path, 'utf8');
    } catch {
      // the next one
    }
  }
  return '';
}

/** A bundle (PEM) with the egress CA added at its end, labelled. */
export function trustBundle(base: string, caCert: string): string {
  const body = base.length === 0 || base.endsWith('\n') ? base : `${base}\n`;
  return `${body}# abx egress proxy CA: HTTPS to hosts with header rules (docs/network.md)\n${caCert}`;
}

/** Where a sandbox on `internet` finds the CA alone and the bundle with it (its own /run/abx). */
export const SANDBOX_CA_FILE = '/run/abx/egress-ca.pem';
export const SANDBOX_BUNDLE_FILE = '/run/abx/ca-certificates.crt';

/**
 * The variables that point a sandbox's tools at the bundle: OpenSSL (curl, Python's ssl, git,
 * wget), curl's own, requests, pip; Node adds the CA to its built-in store.
 */
export function trustEnv(): Record<string, string> {
  return {
    SSL_CERT_FILE: SANDBOX_BUNDLE_FILE,
    CURL_CA_BUNDLE: SANDBOX_BUNDLE_FILE,
    REQUESTS_CA_BUNDLE: SANDBOX_BUNDLE_FILE,
    PIP_CERT: SANDBOX_BUNDLE_FILE,
    NODE_EXTRA_CA_CERTS: SANDBOX_CA_FILE,
  };
}

/**
 * The one copy of a bundle kept in `dir` for every sandbox that trusts the same (named by its
 * SHA-256, mode 0444, written once by rename, so no reader sees half of it): its path. Bound
 * read-only into each sandbox, its pages are in memory once for all of them, where bwrap's
 * --ro-bind-data made a copy in each sandbox's memory, twice (/run/abx and the system's bundle:
 * 2 × 215 KiB a sandbox here, issue 50). `dir` must be one every sandbox uid may enter.
 */
export function sharedBundle(dir: string, content: string): string {
  const file = join(dir, `${createHash('sha256').update(content).digest('hex')}.pem`);
  if (!existsSync(file)) {
    mkdirSync(dir, { recursive: true });
    // Whatever the daemon's umask: every sandbox uid reads it, none writes it.
    chmodSync(dir, 0o755);
    const part = `${file}.${process.pid}.part`;
    writeFileSync(part, content);
    chmodSync(part, 0o444);
    renameSync(part, file);
  }
  return file;
}
