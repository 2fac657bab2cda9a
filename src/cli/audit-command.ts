import { type Command, InvalidArgumentError } from 'commander';
import { auditText } from '../sandbox/activity-text.js';
import {
  SANDBOX_AUDIT_KINDS,
  type SandboxAuditEntry,
  type SandboxAuditKind,
  type SandboxAuditOptions,
} from '../sandbox/sandbox-audit.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';
import { paint } from './style.js';

const KINDS: readonly SandboxAuditKind[] = SANDBOX_AUDIT_KINDS;

/** How often `--follow` asks for new rows. */
const FOLLOW_POLL_MS = 1000;

function kindList(text: string, previous: SandboxAuditKind[] = []): SandboxAuditKind[] {
  const kinds = text.split(',').map((kind) => kind.trim());
  for (const kind of kinds) {
    if (!(KINDS as readonly string[]).includes(kind)) {
      throw new InvalidArgumentError(`'${kind}' is not a kind of row: use ${KINDS.join(', ')}`);
    }
  }
  return [...previous, ...(kinds as SandboxAuditKind[])];
}

/** A time option: ISO 8601, ms since the epoch, or an age (10m, 2h, 1d) before now. */
export function time(text: string): number {
  if (/^\d{1,15}$/.test(text)) return Number(text);
  const relative = /^(\d+)(s|m|h|d)$/.exec(text);
  if (relative) {
    const unit = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[relative[2] as 's'];
    return Date.now() - Number(relative[1]) * unit;
  }
  const parsed = Date.parse(text);
  if (!/^\d{4}-\d\d-\d\d/.test(text) || Number.isNaN(parsed)) {
    throw new InvalidArgumentError(
      `give a time: an ISO 8601 date (2026-01-02T03:04:05Z), ms since the epoch, or an age such as 10m, 2h, 1d; not '${text}'`,
    );
  }
  return parsed;
}

/** What a row says, in a few words (the dashboard's Audit tab says the same but of egress). */
function summary(row: SandboxAuditEntry): string {
  const d = row.data as Record<string, unknown>;
  const end = (at: unknown) => (typeof at === 'number' ? new Date(at).toISOString() : String(at));
  const text = auditText(row.kind, d, end);
  if (text !== undefined) return text;
  const verdict = d.verdict === 'allowed' ? paint('green', 'allowed') : paint('red', 'denied ');
  const where = `${d.name}${d.address && d.address !== d.name ? ` (${d.address})` : ''}:${d.port}`;
  return `${verdict} ${d.protocol} ${where} up ${d.up} down ${d.down}${d.open ? ' so far (open)' : ''}: ${d.rule}`;
}

function rowText(row: SandboxAuditEntry): string {
  const via = row.data.via ? paint('dim', ` [${row.data.face ?? ''} ${row.data.via}]`) : '';
  return `${row.time} ${paint('cyan', row.kind.padEnd(15))} ${summary(row)}${via}`;
}

async function audit(
  id: string,
  options: {
    kind?: SandboxAuditKind[];
    since?: number;
    until?: number;
    json?: boolean;
    jsonl?: boolean;
    follow?: boolean;
  },
): Promise<void> {
  // Loaded here: `abx audit` alone needs the SDK.
  const { openControl } = await import('../sandbox/sandbox-api.js');
  const { readSandboxAudit } = await import('../sandbox/sandbox-audit.js');
  const { client } = await openControl();
  const query: SandboxAuditOptions = {
    limit: 1000,
    ...(options.kind ? { kind: options.kind } : {}),
    ...(options.since === undefined ? {} : { since: options.since }),
    ...(options.until === undefined ? {} : { until: options.until }),
  };
  const all: SandboxAuditEntry[] = [];
  const print = (row: SandboxAuditEntry) => {
    if (options.jsonl) printLine(JSON.stringify(row));
    else if (!options.json) printLine(rowText(row));
    else all.push(row);
  };
  let after: number | undefined;
  for (;;) {
    const page = await readSandboxAudit(client, id, {
      ...query,
      ...(after === undefined ? {} : { after }),
    });
    for (const row of page.audit) print(row);
    after = page.audit.at(-1)?.seq ?? after;
    if (page.next !== null) continue;
    if (!options.follow) break;
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_POLL_MS));
  }
  if (options.json) printJson(all);
}

/** `abx audit ID`: what was done to and from a sandbox, as the daemon saw it. */
export function addAuditCommand(program: Command): void {
  withExamples(
    program
      .command('audit')
      .description(
        'Show a sandbox\'s audit trail, running or ended: commands started through the API (and the exits E2B\'s face served), files written and removed, port links issued, and every egress connection with its verdict and rule. Recorded by the daemon, never by the sandbox; kept as long as events (ABX_EVENTS_RETENTION_MS, 7 days). docs/events.md, "Audit trail".',
      )
      .argument('<id>', 'the sandbox')
      .option('--kind <kinds>', `only these kinds (comma-separated: ${KINDS.join(', ')})`, kindList)
      .option(
        '--since <time>',
        'only rows at or after this (ISO 8601, ms, or an age: 10m, 2h)',
        time,
      )
      .option('--until <time>', 'only rows before this', time)
      .option('--json', 'print the rows as one JSON array')
      .option('--jsonl', 'print each row as a JSON line (an export)')
      .option('-f, --follow', 'then print new rows as they come (asked every second) until Ctrl-C')
      .action(audit),
    'abx audit i1a2b3c4d5e6f7g8',
    'abx audit i1a2b3c4d5e6f7g8 --kind egress --since 1h',
    'abx audit i1a2b3c4d5e6f7g8 --jsonl > audit.jsonl',
  );
}
