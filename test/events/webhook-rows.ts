import type { WebhookRecord } from '../../src/control/webhook-store.js';

// The webhook rows the store tests register: each one new (id, name), key_a's, taking every type.

let sequence = 0;

/** A new webhook row, `overrides` on top. */
export function hook(overrides: Partial<WebhookRecord> = {}): Omit<WebhookRecord, 'cursor'> {
  sequence++;
  return {
    id: `whk_${String(sequence).padStart(4, '0')}${Math.random().toString(16).slice(2, 18)}`,
    owner: 'key_a',
    flavour: 'abx',
    name: `hook-${sequence}`,
    url: 'http://127.0.0.1:9/',
    enabled: true,
    events: [],
    secret: { sealed: 'sealed', keyCheck: 'check', version: 1 },
    createdAt: 1_800_000_000_000,
    updatedAt: 1_800_000_000_000,
    ...overrides,
  };
}
