import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import type { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { packageInfo } from '../util/package-info.js';
import type { EgressAuditEntry } from './audit-queue.js';
import type { EgressCa } from './egress-ca.js';
import { type EgressPolicy, parseEntry } from './policy.js';
import type { SandboxNet } from './sandbox-net.js';
import { resolveSecretFor } from './secret-resolvers.js';
import type { EgressCounters, EgressPorts } from './service.js';
import { TCP_AUDIT_INTERVAL_MAX_MS, TCP_AUDIT_INTERVAL_MIN_MS } from './tcp-audit.js';

/** How long the egress process may take to start, and one control call to answer. */
export const EGRESS_START_TIMEOUT_MS = 10_000;
export const EGRESS_CALL_TIMEOUT_MS = 10_000;
/**
 * How long the daemon waits for egress to read a sandbox's raw TCP into its audit queue (before a
 * new policy, before the namespace goes away, before a read of the sandbox's audit trail): past
 * it, the daemon goes on without (the rows come with egress's next harvest, or, for a namespace
 * gone, not at all).
 */
export const EGRESS_HARVEST_TIMEOUT_MS = 3000;

export interface EgressOptions {
  /** The egress network namespace (`--egress-netns`, ABX_EGRESS_NETNS); none: the daemon's own. */
  netns?: string;
  /**
   * The user namespace that owns `netns` (`--egress-userns`, ABX_EGRESS_USERNS): how a rootless
   * daemon enters it. Derived from a `/proc/PID/ns/net` path when not given.
   */
  userns?: string;
  /** A hosts file answered before DNS (ABX_EGRESS_HOSTS). */
  hostsFile?: string;
  /** Always-denied ranges the operator permits by name (`--egress-permit`, ABX_EGRESS_PERMIT). */
  permit?: string[];
  /** More ranges to deny always (the daemon's own listener). */
  alsoDeny?: string[];
  /**
   * Where the egress proxy's CA is kept (egress-ca.ts): `$ABX_HOME/egress-ca`. None: a CA of
   * this controller's own, made on first use and removed with it.
   */
  caDir?: string;
  /**
   * How often egress reads every sandbox's raw-TCP sets into the audit trail, in ms
   * (ABX_EGRESS_TCP_AUDIT_MS; 1000 to 60000, default 60000: tcp-audit.ts).
   */
  tcpAuditMs?: number;
}

/**
 * nsenter's options that enter the egress namespace (and, rootless, the user namespace that owns
 * it: a daemon without root may enter only what its uid owns); none for the daemon's own.
 */
export function egressEnterArgs(options: Pick<EgressOptions, 'netns' | 'userns'>): string[] {
  if (!options.netns) return [];
  return [
    'nsenter',
    ...(options.userns ? ['--preserve-credentials', `--user=${options.userns}`] : []),
    `--net=${options.netns}`,
    '--',
  ];
}

/**
 * Why this daemon cannot use its egress namespace, or undefined: without root, it must be owned
 * by a user namespace of the daemon's uid, which the daemon enters first.
 */
export function egressProblem(options: EgressOptions, rootless: boolean): string | undefined {
  for (const [i, range] of (options.permit ?? []).entries()) {
    try {
      if (parseEntry(range, `ABX_EGRESS_PERMIT[${i}]`).kind !== 'cidr') throw new Error('a name');
    } catch {
      return `ABX_EGRESS_PERMIT (--egress-permit) names '${range}', which is not a CIDR such as 10.20.0.0/16`;
    }
  }
  const every = options.tcpAuditMs;
  if (
    every !== undefined &&
    (!Number.isInteger(every) ||
      every < TCP_AUDIT_INTERVAL_MIN_MS ||
      every > TCP_AUDIT_INTERVAL_MAX_MS)
  ) {
    return `ABX_EGRESS_TCP_AUDIT_MS must be whole milliseconds from ${TCP_AUDIT_INTERVAL_MIN_MS} to ${TCP_AUDIT_INTERVAL_MAX_MS} (how often raw TCP is read into the audit trail), not ${every}`;
  }
  if (!options.netns) return undefined;
  if (!existsSync(options.netns)) return `the egress namespace ${options.netns} does not exist`;
  if (rootless && !options.userns) {
    return `a daemon without root enters the egress namespace ${options.netns} only through the user namespace of its uid that owns it: give ABX_EGRESS_USERNS (--egress-userns), e.g. /proc/PID/ns/user of the process that made both (docs/network.md)`;
  }
  if (options.userns && !existsSync(options.userns))
    return `the egress user namespace ${options.userns} does not exist`;
  return undefined;
}

/** The egress options a daemon reads from its environment. */
export function egressOptionsFromEnv(
  env: NodeJS.ProcessEnv = process.env,
  rootless = process.getuid?.() !== 0,
): EgressOptions {
  const list = (text: string | undefined) =>
    (text ?? '')
      .split(/[\s,]+/)
      .map((s) => s.trim())
      .filter(Boolean);
  const userns =
    env.ABX_EGRESS_USERNS ||
    (env.ABX_EGRESS_NETNS && rootless
      ? /^(\/proc\/\d+\/ns\/)net$/.exec(env.ABX_EGRESS_NETNS)?.[1]?.concat('user')
      : undefined);
  return {
    ...(env.ABX_EGRESS_NETNS ? { netns: env.ABX_EGRESS_NETNS } : {}),
    ...(env.ABX_EGRESS_NETNS && userns ? { userns } : {}),
    ...(env.ABX_EGRESS_HOSTS ? { hostsFile: env.ABX_EGRESS_HOSTS } : {}),
    ...(env.ABX_EGRESS_PERMIT ? { permit: list(env.ABX_EGRESS_PERMIT) } : {}),
    ...(env.ABX_HOME ? { caDir: join(env.ABX_HOME, 'egress-ca') } : {}),
    ...(env.ABX_EGRESS_TCP_AUDIT_MS ? { tcpAuditMs: Number(env.ABX_EGRESS_TCP_AUDIT_MS) } : {}),
  };
}

/**
 * Answers the egress process's questions for secret values on its fd 3: one JSON line each way,
 * `{ id, sandbox, name }` → `{ id, value? }` (no value: no such secret for the sandbox's owner)
 * or `{ id, error }`. An error's text never holds a value.
 */
function answerSecrets(channel: Socket): void {
  channel.on('error', () => undefined);
  let buffered = '';
  channel.on('data', (chunk: Buffer) => {
    buffered += chunk.toString();
    if (buffered.length > 64 * 1024) return channel.destroy();
    for (let end = buffered.indexOf('\n'); end >= 0; end = buffered.indexOf('\n')) {
      const line = buffered.slice(0, end);
      buffered = buffered.slice(end + 1);
      let ask: { id?: unknown; sandbox?: unknown; name?: unknown };
      try {
        ask = JSON.parse(line);
      } catch {
        continue;
      }
      const { id, sandbox, name } = ask;
      if (typeof sandbox !== 'string' || typeof name !== 'string') {
        channel.write(`${JSON.stringify({ id, error: 'a question is { id, sandbox, name }' })}\n`);
        continue;
      }
      resolveSecretFor(sandbox, name).then(
        (value) => channel.write(`${JSON.stringify({ id, value })}\n`),
        (error: Error) => channel.write(`${JSON.stringify({ id, error: error.message })}\n`),
      );
    }
  });
}

/** An answer of the egress process that is not what was asked for. */
export class EgressError extends Error {
  override name = 'EgressError';
  constructor(
    message: string,
    readonly status: number,
  ) {
    super(message);
  }
}

/**
 * The daemon's side of the egress process: starts it (in the egress namespace) on first use and
 * drives it over its control socket. The process ends with the daemon (it watches its stdin);
 * a new daemon serves adopted sandboxes again on the same ports (`add` with `ports`).
 */
export class EgressController {
  private child: ChildProcess | undefined;
  private starting: Promise<void> | undefined;
  private launching: Promise<void> | undefined;
  private dir: string | undefined;
  private ca: Promise<EgressCa> | undefined;

  constructor(readonly options: EgressOptions = {}) {}

  private get socket(): string {
    return join(this.dir as string, 'egress.sock');
  }

  /**
   * The egress proxy's CA (made on first use): what sandboxes on `internet` trust, so that HTTPS
   * to a host with header rules can be read to set them. Its key stays on the host.
   */
  trust(): Promise<EgressCa> {
    if (!this.ca) {
      this.dir ??= mkdtempSync(join(tmpdir(), 'abx-egress-'));
      const dir = this.options.caDir ?? join(this.dir, 'ca');
      // Loaded when first needed: the X.509 library is large, and most daemons never use it.
      const made = import('./egress-ca.js').then(({ ensureEgressCa }) => ensureEgressCa(dir));
      this.ca = made;
      made.catch(() => {
        if (this.ca === made) this.ca = undefined;
      });
    }
    return this.ca;
  }

  private start(): Promise<void> {
    if (this.child && this.child.exitCode === null && this.child.signalCode === null) {
      return this.starting ?? Promise.resolve();
    }
    if (!this.launching) {
      this.launching = this.trust()
        .then((ca) => this.spawnEgress(ca))
        .finally(() => {
          this.launching = undefined;
        });
    }
    return this.launching;
  }

  private spawnEgress(ca: EgressCa): Promise<void> {
    this.dir ??= mkdtempSync(join(tmpdir(), 'abx-egress-'));
    const script = join(packageInfo().root, 'dist', 'egress.js');
    const argv = [
      ...egressEnterArgs(this.options),
      process.execPath,
      script,
      '--control',
      this.socket,
      '--owns-dir',
      '--secrets-fd',
      '--ca-fd',
      ...(this.options.hostsFile ? ['--hosts', this.options.hostsFile] : []),
      ...(this.options.permit ?? []).flatMap((c) => ['--permit', c]),
      ...(this.options.alsoDeny ?? []).flatMap((c) => ['--deny', c]),
      ...(this.options.tcpAuditMs ? ['--tcp-audit-ms', String(this.options.tcpAuditMs)] : []),
    ];
    const child = spawn(argv[0] as string, argv.slice(1), {
      // fd 3: a socket pair on which egress asks for secret values (answerSecrets); fd 4: the
      // CA's certificate and key, written once below (never a path on its command line: the
      // key is not egress's to find again, and nothing of $ABX_HOME shows in `ps`).
      stdio: ['pipe', 'pipe', 'pipe', 'pipe', 'pipe'],
      env: {
        PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
        // What egress trusts of the origins it opens TLS to (hosts with rules): Node's store,
        // and the CAs the daemon's operator adds.
        ...(process.env.NODE_EXTRA_CA_CERTS
          ? { NODE_EXTRA_CA_CERTS: process.env.NODE_EXTRA_CA_CERTS }
          : {}),
      },
    });
    this.child = child;
    answerSecrets(child.stdio[3] as Socket);
    const caChannel = child.stdio[4] as Socket;
    caChannel.on('error', () => undefined);
    caChannel.end(JSON.stringify({ cert: ca.cert, key: readFileSync(ca.keyFile, 'utf8') }));
    let stderr = '';
    child.stderr?.on('data', (c: Buffer) => {
      stderr = (stderr + c.toString()).slice(-4000);
    });
    this.starting = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`the egress service did not start within ${EGRESS_START_TIMEOUT_MS} ms`));
      }, EGRESS_START_TIMEOUT_MS);
      child.stdout?.once('data', () => {
        clearTimeout(timer);
        resolve();
      });
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(
          new Error(
            `the egress service ended (${signal ?? `exit code ${code}`})${stderr ? `: ${stderr.trim()}` : ''}`,
          ),
        );
      });
      child.once('error', (error) => {
        clearTimeout(timer);
        reject(error);
      });
    });
    // Not a reason for the daemon to stay up: the egress process ends when its stdin does.
    child.unref();
    (child.stdout as unknown as { unref?: () => void })?.unref?.();
    (child.stderr as unknown as { unref?: () => void })?.unref?.();
    (child.stdin as unknown as { unref?: () => void })?.unref?.();
    (child.stdio[3] as unknown as { unref?: () => void })?.unref?.();
    return this.starting;
  }

  private async call(
    method: string,
    path: string,
    body?: unknown,
    timeoutMs = EGRESS_CALL_TIMEOUT_MS,
  ): Promise<unknown> {
    await this.start();
    return new Promise((resolve, reject) => {
      const req = request({ socketPath: this.socket, method, path, timeout: timeoutMs }, (res) => {
        let text = '';
        res.on('data', (c: Buffer) => {
          text += c.toString();
        });
        res.on('end', () => {
          const json = text ? JSON.parse(text) : undefined;
          if ((res.statusCode ?? 500) >= 300) {
            return reject(
              new EgressError(
                json?.error ?? `egress answered ${res.statusCode}`,
                res.statusCode ?? 500,
              ),
            );
          }
          resolve(json);
        });
      });
      req.once('timeout', () =>
        req.destroy(new Error(`the egress service did not answer within ${timeoutMs} ms`)),
      );
      req.once('error', reject);
      req.end(body === undefined ? undefined : JSON.stringify(body));
    });
  }

  /** Serves a sandbox (on `ports` when given: an adopted sandbox's rules name them); its ports. */
  async add(id: string, policy: EgressPolicy, ports?: EgressPorts): Promise<EgressPorts> {
    const answer = (await this.call('PUT', `/sandboxes/${id}`, {
      policy,
      ...(ports ? { ports } : {}),
    })) as {
      ports: EgressPorts;
    };
    return answer.ports;
  }

  /** The sandbox's namespace; `adopted`: made by an earlier daemon, whose egress read it. */
  async setNet(
    id: string,
    net: Pick<SandboxNet, 'holder' | 'userns'>,
    adopted = false,
  ): Promise<void> {
    await this.call('PUT', `/sandboxes/${id}/net`, {
      holder: net.holder,
      userns: net.userns,
      ...(adopted ? { adopted } : {}),
    });
  }

  /**
   * Has egress read the sandbox's raw TCP into its audit queue now (`final`: its namespace goes
   * away), waiting {@link EGRESS_HARVEST_TIMEOUT_MS} at most; nothing while no egress runs.
   */
  async harvest(id: string, final = false): Promise<void> {
    if (!this.child || this.child.exitCode !== null) return;
    await this.call(
      'POST',
      `/sandboxes/${id}/harvest${final ? '?final=1' : ''}`,
      undefined,
      EGRESS_HARVEST_TIMEOUT_MS,
    );
  }

  /** The egress namespace's own addresses, which the sandboxes' rules refuse. */
  async hostAddresses(): Promise<string[]> {
    return ((await this.call('GET', '/host-addresses')) as { addresses: string[] }).addresses;
  }

  async setPolicy(id: string, policy: EgressPolicy): Promise<void> {
    await this.call('PUT', `/sandboxes/${id}/policy`, { policy });
  }

  /** Whether egress would dial this egress proxy: an EgressError (400) saying why not. */
  async checkProxy(egressProxy: NonNullable<EgressPolicy['egressProxy']>): Promise<void> {
    await this.call('POST', '/egress-proxy', { egressProxy });
  }

  async get(
    id: string,
  ): Promise<{ policy: EgressPolicy; ports: EgressPorts; counters: EgressCounters }> {
    return (await this.call('GET', `/sandboxes/${id}`)) as never;
  }

  /**
   * The decisions egress made that the daemon has not read (audit-queue.ts), acknowledging those
   * up to `after` of `epoch`; undefined while no egress process runs (none is started for it).
   * `harvest`: that sandbox's raw TCP is read first (within {@link EGRESS_HARVEST_TIMEOUT_MS}).
   */
  async audit(
    epoch: string | undefined,
    after: number,
    harvest?: string,
  ): Promise<{ epoch: string; rows: EgressAuditEntry[] } | undefined> {
    if (!this.child || this.child.exitCode !== null) return undefined;
    const query = new URLSearchParams({
      after: String(after),
      ...(epoch ? { epoch } : {}),
      ...(harvest ? { harvest } : {}),
    });
    return (await this.call(
      'GET',
      `/audit?${query}`,
      undefined,
      harvest ? EGRESS_HARVEST_TIMEOUT_MS : EGRESS_CALL_TIMEOUT_MS,
    )) as never;
  }

  /** Stops serving a sandbox; one it does not serve is fine. */
  async remove(id: string): Promise<void> {
    if (!this.child || this.child.exitCode !== null) return;
    await this.call('DELETE', `/sandboxes/${id}`).catch((error) => {
      if (!(error instanceof EgressError && error.status === 404)) throw error;
    });
  }

  close(): void {
    this.child?.kill('SIGTERM');
    this.child = undefined;
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
    this.dir = undefined;
    if (!this.options.caDir) this.ca = undefined;
  }
}
