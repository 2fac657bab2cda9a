import { execFile, spawn } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { promisify } from 'node:util';
import ipaddr from 'ipaddr.js';
import { egressEnterArgs } from './controller.js';
import { ALWAYS_DENIED, type EgressPolicy, type Entry, parsePolicy } from './policy.js';
import type { EgressPorts } from './service.js';
import { tcpAuditChains, tcpAuditSets } from './tcp-audit.js';

const run = promisify(execFile);

/** The sandbox side of slirp4netns: its gateway (the egress namespace's loopback) and DNS. */
export const SLIRP_GATEWAY = '10.0.2.2';
export const SLIRP_DNS = '10.0.2.3';
/** What a sandbox on `internet` reads as /etc/resolv.conf (every DNS packet goes to egress anyway). */
export const SANDBOX_RESOLV_CONF = `nameserver ${SLIRP_DNS}\noptions edns0 timeout:2 attempts:2\n`;
/**
 * The proxy variables of an `internet` sandbox, for tools that honour them: they send plain HTTP
 * as absolute URLs and HTTPS as CONNECT to the sandbox's egress proxy, whose refusal is an HTTP
 * 403 naming the rule (without them a denied name fails at DNS). Traffic without them is
 * captured all the same; the sandbox's own loopback is never proxied.
 */
export function proxyEnv(ports: Pick<EgressPorts, 'http'>): Record<string, string> {
  const url = `http://${SLIRP_GATEWAY}:${ports.http}`;
  const local = 'localhost,127.0.0.1,::1';
  return {
    HTTP_PROXY: url,
    HTTPS_PROXY: url,
    NO_PROXY: local,
    http_proxy: url,
    https_proxy: url,
    no_proxy: local,
  };
}

/** How long the namespace holder and slirp4netns may take to be ready. */
export const NET_START_TIMEOUT_MS = 10_000;

/** A sandbox's network namespace and what serves it, as the handle keeps it (survives restarts). */
export interface SandboxNet {
  /** The sandbox's id (what the egress service knows it by). */
  id: string;
  /** The process holding the namespace (and, rootless, the user namespace that owns it). */
  holder: number;
  holderStart: string;
  /** slirp4netns, running in the egress namespace. */
  slirp: number;
  /** Whether the holder made a user namespace (rootless): nsenter must join it too. */
  userns: boolean;
  ports: EgressPorts;
}

/** The environment tag that marks the processes of a sandbox's network (for the sweep). */
export const NET_TAG = 'ABX_SANDBOX_NET';

function startTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

/** nsenter's options that enter a sandbox's network namespace (and its owner, rootless). */
export function enterArgs(net: Pick<SandboxNet, 'holder' | 'userns'>): string[] {
  return net.userns
    ? [
        'nsenter',
        '--preserve-credentials',
        `--user=/proc/${net.holder}/ns/user`,
        `--net=/proc/${net.holder}/ns/net`,
        '--',
      ]
    : ['nsenter', `--net=/proc/${net.holder}/ns/net`, '--'];
}

function cidrs(entries: Entry[], kind: 'ipv4' | 'ipv6'): string[] {
  return entries.flatMap((e) => (e.kind === 'cidr' && e.range[0].kind() === kind ? [e.text] : []));
}

function set(name: string, elements: string[], flags = 'interval'): string {
  const body = elements.length > 0 ? ` elements = { ${elements.join(', ')} }` : '';
  return `  set ${name} { type ipv4_addr; flags ${flags};${body} }`;
}

/**
 * The nftables ruleset of a sandbox's namespace (table `inet abx`). Before address translation
 * (priority -150) it decides by address: loopback passes; DNS passes (it is redirected to the
 * egress service below); only TCP leaves; IPv6 does not; the operator's permitted ranges skip
 * the always-denied ones and the egress namespace's own addresses (`host4`, which egress keeps
 * current: {@link setHostAddresses}) and go straight to the policy (`goto`: what it does not
 * refuse passes); then allowOut CIDRs and the addresses egress's DNS answered for allowed names
 * pass, denyOut CIDRs are reset, and the rest passes. Then DNS, 80 and 443 are sent to the
 * sandbox's ports of the egress service, which decides by name. With an egress proxy, `tunnel4`
 * holds every address: TCP to a port other than 80 and 443 is reset before the policy, since only
 * what passes through egress goes through the proxy (HTTP_PROXY's CONNECT reaches any port). Raw
 * TCP is recorded for the audit trail (tcp-audit.ts) by chains of their own, which only record:
 * `audit_reset`, just before `filter_out`, follows its checks on each connection's first packet
 * and notes what it will reset and by which rule; `audit_out` and `audit_in` count what passed.
 * The sandbox has no capability in this namespace: it can neither read nor change
 * these rules.
 */
