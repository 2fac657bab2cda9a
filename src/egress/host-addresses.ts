import { type ChildProcess, spawn } from 'node:child_process';
import { networkInterfaces } from 'node:os';
import ipaddr from 'ipaddr.js';

/**
 * How often the addresses are read again even when no netlink event came: the backstop for an
 * `ip monitor` that could not start or ended. The longest a new address can stay open to raw TCP.
 */
export const HOST_ADDRESSES_REREAD_MS = 1_000;

/**
 * Every address assigned to an interface of the namespace this process runs in, IPv4 and IPv6,
 * canonical (ipaddr.js's form, IPv6 without a zone), sorted. `getifaddrs` asks the kernel each
 * time (libuv keeps no cache), so this is what is assigned now.
 */
export function interfaceAddresses(): string[] {
  const found = new Set<string>();
  for (const list of Object.values(networkInterfaces())) {
    for (const info of list ?? []) {
      const text = info.address.replace(/%.*$/, '');
      if (ipaddr.isValid(text)) found.add(ipaddr.parse(text).toString());
    }
  }
  return [...found].sort();
}

/**
 * The addresses of the egress namespace (the host's own, outside tests), which no sandbox may
 * dial: a service the host binds to `0.0.0.0` answers on each of them, private or not.
 *
 * Kept current two ways. Every decision of the egress proxy re-reads them ({@link current}), so
 * the proxy, CONNECT and DNS answers follow a change at once. The namespaces' nftables sets (raw
 * TCP) are refilled by `onChange`, which runs when `ip -o monitor address` reports any address
 * event (milliseconds after the change), and at the latest on the next re-read every
 * {@link HOST_ADDRESSES_REREAD_MS} ms, which also covers a monitor that could not start.
 */
export class HostAddresses {
  private addresses: string[];
  private set: ReadonlySet<string>;
  private monitor: ChildProcess | undefined;
  private timer: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(
    private readonly options: {
      /** Reads the addresses (tests give their own). */
      read?: () => string[];
      /** Told the new list whenever it differs from the last one read. */
      onChange?: (addresses: string[]) => void;
    } = {},
  ) {
    this.addresses = this.read();
    this.set = new Set(this.addresses);
  }

  private read(): string[] {
    return (this.options.read ?? interfaceAddresses)();
  }

  /** The addresses as last read (what the namespaces' sets are being filled with). */
  get list(): string[] {
    return [...this.addresses];
  }

  /** The addresses now, read again; a change is passed on to `onChange`. */
  current(): ReadonlySet<string> {
    this.refresh();
    return this.set;
  }

  /** Reads the addresses again; whether they changed. */
  refresh(): boolean {
    const next = this.read();
    if (next.length === this.addresses.length && next.every((a, i) => a === this.addresses[i])) {
      return false;
    }
    this.addresses = next;
    this.set = new Set(next);
    this.options.onChange?.([...next]);
    return true;
  }

  /** Watches for changes: the netlink monitor and the periodic re-read. */
  start(): void {
    this.timer = setInterval(() => this.refresh(), HOST_ADDRESSES_REREAD_MS);
    this.timer.unref();
    this.watch();
  }

  private watch(): void {
    if (this.closed) return;
    const monitor = spawn('ip', ['-o', 'monitor', 'address'], {
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    this.monitor = monitor;
    let pending = false;
    monitor.stdout?.on('data', () => {
      // One read for a burst of events (a link going down drops each of its addresses).
      if (pending) return;
      pending = true;
      setImmediate(() => {
        pending = false;
        this.refresh();
      });
    });
    monitor.once('error', () => undefined);
    monitor.once('exit', () => {
      if (this.monitor !== monitor || this.closed) return;
      // The re-read goes on meanwhile; a monitor that keeps failing is retried slowly.
      setTimeout(() => this.watch(), 5_000).unref();
    });
    monitor.unref();
    (monitor.stdout as unknown as { unref?: () => void } | null)?.unref?.();
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.monitor?.kill('SIGKILL');
    this.monitor = undefined;
  }
}

/**
 * What the daemon's listeners on `hosts` add to the always-denied ranges, as `--deny` CIDRs: each
 * address, and for `0.0.0.0` or `::` every address of the daemon's namespace now (it may not be
 * the egress namespace, whose own addresses egress keeps current itself). Names and addresses
 * inside an always-denied range (loopback, private) add nothing: they are refused already, and
 * nftables refuses an interval set whose elements overlap.
 */
export function listenerDenials(
  hosts: string[],
  always: ReadonlyArray<{ cidr: string }>,
  read: () => string[] = interfaceAddresses,
): string[] {
  const ranges = always.map(({ cidr }) => ipaddr.parseCIDR(cidr));
  const out = new Set<string>();
  for (const host of hosts) {
    const text = host.replace(/^\[(.*)\]$/, '$1');
    if (!ipaddr.isValid(text)) continue;
    const parsed = ipaddr.parse(text);
    const addresses = parsed.range() === 'unspecified' ? read() : [parsed.toString()];
    for (const address of addresses) {
      const one = ipaddr.parse(address);
      if (ranges.some((r) => one.kind() === r[0].kind() && one.match(r as never))) continue;
      out.add(`${one.toString()}/${one.kind() === 'ipv4' ? 32 : 128}`);
    }
  }
  return [...out].sort();
}
