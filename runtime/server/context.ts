import type { CommandTable } from './command-table.js';
import type { Metrics } from './metrics.js';
import type { ProcessTable } from './process-table.js';
import type { RouteGroup } from './route-group.js';

/** What route handlers reach of the server. */
export interface ServerContext {
  commands: CommandTable;
  processes: ProcessTable;
  terminals: ProcessTable;
  metrics: Metrics;
  /** The groups this server serves, in order. */
  enabledGroups: readonly RouteGroup[];
  /** Where headless Chromium is expected. */
  chromiumPath: string;
  /** Server identity for `/info`. */
  info(): Record<string, unknown>;
  /** Starts a graceful stop after the current answer is sent. */
  requestShutdown(): void;
}
