import { useCallback, useEffect, useState } from 'preact/hooks';
import type { ApiKeyInfo } from '../../../runtime/protocol/wire.js';
import { api, type Session, seg } from '../api.js';
import { ask } from '../components/dialog.js';
import { ShownOnce } from '../components/shown-once.js';
import { Failure, TableHead } from '../components/table.js';
import { errorText, time } from '../format.js';

/** API keys (admin): create (the key shown once), list, revoke. */
export function KeysPage({ session }: { session: Session }) {
  const [keys, setKeys] = useState<ApiKeyInfo[] | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const [made, setMade] = useState<{ name: string; key: string } | null>(null);
  const [name, setName] = useState('');
  const [admin, setAdmin] = useState(false);
  const [maxRunning, setMaxRunning] = useState('');

  const load = useCallback(async () => {
    try {
      setKeys((await api<{ keys: ApiKeyInfo[] }>('GET', '/v1/keys')).keys);
    } catch (error) {
      setFailure(errorText(error));
    }
  }, []);
  useEffect(() => {
    if (session.admin) void load();
  }, [load, session.admin]);

  if (!session.admin) {
    return (
      <section>
        <h1>Keys</h1>
        <p>Managing API keys takes an admin key.</p>
      </section>
    );
  }

  const create = async (event: Event) => {
    event.preventDefault();
    setFailure(null);
    try {
      const body: Record<string, unknown> = { name: name.trim(), admin };
      if (maxRunning.trim()) body.maxRunning = Number(maxRunning);
      const answer = await api<ApiKeyInfo & { key: string }>('POST', '/v1/keys', body);
      setMade({ name: answer.name, key: answer.key });
      setName('');
      setAdmin(false);
      setMaxRunning('');
      await load();
    } catch (error) {
      setFailure(errorText(error));
    }
  };

  /** Revokes a key; with `kill`, its running and paused sandboxes are killed too. */
  const revoke = (key: ApiKeyInfo, kill = false) =>
    ask({
      title: kill ? `Revoke key ${key.name} and kill its sandboxes?` : `Revoke key ${key.name}?`,
      message: kill
        ? `${key.prefix}… is refused from its next request on, and its running and paused sandboxes are killed now: their tokens stop working at once.`
        : `${key.prefix}… is refused from its next request on; its sandboxes run on until they end.`,
      confirm: kill ? 'Revoke and kill' : 'Revoke',
      danger: true,
      async run() {
        await api('DELETE', `/v1/keys/${seg(key.id)}${kill ? '?kill=true' : ''}`);
        await load();
      },
    });

  return (
    <section aria-labelledby="keys-title">
      <h1 id="keys-title">Keys</h1>
      <form class="inline-form" onSubmit={create} aria-label="Create a key">
        <div class="field">
          <label for="key-name">Name</label>
          <input
            id="key-name"
            required
            value={name}
            onInput={(e) => setName((e.target as HTMLInputElement).value)}
          />
        </div>
        <div class="field">
          <label for="key-max">Most sandboxes running (empty: no limit)</label>
          <input
            id="key-max"
            type="number"
            min={1}
            step={1}
            value={maxRunning}
            onInput={(e) => setMaxRunning((e.target as HTMLInputElement).value)}
          />
        </div>
        <div class="field inline">
          <input
            id="key-admin"
            type="checkbox"
            checked={admin}
            onChange={(e) => setAdmin((e.target as HTMLInputElement).checked)}
          />
          <label for="key-admin">Admin</label>
        </div>
        <button type="submit" class="primary">
          Create key
        </button>
      </form>
      {made && (
        <ShownOnce id="made-key" label="New key" value={made.key} onDone={() => setMade(null)}>
          The key of <strong>{made.name}</strong>, shown this once: copy it now.
        </ShownOnce>
      )}
      <Failure text={failure} />
      {keys && (
        <div class="table-wrap">
          <table>
            <TableHead
              columns={[
                'Name',
                'Id',
                'Prefix',
                'Admin',
                'Limit',
                'Running',
                'Created',
                'Last used',
                'Revoked',
              ]}
              actions
            />
            <tbody>
              {keys.map((key) => (
                <tr key={key.id}>
                  <th scope="row">{key.name}</th>
                  <td class="mono">{key.id}</td>
                  <td class="mono">{key.prefix}…</td>
                  <td>{key.admin ? 'yes' : 'no'}</td>
                  <td>{key.maxRunning ?? '–'}</td>
                  <td>{key.running ?? 0}</td>
                  <td>{time(key.createdAt)}</td>
                  <td>{time(key.lastUsedAt)}</td>
                  <td>{key.revokedAt ? time(key.revokedAt) : ''}</td>
                  <td>
                    {!key.revokedAt && key.id !== session.keyId && (
                      <button
                        type="button"
                        class="danger"
                        onClick={() => revoke(key)}
                        aria-label={`Revoke key ${key.name}`}
                      >
                        Revoke
                      </button>
                    )}
                    {!key.revokedAt && key.id !== session.keyId && (
                      <button
                        type="button"
                        class="danger"
                        onClick={() => revoke(key, true)}
                        aria-label={`Revoke and kill key ${key.name}`}
                      >
                        Revoke and kill
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
  );
}
