import { describe, expect, test } from 'vitest';
import {
  HostAddresses,
  interfaceAddresses,
  listenerDenials,
} from '../../src/egress/host-addresses.js';
import { ALWAYS_DENIED } from '../../src/egress/policy.js';

describe("the egress namespace's own addresses", () => {
  test('every interface address is read, loopback included, canonical and without an IPv6 zone', () => {
    const addresses = interfaceAddresses();
    expect(addresses).toContain('127.0.0.1');
    for (const address of addresses) expect(address).not.toMatch(/%|^::ffff:/);
  });

  test('a change is passed on once, with the new list; no change, no call', () => {
    let now = ['198.51.100.1'];
    const seen: string[][] = [];
    const host = new HostAddresses({ read: () => now, onChange: (list) => seen.push(list) });
    expect([...host.current()]).toEqual(['198.51.100.1']);
    expect(host.refresh()).toBe(false);
    now = ['198.51.100.1', '198.51.100.77'];
    expect(host.current().has('198.51.100.77')).toBe(true);
    expect(host.refresh()).toBe(false);
    now = ['198.51.100.77'];
    expect(host.refresh()).toBe(true);
    expect(seen).toEqual([['198.51.100.1', '198.51.100.77'], ['198.51.100.77']]);
    expect(host.list).toEqual(['198.51.100.77']);
  });
});

describe("the daemon's listener addresses", () => {
  const read = () => ['127.0.0.1', '10.0.0.5', '198.51.100.1', '::1', '2001:db8::5', 'fe80::1'];

  test('a listener on an address denies it; on 0.0.0.0 or ::, every address of its namespace', () => {
    expect(listenerDenials(['198.51.100.9', '[2001:db8::9]'], ALWAYS_DENIED, read)).toEqual([
      '198.51.100.9/32',
      '2001:db8::9/128',
    ]);
    // What an always-denied range holds already is left out (nft refuses overlapping intervals).
    expect(listenerDenials(['0.0.0.0'], ALWAYS_DENIED, read)).toEqual([
      '198.51.100.1/32',
      '2001:db8::5/128',
    ]);
    expect(listenerDenials(['::'], ALWAYS_DENIED, read)).toEqual(
      listenerDenials(['0.0.0.0'], ALWAYS_DENIED, read),
    );
    expect(listenerDenials(['127.0.0.1', 'localhost', '10.0.0.5'], ALWAYS_DENIED, read)).toEqual(
      [],
    );
  });
});
