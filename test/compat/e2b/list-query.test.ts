import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import type { E2bSandboxRow } from '../../../src/compat/e2b/backend.js';
import { page, parseListQuery } from '../../../src/compat/e2b/list-query.js';
import { InvalidArgumentError } from '../../../src/errors.js';

// The paging of E2B's list (X-Next-Token) and the query the SDK sends, on arbitrary input.

const row = (id: string, createdAt: number): E2bSandboxRow => ({
  id,
  template: 'base',
  state: 'running',
  metadata: {},
  createdAt,
  expiresAt: createdAt + 1000,
  owner: null,
});

/** Rows with distinct ids and start times that often tie. */
const rows = fc
  .uniqueArray(fc.tuple(fc.stringMatching(/^i[a-z0-9]{3}$/), fc.integer({ min: 0, max: 5 })), {
    selector: ([id]) => id,
    maxLength: 30,
  })
  .map((pairs) => pairs.map(([id, at]) => row(id, at)));

/** Every page in turn, as a client following X-Next-Token does. */
function walk(all: E2bSandboxRow[], limit: number, order: 'asc' | 'desc'): string[][] {
  const pages: string[][] = [];
  let token: string | undefined;
  do {
    const query = parseListQuery(
      new URLSearchParams({ limit: String(limit), order, ...(token ? { nextToken: token } : {}) }),
    );
    const result = page(all, query);
    pages.push(result.items.map((item) => item.id));
    token = result.nextToken;
    if (pages.length > all.length + 2) throw new Error('paging does not end');
  } while (token);
  return pages;
}

describe('E2B list paging', () => {
  test('pages of any size give every sandbox once, in start order, and no token after the last', () => {
    fc.assert(
      fc.property(
        rows,
        fc.integer({ min: 1, max: 100 }),
        fc.constantFrom('asc' as const, 'desc' as const),
        (all, limit, order) => {
          const pages = walk(all, limit, order);
          const sorted = [...all].sort(
            (a, b) => a.createdAt - b.createdAt || (a.id < b.id ? -1 : 1),
          );
          if (order === 'desc') sorted.reverse();
          expect(pages.flat()).toEqual(sorted.map((item) => item.id));
          for (const items of pages.slice(0, -1)) expect(items).toHaveLength(limit);
          expect(pages.at(-1)?.length ?? 0).toBeLessThanOrEqual(limit);
        },
      ),
    );
  });

  test('a sandbox created between pages does not shift them', () => {
    const all = [row('ia', 1), row('ib', 2), row('ic', 3)];
    const first = page(all, parseListQuery(new URLSearchParams({ limit: '1' })));
    expect(first.items.map((item) => item.id)).toEqual(['ic']);
    const later = [...all, row('id', 4)];
    const second = page(
      later,
      parseListQuery(new URLSearchParams({ limit: '1', nextToken: first.nextToken as string })),
    );
    expect(second.items.map((item) => item.id)).toEqual(['ib']);
  });

  test('metadata is read as the SDK encodes it: pairs encoded, then joined and encoded again', () => {
    fc.assert(
      fc.property(fc.dictionary(fc.string({ minLength: 1 }), fc.string()), (metadata) => {
        // What e2b's SandboxPaginator sends as `metadata=`.
        const encoded = new URLSearchParams(
          Object.fromEntries(
            Object.entries(metadata).map(([k, v]) => [
              encodeURIComponent(k),
              encodeURIComponent(v),
            ]),
          ),
        ).toString();
        const query = new URLSearchParams({ metadata: encoded });
        expect(parseListQuery(new URLSearchParams(query.toString())).metadata).toEqual(metadata);
      }),
    );
  });

  test('any query string is parsed or refused with InvalidArgumentError, never anything else', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 200 }), (text) => {
        try {
          parseListQuery(new URLSearchParams(text));
        } catch (error) {
          expect(error).toBeInstanceOf(InvalidArgumentError);
        }
      }),
      { numRuns: 2000 },
    );
    for (const token of ['x', 'W10', Buffer.from('[1,2]').toString('base64url'), '%%%']) {
      expect(() => parseListQuery(new URLSearchParams({ nextToken: token }))).toThrow(
        /not a token this API gave/,
      );
    }
  });
});
