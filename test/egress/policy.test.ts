import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import {
  EgressRules,
  normalizePolicy,
  PolicyError,
  parseEntry,
  parsePolicy,
  withoutInternet,
} from '../../src/egress/policy.js';

const rules = new EgressRules();
const decide = (
  allowOut: string[],
  denyOut: string[],
  target: { name?: string; address?: string },
) => rules.decide(parsePolicy({ allowOut, denyOut }), target);

describe('egress policy entries', () => {
  test('CIDRs, addresses, names and wildcards are read canonically', () => {
    expect(parseEntry('10.1.2.3/8', 'x').text).toBe('10.0.0.0/8');
    expect(parseEntry('203.0.113.9', 'x').text).toBe('203.0.113.9/32');
    expect(parseEntry('2001:db8::1', 'x').text).toBe('2001:db8::1/128');
    expect(parseEntry('PyPI.org.', 'x')).toMatchObject({ kind: 'domain', text: 'pypi.org' });
    expect(parseEntry('*.GitHub.com', 'x')).toMatchObject({
      kind: 'wildcard',
      text: '*.github.com',
    });
    expect(normalizePolicy({ allowOut: ['a.test', 'A.test.'], denyOut: [] }).allowOut).toEqual([
      'a.test',
    ]);
  });

  test('bad entries are refused, naming where they are', () => {
    for (const bad of [
      '',
      'not a name',
      '1.2.3.4/33',
      '*.',
      'a..b',
      '-a.test',
      'x_y.test',
      '999.1.1.1',
      '*.*.a',
    ]) {
      expect(() => parsePolicy({ allowOut: ['ok.test', bad], denyOut: [] }), bad).toThrow(
        PolicyError,
      );
      expect(() => parsePolicy({ allowOut: ['ok.test', bad], denyOut: [] }), bad).toThrow(
        'allowOut[1]',
      );
    }
    expect(() => parsePolicy({ allowOut: 'a.test' as never, denyOut: [] })).toThrow(
      'must be an array',
    );
    expect(() => parsePolicy({ allowOut: Array(257).fill('a.test'), denyOut: [] })).toThrow(
      'at most 256',
    );
  });

  test('any string is either read or refused with a PolicyError, never anything else', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 80 }), (text) => {
        try {
          const entry = parseEntry(text, 'x');
          // What is read reads back the same.
          expect(parseEntry(entry.text, 'x').text).toBe(entry.text);
        } catch (error) {
          expect(error).toBeInstanceOf(PolicyError);
        }
      }),
    );
  });
});