export function sandboxRuleset(
  policy: EgressPolicy,
  ports: EgressPorts,
  options: { permit?: string[]; alsoDeny?: string[]; hostAddresses?: string[] } = {},
): string {
  const parsed = parsePolicy(policy);
  const always = [...ALWAYS_DENIED.map((r) => r.cidr), ...(options.alsoDeny ?? [])].filter(
    (c) => !c.includes(':'),
  );
  return [
    'table inet abx {',
    set('always4', always),
    set('permit4', options.permit ?? []),
    set('allow4', cidrs(parsed.allow, 'ipv4')),
    set('deny4', cidrs(parsed.deny, 'ipv4')),
    set('resolved4', [], 'timeout'),
    set('host4', ipv4Only(options.hostAddresses ?? [])),
    set('tunnel4', tunnelled(policy)),
    ...tcpAuditSets(),
    '  chain filter_out {',
    '    type filter hook output priority -150; policy accept;',
    '    oif "lo" accept',
    '    meta l4proto { tcp, udp } th dport 53 accept',
    `    ip daddr ${SLIRP_GATEWAY} tcp dport { ${ports.http}, ${ports.tls} } accept`,
    '    meta nfproto ipv6 reject',
    '    meta l4proto != tcp reject',
    '    ip daddr @permit4 goto decide',
    '    ip daddr @always4 reject with tcp reset',
    '    ip daddr @host4 reject with tcp reset',
    '    jump decide',
    '  }',
    '  chain decide {',
    `    ${TUNNEL_RULE}`,
    '    ip daddr @allow4 accept',
    '    ip daddr @resolved4 accept',
    '    ip daddr @deny4 reject with tcp reset',
    '  }',
    ...tcpAuditChains(SLIRP_GATEWAY, ports),
    '  chain nat_out {',
    '    type nat hook output priority -100; policy accept;',
    '    oif "lo" return',
    `    meta l4proto { tcp, udp } th dport 53 dnat ip to ${SLIRP_GATEWAY}:${ports.dns}`,
    `    ip daddr ${SLIRP_GATEWAY} return`,
    `    tcp dport 80 dnat ip to ${SLIRP_GATEWAY}:${ports.http}`,
    `    tcp dport 443 dnat ip to ${SLIRP_GATEWAY}:${ports.tls}`,
    '  }',
    '}',
    '',
  ].join('\n');
}

/** Resets raw TCP that would leave beside the egress proxy (see {@link sandboxRuleset}). */
const TUNNEL_RULE = 'ip daddr @tunnel4 tcp dport != { 80, 443 } reject with tcp reset';

/** The `tunnel4` set: every address while the policy has an egress proxy, else none. */
function tunnelled(policy: EgressPolicy): string[] {
  return policy.egressProxy ? ['0.0.0.0/0'] : [];
}

function ipv4Only(addresses: string[]): string[] {
  return [...new Set(addresses.filter((a) => ipaddr.IPv4.isValidFourPartDecimal(a)))];
}

/**
 * Replaces the egress namespace's addresses (`host4`) in a sandbox's namespace, in one nft
 * transaction: a connection meets the old set or the new one, never an empty one.
 */
