/**
 * The host uid of a local client of the daemon's API (docs/workspaces.md, "Who may mount what"):
 * the user a process runs as when it reaches the API over loopback TCP. The kernel lists every
 * TCP socket with its owner's uid in /proc/net/tcp and /proc/net/tcp6; the client's socket is the
 * row whose local end is the connection's remote end and whose remote end is the daemon's local
 * one (identd's method, RFC 1413, without the protocol). A connection that is not on loopback, or
 * whose row is not found, or whose client is the daemon itself (its gateway forwarding a request
 * that came from elsewhere), has no local uid.
 */
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { isIPv4, isIPv6 } from 'node:net';

/** The two ends of a TCP connection as Node's socket has them. */
export interface ConnectionEnds {
  localAddress?: string | undefined;
  localPort?: number | undefined;
  remoteAddress?: string | undefined;
  remotePort?: number | undefined;
}

/** An address as 16 bytes (an IPv4 one as IPv4-mapped IPv6), hex; undefined if not an IP. */
export function addressKey(address: string): string | undefined {
  if (isIPv4(address)) {
    const bytes = address.split('.').map((part) => Number(part));
    return `00000000000000000000ffff${Buffer.from(bytes).toString('hex')}`;
  }
  if (!isIPv6(address)) return undefined;
  let text = address.toLowerCase().split('%')[0] as string;
  // A trailing IPv4 part (::ffff:127.0.0.1) as two groups.
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (dotted) {
    const [a, b, c, d] = (dotted[1] as string).split('.').map((part) => Number(part)) as number[];
    const tail = `${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
    text = text.slice(0, dotted.index) + tail;
  }
  const [head, rest] = text.split('::') as [string, string | undefined];
  const left = head === '' ? [] : head.split(':');
  const right = rest === undefined || rest === '' ? [] : rest.split(':');
  const groups =
    rest === undefined
      ? left
      : [...left, ...Array(8 - left.length - right.length).fill('0'), ...right];
  if (groups.length !== 8) return undefined;
  return groups.map((group) => group.padStart(4, '0')).join('');
}

/** Whether an address is a loopback one (127.0.0.0/8, ::1, ::ffff:127.x.y.z). */
export function isLoopbackAddress(address: string): boolean {
  const key = addressKey(address);
  if (key === undefined) return false;
  return key === `${'0'.repeat(31)}1` || key.startsWith('00000000000000000000ffff7f');
}

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([0x0102]).buffer)[0] === 0x02;

/** A /proc/net/tcp[6] address (`0100007F:1F90`: words in host byte order) as addressKey's form. */
function procAddress(field: string): { key: string; port: number } | undefined {
  const [hex, portHex] = field.split(':') as [string, string | undefined];
  if (portHex === undefined || !/^[0-9A-Fa-f]+$/.test(hex)) return undefined;
  // Each 32-bit word is printed as the host holds it in memory: on a little-endian host, the
  // address's bytes in reverse within each word.
  const word = (text: string) =>
    LITTLE_ENDIAN ? Buffer.from(text, 'hex').reverse().toString('hex') : text;
  let key: string;
  if (hex.length === 8) key = `00000000000000000000ffff${word(hex)}`;
  else if (hex.length === 32)
    key = [0, 8, 16, 24].map((at) => word(hex.slice(at, at + 8))).join('');
  else return undefined;
  return { key: key.toLowerCase(), port: Number.parseInt(portHex, 16) };
}

/** One socket of /proc/net/tcp[6]: its ends, owner uid and inode. */
export interface TcpRow {
  local: { key: string; port: number };
  remote: { key: string; port: number };
  uid: number;
  inode: number;
}

/** The rows of a /proc/net/tcp or tcp6 text (the header line skipped). */
export function parseTcpTable(text: string): TcpRow[] {
  const rows: TcpRow[] = [];
  for (const line of text.split('\n').slice(1)) {
    const fields = line.trim().split(/\s+/);
    if (fields.length < 10) continue;
    const local = procAddress(fields[1] as string);
    const remote = procAddress(fields[2] as string);
    if (!local || !remote) continue;
    rows.push({ local, remote, uid: Number(fields[7]), inode: Number(fields[9]) });
  }
  return rows;
}

/** The row of the client's socket of a connection, from the tables given; undefined if none. */
export function clientRow(ends: ConnectionEnds, tables: readonly string[]): TcpRow | undefined {
  const { localAddress, localPort, remoteAddress, remotePort } = ends;
  if (!localAddress || !remoteAddress || localPort === undefined || remotePort === undefined) {
    return undefined;
  }
  const server = addressKey(localAddress);
  const client = addressKey(remoteAddress);
  if (server === undefined || client === undefined) return undefined;
  for (const table of tables) {
    for (const row of parseTcpTable(table)) {
      if (
        row.local.key === client &&
        row.local.port === remotePort &&
        row.remote.key === server &&
        row.remote.port === localPort
      ) {
        return row;
      }
    }
  }
  return undefined;
}

/** The inodes of the sockets this process holds. */
function ownSocketInodes(): Set<number> {
  const inodes = new Set<number>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      const match = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/self/fd/${fd}`));
      if (match) inodes.add(Number(match[1]));
    } catch {
      // closed meanwhile
    }
  }
  return inodes;
}

/**
 * The uid and socket inode of the process at the other end of a loopback connection to this
 * process, or undefined: not on loopback, its socket not listed (closed meanwhile), or held by
 * this process itself (the daemon's gateway forwarding a request: its client is not local).
 */
export function loopbackPeer(ends: ConnectionEnds): { uid: number; inode: number } | undefined {
  if (!ends.remoteAddress || !isLoopbackAddress(ends.remoteAddress)) return undefined;
  const tables: string[] = [];
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    try {
      tables.push(readFileSync(file, 'utf8'));
    } catch {
      // no IPv6 (or no /proc): what is there is read
    }
  }
  const row = clientRow(ends, tables);
  if (!row || ownSocketInodes().has(row.inode)) return undefined;
  return { uid: row.uid, inode: row.inode };
}

/** The host uid of the process at the other end of a loopback connection ({@link loopbackPeer}). */
export function loopbackPeerUid(ends: ConnectionEnds): number | undefined {
  return loopbackPeer(ends)?.uid;
}
