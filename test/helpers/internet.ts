import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { asHostUid } from './host-ns.js';
import { deleteNetns } from './netns.js';
import { makeTestCertificates } from './test-ca.js';

/** Why a test internet cannot be made here, or undefined. */
export function internetUnavailable(): string | undefined {
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  for (const [tool, pkg] of [
    ['ip', 'iproute2'],
    ['nft', 'nftables'],
    ['slirp4netns', 'slirp4netns'],
    ['openssl', 'openssl'],
  ] as const) {
    if (spawnSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' }).status !== 0) {
      return `no '${tool}' command (Debian's ${pkg}; scripts/setup-system.sh installs it)`;
    }
  }
  return undefined;
}

/**
 * A stand-in for the internet, wholly on this machine: two network namespaces joined by a veth
 * pair and nothing else, so there is no route out. The first (`ns`, `path`) is the egress
 * namespace a daemon is given, the stand-in for the host: its link has `hostAddress`
 * (198.51.100.1), a public-looking address of its own, where a service bound to `0.0.0.0`
 * (`hostPort`, HTTP, logged as `host <address> <url>` in `hits`) stands for the host's SSH or
 * database. The second holds the servers: its `lo` carries TEST-NET addresses (RFC 5737), routed
 * to over the link. Each server address serves HTTP on
 * 80 and 8080, HTTPS on 443 (a certificate for every name below, from a CA made here) and a line
 * echo on 7000; every request is logged (`hits`) with the address it reached, so a test can check
 * that a refused request never arrived. Names resolve through `hostsFile` (ABX_EGRESS_HOSTS).
 *
 * Downloads: `/bytes/N` is N bytes of `x`, cheap to serve; `/pattern/N` is N bytes of a random
 * block of {@link PATTERN_BLOCK} bytes repeated (made per run), whose SHA-256 `patternSha256(N)`
 * gives: a prime length, so no read or segment boundary lines up with it, and a lost,
 * repeated or reordered piece changes the hash. Uploads: `/sink` reads the request's body and
 * answers with its length in bytes.
 */
export interface TestInternet {
  ns: string;
  /** The namespace's path, what `--egress-netns` takes. */
  path: string;
  /** With `owner`: the user namespace of that uid which owns the namespace (`--egress-userns`). */
  userns?: string;
  hostsFile: string;
  caCert: string;
  addresses: { allowed: string; denied: string; other: string };
  /** The egress namespace's own address, on its link to the servers' namespace. */
  hostAddress: string;
  /** The servers' namespace (`ip netns exec` it to serve more at `addresses`). */
  serversNs: string;
  /** The port of the egress namespace's own service, bound to 0.0.0.0. */
  hostPort: number;
  /** Every request the servers received: `http|https|tcp <address> <host or line>`. */
  hits(): string[];
  /** The SHA-256 (hex) of what `/pattern/<size>` sends. */
  patternSha256(size: number): string;
  remove(): void;
}

export const TEST_NAMES = {
  'allowed.test': 'allowed',
  'www.allowed.test': 'allowed',
  'api.wild.test': 'other',
  'denied.test': 'denied',
  'other.test': 'other',
  'loopback.test': '127.0.0.1',
  'metadata.test': '169.254.169.254',
  'private.test': '10.1.2.3',
  'host.test': '198.51.100.1',
} as const;

/** The egress namespace's own address (the host's, in production): see {@link TestInternet}. */
export const HOST_ADDRESS = '198.51.100.1';
/** The address of the servers' namespace on the link. */
const FAR_LINK_ADDRESS = '198.51.100.254';
/** The port of the egress namespace's own service. */
export const HOST_PORT = 8081;

/** The egress namespace's own service: what a host binds to all its addresses. */
const HOST_SERVER = `
require('node:http').createServer((req, res) => {
  process.stdout.write('host ' + req.socket.localAddress + ' ' + req.url + '\\n');
  res.end('the host service answered on ' + req.socket.localAddress + '\\n');
}).listen(Number(process.argv[2]), '0.0.0.0', () => process.stdout.write('ready\\n'));
`;

/** The length of `/pattern/N`'s repeated block: a prime, a little under 64 KiB. */
export const PATTERN_BLOCK = 65_521;

