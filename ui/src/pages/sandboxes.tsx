import { useMemo, useState } from 'preact/hooks';
import {
  extendSandbox,
  killSandbox,
  pauseSandbox,
  resumeSandbox,
  snapshotSandbox,
} from '../actions.js';
import type { SandboxInfo, Session } from '../api.js';
import { Sparkline } from '../components/sparkline.js';
import { EmptyRow, Failure, TableHead } from '../components/table.js';
import { bytes, duration, errorText, percent } from '../format.js';
import { useLive, useNow } from '../live.js';
import { href } from '../router.js';

/** `key=value` pairs, separated by commas or spaces; a bare word matches a key or a value. */
function metadataFilter(text: string): ((metadata: Record<string, string>) => boolean) | null {
  const terms = text
    .split(/[,\s]+/)
    .map((t) => t.trim())
    .filter(Boolean);
  if (terms.length === 0) return null;
  return (metadata) =>
    terms.every((term) => {
      const at = term.indexOf('=');
      if (at < 0) {
        return Object.entries(metadata).some(([k, v]) => k.includes(term) || v.includes(term));
      }
      return metadata[term.slice(0, at)] === term.slice(at + 1);
    });
}

export function SandboxesPage({ session, query }: { session: Session; query: URLSearchParams }) {
  const live = useLive();
  const now = useNow();
  const [state, setState] = useState(query.get('state') ?? '');
  const [template, setTemplate] = useState(query.get('template') ?? '');
  const [metadata, setMetadata] = useState(query.get('metadata') ?? '');
  const [failure, setFailure] = useState<string | null>(null);

  const all = [...live.sandboxes.values()].sort((a, b) => b.createdAt.localeCompare(a.createdAt));
  const templates = useMemo(() => [...new Set(all.map((s) => s.template))].sort(), [all]);
  const matches = metadataFilter(metadata);
  const shown = all.filter(
    (s) =>
      (!state || s.state === state) &&
      (!template || s.template === template) &&
      (!matches || matches(s.metadata)),
  );

  const act = (run: () => Promise<void>) => {
    setFailure(null);
    run().catch((error) => setFailure(errorText(error)));
  };

  return (
    <section aria-labelledby="sandboxes-title">
      <h1 id="sandboxes-title">Sandboxes</h1>
      <form class="filters" onSubmit={(e) => e.preventDefault()} aria-label="Filter sandboxes">
        <div class="field">
          <label for="filter-state">State</label>
          <select
            id="filter-state"
            value={state}
            onChange={(e) => setState((e.target as HTMLSelectElement).value)}
          >
            <option value="">any</option>
            <option value="running">running</option>
            <option value="paused">paused</option>
          </select>
        </div>
        <div class="field">
          <label for="filter-template">Template</label>
          <select
            id="filter-template"
            value={template}
            onChange={(e) => setTemplate((e.target as HTMLSelectElement).value)}
          >
            <option value="">any</option>
            {templates.map((name) => (
              <option key={name} value={name}>
                {name}
              </option>
            ))}
          </select>
        </div>
        <div class="field grow">
          <label for="filter-metadata">Metadata</label>
          <input
            id="filter-metadata"
            type="search"
            placeholder="key=value, …"
            value={metadata}
            onInput={(e) => setMetadata((e.target as HTMLInputElement).value)}
          />
        </div>
      </form>
      <Failure text={failure} />
      <p class="count" aria-live="polite">
        {shown.length === all.length
          ? `${all.length} sandbox${all.length === 1 ? '' : 'es'}`
          : `${shown.length} of ${all.length} sandboxes`}
        {session.admin ? ' (every key’s)' : ' (this key’s)'}
      </p>
      <div class="table-wrap">
        <table class="sandboxes">
          <TableHead
            columns={[
              'Sandbox',
              'State',
              'Template',
              'Age',
              'Time left',
              'CPU',
              'Memory',
              'Metadata',
              'Actions',
            ]}
          />
          <tbody>
            {shown.map((sandbox) => (
              <Row
                key={sandbox.sandboxId}
                sandbox={sandbox}
                now={now}
                samples={live.metrics.get(sandbox.sandboxId) ?? []}
                act={act}
              />
            ))}
            {shown.length === 0 && (
              <EmptyRow columns={9}>
                {all.length === 0
                  ? 'No sandbox is running. Start one with the SDK or `abx run`.'
                  : 'No sandbox matches the filters.'}
              </EmptyRow>
            )}
          </tbody>
        </table>
      </div>
    </section>
  );
}

function Row({
  sandbox,
  now,
  samples,
  act,
}: {
  sandbox: SandboxInfo;
  now: number;
  samples: { cpuUsedPct: number; memUsed: number; memTotal: number }[];
  act(run: () => Promise<void>): void;
}) {
  const id = sandbox.sandboxId;
  const last = samples[samples.length - 1];
  const paused = sandbox.state === 'paused';
  return (
    <tr data-sandbox-id={id}>
      <th scope="row">
        <a href={href('sandboxes', id)} class="mono">
          {id}
        </a>
      </th>
      <td>
        <span class={`state ${sandbox.state}`}>
          {paused ? (sandbox.paused?.memory === false ? 'hibernated' : 'paused') : sandbox.state}
        </span>
      </td>
      <td>{sandbox.template}</td>
      <td class="nowrap">{duration(now - Date.parse(sandbox.createdAt))}</td>
      <td class="nowrap">
        {duration(Date.parse(sandbox.expiresAt) - now)}
        {sandbox.lifecycle?.onTimeout === 'pause' ? ' (then pauses)' : ''}
      </td>
      <td class="metric">
        <Sparkline
          values={samples.map((s) => s.cpuUsedPct)}
          max={100}
          label={`CPU of ${id}: ${percent(last?.cpuUsedPct)}`}
        />
        <span>{percent(last?.cpuUsedPct)}</span>
      </td>
      <td class="metric">
        <Sparkline
          values={samples.map((s) => s.memUsed)}
          max={Math.max(0, ...samples.map((s) => s.memUsed)) * 1.25}
          label={`Memory of ${id}: ${bytes(last?.memUsed)}`}
        />
        <span>{bytes(last?.memUsed)}</span>
      </td>
      <td class="metadata">
        {Object.entries(sandbox.metadata ?? {}).map(([key, value]) => (
          <span class="chip" key={key}>
            {key}={value}
          </span>
        ))}
      </td>
      <td class="actions">
        {paused ? (
          <button
            type="button"
            onClick={() => act(() => resumeSandbox(sandbox))}
            aria-label={`Resume ${id}`}
          >
            Resume
          </button>
        ) : (
          <button
            type="button"
            onClick={() => act(() => pauseSandbox(sandbox))}
            aria-label={`Pause ${id}`}
          >
            Pause
          </button>
        )}
        <button
          type="button"
          onClick={() => extendSandbox(sandbox)}
          aria-label={`Extend the timeout of ${id}`}
        >
          Extend
        </button>
        {!paused && (
          <button
            type="button"
            onClick={() => snapshotSandbox(sandbox)}
            aria-label={`Snapshot ${id}`}
          >
            Snapshot
          </button>
        )}
        <button
          type="button"
          class="danger"
          onClick={() => killSandbox(sandbox)}
          aria-label={`Kill ${id}`}
        >
          Kill
        </button>
      </td>
    </tr>
  );
}
