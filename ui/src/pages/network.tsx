import { useEffect, useState } from 'preact/hooks';
import { api, type SandboxInfo, sandboxPath } from '../api.js';
import { TableHead } from '../components/table.js';
import { errorText, time } from '../format.js';

interface EgressEvent {
  time: string;
  kind: 'dns' | 'http' | 'tls' | 'connect';
  target: string;
  allowed: boolean;
  rule: string;
}

interface Network {
  allowOut: string[];
  denyOut: string[];
  allowed: number;
  refused: number;
  recent: EgressEvent[];
}

/** An internet sandbox's egress policy (from its info) and counters (`GET .../network`). */
export function NetworkTab({ sandbox }: { sandbox: SandboxInfo }) {
  const [network, setNetwork] = useState<Network | null>(null);
  const [note, setNote] = useState<string | null>(null);

  useEffect(() => {
    let stop = false;
    if (!sandbox.network || sandbox.state !== 'running') return;
    const load = () =>
      api<Network>('GET', sandboxPath(sandbox.sandboxId, '/network'))
        .then((body) => !stop && setNetwork(body))
        .catch((error) => !stop && setNote(errorText(error)));
    void load();
    const timer = setInterval(load, 5000);
    return () => {
      stop = true;
      clearInterval(timer);
    };
  }, [sandbox.sandboxId, sandbox.state, Boolean(sandbox.network)]);

  if (!sandbox.network) {
    return (
      <section aria-labelledby="network-title">
        <h2 id="network-title">Network</h2>
        <p>
          This sandbox is not on the <code>internet</code> network (its template says{' '}
          <code>none</code> or <code>host</code>): it has no egress policy.
        </p>
      </section>
    );
  }
  const policy = network ?? sandbox.network;
  return (
    <section aria-labelledby="network-title">
      <h2 id="network-title">Network</h2>
      <dl class="facts">
        <div>
          <dt>Allowed out</dt>
          <dd class="mono">{policy.allowOut.join(', ') || 'everything not denied'}</dd>
        </div>
        <div>
          <dt>Denied out</dt>
          <dd class="mono">{policy.denyOut.join(', ') || 'nothing'}</dd>
        </div>
        {network && (
          <div>
            <dt>Connections</dt>
            <dd>
              {network.allowed} allowed, {network.refused} refused
            </dd>
          </div>
        )}
      </dl>
      {note && <p class="notice">{note}</p>}
      {network && network.recent.length > 0 && (
        <div class="table-wrap">
          <table>
            <caption>Recent decisions (newest last)</caption>
            <TableHead columns={['Time', 'Kind', 'Target', 'Decision', 'Rule']} />
            <tbody>
              {network.recent.map((event, index) => (
                <tr key={index}>
                  <td>{time(event.time)}</td>
                  <td>{event.kind}</td>
                  <td class="mono">{event.target}</td>
                  <td>{event.allowed ? 'allowed' : 'refused'}</td>
                  <td class="mono">{event.rule}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
