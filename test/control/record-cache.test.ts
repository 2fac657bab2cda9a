import { describe, expect, test } from 'vitest';
import { RecordCache } from '../../src/control/record-cache.js';
import type { SandboxRecord } from '../../src/control/registry.js';
import { gatewayRecord } from '../helpers/gateway-record.js';

// The gateway's record cache (PostgreSQL registries) keeps a decision's input, the record, by
// sandbox id: only a running one, only for its TTL, and never past a change this daemon made.

function store(record: SandboxRecord) {
  let current: SandboxRecord | undefined = record;
  let loads = 0;
  const cache = new RecordCache(async () => {
    loads++;
    return current;
  }, 60_000);
  return {
    cache,
    loads: () => loads,
    set: (next: SandboxRecord | undefined) => {
      current = next;
    },
  };
}

const running = gatewayRecord({
  id: 'icachedsandbox',
  token: 't',
  envdSocket: '/nonexistent/envd.sock',
  portsDir: '/nonexistent/ports',
  capabilities: ['files'],
});

describe('the gateway record cache', () => {
  test('a running record is kept by id; another id is looked up on its own', async () => {
    const s = store(running);
    expect((await s.cache.get(running.id))?.state).toBe('running');
    expect((await s.cache.get(running.id))?.state).toBe('running');
    expect(s.loads()).toBe(1);
    await s.cache.get('iothersandbox');
    expect(s.loads()).toBe(2);
  });

  test('a change this daemon made is seen at once: forget drops the record', async () => {
    const s = store(running);
    await s.cache.get(running.id);
    s.set({ ...running, state: 'paused' });
    s.cache.forget(running.id);
    expect((await s.cache.get(running.id))?.state).toBe('paused');
  });

  test('a record that is not running is never kept: every lookup asks again', async () => {
    const s = store({ ...running, state: 'paused' });
    await s.cache.get(running.id);
    s.set(running);
    expect((await s.cache.get(running.id))?.state).toBe('running');
    expect(s.loads()).toBe(2);
  });

  test('past its TTL the record is read again', async () => {
    let loads = 0;
    const cache = new RecordCache(async () => {
      loads++;
      return running;
    }, 20);
    await cache.get(running.id);
    await new Promise((resolve) => setTimeout(resolve, 40));
    await cache.get(running.id);
    expect(loads).toBe(2);
  });
});
