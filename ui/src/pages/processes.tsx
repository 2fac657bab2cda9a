import { useCallback, useEffect, useState } from 'preact/hooks';
import type { ProcessInfoWire } from '../../../runtime/protocol/wire.js';
import { ask } from '../components/dialog.js';
import { EmptyRow, Failure, TableHead } from '../components/table.js';
import { errorText, time } from '../format.js';
import { sandboxJson } from '../gateway.js';

/** envd's processes of the sandbox (`GET /process`), each with a kill. */
export function ProcessesTab({ id }: { id: string }) {
  const [processes, setProcesses] = useState<ProcessInfoWire[] | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const [showEnded, setShowEnded] = useState(false);

  const load = useCallback(async () => {
    try {
      const { processes } = await sandboxJson<{ processes: ProcessInfoWire[] }>(
        id,
        'GET',
        '/process',
      );
      setProcesses(processes);
      setFailure(null);
    } catch (error) {
      setFailure(errorText(error));
    }
  }, [id]);

  useEffect(() => {
    void load();
    const timer = setInterval(() => void load(), 5000);
    return () => clearInterval(timer);
  }, [load]);

  const kill = (process: ProcessInfoWire) =>
    ask({
      title: `Kill process ${process.id}?`,
      message: `SIGKILL to its whole process group: ${process.command}`,
      confirm: 'Kill',
      danger: true,
      async run() {
        await sandboxJson(id, 'POST', `/process/${encodeURIComponent(process.id)}/kill`, {
          body: { signal: 'SIGKILL' },
        });
        await load();
      },
    });

  const shown = (processes ?? []).filter((p) => showEnded || p.running);
  return (
    <section aria-labelledby="processes-title">
      <h2 id="processes-title">Processes</h2>
      <div class="toolbar">
        <button type="button" onClick={() => void load()}>
          Refresh
        </button>
        <label class="inline">
          <input
            type="checkbox"
            checked={showEnded}
            onChange={(e) => setShowEnded((e.target as HTMLInputElement).checked)}
          />{' '}
          Show ended ones
        </label>
      </div>
      <Failure text={failure} />
      {processes === null ? (
        <p>Loading…</p>
      ) : (
        <div class="table-wrap">
          <table>
            <TableHead
              columns={['Id', 'PID', 'Command', 'Directory', 'Started', 'State']}
              actions
            />
            <tbody>
              {shown.map((p) => (
                <tr key={p.id}>
                  <td class="mono">{p.id}</td>
                  <td>{p.pid ?? '–'}</td>
                  <td class="mono wrap">{p.command}</td>
                  <td class="mono">{p.cwd}</td>
                  <td>{time(p.started_at)}</td>
                  <td>
                    {p.running
                      ? 'running'
                      : p.signal
                        ? `ended by ${p.signal}`
                        : `exited ${p.exit_code ?? ''}`}
                  </td>
                  <td>
                    {p.running && (
                      <button
                        type="button"
                        class="danger"
                        onClick={() => kill(p)}
                        aria-label={`Kill process ${p.id}`}
                      >
                        Kill
                      </button>
                    )}
                  </td>
                </tr>
              ))}
              {shown.length === 0 && (
                <EmptyRow columns={7}>
                  No process{showEnded ? '' : ' running'} (commands started with the SDK or the
                  terminal show here).
                </EmptyRow>
              )}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
