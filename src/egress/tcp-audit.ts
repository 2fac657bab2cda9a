import { spawn } from 'node:child_process';
import { type EgressAuditRow, OPEN_ROW_INTERVAL_MS } from './audit-queue.js';
import type { Decision, EgressRules, ParsedPolicy } from './policy.js';
import { enterArgs, type SandboxNet } from './sandbox-net.js';
import type { EgressPorts } from './service.js';

/**
 * Raw TCP in the audit trail: the connections a sandbox's own nftables rules decide (every port
 * but 53, 80 and 443, which egress's servers decide and record themselves; and, reset by an
 * address rule, those too). The sandbox's table (`inet abx`, sandbox-net.ts) keeps them in
 * dynamic sets keyed per connection (`ip daddr . tcp dport . tcp sport`): `raw_out` and `raw_in`
 * count each connection's packets and bytes (IP and TCP headers included) out and in, `raw_end`
 * holds those that have sent or met a FIN or RST, and one set per rule that resets holds what it
 * reset (see {@link tcpAuditChains}). Egress reads them (one `nsenter … nft -j list table` per sandbox per harvest) and queues
 * one audit row per connection.
 */

/** Seconds an element lives after its connection's last packet (an attempt reset: after it). */
export const TCP_AUDIT_ELEMENT_TIMEOUT_S = 180;
/**
 * Connections a sandbox's sets hold at most; past it new ones are not recorded (and logged). The
 * kernel sizes a dynamic set's hash table by it up front, whether it fills or not: 16 384 (and
 * 4096 resets) cost 2.3 MiB of unreclaimable kernel memory a sandbox (issue 50's measure);
 * 2048 and 256 cost about 0.1 MiB and still hold 11 new connections a second for an element's
 * 180 s.
 */
export const TCP_AUDIT_SET_SIZE = 2048;
/** Resets of one rule a sandbox's set holds at most. */
export const TCP_AUDIT_RESET_SET_SIZE = 256;
/** How often egress reads every sandbox's sets (ABX_EGRESS_TCP_AUDIT_MS), by default. */
export const TCP_AUDIT_INTERVAL_MS = 60_000;
/** The bounds of that interval: an idle connection must be read before its element expires. */
export const TCP_AUDIT_INTERVAL_MIN_MS = 1000;
export const TCP_AUDIT_INTERVAL_MAX_MS = 60_000;
/** How long one harvest's nft may take. */
export const TCP_AUDIT_NFT_TIMEOUT_MS = 5000;
/** DNS answers kept per sandbox to name the addresses of raw connections. */
const NAMES_PER_SANDBOX = 1024;

/** The rules that reset raw TCP, each with its set (in the order sandboxRuleset checks them). */
export const RESET_SETS = {
  rst_always: 'always4',
  rst_host: 'host4',
  rst_tunnel: 'tunnel4',
  rst_deny: 'deny4',
} as const;
type ResetSet = keyof typeof RESET_SETS;

const KEY = 'type ipv4_addr . inet_service . inet_service';
const FLAGS = `flags dynamic,timeout; timeout ${TCP_AUDIT_ELEMENT_TIMEOUT_S}s`;
/** A connection's key in the sets, written from the sandbox's side (out) or the peer's (in). */
const OUT_KEY = '{ ip daddr . tcp dport . tcp sport }';
const IN_KEY = '{ ip saddr . tcp sport . tcp dport }';

/** The sets of the sandbox's table that record raw TCP. */
export function tcpAuditSets(): string[] {
  const counted = `${KEY}; ${FLAGS}; size ${TCP_AUDIT_SET_SIZE};`;
  return [
    `  set raw_out { ${counted} counter; }`,
    `  set raw_in { ${counted} counter; }`,
    `  set raw_end { ${counted} }`,
    ...Object.keys(RESET_SETS).map(
      (name) => `  set ${name} { ${KEY}; ${FLAGS}; size ${TCP_AUDIT_RESET_SET_SIZE}; }`,
    ),
  ];
}

