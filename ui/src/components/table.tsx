/** Pieces every list page shows the same way: its failure line, its table's header row, its empty row. */

import type { ComponentChildren } from 'preact';

/** A failure of the page's last call, read out by screen readers; nothing when there is none. */
export function Failure({ text }: { text: string | null | undefined }) {
  return text ? (
    <p class="error" role="alert">
      {text}
    </p>
  ) : null;
}

/** A table's header: its columns, then an unnamed column for each row's buttons when `actions`. */
export function TableHead({ columns, actions = false }: { columns: string[]; actions?: boolean }) {
  return (
    <thead>
      <tr>
        {columns.map((name) => (
          <th scope="col" key={name}>
            {name}
          </th>
        ))}
        {actions && (
          <th scope="col">
            <span class="sr-only">Actions</span>
          </th>
        )}
      </tr>
    </thead>
  );
}

/** The one row of a table with nothing to list: `children` says why, across all `columns`. */
export function EmptyRow({ columns, children }: { columns: number; children: ComponentChildren }) {
  return (
    <tr>
      <td colSpan={columns} class="empty">
        {children}
      </td>
    </tr>
  );
}
