import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { InvalidArgumentError } from '../errors.js';
import {
  EgressController,
  EgressError,
  egressOptionsFromEnv,
  egressProblem,
} from './controller.js';
import type { EgressPolicy } from './policy.js';
import {
  orphanNetProcesses,
  type SandboxNet,
  sandboxNetGone,
  startSandboxNet,
  stopSandboxNet,
  updatePolicy,
} from './sandbox-net.js';
import type { EgressCounters, EgressPorts } from './service.js';
import { hostBundle, trustBundle } from './trust.js';

/** An internet sandbox's network as its handle keeps it: the namespace's parts and its policy. */
export type KeptNet = SandboxNet & { policy: EgressPolicy };

/**
 * The `internet` networks of one provider's sandboxes: the egress service (started on first use)
 * and, per sandbox, the namespace's rules and slirp4netns. Local and Docker sandboxes share it;
 * each provider says whose namespace it is (a holder of its own, or a container's).
 */
export class SandboxNetworks {
  private controller: EgressController | undefined;
  private hostTrust: string | undefined;

  constructor(private readonly given?: EgressController) {}

  get egress(): EgressController {
    this.controller ??= this.given ?? new EgressController(egressOptionsFromEnv());
    return this.controller;
  }

  /**
   * Adds the daemon's listener addresses to what no sandbox reaches (`--deny` of the egress
   * process). Takes effect when the egress process starts: the daemon calls it before any
   * sandbox is made or adopted.
   */
  denyListeners(cidrs: string[]): void {
    if (cidrs.length === 0) return;
    const options = this.egress.options;
    options.alsoDeny = [...new Set([...(options.alsoDeny ?? []), ...cidrs])];
  }

  /**
   * Has egress serve a new sandbox ahead of its network (when the sandbox's environment must
   * name its ports, as a container's is fixed at create); `start` then takes the ports. On a
   * failure before `start`, `release` with just the id stops serving it.
   */
  async serve(id: string, policy: EgressPolicy | undefined, rootless: boolean) {
    const problem = egressProblem(this.egress.options, rootless);
    if (problem) throw new Error(`the sandbox's network did not start: ${problem}`);
    await this.checkProxy(policy);
    return this.egress.add(id, policy ?? { allowOut: [], denyOut: [] });
  }

  /**
   * Refuses, before anything of the sandbox changes, an egress proxy that egress would not dial
   * (an address in the always-denied ranges or of the host, unless the operator permitted the
   * range; a name with no such address). Egress decides again at each dial.
   */
  private async checkProxy(policy: EgressPolicy | undefined): Promise<void> {
    if (!policy?.egressProxy) return;
    try {
      await this.egress.checkProxy(policy.egressProxy);
    } catch (error) {
      if (error instanceof EgressError && error.status === 400) {
        throw new InvalidArgumentError(error.message);
      }
      throw error;
    }
  }

  /**
   * Serves a new sandbox (unless `serve` did: its `ports`) and makes its network; on failure
   * nothing is left. `existing`: a namespace that is there already (a container's init),
   * configured as root.
   */
  async start(options: {
    id: string;
    policy: EgressPolicy | undefined;
    rootless: boolean;
    existing?: number;
    ports?: EgressPorts;
  }): Promise<KeptNet> {
    const policy = options.policy ?? { allowOut: [], denyOut: [] };
    const { netns, userns, permit, alsoDeny } = this.egress.options;
    let net: SandboxNet | undefined;
    try {
      const ports =
        options.ports ??
        (await this.serve(options.id, policy, options.rootless && !options.existing));
      net = await startSandboxNet({
        id: options.id,
        rootless: options.rootless,
        policy,
        ports,
        hostAddresses: await this.egress.hostAddresses(),
        ...(options.existing ? { existing: options.existing } : {}),
        ...(netns ? { egressNetns: netns } : {}),
        ...(userns ? { egressUserns: userns } : {}),
        ...(permit ? { permit } : {}),
        ...(alsoDeny ? { alsoDeny } : {}),
      });
      await this.egress.setNet(options.id, net);
      return { ...net, policy };
    } catch (error) {
      if (net) stopSandboxNet(net);
      await this.egress.remove(options.id).catch(() => undefined);
      throw error;
    }
  }

