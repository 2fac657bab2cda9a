import type { JsonClient, Query } from '../installation/json-client.js';

/** What a row of a sandbox's audit trail records (docs/events.md, "Audit trail"). */
export const SANDBOX_AUDIT_KINDS = [
  'command.started',
  'command.exited',
  'command.called',
  'file.written',
  'file.removed',
  'file.renamed',
  'link.issued',
  'egress',
  'audit.dropped',
] as const;

export type SandboxAuditKind = (typeof SANDBOX_AUDIT_KINDS)[number];

/** One row of a sandbox's audit trail, as the daemon saw it happen. */
export interface SandboxAuditEntry {
  /** The order of rows: pass the last one read as `after` for the next page. */
  seq: number;
  /** When, in ms since the epoch. */
  at: number;
  /** The same time as an ISO 8601 date. */
  time: string;
  sandboxId: string;
  /** The API key id that owns the sandbox; null for the daemon's own key. */
  owner: string | null;
  /** The API key id that made the request, when one did (gateway requests carry a token). */
  actor: string | null;
  kind: SandboxAuditKind;
  /**
   * What was done: `command.started` `{ cmd | argv | args, cwd?, env (names only), user, via }`;
   * `command.exited` `{ pid, exitCode }`; `file.written` `{ paths, bytes }`; `file.removed`
   * `{ path }`; `link.issued` `{ port, expiresAt }`; `egress` `{ protocol, name, address?, port,
   * verdict: 'allowed'|'denied', rule, up, down, open? }` (`open`: still open when written, the
   * bytes so far); `audit.dropped` `{ count (null: not known), reason }`.
   */
  data: Record<string, unknown>;
}

export interface SandboxAuditOptions {
  /** Only rows after this seq (the last one of the previous page). */
  after?: number;
  /** Rows in one page, 1 to 1000 (default 100). */
  limit?: number;
  /** Only these kinds. */
  kind?: SandboxAuditKind | readonly SandboxAuditKind[];
  /** Only rows at or after this time. */
  since?: Date | number;
  /** Only rows before this time. */
  until?: Date | number;
}

/** One page of a sandbox's audit trail; `next` is the `after` of the next page, null at the end. */
export interface SandboxAuditPage {
  audit: SandboxAuditEntry[];
  next: number | null;
}

const ms = (time: Date | number | undefined) =>
  time === undefined ? undefined : time instanceof Date ? time.getTime() : time;

/** The query of `GET /v1/sandboxes/{id}/audit` for `options`. */
export function auditQuery(options: SandboxAuditOptions): Query {
  const kinds = options.kind === undefined ? [] : [options.kind].flat();
  return {
    ...(options.after === undefined ? {} : { after: options.after }),
    ...(options.limit === undefined ? {} : { limit: options.limit }),
    ...(kinds.length > 0 ? { kind: kinds.join(',') } : {}),
    ...(options.since === undefined ? {} : { since: ms(options.since) }),
    ...(options.until === undefined ? {} : { until: ms(options.until) }),
  };
}

/** One page of a sandbox's audit trail (see `Sandbox.audit`). */
export function readSandboxAudit(
  client: JsonClient,
  sandboxId: string,
  options: SandboxAuditOptions = {},
): Promise<SandboxAuditPage> {
  return client.json<SandboxAuditPage>(
    'GET',
    `/v1/sandboxes/${encodeURIComponent(sandboxId)}/audit`,
    { query: auditQuery(options) },
  );
}
