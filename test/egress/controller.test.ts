import { describe, expect, test } from 'vitest';
import {
  egressEnterArgs,
  egressOptionsFromEnv,
  egressProblem,
} from '../../src/egress/controller.js';

// How a daemon reads its egress settings and what it says when they cannot work (the isolation
// report's egress line and a refused create carry these words).

describe('egress settings', () => {
  test('a rootless daemon enters /proc/PID/ns/net through the user namespace of the same process', () => {
    const env = { ABX_EGRESS_NETNS: '/proc/123/ns/net', ABX_EGRESS_HOSTS: '/etc/hosts' };
    expect(egressOptionsFromEnv(env, true)).toEqual({
      netns: '/proc/123/ns/net',
      userns: '/proc/123/ns/user',
      hostsFile: '/etc/hosts',
    });
    // A root daemon enters the network namespace alone.
    expect(egressOptionsFromEnv(env, false).userns).toBeUndefined();
    expect(egressEnterArgs(egressOptionsFromEnv(env, true))).toEqual([
      'nsenter',
      '--preserve-credentials',
      '--user=/proc/123/ns/user',
      '--net=/proc/123/ns/net',
      '--',
    ]);
    expect(egressEnterArgs({})).toEqual([]);
  });

  test('an explicit user namespace wins; permitted ranges are a list', () => {
    expect(
      egressOptionsFromEnv(
        {
          ABX_EGRESS_NETNS: '/run/netns/egress',
          ABX_EGRESS_USERNS: '/proc/9/ns/user',
          ABX_EGRESS_PERMIT: '10.20.0.0/16, 192.168.5.0/24',
        },
        true,
      ),
    ).toEqual({
      netns: '/run/netns/egress',
      userns: '/proc/9/ns/user',
      permit: ['10.20.0.0/16', '192.168.5.0/24'],
    });
  });

  test('settings that cannot work are named, with what to do', () => {
    expect(egressProblem({}, true)).toBeUndefined();
    expect(egressProblem({ netns: '/run/netns/abx-no-such-namespace' }, false)).toBe(
      'the egress namespace /run/netns/abx-no-such-namespace does not exist',
    );
    // /proc/self/ns/net exists; without root it needs the user namespace that owns it.
    expect(egressProblem({ netns: '/proc/self/ns/net' }, true)).toContain(
      'give ABX_EGRESS_USERNS (--egress-userns)',
    );
    expect(egressProblem({ netns: '/proc/self/ns/net' }, false)).toBeUndefined();
    expect(egressProblem({ permit: ['10.20.0.0/16', 'intranet.example'] }, false)).toBe(
      "ABX_EGRESS_PERMIT (--egress-permit) names 'intranet.example', which is not a CIDR such as 10.20.0.0/16",
    );
  });
});
