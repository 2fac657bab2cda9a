import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import type { WebhookDelivery, WebhookInfo } from '../../../src/sandbox/webhook.js';
import { api, type Session, seg } from '../api.js';
import { ask } from '../components/dialog.js';
import { ShownOnce } from '../components/shown-once.js';
import { EmptyRow, Failure, TableHead } from '../components/table.js';
import { errorText, time } from '../format.js';

/** How often the open delivery log and the last-delivery column are read again. */
const POLL_MS = 3000;
/** ...and while a delivery is due now or being tried (a test just sent): its outcome comes soon. */
const SOON_MS = 500;
/** Deliveries read per webhook (the API's most is 500). */
const LOG_LIMIT = 50;

const hookPath = (id: string) => `/v1/webhooks/${seg(id)}`;

/** A log newest first by when each delivery was (re)queued: a test or a redelivery on top. */
const newestFirst = (log: WebhookDelivery[]) =>
  [...log].sort((a, b) => b.createdAt.localeCompare(a.createdAt));

const stateClass = (state: WebhookDelivery['state']) =>
  `state ${state === 'delivered' ? 'running' : state === 'pending' ? 'paused' : 'dead'}`;

function outcomeText(d: WebhookDelivery): string {
  const status = d.lastStatus === null ? '' : ` (HTTP ${d.lastStatus})`;
  return `${d.state}${status}`;
}

/** `a, b` → `['a', 'b']`; empty: every type. */
const parseEvents = (text: string) =>
  text
    .split(/[\s,]+/)
    .map((t) => t.trim())
    .filter(Boolean);

/**
 * The key's webhooks (an admin's: every key's): add one, enable or disable it, send it a test
 * event, read its delivery log and redeliver from it, remove it. A secret abx generates is shown
 * once, at creation; nothing the page reads back holds a secret (the API never answers one).
 */
