import { useEffect, useState } from 'preact/hooks';
import { auditText } from '../../../src/sandbox/activity-text.js';
import { api, type SandboxInfo, sandboxPath } from '../api.js';
import { Failure, TableHead } from '../components/table.js';
import { errorText, time } from '../format.js';

interface AuditRow {
  seq: number;
  time: string;
  kind: string;
  actor: string | null;
  data: Record<string, unknown>;
}

interface AuditPage {
  audit: AuditRow[];
  next: number | null;
}

/** What the network route answers that an allow must keep (docs/network.md). */
interface Policy {
  allowOut: string[];
  denyOut: string[];
  rules?: unknown[];
  egressProxy?: unknown;
}

/** Rows kept in the page at most (the newest). */
const KEPT = 2000;

const when = (ms: unknown) => (typeof ms === 'number' ? time(new Date(ms).toISOString()) : '');

/** What a row says, in a few words (as `abx audit` says it, but of egress). */
function summary(row: AuditRow): string {
  const d = row.data;
  return (
    auditText(row.kind, d, when) ??
    `${d.verdict} ${d.protocol} ${d.name}:${d.port} (↑${d.up} ↓${d.down}${d.open ? ' so far, open' : ''}) ${d.rule}`
  );
}

/**
 * A sandbox's audit trail (`GET .../audit`): what the daemon saw done to and from it. Its egress
 * part lists the destinations egress denied, each with a button that adds it to the sandbox's
 * allow list through the network API (`PUT .../network`).
 */
export function AuditTab({ sandbox }: { sandbox: SandboxInfo }) {
  const id = sandbox.sandboxId;
  const [rows, setRows] = useState<AuditRow[]>([]);
  const [failure, setFailure] = useState<string | null>(null);
  const [note, setNote] = useState<string | null>(null);

  useEffect(() => {
    let stop = false;
    let after: number | undefined;
    const load = async () => {
      try {
        for (let page = 0; page < 10 && !stop; page++) {
          const query = `?limit=1000${after === undefined ? '' : `&after=${after}`}`;
          const body = await api<AuditPage>('GET', sandboxPath(id, `/audit${query}`));
          if (stop) return;
          const last = body.audit.at(-1);
          if (last) after = last.seq;
          if (body.audit.length > 0) {
            setRows((kept) => [...kept, ...body.audit].slice(-KEPT));
          }
          if (body.next === null) break;
        }
      } catch (error) {
        if (!stop) setFailure(errorText(error));
      }
    };
    void load();
    const timer = setInterval(load, 5000);
    return () => {
      stop = true;
      clearInterval(timer);
    };
  }, [id]);

  const denied = new Map<string, { count: number; rule: string; ports: Set<number> }>();
  for (const row of rows) {
    if (row.kind !== 'egress' || row.data.verdict !== 'denied') continue;
    const name = String(row.data.name);
    if (name === '?' || name === '') continue;
    const seen = denied.get(name) ?? { count: 0, rule: '', ports: new Set<number>() };
    seen.count++;
    seen.rule = String(row.data.rule);
    seen.ports.add(Number(row.data.port));
    denied.set(name, seen);
  }

  const allow = async (name: string) => {
    setNote(null);
    try {
      const policy = await api<Policy>('GET', sandboxPath(id, '/network'));
      // A change replaces the whole policy: refuse rather than drop what this page cannot resend.
      if ((policy.rules?.length ?? 0) > 0 || policy.egressProxy) {
        setNote(
          `This sandbox has header rules or an egress proxy, which a change from here would drop: allow ${name} with abx network ${id} --allow ... instead.`,
        );
        return;
      }
      await api('PUT', sandboxPath(id, '/network'), {
        allowOut: [...new Set([...policy.allowOut, name])],
        denyOut: policy.denyOut,
      });
      setNote(`${name} is allowed from now on (new connections and DNS questions).`);
    } catch (error) {
      setNote(errorText(error));
    }
  };
  const canAllow = sandbox.state === 'running' && Boolean(sandbox.network);

  return (
    <section aria-labelledby="audit-title">
      <h2 id="audit-title">Audit trail</h2>
      <p>
        What the daemon saw done to and from this sandbox: commands and files through the API, port
        links, and every egress decision. Recorded by the daemon, never by the sandbox.
      </p>
      <Failure text={failure} />
      {note && <p class="notice">{note}</p>}
      {denied.size > 0 && (
        <div class="table-wrap">
          <table>
            <caption>Denied destinations</caption>
            <TableHead columns={['Destination', 'Ports', 'Times', 'Rule']} actions={canAllow} />
            <tbody>
              {[...denied].map(([name, seen]) => (
                <tr key={name}>
                  <td class="mono">{name}</td>
                  <td>{[...seen.ports].join(', ')}</td>
                  <td>{seen.count}</td>
                  <td class="mono">{seen.rule}</td>
                  {canAllow && (
                    <td>
                      <button type="button" onClick={() => void allow(name)}>
                        Allow
                      </button>
                    </td>
                  )}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {rows.length === 0 ? (
        <p>Nothing recorded yet.</p>
      ) : (
        <div class="table-wrap">
          <table>
            <caption>Rows (newest last)</caption>
            <TableHead columns={['Time', 'Kind', 'What', 'How']} />
            <tbody>
              {rows.map((row) => (
                <tr key={row.seq}>
                  <td>{time(row.time)}</td>
                  <td>{row.kind}</td>
                  <td class="mono">{summary(row)}</td>
                  <td>{[row.data.face, row.data.via].filter(Boolean).join(' ')}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
