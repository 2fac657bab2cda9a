import type { IsolationReport } from '../../runtime/protocol/isolation.js';
import type { TemplateResources } from '../commands/template-runtime.js';

/** Where every provider's sandbox has its home (the template's `setup` output lands there). */
export { SANDBOX_HOME } from '../../runtime/protocol/constants.js';
export type { IsolationReport };

/** Everything a provider needs to start one sandbox. */
export interface SandboxSpec {
  id: string;
  /** The sandbox's access token; envd refuses requests without it. */
  accessToken: string;
  /** Host folder owned by this sandbox (its home, its sockets, its log). */
  dir: string;
  /** A built template's home folder to start from, copied for this sandbox. */
  baseHome?: string;
  env: Record<string, string>;
  workdir: string;
  resources: TemplateResources;
  network: 'none' | 'host';
}

/**
 * Where a running sandbox is, in a form that survives a daemon restart (stored in the registry).
 * `pid` + `startTime` identify the sandbox's root process even if the pid is later reused.
 */
export interface SandboxHandle {
  provider: string;
  pid: number;
  startTime: string;
  /** The Unix socket of the sandbox's envd, on the host. */
  envdSocket: string;
  /** The folder holding one Unix socket per forwarded port (`{port}.sock`). */
  portsDir: string;
  /** The host uid the sandbox runs as, when the daemon gave it one of its own (root daemon). */
  uid?: number;
  /** The sandbox's cgroups (memory, CPU, pids), where the host allows them. */
  cgroups?: string[];
  /** @deprecated a handle written by an older daemon: its one memory cgroup. */
  cgroup?: string;
}

/** Why a sandbox's processes ended without being killed. */
export type EndCause = 'oom' | 'exited';

/**
 * Where sandboxes come from. `local` runs them with bubblewrap on this host; a Kubernetes
 * provider would run pods with the same envd and return handles pointing at them.
 */
export interface SandboxProvider {
  readonly name: string;
  /** Starts a sandbox and resolves once its envd answers. */
  create(spec: SandboxSpec): Promise<SandboxHandle>;
  /** True while the sandbox's root process runs (and is the same process). */
  isAlive(handle: SandboxHandle): boolean;
  /** Why a sandbox that is no longer alive ended (call before `kill` releases its cgroups). */
  endCause(handle: SandboxHandle): EndCause;
  /**
   * Kills every process of the sandbox and releases what it held on the host (cgroups, uid);
   * resolves once they are gone. Safe to call on a sandbox that already ended.
   */
  kill(handle: SandboxHandle): Promise<void>;
  /**
   * Kills sandboxes of `sandboxesDir` that the registry does not know as running (e.g. one
   * started just before a daemon crash, before its row was written). Returns their ids.
   */
  sweepOrphans(sandboxesDir: string, running: ReadonlySet<string>): Promise<string[]>;
  /** How this provider isolates sandboxes on this host. */
  isolation(): IsolationReport;
  /** Releases what the provider keeps for itself (an engine client, say); sandboxes keep running. */
  close?(): Promise<void>;
}