export async function setHostAddresses(
  net: Pick<SandboxNet, 'holder' | 'userns'>,
  addresses: string[],
): Promise<void> {
  const v4 = ipv4Only(addresses);
  const fill = [
    'flush set inet abx host4',
    ...(v4.length > 0 ? [`add element inet abx host4 { ${v4.join(', ')} }`] : []),
    '',
  ];
  try {
    await applyRuleset(net, fill.join('\n'));
  } catch {
    // A namespace an older daemon made (adopted) has no host4: its set and rule come first. At
    // the chain's head, ahead of DNS: `reject with tcp reset` matches TCP only.
    await applyRuleset(
      net,
      [
        'add set inet abx host4 { type ipv4_addr; flags interval; }',
        'insert rule inet abx filter_out ip daddr @host4 reject with tcp reset',
        ...fill,
      ].join('\n'),
    );
  }
}

/** Runs `nft -f -` with `ruleset` inside the sandbox's namespace. */
/** A process's network namespace (its `/proc/PID/ns/net` link), or undefined when unreadable. */
function netnsOf(pid: number | 'self'): string | undefined {
  try {
    return readlinkSync(`/proc/${pid}/ns/net`);
  } catch {
    return undefined;
  }
}

/**
 * Refuses a sandbox namespace that is this process's own or the host's (pid 1's): a holder that
 * has not unshared yet, or a pid that is not a holder, would have a sandbox's table reset the
 * host's own traffic to private ranges.
 */
export function mustBeOwnNamespace(net: Pick<SandboxNet, 'holder'>): void {
  const target = netnsOf(net.holder);
  if (target !== undefined && (target === netnsOf('self') || target === netnsOf(1))) {
    throw new Error(
      `process ${net.holder} is in this process's (or the host's) network namespace, not a sandbox's of its own: no sandbox rules are loaded into it`,
    );
  }
}

