import { readFileSync } from 'node:fs';
import { arg, int, sandbox } from 'abx-sandbox';

export interface Summary {
  path: string;
  rows: number;
  columns: string[];
  /** The most frequent values of `column`, most frequent first. */
  top: { value: string; count: number }[];
}

/** Commands of the `data-tools` template, served from inside its sandboxes. */
@sandbox('data-tools')
export class DataTools {
  @sandbox.register({ description: 'Row count, columns and the most frequent values of a column' })
  summarize(
    @arg({ description: 'a CSV file with a header row' }) path: string,
    @int top: number = 10,
    @arg({ description: 'the column to rank' }) column: string = 'name',
  ): Summary {
    const [header = '', ...rows] = readFileSync(path, 'utf8').trim().split('\n');
    const columns = header.split(',');
    const index = columns.indexOf(column);
    const counts = new Map<string, number>();
    for (const row of rows) {
      const value = row.split(',')[index] ?? '';
      counts.set(value, (counts.get(value) ?? 0) + 1);
    }
    const ranked = [...counts].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
    return {
      path,
      rows: rows.length,
      columns,
      top: ranked.slice(0, top).map(([value, count]) => ({ value, count })),
    };
  }

  @sandbox.register({ description: 'Add two numbers' })
  add(x: number, y = 2): number {
    return x + y;
  }
}
