import { useEffect, useState } from 'preact/hooks';
import { lifecycleText } from '../../../src/sandbox/activity-text.js';
import { api, type SandboxInfo } from '../api.js';
import { Failure, TableHead } from '../components/table.js';
import { errorText, time } from '../format.js';

/** One lifecycle event as `GET /v1/events` answers it (docs/events.md). */
interface LifecycleEvent {
  seq: number;
  id: string;
  type: string;
  at: string;
  data: Record<string, unknown>;
}

interface EventPage {
  events: LifecycleEvent[];
  cursor: number | null;
  more: boolean;
}

/** How often the tab asks for new events. */
const POLL_MS = 3000;

const when = (ms: unknown) => (typeof ms === 'number' ? time(new Date(ms).toISOString()) : '');

/** What an event says, in a few words (as `abx events` says it). */
const summary = (event: LifecycleEvent) => lifecycleText(event.type, event.data, when);

/**
 * A sandbox's lifecycle events (`GET /v1/events?sandbox=`), oldest first: each change of its
 * state as the registry recorded it with the change, read again every few seconds.
 */
export function EventsTab({ sandbox }: { sandbox: SandboxInfo }) {
  const id = sandbox.sandboxId;
  const [events, setEvents] = useState<LifecycleEvent[]>([]);
  const [failure, setFailure] = useState<string | null>(null);

  useEffect(() => {
    let stop = false;
    let cursor: number | undefined;
    setEvents([]);
    const load = async () => {
      try {
        for (let page = 0; page < 10 && !stop; page++) {
          const query = `sandbox=${encodeURIComponent(id)}&limit=1000${cursor === undefined ? '' : `&cursor=${cursor}`}`;
          const body = await api<EventPage>('GET', `/v1/events?${query}`);
          if (stop) return;
          if (body.cursor !== null) cursor = body.cursor;
          if (body.events.length > 0) setEvents((kept) => [...kept, ...body.events]);
          if (!body.more) break;
        }
        setFailure(null);
      } catch (error) {
        if (!stop) setFailure(errorText(error));
      }
    };
    void load();
    const timer = setInterval(load, POLL_MS);
    return () => {
      stop = true;
      clearInterval(timer);
    };
  }, [id]);

  return (
    <section aria-labelledby="events-title">
      <h2 id="events-title">Lifecycle events</h2>
      <p>
        Each change of this sandbox's state, recorded with the change itself: kept after it ends,
        for the events' retention (7 days unless the operator set another).
      </p>
      <Failure text={failure} />
      {events.length === 0 ? (
        <p>No events recorded.</p>
      ) : (
        <div class="table-wrap">
          <table>
            <caption>Events (oldest first)</caption>
            <TableHead columns={['Time', 'Event', 'What']} />
            <tbody>
              {events.map((event) => (
                <tr key={event.seq}>
                  <td>{time(event.at)}</td>
                  <td>{event.type.replace('sandbox.lifecycle.', '')}</td>
                  <td class="mono">{summary(event)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