/**
 * The chains that record raw TCP; none decides (each only returns), so `filter_out` and `decide`
 * stay what they were. `audit_reset` runs just before `filter_out` (priority -160) on each
 * connection's first packet (a SYN) and follows its checks in their order, noting what
 * `filter_out` will reset in the set of the rule that resets it: a note of its own before each
 * return, so a full set never changes where a packet goes. `audit_out` and `audit_in` count what
 * passed, after address translation (output priority 0; input before the reply's is undone), so
 * what egress serves (DNS, 80, 443: sent to the gateway) is left out.
 */
export function tcpAuditChains(
  gateway: string,
  ports: Pick<EgressPorts, 'http' | 'tls'>,
): string[] {
  const note = (set: ResetSet, match: string) => [
    `    ${match} update @${set} ${OUT_KEY}`,
    `    ${match} return`,
  ];
  return [
    '  chain audit_reset {',
    '    type filter hook output priority -160; policy accept;',
    '    oif "lo" return',
    '    meta l4proto != tcp return',
    '    tcp flags & (syn | ack) != syn return',
    '    tcp dport 53 return',
    `    ip daddr ${gateway} tcp dport { ${ports.http}, ${ports.tls} } return`,
    '    ip daddr @permit4 goto audit_decide',
    ...note('rst_always', 'ip daddr @always4'),
    ...note('rst_host', 'ip daddr @host4'),
    '    goto audit_decide',
    '  }',
    '  chain audit_decide {',
    ...note('rst_tunnel', 'ip daddr @tunnel4 tcp dport != { 80, 443 }'),
    '    ip daddr @allow4 return',
    '    ip daddr @resolved4 return',
    `    ip daddr @deny4 update @rst_deny ${OUT_KEY}`,
    '  }',
    '  chain audit_out {',
    '    type filter hook output priority 0; policy accept;',
    '    oif "lo" return',
    '    meta l4proto != tcp return',
    '    ct status dnat return',
    `    ip daddr ${gateway} return`,
    `    update @raw_out ${OUT_KEY}`,
    `    tcp flags & (fin | rst) != 0 update @raw_end ${OUT_KEY}`,
    '  }',
    '  chain audit_in {',
    '    type filter hook input priority 0; policy accept;',
    '    meta l4proto != tcp return',
    '    ct status dnat return',
    `    ip saddr ${gateway} return`,
    // The reset the rules send a connection they cut (a new policy) comes back over loopback.
    '    iif "lo" ip saddr 127.0.0.0/8 return',
    `    tcp flags & (fin | rst) != 0 update @raw_end ${IN_KEY}`,
    '    iif "lo" return',
    `    update @raw_in ${IN_KEY}`,
    '  }',
  ];
}

/** One element of a set as `nft -j` lists it. */
interface Element {
  address: string;
  port: number;
  sport: number;
  /** Seconds until it expires. */
  expires: number;
  bytes: number;
}

/** The elements of the raw-TCP sets in `nft -j list table inet abx`'s output, by set. */
export function parseSets(json: string): Map<string, Element[]> {
  const sets = new Map<string, Element[]>();
  const listed = JSON.parse(json) as { nftables?: Array<Record<string, unknown>> };
  for (const item of listed.nftables ?? []) {
    const set = item.set as { name?: string; elem?: unknown[] } | undefined;
    if (!set?.name || !(set.name.startsWith('raw_') || set.name in RESET_SETS)) continue;
    const elements: Element[] = [];
    for (const raw of set.elem ?? []) {
      const elem = (raw as { elem?: Record<string, unknown> }).elem;
      const concat = (elem?.val as { concat?: unknown[] } | undefined)?.concat;
      if (!elem || !Array.isArray(concat) || concat.length !== 3) continue;
      const [address, port, sport] = concat;
      if (typeof address !== 'string' || typeof port !== 'number' || typeof sport !== 'number')
        continue;
      const counter = elem.counter as { bytes?: number } | undefined;
      elements.push({
        address,
        port,
        sport,
        expires: typeof elem.expires === 'number' ? elem.expires : TCP_AUDIT_ELEMENT_TIMEOUT_S,
        bytes: counter?.bytes ?? 0,
      });
    }
    sets.set(set.name, elements);
  }
  return sets;
}