export async function applyRuleset(net: Pick<SandboxNet, 'holder' | 'userns'>, ruleset: string) {
  mustBeOwnNamespace(net);
  const [command, ...args] = [...enterArgs(net), 'nft', '-f', '-'];
  await new Promise<void>((resolve, reject) => {
    const child = spawn(command as string, args, { stdio: ['pipe', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (c: Buffer) => {
      stderr += c.toString();
    });
    child.once('error', reject);
    child.once('close', (code) =>
      code === 0
        ? resolve()
        : reject(new Error(`nft refused the sandbox's rules: ${stderr.trim()}`)),
    );
    child.stdin.end(ruleset);
  });
}

/**
 * Replaces a running sandbox's policy in its namespace: the address sets are rewritten in one
 * nft transaction, so a new connection meets either the old rules or the new ones.
 */
export async function updatePolicy(
  net: Pick<SandboxNet, 'holder' | 'userns'>,
  policy: EgressPolicy,
): Promise<void> {
  const parsed = parsePolicy(policy);
  const fill = (name: string, elements: string[]) => [
    `flush set inet abx ${name}`,
    ...(elements.length > 0 ? [`add element inet abx ${name} { ${elements.join(', ')} }`] : []),
  ];
  const lists = [
    ...fill('allow4', cidrs(parsed.allow, 'ipv4')),
    ...fill('deny4', cidrs(parsed.deny, 'ipv4')),
    'flush set inet abx resolved4',
  ];
  const tunnel = fill('tunnel4', tunnelled(policy));
  try {
    await applyRuleset(net, [...lists, ...tunnel, ''].join('\n'));
  } catch {
    // A namespace an older daemon made (adopted) has no tunnel4: without an egress proxy there
    // is nothing to reset; with one, its set and rule come first, at the head of `decide`,
    // which only TCP that is neither loopback, DNS nor to egress reaches.
    const added = policy.egressProxy
      ? [
          'add set inet abx tunnel4 { type ipv4_addr; flags interval; }',
          `insert rule inet abx decide ${TUNNEL_RULE}`,
          ...tunnel,
        ]
      : [];
    await applyRuleset(net, [...added, ...lists, ''].join('\n'));
  }
}

/**
 * Lets a sandbox dial `addresses` by address for `ttl` seconds from now (egress's DNS answered
 * them). nftables does not renew the timeout of an element added again (nft 1.0.6, Linux 6.18),
 * so each is added, deleted and added afresh in one transaction: open ones are renewed, the
 * others made, and no packet sees the set without them.
 */
export async function allowResolved(
  net: Pick<SandboxNet, 'holder' | 'userns'>,
  addresses: string[],
  ttl: number,
): Promise<void> {
  if (addresses.length === 0) return;
  const timed = addresses.map((a) => `${a} timeout ${Math.max(1, Math.round(ttl))}s`).join(', ');
  await applyRuleset(
    net,
    [
      `add element inet abx resolved4 { ${timed} }`,
      `delete element inet abx resolved4 { ${addresses.join(', ')} }`,
      `add element inet abx resolved4 { ${timed} }`,
      '',
    ].join('\n'),
  );
}

/** An address open for less than this yet is opened again (renewed) rather than taken as open. */
export const REOPEN_MARGIN_MS = 5_000;

/**
 * Opens the addresses of a sandbox's DNS answers to raw TCP ({@link allowResolved}), and skips
 * those open for a while yet: each opening is an `nsenter … nft`, and with one per DNS question,
 * 32 sandboxes resolving at once queued spawns past the resolvers' 2 s timeout, whose retries
 * queued more, until names stopped resolving (test/egress/internet-load.test.ts). A sandbox's
 * calls run one at a time, so a retried or parallel question waits for the opening under way and
 * then finds its address open. An answer from what is open carries the TTL it has left.
 */
export class ResolvedAddresses {
  /** Per sandbox: address → the earliest its element can expire (ms since the epoch). */
  private readonly open = new Map<string, Map<string, number>>();
  private readonly queues = new Map<string, Promise<unknown>>();

  constructor(
    private readonly add: (
      net: Pick<SandboxNet, 'holder' | 'userns'>,
      addresses: string[],
      ttl: number,
    ) => Promise<void> = allowResolved,
  ) {}

  /**
   * Opens `addresses` (for `ttl` seconds) in the sandbox's namespace unless they are open; the
   * TTL the DNS answer should carry: `ttl`, or what is left of an earlier opening.
   */
  allow(
    id: string,
    net: Pick<SandboxNet, 'holder' | 'userns'>,
    addresses: string[],
    ttl: number,
  ): Promise<number> {
    const run = (this.queues.get(id) ?? Promise.resolve())
      .catch(() => undefined)
      .then(() => this.allowNow(id, net, addresses, ttl));
    this.queues.set(id, run);
    const done = () => {
      if (this.queues.get(id) === run) this.queues.delete(id);
    };
    run.then(done, done);
    return run;
  }

  /** Forgets what was opened for a sandbox: its set was flushed (a new policy), or it is gone. */
  forget(id: string): void {
    this.open.delete(id);
  }

  private async allowNow(
    id: string,
    net: Pick<SandboxNet, 'holder' | 'userns'>,
    addresses: string[],
    ttl: number,
  ): Promise<number> {
    const opened = this.open.get(id) ?? new Map<string, number>();
    this.open.set(id, opened);
    const now = Date.now();
    const missing = addresses.filter((a) => (opened.get(a) ?? 0) < now + REOPEN_MARGIN_MS);
    if (missing.length > 0) {
      await this.add(net, missing, ttl);
      // Renewed after `now`: open until this at least.
      for (const address of missing) opened.set(address, now + ttl * 1000);
      for (const [address, until] of opened) if (until < now) opened.delete(address);
    }
    const left = Math.min(...addresses.map((a) => opened.get(a) as number)) - Date.now();
    return Math.max(1, Math.min(ttl, Math.floor(left / 1000)));
  }
}

function waitFor(check: () => boolean, what: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  return new Promise((resolve, reject) => {
    const tick = () => {
      if (check()) return resolve();
      if (Date.now() > deadline) return reject(new Error(`${what} within ${timeoutMs} ms`));
      setTimeout(tick, 2);
    };
    tick();
  });
}

/**
 * Makes a sandbox's network: a namespace held by a small process (rootless: inside a user
 * namespace of the daemon's uid, which is what lets it configure the namespace), its rules, and
 * slirp4netns attached from the egress namespace. Nothing leaves before the rules are in: the
 * namespace has no route until slirp4netns configures its interface. On failure, nothing is left.
 */
export async function startSandboxNet(options: {
  id: string;
  rootless: boolean;
  policy: EgressPolicy;
  ports: EgressPorts;
  /** The egress namespace (a path such as /run/netns/NAME); none: the daemon's own. */
  egressNetns?: string;
  /**
   * The user namespace that owns `egressNetns`, for a rootless daemon: the holder's user
   * namespace is made inside it, so that slirp4netns, run in the egress namespace, may join the
   * sandbox's.
   */
  egressUserns?: string;
  permit?: string[];
  alsoDeny?: string[];
  /** The egress namespace's addresses as egress last read them (it refills them on `net`). */
  hostAddresses?: string[];
  /**
   * A namespace that exists already: the pid of a process in it (a container's init), entered
   * as root. None: a holder of the sandbox's own is made.
   */
  existing?: number;
}): Promise<SandboxNet> {
  const failed = (error: unknown) =>
    new Error(`the sandbox's network did not start: ${(error as Error).message}`, { cause: error });
  if (options.existing)
    return attachNet(options, options.existing).catch((e) => Promise.reject(failed(e)));
  const env = { PATH: '/usr/sbin:/usr/bin:/sbin:/bin', [NET_TAG]: options.id };
  const argv = [
    ...(options.rootless && options.egressUserns
      ? ['nsenter', '--preserve-credentials', `--user=${options.egressUserns}`, '--']
      : []),
    'unshare',
    ...(options.rootless ? ['--user', '--map-root-user'] : []),
    '--net',
    '--',
    // The holder configures its namespace itself before it becomes `sleep`: loopback up and the
    // rules (from stdin), where the daemon spawned an `nsenter … ip` and an `nsenter … nft` for
    // them, each a fork of the daemon (issue 50). `sleep` in its command line means both are in.
    '/bin/sh',
    '-c',
    'ip link set lo up && nft -f - && exec sleep infinity',
  ];
  const holder = spawn(argv[0] as string, argv.slice(1), {
    detached: true,
    stdio: ['pipe', 'ignore', 'pipe'],
    env,
  });
  holder.unref();
  let stderr = '';
  holder.stderr?.on('data', (c: Buffer) => {
    stderr = (stderr + c.toString()).slice(-2000);
  });
  holder.stdin?.on('error', () => undefined);
  holder.stdin?.end(sandboxRuleset(options.policy, options.ports, options));
  const stop = () => {
    try {
      if (holder.pid) process.kill(holder.pid, 'SIGKILL');
    } catch {
      // gone
    }
  };
  try {
    const pid = holder.pid;
    if (!pid) throw new Error('unshare did not start');
    const ours = readlinkSync('/proc/self/ns/net');
    await waitFor(
      () => {
        if (holder.exitCode !== null)
          throw new Error(
            `the namespace's holder ended (exit code ${holder.exitCode}): ${stderr.trim()}`,
          );
        try {
          return (
            readlinkSync(`/proc/${pid}/ns/net`) !== ours &&
            readFileSync(`/proc/${pid}/cmdline`, 'utf8').startsWith('sleep')
          );
        } catch {
          return false;
        }
      },
      'the network namespace was not made',
      NET_START_TIMEOUT_MS,
    );
    holder.stderr?.destroy();
    return await attachNet(options, pid, true);
  } catch (error) {
    stop();
    throw failed(error);
  }
}

/**
 * Configures the namespace `pid` is in: loopback up, the rules (a holder of the sandbox's own,
 * `own`, put both in itself), then slirp4netns from the egress namespace (nothing leaves before
 * the rules are in: there is no route until slirp4netns configures its interface). `own`
 * rootless: the holder's user namespace is what lets the daemon's uid in.
 */
async function attachNet(
  options: Parameters<typeof startSandboxNet>[0],
  pid: number,
  own = false,
): Promise<SandboxNet> {
  const env = { PATH: '/usr/sbin:/usr/bin:/sbin:/bin', [NET_TAG]: options.id };
  const userns = own && options.rootless;
  const net: SandboxNet = {
    id: options.id,
    holder: pid,
    holderStart: startTime(pid) ?? '',
    slirp: 0,
    userns,
    ports: options.ports,
  };
  if (!own) {
    // A namespace that exists already (a container's): configured from outside.
    const [command, ...args] = [...enterArgs(net), 'ip', 'link', 'set', 'lo', 'up'];
    await run(command as string, args, { timeout: NET_START_TIMEOUT_MS });
    await applyRuleset(net, sandboxRuleset(options.policy, options.ports, options));
  }
  const slirpArgs = [
    '--configure',
    '--mtu=65520',
    '--ready-fd=3',
    // Its own mount namespace and no capabilities but binding: only where it may unshare (as
    // root). Rootless it runs as the daemon's uid, which owns nothing it could abuse more.
    ...(options.rootless ? [] : ['--enable-sandbox']),
    '--enable-seccomp',
    ...(userns ? [`--userns-path=/proc/${pid}/ns/user`] : []),
    '--netns-type=path',
    `/proc/${pid}/ns/net`,
    'tap0',
  ];
  // slirp4netns's --enable-sandbox unmounts what it does not need in a mount namespace of its
  // own; as root that namespace must be private first, or the unmounts reach the host's
  // (/run/netns bind mounts vanished). Rootless, its namespace is owned by the holder's user
  // namespace, whose mounts are slaves already.
  const argv = [
    ...egressEnterArgs({ netns: options.egressNetns, userns: options.egressUserns }),
    ...(options.rootless ? [] : ['unshare', '--mount', '--propagation', 'private', '--']),
    'slirp4netns',
    ...slirpArgs,
  ];
  const slirp = spawn(argv[0] as string, argv.slice(1), {
    detached: true,
    stdio: ['ignore', 'ignore', 'pipe', 'pipe'],
    env,
  });
  slirp.unref();
  let stderr = '';
  slirp.stderr?.on('data', (c: Buffer) => {
    stderr = (stderr + c.toString()).slice(-2000);
  });
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`slirp4netns was not ready within ${NET_START_TIMEOUT_MS} ms`)),
        NET_START_TIMEOUT_MS,
      );
      const ready = slirp.stdio[3] as NodeJS.ReadableStream;
      ready.once('data', () => {
        clearTimeout(timer);
        resolve();
      });
      slirp.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`slirp4netns ended (exit code ${code}): ${stderr.trim()}`));
      });
      slirp.once('error', (error) => {
        clearTimeout(timer);
        reject(error);
      });
    });
  } catch (error) {
    slirp.kill('SIGKILL');
    throw error;
  }
  (slirp.stdio[3] as NodeJS.ReadableStream & { destroy(): void }).destroy();
  slirp.stderr?.destroy();
  net.slirp = slirp.pid as number;
  return net;
}

