import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, test } from 'vitest';
import { ROUTE_GROUPS } from '../../runtime/server/groups/index.js';
import { ROOT } from './harness.js';

const doc = readFileSync(join(ROOT, 'docs', 'server-api.md'), 'utf8');

/** The cells of each table row of a markdown section, trimmed (the formatter pads them). */
function tableRows(heading: string): string[][] {
  const start = doc.indexOf(heading);
  const end = doc.indexOf('\n## ', start + heading.length);
  return doc
    .slice(start, end < 0 ? undefined : end)
    .split('\n')
    .filter((line) => line.startsWith('|') && !/^\|[\s|:-]+\|$/.test(line))
    .slice(1)
    .map((line) =>
      line
        .slice(1, -1)
        .split(/(?<!\\)\|/)
        .map((cell) => cell.trim()),
    );
}

const unquote = (cell: string | undefined) => cell?.replace(/^`|`$/g, '');

describe('docs/server-api.md', () => {
  test('lists exactly the endpoints of the RouteTable, each with its group', () => {
    const documented = tableRows('## Endpoints')
      .map(([method, path, group]) => `${method} ${unquote(path)} ${group}`)
      .sort();
    const routes = ROUTE_GROUPS.flatMap((g) => g.routes)
      .map((r) => `${r.method} ${r.path} ${r.group}`)
      .sort();
    expect(documented).toEqual(routes);
    expect(routes).toHaveLength(49);
  });

  test('lists every route group with its prefix and endpoint count', () => {
    const documented = tableRows('## Capability groups').map(([name, prefix, , count]) => [
      name,
      unquote(prefix),
      Number(count),
    ]);
    expect(documented).toEqual(ROUTE_GROUPS.map((g) => [g.name, g.prefix || '/', g.routes.length]));
  });
});
