/**
 * One modal `<dialog>` for the whole page: confirmations of what destroys something, and small
 * forms (a timeout, a snapshot's name). `showModal()` keeps focus inside and Escape closes it.
 */
import { useEffect, useRef, useState } from 'preact/hooks';
import { errorText } from '../format.js';

export interface DialogField {
  name: string;
  label: string;
  type?: 'text' | 'number';
  value?: string;
  required?: boolean;
  min?: number;
  hint?: string;
}

export interface DialogRequest {
  title: string;
  message?: string;
  fields?: DialogField[];
  confirm: string;
  /** Styles the confirm button as destructive. */
  danger?: boolean;
  /** Runs on confirm; an error keeps the dialog open and shows it. */
  run(values: Record<string, string>): Promise<void> | void;
}

let open: ((request: DialogRequest) => void) | null = null;

/** Opens the dialog (asks before `run`). */
export function ask(request: DialogRequest): void {
  open?.(request);
}

export function DialogHost() {
  const ref = useRef<HTMLDialogElement>(null);
  const [request, setRequest] = useState<DialogRequest | null>(null);
  const [values, setValues] = useState<Record<string, string>>({});
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const opener = useRef<Element | null>(null);

  useEffect(() => {
    open = (next) => {
      opener.current = document.activeElement;
      setRequest(next);
      setError(null);
      setBusy(false);
      setValues(Object.fromEntries((next.fields ?? []).map((f) => [f.name, f.value ?? ''])));
    };
    return () => {
      open = null;
    };
  }, []);

  useEffect(() => {
    const dialog = ref.current;
    if (request && dialog && !dialog.open) dialog.showModal();
  }, [request]);

  const close = () => {
    ref.current?.close();
    setRequest(null);
    (opener.current as HTMLElement | null)?.focus?.();
  };

  const submit = async (event: Event) => {
    event.preventDefault();
    if (!request || busy) return;
    setBusy(true);
    setError(null);
    try {
      await request.run(values);
      close();
    } catch (failure) {
      setError(errorText(failure));
      setBusy(false);
    }
  };

  return (
    <dialog ref={ref} aria-labelledby="dialog-title" onClose={() => setRequest(null)}>
      {request && (
        <form onSubmit={submit}>
          <h2 id="dialog-title">{request.title}</h2>
          {request.message && <p>{request.message}</p>}
          {(request.fields ?? []).map((field, index) => (
            <div class="field" key={field.name}>
              <label for={`dialog-${field.name}`}>{field.label}</label>
              <input
                id={`dialog-${field.name}`}
                // Preact's types want one literal per input kind; both kinds take these attributes.
                type={(field.type ?? 'text') as 'text'}
                value={values[field.name] ?? ''}
                required={field.required}
                min={field.min}
                autoFocus={index === 0}
                onInput={(e) =>
                  setValues({ ...values, [field.name]: (e.target as HTMLInputElement).value })
                }
              />
              {field.hint && <small>{field.hint}</small>}
            </div>
          ))}
          {error && (
            <p class="error" role="alert">
              {error}
            </p>
          )}
          <div class="dialog-actions">
            <button type="button" onClick={close}>
              Cancel
            </button>
            <button type="submit" class={request.danger ? 'danger' : 'primary'} disabled={busy}>
              {busy ? 'Working…' : request.confirm}
            </button>
          </div>
        </form>
      )}
    </dialog>
  );
}
