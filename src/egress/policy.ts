import ipaddr from 'ipaddr.js';
import { type HostRules, parseHostRules } from './header-rules.js';

/**
 * A sandbox's egress policy, as users write it (E2B's `network.allowOut` and `denyOut`): entries
 * are IPv4 or IPv6 CIDRs (a bare address is one host), exact domain names, or `*.` wildcard
 * domains. An allow entry wins over a deny entry; what neither names is allowed. Whatever the
 * lists say, the always-denied ranges stay denied (see ALWAYS_DENIED) unless the daemon's
 * operator permits a range by name.
 */
export interface EgressPolicy {
  allowOut: string[];
  denyOut: string[];
  /**
   * Per-host header rules (header-rules.ts), placeholders and never values. A host named here is
   * not allowed by that: the lists decide, as in E2B.
   */
  rules?: HostRules;
  /**
   * The user's own SOCKS5 proxy (E2B's `network.egressProxy`): what the policy allows leaves
   * through it rather than directly, asked for by name when the sandbox asked by name. Its
   * password is kept with the sandbox but never shown: see {@link publicPolicy}.
   */
  egressProxy?: EgressProxy;
}

/** A SOCKS5 proxy of the user's (RFC 1928), with RFC 1929 credentials when it takes them. */
export interface EgressProxy {
  /** `host:port`: a domain name, an IPv4 address or an `[IPv6]` address, and a port. */
  address: string;
  /** 1 to 255 bytes. */
  username?: string;
  /** 1 to 255 bytes, with a username only. */
  password?: string;
}

/** An egress proxy as parsePolicy reads it: the host (no brackets) and port apart. */
export type ParsedProxy = EgressProxy & { host: string; port: number };

/** A policy as it is shown outside egress and the registry: the proxy without its password. */
export type PublicPolicy = Omit<EgressPolicy, 'egressProxy'> & {
  egressProxy?: Omit<EgressProxy, 'password'>;
};

/** Most entries one list may hold: a policy is checked on every connection. */
export const MAX_ENTRIES = 256;

export type Entry =
  | { kind: 'cidr'; text: string; range: [ipaddr.IPv4 | ipaddr.IPv6, number] }
  | { kind: 'domain'; text: string; name: string }
  | { kind: 'wildcard'; text: string; suffix: string };

/** A policy entry that is neither a CIDR nor a domain name, with where it was. */
export class PolicyError extends Error {
  override name = 'PolicyError';
}

const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

/** A domain name in canonical form (lower case, no trailing dot), or undefined if it is none. */
export function canonicalName(text: string): string | undefined {
  const name = text.toLowerCase().replace(/\.$/, '');
  if (name.length === 0 || name.length > 253) return undefined;
  const labels = name.split('.');
  // A name of digits and dots only is an address someone mistyped, not a name.
  if (labels.every((l) => /^\d+$/.test(l))) return undefined;
  return labels.every((l) => LABEL.test(l)) ? name : undefined;
}

/** Reads one entry; `where` names it in the error (for example `allowOut[2]`). */
export function parseEntry(text: unknown, where: string): Entry {
  if (typeof text !== 'string' || text.trim() === '') {
    throw new PolicyError(`${where} must be a CIDR, a domain name or a *.domain wildcard`);
  }
  const value = text.trim();
  if (value.includes('/')) {
    try {
      const range = ipaddr.parseCIDR(value);
      // Written canonically: the network address and its length (10.1.2.3/8 is 10.0.0.0/8).
      const network =
        range[0].kind() === 'ipv4'
          ? ipaddr.IPv4.networkAddressFromCIDR(value)
          : ipaddr.IPv6.networkAddressFromCIDR(value);
      return {
        kind: 'cidr',
        text: `${network.toString()}/${range[1]}`,
        range: [network, range[1]],
      };
    } catch {
      throw new PolicyError(`${where}: '${value}' is not a valid CIDR (for example 10.0.0.0/8)`);
    }
  }
  if (ipaddr.isValid(value)) {
    const address = ipaddr.parse(value);
    const bits = address.kind() === 'ipv4' ? 32 : 128;
    return { kind: 'cidr', text: `${address.toString()}/${bits}`, range: [address, bits] };
  }
  if (value.startsWith('*.')) {
    const suffix = canonicalName(value.slice(2));
    if (!suffix) throw new PolicyError(`${where}: '${value}' is not a valid *.domain wildcard`);
    return { kind: 'wildcard', text: `*.${suffix}`, suffix };
  }
  const name = canonicalName(value);
  if (!name) {
    throw new PolicyError(
      `${where}: '${value}' is neither a CIDR, an IP address, a domain name nor a *.domain wildcard`,
    );
  }
  return { kind: 'domain', text: name, name };
}