export function WebhooksPage({ session }: { session: Session }) {
  const [hooks, setHooks] = useState<WebhookInfo[] | null>(null);
  const [logs, setLogs] = useState<Record<string, WebhookDelivery[]>>({});
  const [open, setOpen] = useState<string | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const [done, setDone] = useState<string | null>(null);
  const [made, setMade] = useState<{ name: string; secret: string } | null>(null);
  const [url, setUrl] = useState('');
  const [name, setName] = useState('');
  const [events, setEvents] = useState('');
  const [secret, setSecret] = useState('');

  const lastLoad = useRef(0);
  const dueSoon = useRef(false);
  const load = useCallback(async () => {
    lastLoad.current = Date.now();
    try {
      const list = (await api<{ webhooks: WebhookInfo[] }>('GET', '/v1/webhooks')).webhooks;
      const read = await Promise.all(
        list.map(async (hook) => {
          const body = await api<{ deliveries: WebhookDelivery[] }>(
            'GET',
            `${hookPath(hook.id)}/deliveries?limit=${LOG_LIMIT}`,
          );
          return [hook.id, newestFirst(body.deliveries)] as const;
        }),
      );
      setHooks(list);
      setLogs(Object.fromEntries(read));
      const soon = Date.now() + 2000;
      dueSoon.current = read.some(([, log]) =>
        log.some(
          (d) =>
            d.state === 'pending' &&
            (d.nextAttemptAt === null || Date.parse(d.nextAttemptAt) < soon),
        ),
      );
    } catch (error) {
      setFailure(errorText(error));
    }
  }, []);
  useEffect(() => {
    void load();
    const timer = setInterval(() => {
      if (dueSoon.current || Date.now() - lastLoad.current >= POLL_MS) void load();
    }, SOON_MS);
    return () => clearInterval(timer);
  }, [load]);

  const act = async (work: () => Promise<string>) => {
    setFailure(null);
    setDone(null);
    try {
      const said = await work();
      // Said once the list shows it (a disabled webhook's Test button is off by then).
      await load();
      setDone(said);
    } catch (error) {
      setFailure(errorText(error));
    }
  };

  const create = async (event: Event) => {
    event.preventDefault();
    const given = secret;
    // The secret typed leaves the page whether or not it was taken.
    setSecret('');
    await act(async () => {
      const types = parseEvents(events);
      const body = await api<WebhookInfo & { secret?: string }>('POST', '/v1/webhooks', {
        url: url.trim(),
        ...(name.trim() ? { name: name.trim() } : {}),
        ...(types.length > 0 ? { events: types } : {}),
        ...(given ? { secret: given } : {}),
      });
      setUrl('');
      setName('');
      setEvents('');
      if (body.secret) setMade({ name: body.name, secret: body.secret });
      return `Made webhook ${body.name} (${body.id}).`;
    });
  };

  const setEnabled = (hook: WebhookInfo, enabled: boolean) =>
    act(async () => {
      await api('PATCH', hookPath(hook.id), { enabled });
      return `${enabled ? 'Enabled' : 'Disabled'} webhook ${hook.name}.`;
    });

  const test = (hook: WebhookInfo) =>
    act(async () => {
      const delivery = await api<WebhookDelivery>('POST', `${hookPath(hook.id)}/test`);
      setOpen(hook.id);
      return `Sent ${hook.name} a test event: delivery ${delivery.id}; its outcome shows in the log.`;
    });

  const redeliver = (hook: WebhookInfo, delivery: WebhookDelivery) =>
    act(async () => {
      await api('POST', `${hookPath(hook.id)}/deliveries/${seg(delivery.id)}/redeliver`);
      return `Queued delivery ${delivery.id} again (same id: a receiver that has it deduplicates it).`;
    });

  const remove = (hook: WebhookInfo) =>
    ask({
      title: `Remove webhook ${hook.name}?`,
      message: 'Nothing more is sent to it, and its delivery log is deleted.',
      confirm: 'Remove',
      danger: true,
      async run() {
        await api('DELETE', hookPath(hook.id));
        if (open === hook.id) setOpen(null);
        await load();
      },
    });

  const columns = [
    'Name',
    'URL',
    'Events',
    'Enabled',
    'Last delivery',
    ...(session.admin ? ['Owner'] : []),
  ];
  const shown = hooks?.find((h) => h.id === open);
  const log = shown ? (logs[shown.id] ?? []) : [];
  return (
    <section aria-labelledby="webhooks-title">
      <h1 id="webhooks-title">Webhooks</h1>
      <p class="hint">
        The lifecycle events of this key's sandboxes, POSTed to a URL as they happen, signed
        (abx-webhook-signature) and retried for up to a day. A secret abx makes is shown once.
      </p>
      <form class="inline-form" onSubmit={create} aria-label="Add a webhook">
        <div class="field">
          <label for="webhook-url">URL</label>
          <input
            id="webhook-url"
            type="url"
            required
            placeholder="https://example.com/abx"
            value={url}
            onInput={(e) => setUrl((e.target as HTMLInputElement).value)}
          />
        </div>
        <div class="field">
          <label for="webhook-name">Name (empty: the URL's host)</label>
          <input
            id="webhook-name"
            value={name}
            onInput={(e) => setName((e.target as HTMLInputElement).value)}
          />
        </div>
        <div class="field">
          <label for="webhook-events">Event types (empty: all)</label>
          <input
            id="webhook-events"
            placeholder="sandbox.lifecycle.killed, …"
            value={events}
            onInput={(e) => setEvents((e.target as HTMLInputElement).value)}
          />
        </div>
        <div class="field">
          <label for="webhook-secret">Signing secret (empty: abx makes one)</label>
          <input
            id="webhook-secret"
            type="password"
            autocomplete="off"
            minLength={8}
            maxLength={1024}
            value={secret}
            onInput={(e) => setSecret((e.target as HTMLInputElement).value)}
          />
        </div>
        <button type="submit" class="primary">
          Add webhook
        </button>
      </form>
      {made && (
        <ShownOnce
          id="made-secret"
          label="Signing secret"
          value={made.secret}
          onDone={() => setMade(null)}
        >
          The signing secret of <strong>{made.name}</strong>, shown this once: copy it now.
        </ShownOnce>
      )}
      <Failure text={failure} />
      {done && (
        <p class="hint" role="status">
          {done}
        </p>
      )}
      {hooks && (
        <div class="table-wrap">
          <table>
            <TableHead columns={columns} actions />
            <tbody>
              {hooks.map((hook) => {
                const last = logs[hook.id]?.[0];
                return (
                  <tr key={hook.id}>
                    <th scope="row">{hook.name}</th>
                    <td class="mono">{hook.url}</td>
                    <td>{hook.events.length > 0 ? hook.events.join(', ') : 'all'}</td>
                    <td>{hook.enabled ? 'yes' : 'no'}</td>
                    <td>
                      {last ? (
                        <>
                          <span class={stateClass(last.state)}>{outcomeText(last)}</span>{' '}
                          {time(last.deliveredAt ?? last.createdAt)}
                        </>
                      ) : (
                        '—'
                      )}
                    </td>
                    {session.admin && <td>{hook.owner ?? 'daemon key'}</td>}
                    <td class="actions">
                      <button
                        type="button"
                        onClick={() => void test(hook)}
                        disabled={!hook.enabled}
                        aria-label={`Send webhook ${hook.name} a test event`}
                      >
                        Test
                      </button>
                      <button
                        type="button"
                        onClick={() => void setEnabled(hook, !hook.enabled)}
                        aria-label={`${hook.enabled ? 'Disable' : 'Enable'} webhook ${hook.name}`}
                      >
                        {hook.enabled ? 'Disable' : 'Enable'}
                      </button>
                      <button
                        type="button"
                        aria-pressed={open === hook.id}
                        onClick={() => setOpen(open === hook.id ? null : hook.id)}
                        aria-label={`Deliveries of webhook ${hook.name}`}
                      >
                        Deliveries
                      </button>
                      <button
                        type="button"
                        class="danger"
                        onClick={() => remove(hook)}
                        aria-label={`Remove webhook ${hook.name}`}
                      >
                        Remove
                      </button>
                    </td>
                  </tr>
                );
              })}
              {hooks.length === 0 && (
                <EmptyRow columns={columns.length + 1}>No webhook yet.</EmptyRow>
              )}
            </tbody>
          </table>
        </div>
      )}
      {shown && (
        <section aria-labelledby="deliveries-title">
          <h2 id="deliveries-title">Deliveries of {shown.name}</h2>
          <p class="hint">
            Newest first, read again every {POLL_MS / 1000} s (every {SOON_MS} ms while one is being
            tried). A delivery keeps its id on every attempt and redelivery (the abx-webhook-id
            header): receivers deduplicate on it.
          </p>
          {log.length === 0 ? (
            <p>No deliveries yet.</p>
          ) : (
            <div class="table-wrap">
              <table>
                <TableHead
                  columns={['Delivery', 'Of', 'State', 'Attempts', 'Last error', 'Time']}
                  actions
                />
                <tbody>
                  {log.map((d) => (
                    <tr key={d.id}>
                      <th scope="row" class="mono">
                        {d.id}
                      </th>
                      <td class="mono">{d.kind === 'test' ? 'test event' : d.sandboxId}</td>
                      <td>
                        <span class={stateClass(d.state)}>{outcomeText(d)}</span>
                      </td>
                      <td>{d.attempts}</td>
                      <td class="mono">{d.lastError ?? '—'}</td>
                      <td>{time(d.deliveredAt ?? d.createdAt)}</td>
                      <td class="actions">
                        {d.state !== 'pending' && (
                          <button
                            type="button"
                            onClick={() => void redeliver(shown, d)}
                            disabled={!shown.enabled}
                            aria-label={`Redeliver ${d.id}`}
                          >
                            Redeliver
                          </button>
                        )}
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
        </section>
      )}
    </section>
  );
}