/** Lists the sandbox's table (`nft -j`), killed past {@link TCP_AUDIT_NFT_TIMEOUT_MS}. */
export function listTable(net: Pick<SandboxNet, 'holder' | 'userns'>): Promise<string> {
  const [command, ...args] = [...enterArgs(net), 'nft', '-j', 'list', 'table', 'inet', 'abx'];
  return new Promise((resolve, reject) => {
    const child = spawn(command as string, args, {
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: TCP_AUDIT_NFT_TIMEOUT_MS,
    });
    const out: Buffer[] = [];
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => out.push(c));
    child.stderr.on('data', (c: Buffer) => {
      stderr = (stderr + c.toString()).slice(-1000);
    });
    child.once('error', reject);
    child.once('close', (code, signal) =>
      code === 0
        ? resolve(Buffer.concat(out).toString())
        : reject(
            new Error(
              `nft could not list the sandbox's table (${signal ?? `exit code ${code}`}): ${stderr.trim()}`,
            ),
          ),
    );
  });
}

/** What a harvest reads the policy and the rules from, and where it puts rows. */
export interface TcpAuditDeps {
  rules: Pick<EgressRules, 'decide'>;
  /** The sandbox's policy as egress holds it now (before a new one applies). */
  policy(id: string): ParsedPolicy | undefined;
  push(row: Omit<EgressAuditRow, 'seq'>): void;
  /** Connections of the sandbox's were not recorded, for `reason` (how many: not known). */
  dropped(id: string, reason: string): void;
  list?: (net: Pick<SandboxNet, 'holder' | 'userns'>) => Promise<string>;
  now?: () => number;
}

/** What a harvest writes besides what has ended (see {@link TcpAudit.harvest}). */
export interface HarvestOptions {
  final?: boolean;
  open?: boolean;
  baseline?: boolean;
}

interface Written {
  up: number;
  down: number;
  /** When (ms): a connection still open is written on a read again only OPEN_ROW_INTERVAL_MS later. */
  at: number;
  /** Written at its end: what comes after (the last ACKs) is not written again. */
  ended: boolean;
}

interface SandboxState {
  /** Connections (and resets) written, by key, until their element is gone. */
  written: Map<string, Written>;
  /**
   * The rule of a passing connection as of the harvest that first saw it, until it is written:
   * a new policy is applied after a harvest, so the rule named is the one that let it through.
   */
  rules: Map<string, { rule: string; name: string | undefined }>;
  /** Address → the name egress's DNS gave it for, and until when (ms). */
  names: Map<string, { name: string; until: number }>;
  /** The sets found full at the last harvest: told once, until one has room again. */
  full: Set<string>;
}

/**
 * Harvests the raw-TCP sets of the sandboxes' namespaces into egress's audit queue. A connection
 * is written once it has ended (a FIN or RST either way), when its element is about to expire
 * (idle: what it carries later is written as a row of its own), when its sandbox's trail is read
 * (`open`: likewise), or when its namespace goes away (`final`); a reset when first read. A set
 * found full is told once (`dropped`) until it has room again. What was written is remembered while its element lives, so
 * nothing is written twice. One harvest at a time per sandbox.
 */
export class TcpAudit {
  private readonly state = new Map<string, SandboxState>();
  private readonly queues = new Map<string, Promise<unknown>>();

  constructor(
    private readonly deps: TcpAuditDeps,
    /** The harvest interval: an element expiring within two of it (and 5 s) is written. */
    private readonly intervalMs = TCP_AUDIT_INTERVAL_MS,
  ) {}

