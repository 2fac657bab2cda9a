import type { SandboxRecord } from './registry.js';

/** How long the gateway trusts a running sandbox's record without asking the database again. */
export const RECORD_CACHE_TTL_MS = 1000;
/** Records kept at most (the cache is emptied when it grows past this). */
const MAX_RECORDS = 10_000;

/**
 * The gateway's lookups on a registry that needs a round trip (PostgreSQL): running sandboxes'
 * records for `ttlMs`, so a burst of new connections to one sandbox costs one query. What the
 * gateway reads of a running sandbox (token hash, handle, capabilities) never changes; that it
 * still runs is checked against its processes on every lookup, and a sandbox this daemon ends is
 * forgotten at once. A sandbox another daemon ends is refused here within `ttlMs` at most (sooner
 * once its processes are gone). While the database does not answer, records already seen are
 * served past `ttlMs`: running sandboxes stay reachable through an outage.
 */
export class RecordCache {
  private readonly records = new Map<string, { record: SandboxRecord; at: number }>();
  private readonly loading = new Map<string, Promise<SandboxRecord | undefined>>();

  constructor(
    private readonly load: (id: string) => Promise<SandboxRecord | undefined>,
    private readonly ttlMs = RECORD_CACHE_TTL_MS,
  ) {}

  async get(id: string): Promise<SandboxRecord | undefined> {
    const cached = this.records.get(id);
    if (cached && Date.now() - cached.at < this.ttlMs) return cached.record;
    let loading = this.loading.get(id);
    if (!loading) {
      loading = this.load(id).finally(() => this.loading.delete(id));
      this.loading.set(id, loading);
    }
    let record: SandboxRecord | undefined;
    try {
      record = await loading;
    } catch (error) {
      if (cached) return cached.record;
      throw error;
    }
    if (record?.state === 'running') {
      if (this.records.size >= MAX_RECORDS) this.records.clear();
      this.records.set(id, { record, at: Date.now() });
    } else {
      this.records.delete(id);
    }
    return record;
  }

  forget(id: string): void {
    this.records.delete(id);
  }
}
