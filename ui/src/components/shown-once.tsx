import type { ComponentChildren } from 'preact';

/**
 * A credential the server gives once (a new API key, a webhook's generated signing secret): its
 * text in a read-only field to select or copy, and Done, which drops it from the page for good.
 */
export function ShownOnce({
  id,
  label,
  value,
  onDone,
  children,
}: {
  id: string;
  label: string;
  value: string;
  onDone: () => void;
  /** What it is, said above the field. */
  children: ComponentChildren;
}) {
  return (
    <div class="made" role="status">
      <p>{children}</p>
      <label for={id}>{label}</label>
      <input
        id={id}
        class="mono"
        readOnly
        value={value}
        onFocus={(e) => (e.target as HTMLInputElement).select()}
      />
      <button type="button" onClick={() => void navigator.clipboard?.writeText(value)}>
        Copy
      </button>
      <button type="button" onClick={onDone}>
        Done
      </button>
    </div>
  );
}
