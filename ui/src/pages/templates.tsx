import { useCallback, useEffect, useState } from 'preact/hooks';
import { api, errorOf, request, type Session, seg, type TemplateInfo } from '../api.js';
import { ask } from '../components/dialog.js';
import { Failure, TableHead } from '../components/table.js';
import { errorText, time } from '../format.js';

const EXAMPLE = `name: my-template
description: An example
capabilities: [shell, files, code, ports]
setup:
  - echo building
`;

interface LogLine {
  text: string;
  kind: 'progress' | 'done' | 'error';
}

export function TemplatesPage({ session }: { session: Session }) {
  const [templates, setTemplates] = useState<TemplateInfo[] | null>(null);
  const [failure, setFailure] = useState<string | null>(null);

  const load = useCallback(async () => {
    try {
      setTemplates((await api<{ templates: TemplateInfo[] }>('GET', '/v1/templates')).templates);
    } catch (error) {
      setFailure(errorText(error));
    }
  }, []);
  useEffect(() => void load(), [load]);

  /** A key removes its own templates; admins any (the API decides, this only hides the button). */
  const mayRemove = (t: TemplateInfo) =>
    t.name !== 'base' && (session.admin || (!t.shared && t.owner === session.keyId));

  const publish = async (template: TemplateInfo) => {
    try {
      await api('POST', `/v1/templates/${seg(template.name)}/publish`, {
        shared: !template.shared,
      });
      await load();
    } catch (error) {
      setFailure(errorText(error));
    }
  };

  const remove = (template: TemplateInfo) =>
    ask({
      title: `Remove template ${template.name}?`,
      message: 'New sandboxes can no longer start from it; running ones go on.',
      confirm: 'Remove',
      danger: true,
      async run() {
        await api('DELETE', `/v1/templates/${seg(template.name)}`);
        await load();
      },
    });

  return (
    <section aria-labelledby="templates-title">
      <h1 id="templates-title">Templates</h1>
      <Failure text={failure} />
      {templates && (
        <div class="table-wrap">
          <table>
            <TableHead
              columns={[
                'Name',
                'Description',
                'Image',
                'Capabilities',
                'Network',
                'Commands',
                'Shared',
                'Built',
              ]}
              actions
            />
            <tbody>
              {templates.map((t) => (
                <tr key={t.name}>
                  <th scope="row">{t.name}</th>
                  <td>{t.description}</td>
                  <td class="mono">
                    {t.builtImage ?? t.image ?? (t.dockerfile ? 'Dockerfile' : 'host system')}
                  </td>
                  <td>{t.capabilities.join(', ')}</td>
                  <td>{t.network}</td>
                  <td>{t.customCommands.map((c) => c.name).join(', ') || '–'}</td>
                  <td>
                    {t.shared ? 'every key' : t.owner === session.keyId ? 'this key' : t.owner}
                  </td>
                  <td>{time(t.builtAt)}</td>
                  <td>
                    {session.admin && t.name !== 'base' && (
                      <button
                        type="button"
                        onClick={() => publish(t)}
                        aria-label={`${t.shared ? 'Unpublish' : 'Publish'} template ${t.name}`}
                      >
                        {t.shared ? 'Unpublish' : 'Publish'}
                      </button>
                    )}
                    {mayRemove(t) && (
                      <button
                        type="button"
                        class="danger"
                        onClick={() => remove(t)}
                        aria-label={`Remove template ${t.name}`}
                      >
                        Remove
                      </button>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      <BuildForm onBuilt={load} />
      <p class="hint">
        {session.admin
          ? 'Templates built with an admin key are shared by every key; Publish shares a key’s own.'
          : 'Templates built here and snapshots are this key’s own; admin keys publish them to every key.'}
      </p>
    </section>
  );
}

/** Builds a template from pasted YAML, its progress streamed (NDJSON) into a log. */
function BuildForm({ onBuilt }: { onBuilt(): void }) {
  const [yaml, setYaml] = useState(EXAMPLE);
  const [log, setLog] = useState<LogLine[]>([]);
  const [busy, setBusy] = useState(false);

  const build = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    const lines: LogLine[] = [];
    const add = (line: LogLine) => {
      lines.push(line);
      setLog([...lines]);
    };
    try {
      const response = await request('POST', '/v1/templates', { yaml, progress: true });
      if (!response.body) throw await errorOf(response, 'POST /v1/templates');
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffered = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (value) buffered += value;
        let at = buffered.indexOf('\n');
        while (at >= 0) {
          const text = buffered.slice(0, at).trim();
          buffered = buffered.slice(at + 1);
          if (text) handle(text, add);
          at = buffered.indexOf('\n');
        }
        if (done) break;
      }
      if (buffered.trim()) handle(buffered.trim(), add);
      onBuilt();
    } catch (error) {
      add({ kind: 'error', text: errorText(error) });
    } finally {
      setBusy(false);
    }
  };

  return (
    <form class="build" onSubmit={build} aria-labelledby="build-title">
      <h2 id="build-title">Build a template</h2>
      <label for="template-yaml">template.yaml</label>
      <textarea
        id="template-yaml"
        class="mono"
        rows={10}
        spellcheck={false}
        value={yaml}
        onInput={(e) => setYaml((e.target as HTMLTextAreaElement).value)}
      />
      <button type="submit" class="primary" disabled={busy}>
        {busy ? 'Building…' : 'Build'}
      </button>
      {log.length > 0 && (
        <pre class="log" role="log" aria-label="Build log">
          {log.map((line, index) => (
            <span key={index} class={line.kind}>
              {line.text}
              {'\n'}
            </span>
          ))}
        </pre>
      )}
    </form>
  );
}

function handle(text: string, add: (line: LogLine) => void): void {
  let line: {
    progress?: { phase: string; step?: number; of?: number; text: string };
    template?: TemplateInfo;
    error?: { error?: string; type?: string };
    status?: number;
  };
  try {
    line = JSON.parse(text);
  } catch {
    add({ kind: 'progress', text });
    return;
  }
  if (line.progress) {
    const { phase, step, of, text: what } = line.progress;
    // A line a step printed: as it is, under its step's line.
    if (phase === 'output') {
      add({ kind: 'progress', text: what });
      return;
    }
    const where = step === undefined ? phase : `step ${step + 1}${of ? `/${of}` : ''}`;
    add({ kind: 'progress', text: `[${where}] ${what}` });
  } else if (line.template) {
    add({ kind: 'done', text: `Built template ${line.template.name}.` });
  } else if (line.error) {
    add({
      kind: 'error',
      text: `Build failed (${line.status ?? 'error'}${line.error.type ? `, ${line.error.type}` : ''}): ${line.error.error ?? ''}`,
    });
  }
}