  /**
   * Ends a sandbox's network (slirp4netns, a holder of its own); egress stops serving it. Just
   * `{ id }`: a sandbox served whose network was not made.
   */
  async release(net: SandboxNet | { id: string } | undefined): Promise<void> {
    if (!net) return;
    if ('holder' in net) {
      // Its raw TCP is read while the namespace is there: every connection written.
      await this.egress.harvest(net.id, true).catch(() => undefined);
      stopSandboxNet(net);
      // Gone (or a zombie, nothing left of it) before the kill is said to be done: a SIGKILL
      // takes effect a moment after it is sent, longer on a loaded machine. 2 s at most.
      for (let waited = 0; waited < 2000 && !sandboxNetGone(net); waited += 5) await sleep(5);
    }
    await this.egress.remove(net.id).catch(() => undefined);
  }

  /**
   * A sandbox's new policy: the namespace's address rules first, then the names egress decides
   * by. The handle to keep from now on.
   */
  async setPolicy<H extends { net?: KeptNet }>(handle: H, policy: EgressPolicy): Promise<H> {
    const net = internetOf(handle);
    await this.checkProxy(policy);
    // Raw TCP the old rules decided is read while they are the ones egress names.
    await this.egress.harvest(net.id).catch(() => undefined);
    await updatePolicy(net, policy);
    await this.egress.setPolicy(net.id, policy);
    return { ...handle, net: { ...net, policy } };
  }

  async stats(handle: { net?: KeptNet }): Promise<EgressCounters> {
    return (await this.egress.get(internetOf(handle).id)).counters;
  }

  /** The egress decisions not read yet, for the daemon's audit trail (EgressController.audit). */
  audit(epoch: string | undefined, after: number, harvest?: string) {
    return this.controller
      ? this.controller.audit(epoch, after, harvest)
      : Promise.resolve(undefined);
  }

  /** A new daemon serves an adopted sandbox again, on the ports its rules name. */
  async adopt(handle: { net?: KeptNet }): Promise<void> {
    const { net } = handle;
    if (!net) return;
    await this.egress.add(net.id, net.policy, net.ports);
    await this.egress.setNet(net.id, net, true);
  }

  /**
   * What an `internet` sandbox trusts beside its system's CAs: the egress proxy's CA alone
   * (`ca`), and `bundle`: `base` (an image's own bundle; default the host's) with it added.
   */
  async trust(base?: string): Promise<{ ca: string; bundle: string }> {
    const { cert } = await this.egress.trust();
    this.hostTrust ??= trustBundle(hostBundle(), cert);
    return { ca: cert, bundle: base === undefined ? this.hostTrust : trustBundle(base, cert) };
  }

  /** Pids of the network processes of sandboxes `orphan` names (for a provider's sweep). */
  orphans(orphan: (id: string) => boolean): number[] {
    return orphanNetProcesses(orphan);
  }

  /**
   * Whether `internet` sandboxes can start here (the isolation report's `egress` line). Without
   * the tools such a sandbox does not start: denied rather than allowed.
   */
  support(rootless = process.getuid?.() !== 0): { enforced: boolean; how: string } {
    const missing = ['slirp4netns', 'nft', 'unshare', 'nsenter'].filter(
      (tool) =>
        !['/usr/bin', '/usr/sbin', '/bin', '/sbin'].some((dir) => existsSync(join(dir, tool))),
    );
    if (missing.length > 0) {
      return {
        enforced: false,
        how: `internet network unavailable: no ${missing.join(', ')} (Debian: slirp4netns, nftables, util-linux); such sandboxes do not start, and templates that name no network run offline`,
      };
    }
    const problem = egressProblem(this.egress.options, rootless);
    if (problem) {
      return {
        enforced: false,
        how: `internet network unavailable: ${problem}; such sandboxes do not start, and templates that name no network run offline`,
      };
    }
    return {
      enforced: true,
      how: `internet network: a namespace per sandbox, nftables rules and slirp4netns, egress by policy from ${this.egress.options.netns ?? "the daemon's own network namespace"} (docs/network.md)`,
    };
  }
}

function internetOf(handle: { net?: KeptNet }): KeptNet {
  if (!handle.net) throw new Error('the sandbox is not on the internet network');
  return handle.net;
}
