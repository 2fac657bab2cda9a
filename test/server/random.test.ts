import { describe, expect, test } from 'vitest';
import { randomBytes, randomUUID, sameSecret } from '../../runtime/server/file-tools/random.js';

// envd's random names and its token check, without node:crypto (runtime/server/file-tools/random.ts).

describe('sameSecret', () => {
  const secret = Buffer.from('own-client-token-AAAAAAAAAAAAAAAAAAAAAAAAAAAA');

  test('only the same bytes match: not a prefix, a longer one, one byte changed or nothing', () => {
    expect(sameSecret(Buffer.from(secret), secret)).toBe(true);
    for (const given of [
      secret.subarray(0, secret.length - 1),
      Buffer.concat([secret, Buffer.from('A')]),
      Buffer.concat([secret, Buffer.alloc(1)]),
      Buffer.from(`${secret.toString().slice(0, -1)}B`),
      Buffer.from(`X${secret.toString().slice(1)}`),
      Buffer.alloc(secret.length),
      Buffer.alloc(0),
    ]) {
      expect(sameSecret(given, secret), JSON.stringify(given.toString())).toBe(false);
    }
  });

  test('a secret of nothing matches nothing only, and a byte past the end counts', () => {
    expect(sameSecret(Buffer.alloc(0), Buffer.alloc(0))).toBe(true);
    expect(sameSecret(Buffer.from('a'), Buffer.alloc(0))).toBe(false);
    // Bytes of 0 past a shorter secret's end are not taken for its missing ones.
    expect(sameSecret(Buffer.from('ab\0'), Buffer.from('ab'))).toBe(false);
    expect(sameSecret(Buffer.from('ab'), Buffer.from('ab\0'))).toBe(false);
  });
});

describe('random bytes', () => {
  test('as many as asked, and not the same twice', () => {
    for (const count of [0, 1, 6, 16, 100_000]) expect(randomBytes(count)).toHaveLength(count);
    const seen = new Set(Array.from({ length: 200 }, () => randomBytes(8).toString('hex')));
    expect(seen.size).toBe(200);
    for (const hex of seen) expect(hex).toMatch(/^[0-9a-f]{16}$/);
    // 100 000 bytes hold every byte value: a source stuck on a few would not.
    expect(new Set(randomBytes(100_000)).size).toBe(256);
  });

  test('UUIDs of version 4 and the RFC 4122 variant, each new', () => {
    const uuids = Array.from({ length: 100 }, () => randomUUID());
    expect(new Set(uuids).size).toBe(100);
    for (const uuid of uuids) {
      expect(uuid).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    }
  });
});
