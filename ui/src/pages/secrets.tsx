import { useCallback, useEffect, useState } from 'preact/hooks';
import { api, type Session, seg } from '../api.js';
import { ask } from '../components/dialog.js';
import { EmptyRow, Failure, TableHead } from '../components/table.js';
import { errorText, time } from '../format.js';

/** A secret as /v1 shows it: never its value. */
interface SecretRow {
  secretId: string;
  name: string;
  version: number;
  metadata: Record<string, string>;
  createdAt: string;
  updatedAt: string;
  /** The owning key's id (null: the daemon's own key); admin sessions only. */
  owner?: string | null;
}

/** `team=ml, env=prod` → `{ team: 'ml', env: 'prod' }`; undefined when the field is empty. */
function parseMetadata(text: string): Record<string, string> | undefined {
  const pairs = text
    .split(',')
    .map((pair) => pair.trim())
    .filter(Boolean);
  if (pairs.length === 0) return undefined;
  const metadata: Record<string, string> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new Error(`metadata ${JSON.stringify(pair)} is not KEY=VALUE`);
    metadata[pair.slice(0, eq).trim()] = pair.slice(eq + 1).trim();
  }
  return metadata;
}

const metadataText = (metadata: Record<string, string>) =>
  Object.entries(metadata)
    .map(([k, v]) => `${k}=${v}`)
    .join(', ');

/**
 * The key's secrets: names, versions, metadata and times. A value is typed into a password field,
 * sent once and cleared; nothing the page reads back holds one (the API never answers it).
 */
export function SecretsPage({ session }: { session: Session }) {
  const [secrets, setSecrets] = useState<SecretRow[] | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const [done, setDone] = useState<string | null>(null);
  const [name, setName] = useState('');
  const [value, setValue] = useState('');
  const [meta, setMeta] = useState('');
  const [target, setTarget] = useState('');
  const [newValue, setNewValue] = useState('');
  const [newMeta, setNewMeta] = useState('');

  const load = useCallback(async () => {
    try {
      setSecrets((await api<{ secrets: SecretRow[] }>('GET', '/v1/secrets')).secrets);
    } catch (error) {
      setFailure(errorText(error));
    }
  }, []);
  useEffect(() => void load(), [load]);

  const create = async (event: Event) => {
    event.preventDefault();
    setFailure(null);
    setDone(null);
    try {
      const metadata = parseMetadata(meta);
      const made = await api<SecretRow>('POST', '/v1/secrets', {
        name: name.trim(),
        value,
        ...(metadata ? { metadata } : {}),
      });
      setName('');
      setMeta('');
      setDone(`Made secret ${made.name} (version ${made.version}).`);
      await load();
    } catch (error) {
      setFailure(errorText(error));
    } finally {
      // The value leaves the page whether or not it was taken.
      setValue('');
    }
  };

  const update = async (event: Event) => {
    event.preventDefault();
    setFailure(null);
    setDone(null);
    try {
      const metadata = parseMetadata(newMeta);
      const updated = await api<SecretRow>('POST', `/v1/secrets/${seg(target)}`, {
        ...(newValue === '' ? {} : { value: newValue }),
        ...(metadata ? { metadata } : {}),
      });
      setNewMeta('');
      setDone(`Updated secret ${updated.name} (version ${updated.version}).`);
      await load();
    } catch (error) {
      setFailure(errorText(error));
    } finally {
      setNewValue('');
    }
  };

  const remove = (secret: SecretRow) =>
    ask({
      title: `Remove secret ${secret.name}?`,
      message: 'Every version of its value is deleted.',
      confirm: 'Remove',
      danger: true,
      async run() {
        await api('DELETE', `/v1/secrets/${seg(secret.secretId)}`);
        await load();
      },
    });

  const columns = [
    'Name',
    'Version',
    'Metadata',
    'Updated',
    'Created',
    ...(session.admin ? ['Owner'] : []),
  ];
  return (
    <section aria-labelledby="secrets-title">
      <h1 id="secrets-title">Secrets</h1>
      <p class="hint">Values are write-only: they are sent once and never shown again.</p>
      <form class="inline-form" onSubmit={create} aria-label="Create a secret">
        <div class="field">
          <label for="secret-name">Name</label>
          <input
            id="secret-name"
            required
            pattern="[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}"
            title="1 to 64 letters, digits, _, - and ., starting with a letter or digit"
            value={name}
            onInput={(e) => setName((e.target as HTMLInputElement).value)}
          />
        </div>
        <div class="field">
          <label for="secret-value">Value</label>
          <input
            id="secret-value"
            type="password"
            autocomplete="off"
            required
            value={value}
            onInput={(e) => setValue((e.target as HTMLInputElement).value)}
          />
        </div>
        <div class="field">
          <label for="secret-meta">Metadata (KEY=VALUE, …)</label>
          <input
            id="secret-meta"
            value={meta}
            onInput={(e) => setMeta((e.target as HTMLInputElement).value)}
          />
        </div>
        <button type="submit" class="primary">
          Create secret
        </button>
      </form>
      {secrets && secrets.length > 0 && (
        <form class="inline-form" onSubmit={update} aria-label="Update a secret">
          <div class="field">
            <label for="secret-target">Secret</label>
            <select
              id="secret-target"
              required
              value={target}
              onChange={(e) => setTarget((e.target as HTMLSelectElement).value)}
            >
              <option value="">Choose…</option>
              {secrets.map((secret) => (
                <option key={secret.secretId} value={secret.secretId}>
                  {secret.name}
                  {session.admin && secret.owner ? ` (${secret.owner})` : ''}
                </option>
              ))}
            </select>
          </div>
          <div class="field">
            <label for="secret-new-value">New value (empty: keep it)</label>
            <input
              id="secret-new-value"
              type="password"
              autocomplete="off"
              value={newValue}
              onInput={(e) => setNewValue((e.target as HTMLInputElement).value)}
            />
          </div>
          <div class="field">
            <label for="secret-new-meta">New metadata (replaces it)</label>
            <input
              id="secret-new-meta"
              value={newMeta}
              onInput={(e) => setNewMeta((e.target as HTMLInputElement).value)}
            />
          </div>
          <button type="submit">Update secret</button>
        </form>
      )}
      <Failure text={failure} />
      {done && (
        <p class="hint" role="status">
          {done}
        </p>
      )}
      {secrets && (
        <div class="table-wrap">
          <table>
            <TableHead columns={columns} actions />
            <tbody>
              {secrets.map((secret) => (
                <tr key={secret.secretId}>
                  <th scope="row">{secret.name}</th>
                  <td>{secret.version}</td>
                  <td>{metadataText(secret.metadata) || '—'}</td>
                  <td>{time(secret.updatedAt)}</td>
                  <td>{time(secret.createdAt)}</td>
                  {session.admin && <td>{secret.owner ?? 'daemon key'}</td>}
                  <td>
                    <button
                      type="button"
                      class="danger"
                      onClick={() => remove(secret)}
                      aria-label={`Remove secret ${secret.name}`}
                    >
                      Remove
                    </button>
                  </td>
                </tr>
              ))}
              {secrets.length === 0 && (
                <EmptyRow columns={columns.length + 1}>No secret yet.</EmptyRow>
              )}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
