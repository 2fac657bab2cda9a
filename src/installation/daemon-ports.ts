import { randomInt } from 'node:crypto';
import { readFileSync, renameSync, writeFileSync } from 'node:fs';

/**
 * The local daemon's two loopback ports (its API and its gateway) are chosen once and kept in
 * `$ABX_HOME/ports.json`, so the URLs a daemon hands out (`abx e2b env`'s export lines, a
 * Prometheus target, a bookmarked dashboard) stay valid across `abx daemon stop && abx daemon
 * start`. Why not fixed defaults: several installations on one host (two users, CI jobs, a test
 * run) would collide on them at their first start; a free port chosen at the first start never
 * does, and is kept from then on.
 */

/** The two loopback listeners, as flags, variables and messages name them. */
export const PORT_SETTINGS = {
  api: { flag: '--api-port', env: 'ABX_API_PORT', what: 'API' },
  gateway: { flag: '--gateway-port', env: 'ABX_GATEWAY_PORT', what: 'gateway' },
} as const;

export type Listener = keyof typeof PORT_SETTINGS;

/** How one listener's port is chosen for this start. */
export interface PortPlan {
  /** Tried in order; the first free one is taken (one entry unless the port is new). */
  ports: number[];
  /**
   * Where the port came from: the flag or variable (`set`; 0 there means a random port this
   * start, not kept), `ports.json` (`kept`), or chosen now, the first start (`new`).
   */
  from: 'set' | 'kept' | 'new';
}

/** The port `text` names (0 to 65535), or an error message naming `name`. */
export function parsePort(text: string, name: string): number | string {
  const value = /^\d{1,5}$/.test(text.trim()) ? Number(text) : Number.NaN;
  if (!Number.isInteger(value) || value > 65535) {
    return `${name} must be a TCP port, 1 to 65535 (0: a random free port each start, not kept), not '${text}'`;
  }
  return value;
}

/** What `ports.json` holds; a missing or unreadable file holds nothing. */
export function readKeptPorts(file: string): Partial<Record<Listener, number>> {
  let saved: unknown;
  try {
    saved = JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    return {};
  }
  const kept: Partial<Record<Listener, number>> = {};
  for (const listener of Object.keys(PORT_SETTINGS) as Listener[]) {
    const port = (saved as Record<string, unknown> | null)?.[listener];
    if (Number.isInteger(port) && (port as number) > 0 && (port as number) <= 65535) {
      kept[listener] = port as number;
    }
  }
  return kept;
}

/**
 * Random candidates for a new port: from 20000 up to below the kernel's ephemeral range (where
 * outgoing connections take their local ports, one of which could hold the port at a later
 * start), else any free port.
 */
export function newPortCandidates(count = 16): number[] {
  let low = 32768;
  try {
    low = Number(
      readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0],
    );
  } catch {
    // not Linux: the usual lower bound
  }
  if (!Number.isInteger(low) || low - 20000 < 1000) return [0];
  const ports = new Set<number>();
  while (ports.size < count) ports.add(randomInt(20000, low));
  return [...ports, 0];
}

/** Each listener's plan: the variable (from the flag) wins, then `ports.json`, then a new port. */
export function planPorts(
  file: string,
  env: NodeJS.ProcessEnv = process.env,
): Record<Listener, PortPlan> {
  const kept = readKeptPorts(file);
  const plan = (listener: Listener): PortPlan => {
    const setting = PORT_SETTINGS[listener];
    const text = env[setting.env];
    if (text !== undefined && text !== '') {
      const port = parsePort(text, `${setting.env} (${setting.flag})`);
      if (typeof port === 'string') throw new Error(port);
      return { ports: [port], from: 'set' };
    }
    const port = kept[listener];
    return port === undefined
      ? { ports: newPortCandidates(), from: 'new' }
      : { ports: [port], from: 'kept' };
  };
  return { api: plan('api'), gateway: plan('gateway') };
}

/**
 * Writes the ports to keep (0600): a port set to a number or chosen new is kept; a random one
 * (set to 0) leaves the file's entry as it was.
 */
export function keepPorts(
  file: string,
  plans: Record<Listener, PortPlan>,
  bound: Record<Listener, number>,
): void {
  const kept = readKeptPorts(file);
  let changed = false;
  for (const listener of Object.keys(plans) as Listener[]) {
    const plan = plans[listener];
    if (plan.from === 'set' && plan.ports[0] === 0) continue;
    if (kept[listener] !== bound[listener]) {
      kept[listener] = bound[listener];
      changed = true;
    }
  }
  if (!changed) return;
  const temporary = `${file}.${process.pid}`;
  writeFileSync(temporary, `${JSON.stringify(kept)}\n`, { mode: 0o600 });
  renameSync(temporary, file);
}

/** The one line a daemon fails with when its port is taken. */
export function portInUseMessage(
  listener: Listener,
  plan: PortPlan,
  port: number,
  file: string,
): string {
  const setting = PORT_SETTINGS[listener];
  const who = `\`ss -ltnp 'sport = :${port}'\` shows which process`;
  if (plan.from === 'kept') {
    return `the ${setting.what} port ${port} on 127.0.0.1 is in use by another process (${who}); this daemon keeps that port (${file}) so the addresses it printed stay valid: stop that process, or start with ${setting.flag} N (${setting.env}=N) to move to another port, or ${setting.flag} 0 for a random one`;
  }
  if (plan.from === 'set') {
    return `the ${setting.what} port ${port} on 127.0.0.1 (${setting.flag}, ${setting.env}) is in use by another process (${who}): stop it, or choose another with ${setting.flag} N, or ${setting.flag} 0 for a random one`;
  }
  return `no free ${setting.what} port was found on 127.0.0.1 (tried ${plan.ports.join(', ')}): choose one with ${setting.flag} N (${setting.env}=N)`;
}
