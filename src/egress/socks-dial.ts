import { connect, type Socket } from 'node:net';
import ipaddr from 'ipaddr.js';
import { SocksClient } from 'socks';
import {
  canonicalName,
  type EgressPolicy,
  type EgressRules,
  type ParsedProxy,
  parseEgressProxy,
} from './policy.js';
import type { NameResolver } from './resolver.js';

/** What dialling upstream needs besides the policy: the daemon's rules and egress's resolver. */
export interface UpstreamContext {
  rules: EgressRules;
  resolver: NameResolver;
  /** How long a dial (through the proxy: its connection, handshake and CONNECT) may take. */
  timeoutMs: number;
}

/** An egress proxy that cannot be used: refused by the rules, unresolved, or its SOCKS5 failed. */
export class EgressProxyError extends Error {
  override name = 'EgressProxyError';
}

/**
 * The address to dial for the egress proxy: its IP literal, or the first address of its name
 * that no rule refuses (resolved at each dial, as a sandbox's own names are). The proxy is the
 * user's choice, but a proxy on the host's loopback or its own addresses would be a way in: the
 * always-denied ranges and the host's addresses refuse it unless the operator permitted the range.
 */
export async function proxyAddress(
  proxy: Pick<ParsedProxy, 'address' | 'host'>,
  rules: EgressRules,
  resolver: NameResolver,
): Promise<string> {
  const refused = (why: string) =>
    new EgressProxyError(
      `the egress proxy ${proxy.address} is refused: ${why}; a proxy there would let the sandbox reach this host (an operator may permit the range: ABX_EGRESS_PERMIT)`,
    );
  if (ipaddr.isValid(proxy.host)) {
    const rule = rules.alwaysDenied(proxy.host);
    if (rule) throw refused(rule);
    return proxy.host;
  }
  let addresses: string[];
  // localhost and its subdomains are the loopback (RFC 6761), never asked of a resolver.
  if (proxy.host === 'localhost' || proxy.host.endsWith('.localhost')) addresses = ['127.0.0.1'];
  else {
    try {
      addresses = (await resolver.resolve(proxy.host)).addresses;
    } catch (error) {
      throw new EgressProxyError(`the egress proxy ${proxy.address}: ${(error as Error).message}`);
    }
  }
  if (addresses.length === 0) {
    throw new EgressProxyError(`the egress proxy's name ${proxy.host} has no address`);
  }
  const usable = addresses.find((address) => !rules.alwaysDenied(address));
  if (usable) return usable;
  const first = addresses[0] as string;
  throw refused(`${rules.alwaysDenied(first)} (${proxy.host} is ${first})`);
}

/**
 * A TCP connection to `target` through a SOCKS5 proxy at `at` (an address): CONNECT with the
 * target as given, so a name goes as a name (ATYP 3) and the proxy resolves it. Username and
 * password authentication (RFC 1929) when the proxy has them, else none.
 */
export async function connectThrough(
  proxy: ParsedProxy,
  at: string,
  target: { host: string; port: number },
  timeoutMs: number,
): Promise<Socket> {
  try {
    const { socket } = await SocksClient.createConnection({
      proxy: {
        host: at,
        port: proxy.port,
        type: 5,
        ...(proxy.username === undefined ? {} : { userId: proxy.username }),
        ...(proxy.password === undefined ? {} : { password: proxy.password }),
      },
      command: 'connect',
      destination: target,
      timeout: timeoutMs,
    });
    return socket;
  } catch (error) {
    // The library's error carries its options, the password among them: only the message goes on.
    throw new EgressProxyError(
      `the egress proxy ${proxy.address}: ${(error as Error).message} (to ${target.host}:${target.port})`,
    );
  }
}

/** A plain TCP connection to `address`, once connected. */
function connected(address: string, port: number, timeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: address, port, timeout: timeoutMs });
    socket.once('timeout', () => socket.destroy(new Error('dial timed out')));
    socket.once('error', reject);
    socket.once('connect', () => {
      socket.setTimeout(0);
      socket.off('error', reject);
      resolve(socket);
    });
  });
}

/**
 * The connection a sandbox's allowed traffic leaves on: plain TCP to `address` (what egress
 * resolved and decided), or, when the policy has an egress proxy, through it to `name` (the
 * name the sandbox asked for, which the proxy resolves) or to `address` when it asked by address.
 * For every path that dials upstream (the relays here, and TLS that egress terminates).
 */
export async function upstreamSocket(
  policy: EgressPolicy,
  name: string | undefined,
  address: string,
  port: number,
  context: UpstreamContext,
): Promise<Socket> {
  const proxy = parseEgressProxy(policy.egressProxy, 'network.egressProxy');
  if (!proxy) return connected(address, port, context.timeoutMs);
  const at = await proxyAddress(proxy, context.rules, context.resolver);
  const literal = name?.replace(/^\[(.*)\]$/, '$1');
  const host =
    literal === undefined || ipaddr.isValid(literal)
      ? address
      : (canonicalName(literal) ?? address);
  return connectThrough(proxy, at, { host, port }, context.timeoutMs);
}

/**
 * Relays a sandbox's connection and an upstream one both ways; `head` (what the sandbox sent
 * already) goes first. An end is passed on once what came before it is written; an error cuts
 * both at once.
 */
export function relay(upstream: Socket, socket: Socket, head: Buffer | undefined): void {
  if (socket.destroyed) {
    upstream.destroy();
    return;
  }
  let ended = false;
  if (head && head.length > 0) upstream.write(head);
  socket.pipe(upstream);
  upstream.pipe(socket);
  upstream.once('end', () => {
    ended = true;
  });
  upstream.once('error', () => socket.destroy());
  upstream.once('close', () => {
    if (!ended || socket.writableFinished) socket.destroy();
    else socket.once('finish', () => socket.destroy());
  });
  socket.once('error', () => upstream.destroy());
  socket.once('close', () => upstream.destroy());
}
