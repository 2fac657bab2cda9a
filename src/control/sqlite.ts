import type { DatabaseSync, StatementSync } from 'node:sqlite';

/**
 * SQLite as Node has it built in (`node:sqlite`, unflagged from 22.13): no native addon to
 * compile at install, and one `node_modules` for every Node line. Node 22 marks it experimental
 * and says so on stderr the first time it loads; that line would land in every `abx` command's
 * output, so it alone is kept back while the module loads.
 */

export type { DatabaseSync, StatementSync };

let sqlite: typeof import('node:sqlite') | undefined;

function load(): typeof import('node:sqlite') {
  if (sqlite) return sqlite;
  const emit = process.emitWarning;
  process.emitWarning = ((warning: string | Error, ...rest: unknown[]) => {
    const text = typeof warning === 'string' ? warning : warning.message;
    if (/SQLite is an experimental feature/.test(text)) return;
    return (emit as (...args: unknown[]) => void).call(process, warning, ...rest);
  }) as typeof process.emitWarning;
  try {
    sqlite = process.getBuiltinModule('node:sqlite');
  } finally {
    process.emitWarning = emit;
  }
  return sqlite;
}

/**
 * Opens (or creates) the database file at `location` (`:memory:` for one in memory); `readOnly`
 * opens one that exists, for reading only.
 */
export function openSqlite(location: string, options: { readOnly?: boolean } = {}): DatabaseSync {
  return new (load().DatabaseSync)(location, options);
}

/**
 * Runs `fn` in a transaction: committed when it returns, rolled back when it throws.
 * `IMMEDIATE` takes the write lock first, so what `fn` reads is what it replaces, for every
 * process on the file.
 */
export function transaction<T>(
  db: DatabaseSync,
  fn: () => T,
  mode: 'DEFERRED' | 'IMMEDIATE' = 'DEFERRED',
): T {
  db.exec(`BEGIN ${mode}`);
  try {
    const result = fn();
    db.exec('COMMIT');
    return result;
  } catch (error) {
    if (db.isTransaction) db.exec('ROLLBACK');
    throw error;
  }
}

/**
 * A compiled statement as the registry uses it: values in (named parameters from an object that
 * may have more fields than the statement names), rows out as the caller declares them.
 */
export interface Statement {
  run(...params: unknown[]): { changes: number };
  get(...params: unknown[]): unknown;
  all(...params: unknown[]): unknown[];
}

/** `statement` as a {@link Statement}. */
export function lenient(statement: StatementSync): Statement {
  statement.setAllowUnknownNamedParameters?.(true);
  return statement as unknown as Statement;
}
