import { useCallback, useEffect, useState } from 'preact/hooks';
import { api, seg } from '../api.js';
import { ask } from '../components/dialog.js';
import { EmptyRow, Failure, TableHead } from '../components/table.js';
import { bytes, errorText, time } from '../format.js';

interface Volume {
  volumeId: string;
  name: string;
  sizeBytes: number;
  createdAt: string;
}

/** The key's volumes: list, create, remove. */
export function VolumesPage() {
  const [volumes, setVolumes] = useState<Volume[] | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const [name, setName] = useState('');
  const [size, setSize] = useState('1G');

  const load = useCallback(async () => {
    try {
      setVolumes((await api<{ volumes: Volume[] }>('GET', '/v1/volumes')).volumes);
    } catch (error) {
      setFailure(errorText(error));
    }
  }, []);
  useEffect(() => void load(), [load]);

  const create = async (event: Event) => {
    event.preventDefault();
    setFailure(null);
    try {
      await api('POST', '/v1/volumes', {
        name: name.trim(),
        ...(size.trim() ? { size: size.trim() } : {}),
      });
      setName('');
      await load();
    } catch (error) {
      setFailure(errorText(error));
    }
  };

  const remove = (volume: Volume) =>
    ask({
      title: `Remove volume ${volume.name}?`,
      message:
        'Every file in it is deleted. A volume that a running or paused sandbox mounts is refused.',
      confirm: 'Remove',
      danger: true,
      async run() {
        await api('DELETE', `/v1/volumes/${seg(volume.name)}`);
        await load();
      },
    });

  return (
    <section aria-labelledby="volumes-title">
      <h1 id="volumes-title">Volumes</h1>
      <form class="inline-form" onSubmit={create} aria-label="Create a volume">
        <div class="field">
          <label for="volume-name">Name</label>
          <input
            id="volume-name"
            required
            pattern="[A-Za-z0-9_\-]+"
            title="letters, digits, _ and -"
            value={name}
            onInput={(e) => setName((e.target as HTMLInputElement).value)}
          />
        </div>
        <div class="field">
          <label for="volume-size">Size (bytes, or 512M, 2G)</label>
          <input
            id="volume-size"
            value={size}
            onInput={(e) => setSize((e.target as HTMLInputElement).value)}
          />
        </div>
        <button type="submit" class="primary">
          Create volume
        </button>
      </form>
      <Failure text={failure} />
      {volumes && (
        <div class="table-wrap">
          <table>
            <TableHead columns={['Name', 'Size', 'Created']} actions />
            <tbody>
              {volumes.map((volume) => (
                <tr key={volume.volumeId}>
                  <th scope="row">{volume.name}</th>
                  <td>{bytes(volume.sizeBytes)}</td>
                  <td>{time(volume.createdAt)}</td>
                  <td>
                    <button
                      type="button"
                      class="danger"
                      onClick={() => remove(volume)}
                      aria-label={`Remove volume ${volume.name}`}
                    >
                      Remove
                    </button>
                  </td>
                </tr>
              ))}
              {volumes.length === 0 && <EmptyRow columns={4}>No volume yet.</EmptyRow>}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