/** Ends a sandbox's network: slirp4netns and the holder (each checked by its tag: pids get reused). */
export function stopSandboxNet(net: SandboxNet): void {
  for (const pid of [net.slirp, net.holder]) {
    if (!pid) continue;
    try {
      const tag = readFileSync(`/proc/${pid}/environ`, 'utf8');
      if (!tag.includes(`${NET_TAG}=`)) continue;
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
}

/**
 * Whether a sandbox's network processes are gone: exited, or zombies with nothing left (their
 * environment cannot be read), or their pid another process's now.
 */
export function sandboxNetGone(net: SandboxNet): boolean {
  return [net.slirp, net.holder].every((pid) => {
    if (!pid) return true;
    try {
      return !readFileSync(`/proc/${pid}/environ`, 'utf8')
        .split('\0')
        .includes(`${NET_TAG}=${net.id}`);
    } catch {
      return true;
    }
  });
}

/** Pids of network processes (holders, slirp4netns) of the sandboxes `orphan` says are, for the sweep. */
export function orphanNetProcesses(orphan: (id: string) => boolean): number[] {
  const found: number[] = [];
  for (const entry of readdirSafe('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let environ: string;
    try {
      environ = readFileSync(`/proc/${entry}/environ`, 'utf8');
    } catch {
      continue;
    }
    const tag = environ.split('\0').find((v) => v.startsWith(`${NET_TAG}=`));
    if (tag && orphan(tag.slice(NET_TAG.length + 1))) found.push(Number(entry));
  }
  return found;
}

function readdirSafe(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}
