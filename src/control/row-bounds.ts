/** The cursor and time bounds of a read of events or audit rows (both are ordered by `seq`). */
export interface RowBounds {
  afterSeq?: number;
  beforeSeq?: number;
  since?: number;
  until?: number;
}

/**
 * The WHERE clauses of `bounds`, for both stores: `param` adds a value and writes its
 * placeholder (`?` on SQLite, `$n` on PostgreSQL), so values go in the order the clauses do.
 */
export function boundClauses(bounds: RowBounds, param: (value: unknown) => string): string[] {
  const where: string[] = [];
  if (bounds.afterSeq !== undefined) where.push(`seq > ${param(bounds.afterSeq)}`);
  if (bounds.beforeSeq !== undefined) where.push(`seq < ${param(bounds.beforeSeq)}`);
  if (bounds.since !== undefined) where.push(`at >= ${param(bounds.since)}`);
  if (bounds.until !== undefined) where.push(`at < ${param(bounds.until)}`);
  return where;
}
