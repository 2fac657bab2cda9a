import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, test } from 'vitest';
import {
  addressKey,
  clientRow,
  isLoopbackAddress,
  loopbackPeerUid,
} from '../../src/control/peer-uid.js';

// The uid of a local client of a loopback TCP connection, found in /proc/net/tcp[6] (identd's
// method): a real connection from a child process run as another uid is named that uid.

const isRoot = process.getuid?.() === 0;
const servers: Server[] = [];
afterEach(() => {
  for (const server of servers.splice(0)) server.close();
});

/** A server on `host`; resolves with its port and the next connection's peer uid. */
async function listen(
  host: string,
): Promise<{ port: number; next: Promise<[Socket, number | undefined]> }> {
  let accept: (value: [Socket, number | undefined]) => void = () => undefined;
  const next = new Promise<[Socket, number | undefined]>((resolve) => {
    accept = resolve;
  });
  const server = createServer((socket) => accept([socket, loopbackPeerUid(socket)]));
  servers.push(server);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, resolve);
  });
  return { port: (server.address() as { port: number }).port, next };
}

describe('loopbackPeerUid', () => {
  test.skipIf(!isRoot)(
    'a client running as uid 65534 is named 65534',
    async () => {
      const { port, next } = await listen('127.0.0.1');
      // bash's /dev/tcp: no program of a folder uid 65534 may not search (node is under /root's).
      const child = spawn(
        'setpriv',
        [
          '--reuid=65534',
          '--regid=65534',
          '--clear-groups',
          'bash',
          '-c',
          `exec 3<>/dev/tcp/127.0.0.1/${port}; read -r -t 10 line <&3`,
        ],
        { stdio: 'ignore' },
      );
      const exited = new Promise((resolve) => child.once('exit', resolve));
      try {
        const [socket, uid] = await next;
        expect(uid).toBe(65534);
        socket.end('bye\n');
        expect(await exited).toBe(0);
      } finally {
        child.kill('SIGKILL');
      }
    },
    15_000,
  );

  test('a connection of this process itself (the gateway forwarding) has no local uid', async () => {
    const { port, next } = await listen('127.0.0.1');
    const client = connect(port, '127.0.0.1');
    try {
      const [socket, uid] = await next;
      expect(uid).toBeUndefined();
      // The row is there all the same: it is this process's own.
      expect(clientRow(socket, [readFileSync('/proc/net/tcp', 'utf8')])?.uid).toBe(
        process.getuid?.(),
      );
      socket.destroy();
    } finally {
      client.destroy();
    }
  });

  test('addresses: loopback or not, IPv4 and IPv6 rows', () => {
    expect(isLoopbackAddress('127.0.0.1')).toBe(true);
    expect(isLoopbackAddress('127.3.2.1')).toBe(true);
    expect(isLoopbackAddress('::1')).toBe(true);
    expect(isLoopbackAddress('::ffff:127.0.0.1')).toBe(true);
    expect(isLoopbackAddress('10.0.0.5')).toBe(false);
    expect(isLoopbackAddress('::2')).toBe(false);
    expect(isLoopbackAddress('fe80::1%eth0')).toBe(false);
    expect(addressKey('::ffff:127.0.0.1')).toBe(addressKey('127.0.0.1'));
    expect(addressKey('2001:db8::1')).toBe('20010db8000000000000000000000001');
    // Rows as the kernel writes them (a little-endian host): a client on ::ffff:127.0.0.1:40000
    // to the daemon at 127.0.0.1:8080 in tcp6, and one on [::1]:40001 to [::1]:8080.
    const header =
      '  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n';
    const tcp6 =
      header +
      '   0: 0000000000000000FFFF00000100007F:9C40 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 4242 1\n' +
      '   1: 00000000000000000000000001000000:9C41 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000  1002        0 4343 1\n';
    const ends = (remoteAddress: string, remotePort: number, localAddress: string) => ({
      remoteAddress,
      remotePort,
      localAddress,
      localPort: 8080,
    });
    expect(clientRow(ends('::ffff:127.0.0.1', 40000, '::ffff:127.0.0.1'), [tcp6])?.uid).toBe(1001);
    expect(clientRow(ends('::1', 40001, '::1'), [tcp6])?.uid).toBe(1002);
    // The daemon's own end of the connection is never taken for the client's.
    expect(clientRow(ends('::1', 8080, '::1'), [tcp6])).toBeUndefined();
    expect(clientRow(ends('::1', 40002, '::1'), [tcp6])).toBeUndefined();
    expect(loopbackPeerUid(ends('10.0.0.5', 40000, '10.0.0.1'))).toBeUndefined();
  });
});
