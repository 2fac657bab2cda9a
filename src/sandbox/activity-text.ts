/**
 * What a lifecycle event or an audit row says, in a few words: one text for `abx events`,
 * `abx audit` and the dashboard's Events and Audit tabs. No Node built-ins (the dashboard bundles
 * it); `when` writes a time (ms since the epoch) as each wants it.
 */

type Data = Record<string, unknown>;

const list = (value: unknown) => (Array.isArray(value) ? value.join(' ') : String(value ?? ''));

/** A lifecycle event's `data` (docs/events.md), for its type. */
export function lifecycleText(type: string, d: Data, when: (ms: unknown) => string): string {
  switch (type) {
    case 'sandbox.lifecycle.created':
      return `from ${d.source}${d.forkedFrom ? ` of ${d.forkedFrom}` : ''}, until ${when(d.expiresAt)}`;
    case 'sandbox.lifecycle.updated':
      return d.change === 'timeout'
        ? `timeout: until ${when(d.expiresAt)}`
        : `network: ${JSON.stringify(d.network)}`;
    case 'sandbox.lifecycle.paused':
      return `${d.kind === 'memory' ? 'frozen' : 'hibernated'} (${d.reason === 'timeout' ? 'its timeout' : 'asked'})`;
    case 'sandbox.lifecycle.resumed':
      return `${d.kind === 'memory' ? 'thawed' : 'woken'}${d.reason ? ` (${d.reason})` : ''}, until ${when(d.expiresAt)}`;
    case 'sandbox.lifecycle.killed':
      return `${d.reason}: ${d.endReason}`;
    case 'sandbox.lifecycle.checkpointed':
      return `snapshot ${d.snapshot}`;
    case 'sandbox.lifecycle.failed':
      return String(d.error);
    case 'sandbox.lifecycle.expiring':
      return `${d.onTimeout === 'pause' ? 'pauses' : 'ends'} at ${when(d.expiresAt)}`;
    default:
      return JSON.stringify(d);
  }
}

/**
 * An audit row's `data` (docs/events.md, "Audit trail"), for its kind; undefined for `egress`,
 * which the terminal colours and the dashboard lays out each its own way.
 */
export function auditText(
  kind: string,
  d: Data,
  when: (ms: unknown) => string,
): string | undefined {
  switch (kind) {
    case 'command.started':
      return d.args !== undefined ? `${d.cmd} ${list(d.args)}` : String(d.cmd ?? list(d.argv));
    case 'command.exited':
      return `pid ${d.pid} exited ${d.exitCode}`;
    case 'command.called':
      return `${d.name} on port ${d.port}`;
    case 'file.written':
      return `${list(d.paths)} (${d.bytes} bytes)`;
    case 'file.removed':
      return String(d.path);
    case 'file.renamed':
      return `${d.from} → ${d.to}`;
    case 'link.issued':
      return `port ${d.port}${d.path ?? ''}, until ${when(d.expiresAt)}`;
    case 'egress':
      return undefined;
    case 'audit.dropped':
      return `${d.count ?? 'an unknown number of'} rows not kept: ${d.reason ?? "the daemon's audit buffer was full"}`;
    default:
      return JSON.stringify(d);
  }
}
