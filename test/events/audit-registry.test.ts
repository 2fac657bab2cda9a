import { describe, expect } from 'vitest';
import { AuditLog, type NewAuditRecord } from '../../src/control/audit.js';
import { STORES, storeTest } from '../control/registry-stores.js';

const at0 = 1_800_000_000_000;

function row(
  sandboxId: string,
  kind: NewAuditRecord['kind'],
  at: number,
  data: Record<string, unknown> = {},
): NewAuditRecord {
  return { at, sandboxId, owner: sandboxId === 'sbxa' ? 'key_a' : null, actor: null, kind, data };
}

// The audit store on both registries, and the daemon's batched writer over it.
for (const kind of STORES) {
  const test = storeTest(kind);

  describe.skipIf(kind.skipped !== '')(
    `the audit trail in the ${kind.name} registry${kind.skipped}`,
    () => {
      test('a batch keeps its order; a sandbox reads its rows by cursor, kind and time; purge by age', async ({
        store,
      }) => {
        const registry = await store.open();
        await registry.appendAudit([
          row('sbxa', 'command.started', at0, { cmd: 'echo hi', nested: { x: [1, 'two'] } }),
          row('sbxb', 'file.written', at0 + 1, { path: '/tmp/b', size: 3 }),
          row('sbxa', 'file.written', at0 + 2, { path: '/tmp/a', size: 5 }),
        ]);
        await registry.appendAudit([row('sbxa', 'egress', at0 + 10, { allowed: false })]);
        const all = await registry.listAudit({ sandboxId: 'sbxa', limit: 100 });
        expect(all.map((r) => r.kind)).toEqual(['command.started', 'file.written', 'egress']);
        expect(all[0]).toMatchObject({
          sandboxId: 'sbxa',
          owner: 'key_a',
          actor: null,
          at: at0,
          data: { cmd: 'echo hi', nested: { x: [1, 'two'] } },
        });
        expect(all[1]?.seq).toBeGreaterThan(all[0]?.seq as number);
        // The daemon's own key reads back as null.
        expect((await registry.listAudit({ sandboxId: 'sbxb', limit: 10 }))[0]?.owner).toBeNull();
        const after = await registry.listAudit({
          sandboxId: 'sbxa',
          afterSeq: all[0]?.seq as number,
          limit: 1,
        });
        expect(after.map((r) => r.kind)).toEqual(['file.written']);
        const kinds = await registry.listAudit({ sandboxId: 'sbxa', kinds: ['egress'], limit: 10 });
        expect(kinds.map((r) => r.data)).toEqual([{ allowed: false }]);
        const window = await registry.listAudit({
          sandboxId: 'sbxa',
          since: at0 + 1,
          until: at0 + 10,
          limit: 10,
        });
        expect(window.map((r) => r.kind)).toEqual(['file.written']);
        expect(await registry.purgeAudit(at0 + 2)).toBe(2);
        expect(
          (await registry.listAudit({ sandboxId: 'sbxa', limit: 10 })).map((r) => r.kind),
        ).toEqual(['file.written', 'egress']);
      });

      test('the writer batches, and past its bound counts what it drops in one audit.dropped row', async ({
        store,
      }) => {
        const registry = await store.open();
        const log = new AuditLog(registry, { flushMs: 50, batchRows: 100, maxBuffered: 3 });
        for (let i = 0; i < 5; i++) {
          log.record({
            sandboxId: 'sbxa',
            owner: 'key_a',
            actor: null,
            kind: 'egress',
            data: { i },
          });
        }
        // Nothing is written while the request that recorded it runs.
        expect(await registry.listAudit({ sandboxId: 'sbxa', limit: 10 })).toEqual([]);
        await log.close();
        const rows = await registry.listAudit({ sandboxId: 'sbxa', limit: 10 });
        expect(
          rows.map((r) => (r.kind === 'egress' ? r.data.i : `${r.kind} ${r.data.count}`)),
        ).toEqual([0, 1, 2, 'audit.dropped 2']);
        expect(rows[3]?.owner).toBe('key_a');
      });
    },
  );
}