  /** Egress's DNS answered `name` with `addresses` for the sandbox, for `ttl` seconds. */
  noteAnswer(id: string, name: string, addresses: string[], ttl: number): void {
    const names = this.sandbox(id).names;
    // Kept past the TTL as long as an element can outlive it: a connection opened late is named.
    const until = (this.deps.now ?? Date.now)() + (ttl + TCP_AUDIT_ELEMENT_TIMEOUT_S) * 1000;
    for (const address of addresses) {
      names.delete(address);
      names.set(address, { name, until });
    }
    while (names.size > NAMES_PER_SANDBOX) names.delete(names.keys().next().value as string);
  }

  /**
   * Reads the sandbox's sets and queues a row per connection due (see the class); `final`: the
   * namespace goes away, every connection is written; `open`: its trail is being read, so
   * connections still open are written too (`open: true`, with what they carried so far);
   * `baseline`: what is there now is taken as written (a namespace a previous egress process
   * read). A sandbox whose table has no such sets
   * (made by an older daemon) is left alone.
   */
  harvest(
    id: string,
    net: Pick<SandboxNet, 'holder' | 'userns'>,
    options: HarvestOptions = {},
  ): Promise<void> {
    const run = (this.queues.get(id) ?? Promise.resolve())
      .catch(() => undefined)
      .then(() => this.harvestNow(id, net, options));
    this.queues.set(id, run);
    const done = () => {
      if (this.queues.get(id) === run) this.queues.delete(id);
    };
    run.then(done, done);
    return run;
  }

  /** Forgets a sandbox (egress no longer serves it). */
  forget(id: string): void {
    this.state.delete(id);
  }

  private sandbox(id: string): SandboxState {
    let state = this.state.get(id);
    if (!state) {
      state = { written: new Map(), rules: new Map(), names: new Map(), full: new Set() };
      this.state.set(id, state);
    }
    return state;
  }

