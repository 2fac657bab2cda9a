import type { IsolationReport } from '../../runtime/protocol/isolation.js';

/** What `daemon.json` holds, for clients to find the daemon. */
export interface DaemonInfo {
  pid: number;
  apiUrl: string;
  gatewayUrl: string;
  domain: string;
  version: string;
  startedAt: string;
  /**
   * The Node the daemon runs on: its version and binary (image sandboxes run a copy of it). Absent:
   * written by an older daemon.
   */
  node?: { version: string; path: string };
  /** Where its sandboxes run: `local` (bubblewrap) or `docker` (absent: written by an older daemon, local). */
  provider?: string;
  /**
   * The listeners for remote clients (`abx daemon start --listen`), besides the loopback ones
   * above: where the API and gateway listen, the gateway's origin as clients see it (its host the
   * sandbox domain), and whether they serve TLS.
   */
  remote?: { apiUrl: string; gatewayUrl: string; publicGatewayUrl: string; tls: boolean };
  /** How sandboxes are isolated: root or rootless mode, and which limits this host enforces. */
  isolation?: IsolationReport;
  /**
   * Where the registry is: the SQLite file, or the PostgreSQL URL without its password (absent:
   * written by an older daemon, SQLite in the installation).
   */
  registry?: string;
}