describe('egress decisions', () => {
  test('with no entries everything public is allowed; the always-denied ranges never are', () => {
    expect(decide([], [], { address: '203.0.113.5' })).toMatchObject({ allowed: true });
    for (const address of [
      '127.0.0.1',
      '169.254.169.254',
      '10.0.0.1',
      '172.20.1.1',
      '192.168.1.1',
      '::1',
      'fe80::1',
      'fd00::1',
      '::ffff:127.0.0.1',
      '0.0.0.0',
    ]) {
      const decision = decide(['0.0.0.0/0', '::/0'], [], { address });
      expect(decision.allowed, address).toBe(false);
      expect(decision.rule, address).toMatch(/^always denied/);
    }
  });

  test('allow wins over deny, by name, wildcard and CIDR', () => {
    expect(decide(['www.a.test'], ['*.a.test'], { name: 'www.a.test' })).toEqual({
      allowed: true,
      rule: 'allowOut www.a.test',
    });
    expect(decide(['www.a.test'], ['*.a.test'], { name: 'api.a.test' })).toEqual({
      allowed: false,
      rule: 'denyOut *.a.test',
    });
    // A wildcard names subdomains, not the domain itself.
    expect(decide([], ['*.a.test'], { name: 'a.test' })).toMatchObject({ allowed: true });
    expect(decide(['203.0.113.0/24'], ['0.0.0.0/0'], { address: '203.0.113.7' })).toMatchObject({
      allowed: true,
    });
    expect(decide(['203.0.113.0/24'], ['0.0.0.0/0'], { address: '198.51.100.7' })).toEqual({
      allowed: false,
      rule: 'denyOut 0.0.0.0/0',
    });
    // A name allowed by name, at any public address.
    expect(
      decide(['a.test'], ['0.0.0.0/0'], { name: 'a.test', address: '198.51.100.7' }),
    ).toMatchObject({ allowed: true });
  });

  test('allowInternetAccess false denies every name and address but what allowOut names', () => {
    const closed = parsePolicy(withoutInternet({ allowOut: ['a.test'], denyOut: [] }));
    expect(rules.decide(closed, { name: 'b.test' })).toEqual({
      allowed: false,
      rule: 'denyOut 0.0.0.0/0',
    });
    expect(rules.decide(closed, { name: 'a.test' })).toMatchObject({ allowed: true });
    expect(rules.decide(closed, { address: '2001:db8::1' })).toEqual({
      allowed: false,
      rule: 'denyOut ::/0',
    });
  });

  test("an operator's permitted range lifts the always-denied one, and only it", () => {
    const permissive = new EgressRules({ permit: ['10.9.0.0/16'] });
    const policy = parsePolicy({ allowOut: [], denyOut: [] });
    expect(permissive.decide(policy, { address: '10.9.1.1' })).toMatchObject({ allowed: true });
    expect(permissive.decide(policy, { address: '10.8.1.1' }).allowed).toBe(false);
    expect(() => new EgressRules({ permit: ['example.com'] })).toThrow('CIDRs only');
  });

  test("the egress namespace's own addresses are always denied, as they are now, whatever allowOut says; a permit lifts them", () => {
    let own = new Set(['198.51.100.1', '2001:db8::1']);
    const host = new EgressRules({ hostAddresses: () => own });
    const open = parsePolicy({
      allowOut: ['198.51.100.0/24', '2001:db8::/32', 'h.test'],
      denyOut: [],
    });
    expect(host.decide(open, { address: '198.51.100.1' })).toEqual({
      allowed: false,
      rule: 'always denied: an address of this host (198.51.100.1)',
    });
    // Any spelling of the same address: IPv4-mapped, uncompressed IPv6; and by name.
    expect(host.decide(open, { address: '::ffff:198.51.100.1' }).allowed).toBe(false);
    expect(host.decide(open, { address: '2001:0db8:0:0:0:0:0:1' }).rule).toBe(
      'always denied: an address of this host (2001:db8::1)',
    );
    expect(host.decide(open, { name: 'h.test', address: '198.51.100.1' }).allowed).toBe(false);
    expect(host.decide(open, { address: '198.51.100.2' }).allowed).toBe(true);
    // Read at each decision: an address the host gets is refused from then on.
    own = new Set(['198.51.100.2']);
    expect(host.decide(open, { address: '198.51.100.2' }).allowed).toBe(false);
    expect(host.decide(open, { address: '198.51.100.1' }).allowed).toBe(true);
    // A loopback or private address of the host is refused by its range, which says more.
    own = new Set(['127.0.0.1', '10.1.2.3']);
    expect(host.alwaysDenied('10.1.2.3')).toBe('always denied: private (RFC 1918) (10.0.0.0/8)');
    const permitted = new EgressRules({ permit: ['198.51.100.0/24'], hostAddresses: () => own });
    own = new Set(['198.51.100.1']);
    expect(permitted.decide(open, { address: '198.51.100.1' })).toMatchObject({ allowed: true });
  });

  test('for any address, allowOut naming it allows it unless it is always denied', () => {
    fc.assert(
      fc.property(fc.ipV4(), (address) => {
        const decision = decide([`${address}/32`], ['0.0.0.0/0'], { address });
        expect(decision.allowed).toBe(rules.alwaysDenied(address) === undefined);
      }),
    );
  });
});