  private async harvestNow(
    id: string,
    net: Pick<SandboxNet, 'holder' | 'userns'>,
    options: HarvestOptions,
  ): Promise<void> {
    const sets = parseSets(await (this.deps.list ?? listTable)(net));
    if (!sets.has('raw_out')) return;
    const now = (this.deps.now ?? Date.now)();
    const state = this.sandbox(id);
    const seen = new Set<string>();
    const key = (e: Element) => `${e.address} ${e.port} ${e.sport}`;
    /** When the element's last packet was, from what is left of its timeout. */
    const lastPacket = (e: Element) =>
      now - Math.max(0, TCP_AUDIT_ELEMENT_TIMEOUT_S - e.expires) * 1000;
    for (const [name, elements] of sets) {
      const resets = name in RESET_SETS;
      const size = resets ? TCP_AUDIT_RESET_SET_SIZE : TCP_AUDIT_SET_SIZE;
      if (elements.length < size) state.full.delete(name);
      else if (!state.full.has(name) && !options.baseline) {
        state.full.add(name);
        this.deps.dropped(
          id,
          `raw TCP: the sandbox's ${name} set was full (${size} ${resets ? 'resets' : 'connections'} within ${TCP_AUDIT_ELEMENT_TIMEOUT_S} s): ${resets ? 'resets' : 'connections'} past it are not in the trail`,
        );
      }
    }
    // Resets: one row each, when first read.
    for (const name of Object.keys(RESET_SETS) as ResetSet[]) {
      for (const e of sets.get(name) ?? []) {
        const k = `${name} ${key(e)}`;
        seen.add(k);
        if (state.written.has(k)) continue;
        state.written.set(k, { up: 0, down: 0, at: now, ended: true });
        if (options.baseline) continue;
        this.deps.push({
          at: lastPacket(e),
          sandbox: id,
          kind: 'tcp',
          name: this.nameOf(state, e.address, now) ?? e.address,
          address: e.address,
          port: e.port,
          allowed: false,
          rule: this.resetRule(id, name, e.address, e.port),
          up: 0,
          down: 0,
        });
      }
    }
    // Connections that passed: out and in joined by key.
    const flows = new Map<string, { e: Element; up: number; down: number; expires: number }>();
    for (const e of sets.get('raw_out') ?? []) {
      flows.set(key(e), { e, up: e.bytes, down: 0, expires: e.expires });
    }
    for (const e of sets.get('raw_in') ?? []) {
      const flow = flows.get(key(e));
      if (flow) {
        flow.down = e.bytes;
        flow.expires = Math.max(flow.expires, e.expires);
      } else flows.set(key(e), { e, up: 0, down: e.bytes, expires: e.expires });
    }
    const ended = new Set((sets.get('raw_end') ?? []).map(key));
    const soon = (2 * this.intervalMs + 5000) / 1000;
    for (const [k, flow] of flows) {
      seen.add(k);
      const before = state.written.get(k);
      if (before?.ended) continue;
      const isEnded = ended.has(k);
      if (options.baseline) {
        state.written.set(k, { up: flow.up, down: flow.down, at: now, ended: true });
        continue;
      }
      let decided = state.rules.get(k);
      if (!decided) {
        const name = this.nameOf(state, flow.e.address, now);
        decided = { rule: this.allowRule(id, flow.e.address, name), name };
        state.rules.set(k, decided);
      }
      const due = isEnded || options.final || flow.expires <= soon;
      const read = options.open && (!before || now - before.at >= OPEN_ROW_INTERVAL_MS);
      if (!(due || read)) continue;
      const up = flow.up - (before?.up ?? 0);
      const down = flow.down - (before?.down ?? 0);
      if (before && up <= 0 && down <= 0 && !isEnded) continue;
      state.written.set(k, { up: flow.up, down: flow.down, at: now, ended: isEnded });
      if (before && up <= 0 && down <= 0) continue;
      const { name, rule } = decided;
      this.deps.push({
        at: lastPacket({ ...flow.e, expires: flow.expires }),
        sandbox: id,
        kind: 'tcp',
        name: name ?? flow.e.address,
        address: flow.e.address,
        port: flow.e.port,
        allowed: true,
        rule,
        up: Math.max(0, up),
        down: Math.max(0, down),
        ...(isEnded || options.final ? {} : { open: true }),
      });
    }
    // An element gone is a key that may be used again: forget it.
    for (const k of state.written.keys()) if (!seen.has(k)) state.written.delete(k);
    for (const k of state.rules.keys())
      if (!seen.has(k) || state.written.get(k)?.ended) state.rules.delete(k);
    for (const [address, { until }] of state.names) if (until < now) state.names.delete(address);
    if (options.final) this.forget(id);
  }

  private nameOf(state: SandboxState, address: string, now: number): string | undefined {
    const known = state.names.get(address);
    return known && known.until >= now ? known.name : undefined;
  }

  private decide(id: string, target: { name?: string; address: string }): Decision | undefined {
    const policy = this.deps.policy(id);
    return policy ? this.deps.rules.decide(policy, target) : undefined;
  }

  /** The rule that let a connection through, as egress decides the address (and its name). */
  private allowRule(id: string, address: string, name: string | undefined): string {
    const decision =
      (name ? this.decide(id, { name, address }) : undefined) ?? this.decide(id, { address });
    if (decision?.allowed) return decision.rule;
    if (name && decision)
      return `the address of ${name} as egress's DNS answered it (now: ${decision.rule})`;
    return decision ? `passed (now: ${decision.rule})` : 'passed';
  }

  /** The rule that reset a connection: the set it was in, with what egress says of the address. */
  private resetRule(id: string, set: ResetSet, address: string, port: number): string {
    if (set === 'rst_tunnel') {
      return `the sandbox's egress proxy carries only what egress serves: raw TCP to port ${port} (not 80 or 443) is reset`;
    }
    const decision = this.decide(id, { address });
    if (decision && !decision.allowed) return decision.rule;
    if (set === 'rst_always') return `always denied (${address})`;
    if (set === 'rst_host') return `always denied: an address of this host (${address})`;
    return `denyOut (${address})`;
  }
}
