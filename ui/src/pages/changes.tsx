import { useEffect, useState } from 'preact/hooks';
import { quotePath } from '../../../src/workspace/quote-path.js';
import { api, sandboxPath } from '../api.js';
import { ask } from '../components/dialog.js';
import { Failure, TableHead } from '../components/table.js';
import { errorText } from '../format.js';

/** One side of a change, as `GET …/workspace/changes` gives it (docs/workspaces.md). */
interface EntrySide {
  kind: string;
  mode: number;
}

interface Change {
  status: 'added' | 'deleted' | 'modified' | 'renamed' | 'typechange';
  path: string;
  from?: string;
  before?: EntrySide;
  after?: EntrySide;
  modeChanged: boolean;
  binary: boolean;
}

interface Review {
  patch: string;
  complete: boolean;
  omitted: { path: string; reason: string }[];
}

interface Applied {
  dryRun: boolean;
  applied: Change[];
  forced: { path: string; reason: string }[];
}

/** The patch's sections (`diff --git …` to the next) that are this change's (two for a type change). */
function sectionsOf(patch: string, change: Change): string {
  const header = `diff --git ${quotePath('a/', change.from ?? change.path)} ${quotePath('b/', change.path)}`;
  return patch
    .split(/^(?=diff --git )/m)
    .filter((section) => section.split('\n', 1)[0] === header)
    .join('');
}

const mode = (side: EntrySide | undefined) => (side ? side.mode.toString(8).padStart(4, '0') : '');

/** A diff's lines, each in a text node: a path or content the agent wrote never becomes markup. */
function DiffView({ text }: { text: string }) {
  const lines = text.endsWith('\n') ? text.slice(0, -1).split('\n') : text.split('\n');
  return (
    <pre class="diff">
      {lines.map((line, index) => {
        const kind = line.startsWith('+++') || line.startsWith('---') ? 'meta' : line[0];
        const cls =
          kind === '+' ? 'add' : kind === '-' ? 'del' : line.startsWith('@@') ? 'hunk' : undefined;
        return (
          <span key={index} class={cls}>
            {line}
            {'\n'}
          </span>
        );
      })}
    </pre>
  );
}

/**
 * A sandbox's workspace against its host folder: the changes (`GET …/workspace/changes`) and
 * the patch of the one selected (`GET …/workspace/diff?format=json`); Apply writes them all
 * back (`POST …/workspace/apply`, asked first), or shows the daemon's refusal.
 */
export function ChangesTab({ id, path }: { id: string; path: string }) {
  const [changes, setChanges] = useState<Change[] | null>(null);
  const [review, setReview] = useState<Review | null>(null);
  const [selected, setSelected] = useState<string | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const [done, setDone] = useState<Applied | null>(null);
  const [round, setRound] = useState(0);

  useEffect(() => {
    let stop = false;
    setFailure(null);
    Promise.all([
      api<{ entries: Change[] }>('GET', sandboxPath(id, '/workspace/changes')),
      api<Review>('GET', sandboxPath(id, '/workspace/diff?format=json')),
    ])
      .then(([found, diff]) => {
        if (stop) return;
        setChanges(found.entries);
        setReview(diff);
      })
      .catch((error) => !stop && setFailure(errorText(error)));
    return () => {
      stop = true;
    };
  }, [id, round]);

  const apply = () =>
    ask({
      title: `Apply ${changes?.length ?? 0} changes to the host folder?`,
      message:
        'Each changed file is written into the folder this workspace was made from. A file changed on the host meanwhile is refused, and then nothing is written.',
      confirm: 'Apply',
      danger: true,
      async run() {
        setDone(await api<Applied>('POST', sandboxPath(id, '/workspace/apply'), {}));
        setRound((n) => n + 1);
      },
    });

  const current = changes?.find((change) => change.path === selected);
  return (
    <section aria-labelledby="changes-title">
      <h2 id="changes-title">Changes</h2>
      <p>
        The workspace at <code>{path}</code> against its host folder.{' '}
        <button type="button" onClick={() => setRound((n) => n + 1)}>
          Refresh
        </button>{' '}
        {changes && changes.length > 0 && (
          <button type="button" class="danger" onClick={apply}>
            Apply to host folder
          </button>
        )}
      </p>
      <Failure text={failure} />
      {done && (
        <p class="notice" role="status">
          Applied {done.applied.length} changes
          {done.forced.length > 0 ? `, ${done.forced.length} over host edits` : ''}.
        </p>
      )}
      {changes === null && !failure && <p>Loading…</p>}
      {changes && changes.length === 0 && <p>No changes: the workspace is its host folder.</p>}
      {changes && changes.length > 0 && (
        <div class="table-wrap">
          <table class="changes">
            <TableHead columns={['Status', 'Path', 'Binary', 'Mode']} />
            <tbody>
              {changes.map((change) => (
                <tr key={change.path} aria-selected={change.path === selected}>
                  <td>{change.status}</td>
                  <td class="mono">
                    <button type="button" class="link" onClick={() => setSelected(change.path)}>
                      {change.from ? `${change.from} → ${change.path}` : change.path}
                    </button>
                  </td>
                  <td>{change.binary ? 'binary' : ''}</td>
                  <td class="mono">
                    {change.modeChanged
                      ? `${mode(change.before)} → ${mode(change.after)}`
                      : mode(change.after ?? change.before)}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {review && !review.complete && (
        <p class="notice">
          Not in the patch:{' '}
          {review.omitted.map((entry) => `${entry.path} (${entry.reason})`).join('; ')}
        </p>
      )}
      {current && review && (
        <>
          <h3 class="mono">{current.path}</h3>
          {sectionsOf(review.patch, current) ? (
            <DiffView text={sectionsOf(review.patch, current)} />
          ) : (
            <p>Nothing of this change is in the patch (see above).</p>
          )}
        </>
      )}
    </section>
  );
}