export interface ParsedPolicy {
  allow: Entry[];
  deny: Entry[];
  rules?: HostRules;
  egressProxy?: ParsedProxy;
}

/**
 * Reads an egress proxy (`where` names it in errors, as `network.egressProxy`); undefined when
 * absent. Nothing here says what the address reaches: that is decided where it is dialled.
 */
export function parseEgressProxy(value: unknown, where: string): ParsedProxy | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw new PolicyError(
      `${where} must be an object { address: 'host:port', username?, password? }`,
    );
  }
  const { address, username, password, ...rest } = value as Record<string, unknown>;
  const other = Object.keys(rest)[0];
  if (other !== undefined) {
    throw new PolicyError(
      `${where}.${other} is not an egress proxy key (address, username, password)`,
    );
  }
  if (typeof address !== 'string') {
    throw new PolicyError(
      `${where}.address must be a string host:port (for example proxy.example.com:1080)`,
    );
  }
  const match = /^(?:\[([^\]]*)\]|([^:[\]]+)):(\d{1,5})$/.exec(address.trim());
  if (!match) {
    throw new PolicyError(
      `${where}.address: '${address}' is not host:port (a domain name, an IPv4 address or an [IPv6] address, then a port, for example proxy.example.com:1080)`,
    );
  }
  const port = Number(match[3]);
  if (port < 1 || port > 65_535) {
    throw new PolicyError(`${where}.address: port ${match[3]} is not between 1 and 65535`);
  }
  let host: string;
  if (match[1] !== undefined) {
    if (!ipaddr.IPv6.isValid(match[1])) {
      throw new PolicyError(`${where}.address: '[${match[1]}]' is not an IPv6 address`);
    }
    host = ipaddr.IPv6.parse(match[1]).toString();
  } else {
    const text = match[2] as string;
    if (ipaddr.IPv4.isValidFourPartDecimal(text)) host = ipaddr.IPv4.parse(text).toString();
    else if (ipaddr.isValid(text)) {
      // 127.1, 0x7f000001: an address someone could mean otherwise; said one way only.
      throw new PolicyError(
        `${where}.address: '${text}' is an IPv4 address not written as a.b.c.d; write it that way`,
      );
    } else {
      const name = canonicalName(text);
      if (!name) {
        throw new PolicyError(
          `${where}.address: '${text}' is neither a domain name nor an IP address`,
        );
      }
      host = name;
    }
  }
  // RFC 1929 carries each in 1 to 255 bytes. The values are never put in a message.
  const credential = (given: unknown, key: 'username' | 'password'): string | undefined => {
    if (given === undefined || given === null) return undefined;
    if (typeof given !== 'string') throw new PolicyError(`${where}.${key} must be a string`);
    const bytes = Buffer.byteLength(given);
    if (bytes < 1 || bytes > 255) {
      throw new PolicyError(`${where}.${key} is ${bytes} bytes; SOCKS5 (RFC 1929) takes 1 to 255`);
    }
    return given;
  };
  const user = credential(username, 'username');
  const secret = credential(password, 'password');
  if (secret !== undefined && user === undefined) {
    throw new PolicyError(`${where}.password needs a username (SOCKS5 sends them together)`);
  }
  return {
    address: host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`,
    host,
    port,
    ...(user === undefined ? {} : { username: user }),
    ...(secret === undefined ? {} : { password: secret }),
  };
}

/** Checks and reads a policy; throws a PolicyError naming the first bad entry. */
export function parsePolicy(policy: EgressPolicy, where = 'network'): ParsedPolicy {
  const list = (entries: unknown, key: 'allowOut' | 'denyOut'): Entry[] => {
    if (entries === undefined) return [];
    if (!Array.isArray(entries)) throw new PolicyError(`${where}.${key} must be an array`);
    if (entries.length > MAX_ENTRIES) {
      throw new PolicyError(
        `${where}.${key} has ${entries.length} entries; at most ${MAX_ENTRIES}`,
      );
    }
    const seen = new Set<string>();
    const out: Entry[] = [];
    for (const [i, text] of entries.entries()) {
      const entry = parseEntry(text, `${where}.${key}[${i}]`);
      if (seen.has(entry.text)) continue;
      seen.add(entry.text);
      out.push(entry);
    }
    return out;
  };
  const rules = parseHostRules(policy.rules, `${where}.rules`);
  const egressProxy = parseEgressProxy(policy.egressProxy, `${where}.egressProxy`);
  return {
    allow: list(policy.allowOut, 'allowOut'),
    deny: list(policy.denyOut, 'denyOut'),
    ...(rules ? { rules } : {}),
    ...(egressProxy ? { egressProxy } : {}),
  };
}

/** The policy in canonical form (each entry as parsePolicy writes it, duplicates dropped). */
export function normalizePolicy(policy: EgressPolicy, where?: string): EgressPolicy {
  const parsed = parsePolicy(policy, where);
  const proxy = parsed.egressProxy;
  return {
    allowOut: parsed.allow.map((e) => e.text),
    denyOut: parsed.deny.map((e) => e.text),
    ...(parsed.rules ? { rules: parsed.rules } : {}),
    ...(proxy
      ? {
          egressProxy: {
            address: proxy.address,
            ...(proxy.username === undefined ? {} : { username: proxy.username }),
            ...(proxy.password === undefined ? {} : { password: proxy.password }),
          },
        }
      : {}),
  };
}

/**
 * A policy as every answer, page and log shows it: the egress proxy's address and username, never
 * its password. Each place that shows a sandbox's network outward goes through this.
 */
export function publicPolicy(policy: EgressPolicy): PublicPolicy {
  const { egressProxy, ...rest } = policy;
  if (!egressProxy) return rest;
  return {
    ...rest,
    egressProxy: {
      address: egressProxy.address,
      ...(egressProxy.username === undefined ? {} : { username: egressProxy.username }),
    },
  };
}

/**
 * E2B's `allowInternetAccess: false`: every address denied, the allow list still winning (as in
 * E2B, where it is `denyOut: ['0.0.0.0/0']`).
 */
export function withoutInternet(policy: EgressPolicy): EgressPolicy {
  return normalizePolicy({ ...policy, denyOut: [...policy.denyOut, '0.0.0.0/0', '::/0'] });
}

/** Ranges no sandbox reaches whatever its policy says, each with why. */
export const ALWAYS_DENIED: ReadonlyArray<{ cidr: string; what: string }> = [
  { cidr: '127.0.0.0/8', what: "the host's loopback" },
  { cidr: '::1/128', what: "the host's loopback" },
  { cidr: '0.0.0.0/8', what: "'this network' (0.0.0.0 reaches the host)" },
  { cidr: '::/128', what: 'the unspecified address' },
  { cidr: '169.254.0.0/16', what: 'link-local (cloud metadata at 169.254.169.254)' },
  { cidr: 'fe80::/10', what: 'link-local' },
  { cidr: '10.0.0.0/8', what: 'private (RFC 1918)' },
  { cidr: '172.16.0.0/12', what: 'private (RFC 1918)' },
  { cidr: '192.168.0.0/16', what: 'private (RFC 1918)' },
  { cidr: '100.64.0.0/10', what: 'shared address space (RFC 6598, carrier NAT and some clouds)' },
  { cidr: 'fc00::/7', what: 'unique local (ULA)' },
  { cidr: '224.0.0.0/4', what: 'multicast' },
  { cidr: 'ff00::/8', what: 'multicast' },
  { cidr: '255.255.255.255/32', what: 'broadcast' },
  { cidr: '::ffff:0:0/96', what: 'IPv4-mapped IPv6 (checked as IPv4 instead)' },
];

export interface Decision {
  allowed: boolean;
  /** The rule that decided, as a user reads it: `allowOut pypi.org`, `always denied: …`. */
  rule: string;
}

function inRange(address: ipaddr.IPv4 | ipaddr.IPv6, range: Entry & { kind: 'cidr' }): boolean {
  const [network, bits] = range.range;
  return address.kind() === network.kind() && address.match([network, bits] as never);
}

function nameMatches(name: string, entry: Entry): boolean {
  if (entry.kind === 'domain') return entry.name === name;
  if (entry.kind === 'wildcard') return name.endsWith(`.${entry.suffix}`);
  return false;
}

/** An address as one kind: IPv4-mapped IPv6 addresses are read as the IPv4 they carry. */
export function plainAddress(text: string): ipaddr.IPv4 | ipaddr.IPv6 {
  const address = ipaddr.parse(text);
  if (address.kind() === 'ipv6' && (address as ipaddr.IPv6).isIPv4MappedAddress()) {
    return (address as ipaddr.IPv6).toIPv4Address();
  }
  return address;
}

/** The rule that refuses an address of the egress namespace (the host's own, outside tests). */
export function hostAddressRule(address: string): string {
  return `always denied: an address of this host (${address})`;
}

/**
 * The decider of one daemon: the always-denied ranges, less what its operator permits by name
 * (`--egress-permit CIDR`), plus the daemon's own listener addresses and every address of the
 * egress namespace's interfaces (`hostAddresses`, read at each decision).
 */
export class EgressRules {
  private readonly always: Array<Entry & { kind: 'cidr' }>;
  private readonly permitted: Array<Entry & { kind: 'cidr' }>;
  private readonly hostAddresses: () => ReadonlySet<string>;

  constructor(
    options: {
      permit?: string[];
      alsoDeny?: Array<{ cidr: string; what: string }>;
      /** The egress namespace's addresses now, canonical (see HostAddresses). */
      hostAddresses?: () => ReadonlySet<string>;
    } = {},
  ) {
    this.hostAddresses = options.hostAddresses ?? (() => new Set());
    const cidr = (text: string, where: string) =>
      parseEntry(text, where) as Entry & { kind: 'cidr' };
    this.always = [...ALWAYS_DENIED, ...(options.alsoDeny ?? [])].map(({ cidr: c, what }) => ({
      ...cidr(c, 'always denied'),
      text: `always denied: ${what} (${c})`,
    }));
    this.permitted = (options.permit ?? []).map((c, i) => {
      const entry = parseEntry(c, `--egress-permit[${i}]`);
      if (entry.kind !== 'cidr') {
        throw new PolicyError(`--egress-permit takes CIDRs only; '${c}' is not one`);
      }
      return entry;
    });
  }

  /** The operator's permitted ranges, canonical. */
  get permits(): string[] {
    return this.permitted.map((e) => e.text);
  }

  /** Whether `address` is always denied (and not permitted by the operator): the rule, or undefined. */
  alwaysDenied(addressText: string): string | undefined {
    const address = plainAddress(addressText);
    if (this.permitted.some((p) => inRange(address, p))) return undefined;
    const range = this.always.find((r) => inRange(address, r))?.text;
    if (range) return range;
    const text = address.toString();
    return this.hostAddresses().has(text) ? hostAddressRule(text) : undefined;
  }

  /**
   * Whether a connection may go to `address` (the address that is dialled), asked for by `name`
   * when known (the DNS question, the Host header or the TLS server name).
   */
  decide(policy: ParsedPolicy, target: { name?: string; address?: string }): Decision {
    const address = target.address === undefined ? undefined : plainAddress(target.address);
    if (address) {
      const always = this.alwaysDenied(address.toString());
      if (always) return { allowed: false, rule: always };
    }
    const name = target.name === undefined ? undefined : canonicalName(target.name);
    for (const entry of policy.allow) {
      if (name && nameMatches(name, entry))
        return { allowed: true, rule: `allowOut ${entry.text}` };
      if (address && entry.kind === 'cidr' && inRange(address, entry)) {
        return { allowed: true, rule: `allowOut ${entry.text}` };
      }
    }
    for (const entry of policy.deny) {
      if (name && nameMatches(name, entry))
        return { allowed: false, rule: `denyOut ${entry.text}` };
      if (address && entry.kind === 'cidr' && inRange(address, entry)) {
        return { allowed: false, rule: `denyOut ${entry.text}` };
      }
    }
    if (!address) {
      // A name no entry names, under a policy that denies every IPv4 address it could have
      // (and allows no range): refused as such, without a lookup.
      const all = policy.deny.find((e) => e.kind === 'cidr' && e.text === '0.0.0.0/0');
      const someRange = policy.allow.some((e) => e.kind === 'cidr' && e.range[0].kind() === 'ipv4');
      if (all && !someRange) return { allowed: false, rule: `denyOut ${all.text}` };
    }
    return { allowed: true, rule: 'default (no entry names it)' };
  }
}
