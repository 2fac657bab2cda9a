import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A SOCKS5 server (RFC 1928 CONNECT, RFC 1929 username and password when given) for tests: it
 * logs each request as the client sent it, `connect name allowed.test:80` (ATYP 3) or
 * `connect address 203.0.113.10:7000` (ATYP 1), and `auth failed USER` for wrong credentials
 * (never a password). Names resolve through a hosts file only.
 */
const SERVER = `
const net = require('node:net');
const fs = require('node:fs');
const [host, port, hostsFile, user, pass] = process.argv.slice(2);
const hosts = new Map();
for (const line of fs.readFileSync(hostsFile, 'utf8').split('\\n')) {
  const [address, ...names] = line.trim().split(/\\s+/);
  for (const name of names) if (!hosts.has(name)) hosts.set(name, address);
}
const log = (line) => process.stdout.write(line + '\\n');
const reply = (code) => Buffer.from([5, code, 0, 1, 0, 0, 0, 0, 0, 0]);
net.createServer((client) => {
  client.on('error', () => {});
  let buffer = Buffer.alloc(0);
  let stage = 'greeting';
  const onData = (chunk) => {
    buffer = Buffer.concat([buffer, chunk]);
    for (;;) {
      if (stage === 'greeting') {
        if (buffer.length < 2 || buffer.length < 2 + buffer[1]) return;
        if (buffer[0] !== 5) return client.destroy();
        const methods = [...buffer.subarray(2, 2 + buffer[1])];
        buffer = buffer.subarray(2 + buffer[1]);
        const wanted = user ? 2 : 0;
        if (!methods.includes(wanted)) {
          log('refused: no acceptable method');
          return client.end(Buffer.from([5, 0xff]));
        }
        client.write(Buffer.from([5, wanted]));
        stage = user ? 'auth' : 'request';
      } else if (stage === 'auth') {
        if (buffer.length < 2) return;
        const ulen = buffer[1];
        if (buffer.length < 3 + ulen) return;
        const plen = buffer[2 + ulen];
        if (buffer.length < 3 + ulen + plen) return;
        const u = buffer.subarray(2, 2 + ulen).toString();
        const p = buffer.subarray(3 + ulen, 3 + ulen + plen).toString();
        buffer = buffer.subarray(3 + ulen + plen);
        if (u !== user || p !== pass) {
          log('auth failed ' + u);
          return client.end(Buffer.from([1, 1]));
        }
        client.write(Buffer.from([1, 0]));
        stage = 'request';
      } else {
        if (buffer.length < 5) return;
        const atyp = buffer[3];
        let target;
        let end;
        if (atyp === 1) {
          end = 10;
          if (buffer.length < end) return;
          target = [...buffer.subarray(4, 8)].join('.');
        } else if (atyp === 3) {
          end = 7 + buffer[4];
          if (buffer.length < end) return;
          target = buffer.subarray(5, 5 + buffer[4]).toString();
        } else return client.end(reply(8));
        const port = buffer.readUInt16BE(end - 2);
        const rest = buffer.subarray(end);
        client.off('data', onData);
        log('connect ' + (atyp === 3 ? 'name ' : 'address ') + target + ':' + port);
        const address = atyp === 3 ? hosts.get(target) : target;
        if (!address) return client.end(reply(4));
        let connected = false;
        const upstream = net.connect({ host: address, port }, () => {
          connected = true;
          client.write(reply(0));
          if (rest.length > 0) upstream.write(rest);
          client.pipe(upstream);
          upstream.pipe(client);
        });
        upstream.on('error', () => (connected ? client.destroy() : client.end(reply(5))));
        client.on('close', () => upstream.destroy());
        return;
      }
    }
  };
  client.on('data', onData);
}).listen(Number(port), host, () => log('ready'));
`;

export interface Socks5Server {
  /** Where it listens, as `host:port`. */
  address: string;
  /** What it logged so far (see above). */
  log(): string[];
  close(): void;
}

/**
 * Starts the server in the network namespace `netns` (`ip netns exec`), on `host:port`; with
 * `username` and `password`, it takes only those.
 */
export async function startSocks5Server(options: {
  netns: string;
  host: string;
  port: number;
  hostsFile: string;
  username?: string;
  password?: string;
}): Promise<Socks5Server> {
  const dir = mkdtempSync(join(tmpdir(), 'abx-socks5-'));
  const script = join(dir, 'socks5.cjs');
  writeFileSync(script, SERVER);
  const child = spawn(
    'ip',
    [
      'netns',
      'exec',
      options.netns,
      process.execPath,
      script,
      options.host,
      String(options.port),
      options.hostsFile,
      ...(options.username ? [options.username, options.password ?? ''] : []),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const lines: string[] = [];
  let buffered = '';
  child.stdout.on('data', (chunk: Buffer) => {
    buffered += chunk.toString();
    const parts = buffered.split('\n');
    buffered = parts.pop() ?? '';
    lines.push(...parts);
  });
  const close = () => {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 10_000;
  while (!lines.includes('ready')) {
    if (Date.now() > deadline || child.exitCode !== null) {
      close();
      throw new Error('the SOCKS5 test server did not start');
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    address: `${options.host}:${options.port}`,
    log: () => lines.filter((l) => l !== 'ready'),
    close,
  };
}