const SERVER = `
const fs = require('node:fs');
const [cert, key] = [fs.readFileSync(process.argv[2]), fs.readFileSync(process.argv[3])];
const block = fs.readFileSync(process.argv[4]);
const log = (line) => process.stdout.write(line + '\\n');
const handler = (scheme) => (req, res) => {
  log(scheme + ' ' + req.socket.localAddress + ' ' + req.headers.host + ' ' + req.url);
  if (req.url.startsWith('/pattern/')) {
    const size = Number(req.url.slice(9));
    res.writeHead(200, { 'content-length': size });
    let left = size;
    const pump = () => {
      while (left > 0) {
        const n = Math.min(left, block.length);
        left -= n;
        if (!res.write(n === block.length ? block : block.subarray(0, n))) return res.once('drain', pump);
      }
      res.end();
    };
    return pump();
  }
  if (req.url.startsWith('/bytes/')) {
    const size = Number(req.url.slice(7));
    res.writeHead(200, { 'content-length': size });
    const chunk = Buffer.alloc(65536, 120);
    let left = size;
    const pump = () => {
      while (left > 0) {
        const n = Math.min(left, chunk.length);
        left -= n;
        if (!res.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return res.once('drain', pump);
      }
      res.end();
    };
    return pump();
  }
  // What a request arrived with (header rules' tests), and a redirect to another URL.
  if (req.url.startsWith('/headers')) {
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify(req.headers));
  }
  if (req.url.startsWith('/redirect/')) {
    res.writeHead(302, { location: decodeURIComponent(req.url.slice(10)) });
    return res.end();
  }
  if (req.url === '/sink') {
    let size = 0;
    req.on('data', (chunk) => { size += chunk.length; });
    return req.on('end', () => res.end(String(size)));
  }
  res.end(scheme + ' hello from ' + req.socket.localAddress + ' for ' + req.headers.host + '\\n');
};
require('node:http').createServer(handler('http')).listen(80, '0.0.0.0');
require('node:http').createServer(handler('http')).listen(8080, '0.0.0.0');
require('node:https').createServer({ cert, key }, handler('https')).listen(443, '0.0.0.0');
require('node:net').createServer((s) => {
  s.once('data', (d) => { log('tcp ' + s.localAddress + ' ' + d.toString().trim()); s.end('echo ' + d); });
}).listen(7000, '0.0.0.0', () => log('ready'));
`;

/**
 * `owner`: the namespace belongs to a user namespace of that uid (made by a process of that uid),
 * as a rootless daemon's egress namespace must; it is named the same way, and its files are
 * readable by all.
 */
