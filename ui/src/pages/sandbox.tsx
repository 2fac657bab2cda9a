import { useEffect, useState } from 'preact/hooks';
import {
  extendSandbox,
  hibernateSandbox,
  killSandbox,
  pauseSandbox,
  resumeSandbox,
  snapshotSandbox,
} from '../actions.js';
import { api, type SandboxInfo, type Session, sandboxPath } from '../api.js';
import { Failure } from '../components/table.js';
import { duration, errorText, time } from '../format.js';
import { useLive, useNow } from '../live.js';
import { href, navigate } from '../router.js';
import { AuditTab } from './audit.js';
import { ChangesTab } from './changes.js';
import { CommandsTab } from './commands.js';
import { EventsTab } from './events.js';
import { FilesTab } from './files.js';
import { MetricsTab } from './metrics.js';
import { NetworkTab } from './network.js';
import { ProcessesTab } from './processes.js';
import { TerminalTab } from './terminal.js';

const TABS: [string, string][] = [
  ['overview', 'Overview'],
  ['processes', 'Processes'],
  ['files', 'Files'],
  ['terminal', 'Terminal'],
  ['network', 'Network'],
  ['commands', 'Commands'],
  ['audit', 'Audit'],
  ['events', 'Events'],
];
/** Only a sandbox with a workspace has this tab. */
const CHANGES_TAB: [string, string] = ['changes', 'Changes'];

/** One sandbox: its facts and metrics, and (while it runs) its processes, files, terminal, commands. */
export function SandboxPage({ id, tab }: { session: Session; id: string; tab: string }) {
  const live = useLive();
  const now = useNow();
  const [fetched, setFetched] = useState<SandboxInfo | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const current = live.sandboxes.get(id) ?? fetched;
  const endReason = live.ended.get(id);

  useEffect(() => {
    if (live.sandboxes.has(id)) return;
    let stop = false;
    api<SandboxInfo>('GET', sandboxPath(id))
      .then((info) => !stop && setFetched(info))
      .catch((error) => !stop && setFailure(errorText(error)));
    return () => {
      stop = true;
    };
  }, [id, endReason]);

  const act = (run: () => Promise<void>) => {
    setFailure(null);
    run().catch((error) => setFailure(errorText(error)));
  };

  if (!current) {
    return (
      <section>
        <p>
          <a href={href('sandboxes')}>← Sandboxes</a>
        </p>
        <h1 class="mono">{id}</h1>
        {failure ? (
          <p class="error" role="alert">
            {failure}
          </p>
        ) : (
          <p>Loading…</p>
        )}
      </section>
    );
  }
  const ended = ['killed', 'expired', 'dead'].includes(current.state) || endReason !== undefined;
  const running = current.state === 'running' && !ended;
  const paused = current.state === 'paused';
  return (
    <section aria-labelledby="sandbox-title">
      <p>
        <a href={href('sandboxes')}>← Sandboxes</a>
      </p>
      <h1 id="sandbox-title">
        Sandbox <span class="mono">{id}</span>
      </h1>
      <div class="summary">
        <span class={`state ${ended ? 'killed' : current.state}`}>
          {ended
            ? `ended${endReason || current.endReason ? `: ${endReason ?? current.endReason}` : ''}`
            : current.state}
        </span>
        <span>template {current.template}</span>
        {!ended && <span>{duration(Date.parse(current.expiresAt) - now)} left</span>}
        <div class="actions">
          {running && (
            <>
              <button type="button" onClick={() => act(() => pauseSandbox(current))}>
                Pause
              </button>
              <button type="button" class="danger" onClick={() => hibernateSandbox(current)}>
                Hibernate
              </button>
            </>
          )}
          {paused && (
            <button type="button" onClick={() => act(() => resumeSandbox(current))}>
              Resume
            </button>
          )}
          {!ended && (
            <button type="button" onClick={() => extendSandbox(current)}>
              Extend timeout
            </button>
          )}
          {running && (
            <button type="button" onClick={() => snapshotSandbox(current)}>
              Snapshot
            </button>
          )}
          {!ended && (
            <button
              type="button"
              class="danger"
              onClick={() => killSandbox(current, () => navigate(href('sandboxes')))}
            >
              Kill
            </button>
          )}
        </div>
      </div>
      <Failure text={failure} />
      <nav class="tabs" aria-label="Sandbox sections">
        <ul>
          {(current.workspace ? [...TABS, CHANGES_TAB] : TABS).map(([name, label]) => (
            <li key={name}>
              <a
                href={href('sandboxes', id, name)}
                aria-current={tab === name ? 'page' : undefined}
              >
                {label}
              </a>
            </li>
          ))}
        </ul>
      </nav>
      <div class="tab-body">
        {tab === 'overview' && <Overview sandbox={current} />}
        {tab === 'network' && <NetworkTab sandbox={current} />}
        {tab === 'audit' && <AuditTab sandbox={current} />}
        {tab === 'events' && <EventsTab sandbox={current} />}
        {tab !== 'overview' &&
          tab !== 'network' &&
          tab !== 'audit' &&
          tab !== 'events' &&
          !running && (
            <p class="notice">
              {ended
                ? 'This sandbox has ended: nothing runs in it any more.'
                : 'This sandbox is paused. Resume it to see its processes, files, terminal and commands.'}
            </p>
          )}
        {running && tab === 'processes' && <ProcessesTab id={id} />}
        {running && tab === 'files' && <FilesTab id={id} />}
        {running && tab === 'terminal' && <TerminalTab id={id} />}
        {running && tab === 'commands' && <CommandsTab id={id} />}
        {running &&
          tab === 'changes' &&
          (current.workspace ? (
            <ChangesTab id={id} path={current.workspace.path} />
          ) : (
            <p class="notice">This sandbox has no workspace: there are no changes to review.</p>
          ))}
      </div>
    </section>
  );
}

function Overview({ sandbox }: { sandbox: SandboxInfo }) {
  const rows: [string, string][] = [
    ['Template', sandbox.template],
    ['State', sandbox.state],
    ['Created', time(sandbox.createdAt)],
    ['Expires', time(sandbox.expiresAt)],
    ['At its timeout', sandbox.lifecycle?.onTimeout === 'pause' ? 'pauses' : 'is killed'],
    ['Capabilities', sandbox.capabilities.join(', ') || '–'],
    [
      'Volumes',
      sandbox.volumeMounts
        .map((v) => `${v.name} at ${v.path}${v.readOnly ? ' (read-only)' : ''}`)
        .join(', ') || '–',
    ],
  ];
  if (sandbox.paused)
    rows.push([
      'Paused',
      `${time(sandbox.paused.pausedAt)}${sandbox.paused.memory ? ', memory kept' : ', hibernated'}`,
    ]);
  if (sandbox.endedAt)
    rows.push(['Ended', `${time(sandbox.endedAt)} (${sandbox.endReason ?? ''})`]);
  const metadata = Object.entries(sandbox.metadata ?? {});
  return (
    <>
      <dl class="facts">
        {rows.map(([term, value]) => (
          <div key={term}>
            <dt>{term}</dt>
            <dd>{value}</dd>
          </div>
        ))}
        <div>
          <dt>Metadata</dt>
          <dd class="metadata">
            {metadata.length === 0
              ? '–'
              : metadata.map(([key, value]) => (
                  <span class="chip" key={key}>
                    {key}={value}
                  </span>
                ))}
          </dd>
        </div>
      </dl>
      {sandbox.state === 'running' && <MetricsTab sandbox={sandbox} />}
    </>
  );
}
