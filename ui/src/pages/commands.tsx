import { useEffect, useState } from 'preact/hooks';
import { SERVER_STATE_DIR } from '../../../runtime/protocol/constants.js';
import type { CommandDescription } from '../../../runtime/protocol/wire.js';
import { ApiError } from '../api.js';
import { Failure } from '../components/table.js';
import { errorText } from '../format.js';
import { sandboxFetch, sandboxJson } from '../gateway.js';

/** What a running command server's state file in the sandbox holds (src/sandbox/server-client.ts). */
interface ServerState {
  port: number;
  token: string;
  pid: string;
  startedAt: string;
  commands: CommandDescription[];
  sandboxId?: string;
}

type Arg = CommandDescription['args'][number];

/** The command servers of a sandbox: each one's registered commands, a form per command. */
export function CommandsTab({ id }: { id: string }) {
  const [servers, setServers] = useState<{ state: ServerState; live: boolean }[] | null>(null);
  const [failure, setFailure] = useState<string | null>(null);
  const [generation, setGeneration] = useState(0);

  useEffect(() => {
    let stop = false;
    (async () => {
      const { entries } = await sandboxJson<{
        entries: { name: string; path: string; type: string }[];
      }>(id, 'GET', '/files/list', { query: { path: SERVER_STATE_DIR } }).catch((error) => {
        if (error instanceof ApiError && error.status === 404) return { entries: [] };
        throw error;
      });
      const found: { state: ServerState; live: boolean }[] = [];
      for (const entry of entries) {
        if (entry.type !== 'file' || !/^server-\d+\.json$/.test(entry.name)) continue;
        let state: ServerState;
        try {
          const response = await sandboxFetch(id, 'GET', '/files/read', {
            query: { path: entry.path },
          });
          state = JSON.parse(await response.text()) as ServerState;
        } catch {
          continue;
        }
        // A snapshot's sandboxes inherit the file, not the server.
        if (state.sandboxId && state.sandboxId !== id) continue;
        let live = true;
        try {
          await sandboxJson(id, 'GET', '/commands', {
            port: state.port,
            headers: { authorization: `Bearer ${state.token}` },
          });
        } catch {
          live = false;
        }
        found.push({ state, live });
      }
      if (!stop) setServers(found);
    })().catch((error) => !stop && setFailure(errorText(error)));
    return () => {
      stop = true;
    };
  }, [id, generation]);

  return (
    <section aria-labelledby="commands-title">
      <h2 id="commands-title">Commands</h2>
      <div class="toolbar">
        <button type="button" onClick={() => setGeneration((n) => n + 1)}>
          Refresh
        </button>
      </div>
      <Failure text={failure} />
      {servers === null && !failure && <p>Looking for command servers…</p>}
      {servers?.length === 0 && (
        <p>
          No command server runs in this sandbox. Start one with{' '}
          <code>
            sandbox.server.start({'{'} commands: [YourClass] {'}'})
          </code>{' '}
          (its template needs the <code>ports</code> capability).
        </p>
      )}
      {servers?.map(({ state, live }) => (
        <section
          key={state.port}
          class="server"
          aria-label={`Command server on port ${state.port}`}
        >
          <h3>
            Server on port {state.port} {live ? '' : '(not answering)'}
          </h3>
          {state.commands.length === 0 && <p>It serves no registered command.</p>}
          {state.commands.map((command) => (
            <CommandForm
              key={command.name}
              sandboxId={id}
              server={state}
              command={command}
              disabled={!live}
            />
          ))}
        </section>
      ))}
    </section>
  );
}

function initial(arg: Arg): string | boolean {
  if (arg.type === 'bool') return arg.default === true;
  return arg.default === undefined ? '' : String(arg.default);
}

