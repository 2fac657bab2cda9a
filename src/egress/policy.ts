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
}

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
  return {
    allow: list(policy.allowOut, 'allowOut'),
    deny: list(policy.denyOut, 'denyOut'),
    ...(rules ? { rules } : {}),
  };
}

/** The policy in canonical form (each entry as parsePolicy writes it, duplicates dropped). */
export function normalizePolicy(policy: EgressPolicy, where?: string): EgressPolicy {
  const parsed = parsePolicy(policy, where);
  return {
    allowOut: parsed.allow.map((e) => e.text),
    denyOut: parsed.deny.map((e) => e.text),
    ...(parsed.rules ? { rules: parsed.rules } : {}),
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
