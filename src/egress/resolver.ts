import { Resolver } from 'node:dns/promises';
import { readFileSync } from 'node:fs';
import ipaddr from 'ipaddr.js';
import { canonicalName } from './policy.js';

/**
 * How the egress service finds a name's addresses: names from a hosts file first
 * (`ABX_EGRESS_HOSTS`, hosts-file format; tests name their servers this way), then the
 * resolvers of the egress namespace's /etc/resolv.conf. IPv4 only: sandboxes have no IPv6 route.
 */
export class NameResolver {
  private readonly hosts = new Map<string, string[]>();
  private readonly dns = new Resolver({ timeout: 2_000, tries: 2 });

  constructor(options: { hostsFile?: string } = {}) {
    if (options.hostsFile) this.load(readFileSync(options.hostsFile, 'utf8'));
  }

  private load(text: string): void {
    for (const raw of text.split('\n')) {
      const [address, ...names] = raw.replace(/#.*/, '').trim().split(/\s+/);
      if (!address || names.length === 0 || !ipaddr.IPv4.isValidFourPartDecimal(address)) continue;
      for (const n of names) {
        const name = canonicalName(n);
        if (!name) continue;
        const list = this.hosts.get(name) ?? [];
        if (!list.includes(address)) list.push(address);
        this.hosts.set(name, list);
      }
    }
  }

  /** The IPv4 addresses of `name` and how long they may be kept; [] when it has none. */
  async resolve(name: string): Promise<{ addresses: string[]; ttl: number }> {
    const listed = this.hosts.get(name);
    if (listed) return { addresses: listed, ttl: 60 };
    try {
      const records = await this.dns.resolve4(name, { ttl: true });
      return {
        addresses: records.map((r) => r.address),
        ttl: Math.max(1, Math.min(300, ...records.map((r) => r.ttl))),
      };
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === 'ENOTFOUND' || code === 'ENODATA') return { addresses: [], ttl: 30 };
      throw new Error(`cannot resolve ${name}: ${code ?? (error as Error).message}`);
    }
  }
}
