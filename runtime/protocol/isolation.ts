/** How a provider isolates sandboxes on its host, as `daemon.json` and `abx daemon status` show. */
export interface IsolationReport {
  /** `root`: each sandbox runs as a host uid of its own; `rootless`: as the daemon's uid. */
  mode: 'root' | 'rootless';
  /** Each limit and whether this host enforces it, with how. */
  limits: Record<string, { enforced: boolean; how: string }>;
  warnings: string[];
}