export async function makeInternet(options: { owner?: number } = {}): Promise<TestInternet> {
  const suffix = randomBytes(3).toString('hex');
  const ns = `abxinet-${suffix}`;
  const far = `abxfar-${suffix}`;
  const dir = mkdtempSync(join(tmpdir(), 'abx-internet-'));
  let userns: string | undefined;
  const addresses = { allowed: '203.0.113.10', denied: '198.51.100.7', other: '192.0.2.44' };
  const ip = (...args: string[]) => execFileSync('ip', args, { stdio: 'pipe' });
  let server: ChildProcess | undefined;
  let hostServer: ChildProcess | undefined;
  const lines: string[] = [];
  const block = randomBytes(PATTERN_BLOCK);
  const patternSha256 = (size: number) => {
    const hash = createHash('sha256');
    for (let left = size; left > 0; left -= block.length) {
      hash.update(left >= block.length ? block : block.subarray(0, left));
    }
    return hash.digest('hex');
  };
  const remove = () => {
    server?.kill('SIGKILL');
    hostServer?.kill('SIGKILL');
    deleteNetns(far);
    deleteNetns(ns);
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    if (options.owner === undefined) ip('netns', 'add', ns);
    else userns = await ownedNamespace(ns, options.owner);
    chmodSync(dir, 0o755);
    ip('-n', ns, 'link', 'set', 'lo', 'up');
    ip('netns', 'add', far);
    ip('-n', far, 'link', 'set', 'lo', 'up');
    // The link: the egress side has the host's address, the servers' side one of its own; each
    // side has routes to what the other holds, and neither has a default route.
    const [hostEnd, farEnd] = [`abxe-${suffix}`, `abxf-${suffix}`];
    ip('link', 'add', hostEnd, 'type', 'veth', 'peer', 'name', farEnd);
    ip('link', 'set', hostEnd, 'netns', ns);
    ip('link', 'set', farEnd, 'netns', far);
    ip('-n', ns, 'addr', 'add', `${HOST_ADDRESS}/32`, 'dev', hostEnd);
    ip('-n', far, 'addr', 'add', `${FAR_LINK_ADDRESS}/32`, 'dev', farEnd);
    ip('-n', ns, 'link', 'set', hostEnd, 'up');
    ip('-n', far, 'link', 'set', farEnd, 'up');
    ip('-n', far, 'route', 'add', `${HOST_ADDRESS}/32`, 'dev', farEnd);
    for (const address of [FAR_LINK_ADDRESS, ...Object.values(addresses)]) {
      if (address !== FAR_LINK_ADDRESS) ip('-n', far, 'addr', 'add', `${address}/32`, 'dev', 'lo');
      ip('-n', ns, 'route', 'add', `${address}/32`, 'dev', hostEnd);
    }
    const certs = makeTestCertificates(dir, Object.keys(TEST_NAMES));
    const hosts = Object.entries(TEST_NAMES).map(
      ([name, where]) =>
        `${where in addresses ? addresses[where as keyof typeof addresses] : where} ${name}`,
    );
    const hostsFile = join(dir, 'hosts');
    writeFileSync(hostsFile, `${hosts.join('\n')}\n`);
    const script = join(dir, 'server.cjs');
    writeFileSync(script, SERVER);
    const blockFile = join(dir, 'pattern');
    writeFileSync(blockFile, block);
    server = spawn(
      'ip',
      ['netns', 'exec', far, process.execPath, script, certs.cert, certs.key, blockFile],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const hostScript = join(dir, 'host-server.cjs');
    writeFileSync(hostScript, HOST_SERVER);
    hostServer = spawn(
      'ip',
      ['netns', 'exec', ns, process.execPath, hostScript, String(HOST_PORT)],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    for (const child of [server, hostServer]) {
      let buffered = '';
      child.stdout?.on('data', (chunk: Buffer) => {
        buffered += chunk.toString();
        const parts = buffered.split('\n');
        buffered = parts.pop() ?? '';
        lines.push(...parts);
      });
    }
    const deadline = Date.now() + 15_000;
    while (lines.filter((l) => l === 'ready').length < 2) {
      if (Date.now() > deadline || server.exitCode !== null || hostServer.exitCode !== null) {
        throw new Error('the test internet servers did not start');
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    return {
      ns,
      path: `/run/netns/${ns}`,
      ...(userns ? { userns } : {}),
      hostsFile,
      caCert: certs.caCert,
      addresses,
      hostAddress: HOST_ADDRESS,
      serversNs: far,
      hostPort: HOST_PORT,
      hits: () => lines.filter((l) => l !== 'ready'),
      patternSha256,
      remove,
    };
  } catch (error) {
    remove();
    throw error;
  }
}

/**
 * A network namespace owned by a new user namespace of `uid` (its root mapped to `uid`), held by
 * a `sleep` of that uid and named `ns` like `ip netns add`'s; the user namespace's path.
 */
export async function ownedNamespace(ns: string, uid: number): Promise<string> {
  const [command, ...args] = [
    ...asHostUid(uid),
    'unshare',
    '--user',
    '--map-root-user',
    '--net',
    'sleep',
    'infinity',
  ];
  const holder = spawn(command, args, { detached: true, stdio: 'ignore' });
  holder.unref();
  const ours = readlinkSync('/proc/self/ns/net');
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      if (readlinkSync(`/proc/${holder.pid}/ns/net`) !== ours) break;
    } catch {
      // not yet
    }
    if (Date.now() > deadline || holder.exitCode !== null) {
      holder.kill('SIGKILL');
      throw new Error(`the namespace of uid ${uid} was not made`);
    }
    await new Promise((r) => setTimeout(r, 10));
  }
  execFileSync('ip', ['netns', 'attach', ns, String(holder.pid)], { stdio: 'pipe' });
  return `/proc/${holder.pid}/ns/user`;
}