/** The kwargs of a form, typed as the command declares; a problem names its argument. */
function kwargsOf(args: Arg[], values: Record<string, string | boolean>): Record<string, unknown> {
  const kwargs: Record<string, unknown> = {};
  for (const arg of args) {
    const value = values[arg.name];
    if (arg.type === 'bool') {
      kwargs[arg.name] = value === true;
      continue;
    }
    const text = String(value ?? '');
    if (text === '' && !arg.required) continue;
    if (text === '' && arg.type !== 'str') throw new Error(`${arg.name} is required`);
    if (arg.type === 'int') {
      const n = Number(text);
      if (!Number.isSafeInteger(n))
        throw new Error(`${arg.name} must be a whole number, not "${text}"`);
      kwargs[arg.name] = n;
    } else if (arg.type === 'float') {
      const n = Number(text);
      if (!Number.isFinite(n)) throw new Error(`${arg.name} must be a number, not "${text}"`);
      kwargs[arg.name] = n;
    } else {
      kwargs[arg.name] = text;
    }
  }
  return kwargs;
}

function CommandForm({
  sandboxId,
  server,
  command,
  disabled,
}: {
  sandboxId: string;
  server: ServerState;
  command: CommandDescription;
  disabled: boolean;
}) {
  const [values, setValues] = useState<Record<string, string | boolean>>(() =>
    Object.fromEntries(command.args.map((arg) => [arg.name, initial(arg)])),
  );
  const [result, setResult] = useState<{ ok: boolean; text: string } | null>(null);
  const [busy, setBusy] = useState(false);
  const prefix = `cmd-${server.port}-${command.name}`;

  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setResult(null);
    try {
      const kwargs = kwargsOf(command.args, values);
      const { result } = await sandboxJson<{ result: unknown }>(
        sandboxId,
        'POST',
        `/commands/${encodeURIComponent(command.name)}`,
        { port: server.port, body: kwargs, headers: { authorization: `Bearer ${server.token}` } },
      );
      setResult({
        ok: true,
        text: typeof result === 'string' ? result : JSON.stringify(result, null, 2),
      });
    } catch (error) {
      const type = error instanceof ApiError && error.type ? `${error.type}: ` : '';
      setResult({ ok: false, text: `${type}${errorText(error)}` });
    } finally {
      setBusy(false);
    }
  };

  return (
    <form class="command" onSubmit={submit} aria-labelledby={`${prefix}-title`}>
      <h4 id={`${prefix}-title`} class="mono">
        {command.name}
      </h4>
      {command.description && <p>{command.description}</p>}
      {command.args.map((arg) => {
        const inputId = `${prefix}-${arg.name}`;
        const label = `${arg.name} (${arg.type}${arg.required ? '' : `, default ${JSON.stringify(arg.default ?? null)}`})`;
        const set = (value: string | boolean) => setValues({ ...values, [arg.name]: value });
        return (
          <div class={arg.type === 'bool' ? 'field inline' : 'field'} key={arg.name}>
            {arg.type === 'bool' ? (
              <>
                <input
                  id={inputId}
                  type="checkbox"
                  checked={values[arg.name] === true}
                  onChange={(e) => set((e.target as HTMLInputElement).checked)}
                />
                <label for={inputId}>{label}</label>
              </>
            ) : (
              <>
                <label for={inputId}>{label}</label>
                <input
                  id={inputId}
                  type={(arg.type === 'str' ? 'text' : 'number') as 'text'}
                  step={arg.type === 'int' ? 1 : arg.type === 'float' ? 'any' : undefined}
                  required={arg.required && arg.type !== 'str'}
                  value={String(values[arg.name] ?? '')}
                  onInput={(e) => set((e.target as HTMLInputElement).value)}
                />
              </>
            )}
            {arg.description && <small>{arg.description}</small>}
          </div>
        );
      })}
      <button type="submit" class="primary" disabled={busy || disabled}>
        {busy ? 'Running…' : `Run ${command.name}`}
      </button>
      {result && (
        <div class={result.ok ? 'result' : 'result error'} role="status">
          <span class="sr-only">{result.ok ? 'Result' : 'Error'}</span>
          <pre>{result.text}</pre>
        </div>
      )}
    </form>
  );
}
