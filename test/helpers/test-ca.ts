import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** A CA made for one test run, and a server certificate it signed. */
export interface TestCertificates {
  /** The CA's certificate (PEM file): what clients trust. */
  caCert: string;
  /** The server's certificate and key (PEM files). */
  cert: string;
  key: string;
}

/**
 * Makes a throwaway CA and a server certificate for `names` (DNS names, `*.` wildcards allowed)
 * and `ips` in `dir`, with Debian's openssl CLI.
 */
export function makeTestCertificates(
  dir: string,
  names: string[],
  ips: string[] = [],
): TestCertificates {
  const file = (name: string) => join(dir, name);
  const openssl = (...args: string[]) => execFileSync('openssl', args, { stdio: 'pipe' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  openssl(
    'req',
    '-x509',
    ...ec,
    '-keyout',
    file('ca.key'),
    '-out',
    file('ca.pem'),
    '-days',
    '2',
    '-subj',
    '/CN=abx test CA',
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign,cRLSign',
  );
  openssl(
    'req',
    '-new',
    ...ec,
    '-keyout',
    file('server.key'),
    '-out',
    file('server.csr'),
    '-subj',
    `/CN=${names[0] ?? ips[0] ?? 'abx'}`,
  );
  const san = [...names.map((n) => `DNS:${n}`), ...ips.map((ip) => `IP:${ip}`)].join(',');
  writeFileSync(
    file('server.ext'),
    `subjectAltName=${san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n`,
  );
  openssl(
    'x509',
    '-req',
    '-in',
    file('server.csr'),
    '-CA',
    file('ca.pem'),
    '-CAkey',
    file('ca.key'),
    '-CAcreateserial',
    '-out',
    file('server.pem'),
    '-days',
    '2',
    '-extfile',
    file('server.ext'),
  );
  return { caCert: file('ca.pem'), cert: file('server.pem'), key: file('server.key') };
}
