import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { detachMount, idmapMount } from '../../src/providers/local/idmap.js';
import {
  childPidOf,
  mapRootUserns,
  ROOT_CAPS,
  rootBwrapArgs,
  rootUidOf,
} from '../../src/providers/local/root-userns.js';
import { asHostUid, inPrivateMounts } from '../helpers/host-ns.js';

// The containment of root inside an image sandbox (issue 46), against the real kernel and bwrap:
// a root attacker in a user namespace whose 0 is an unprivileged host uid, over an overlay whose
// lower layer (here the host's own root file system, idmapped, standing in for an image's) it
// owns. Not yet wired into sandbox
// starts: this holds the mechanism before it is.

const IS_ROOT = process.getuid?.() === 0;
const USER_UID = 1_500_999_123;
const ROOT_UID = rootUidOf(USER_UID);
const RUN_TIMEOUT_MS = 20_000;

const ATTACK = `
echo "uid=$(id -u)"
echo "caps=$(sed -n 's/^CapEff:\\t//p' /proc/self/status)"
unshare -r true 2>/dev/null && echo nested-userns=made || echo nested-userns=refused
( echo 5 > /proc/sys/user/max_user_namespaces ) 2>/dev/null && echo userns-limit=raised || echo userns-limit=refused
( echo 1 > /proc/sys/kernel/sysrq ) 2>/dev/null && echo sysctl=written || echo sysctl=refused
mount -t tmpfs x /mnt 2>/dev/null && echo mount=made || echo mount=refused
ip link set lo up 2>/dev/null && echo netadmin=yes || echo netadmin=refused
mknod /tmp/null c 1 3 2>/dev/null && echo mknod=made || echo mknod=refused
echo probe > /usr/bin/abx-root-probe && chmod 4755 /usr/bin/abx-root-probe && echo image-write=ok
chown 1000:1000 /usr/bin/abx-root-probe && chown 0:0 /usr/bin/abx-root-probe && echo chown=ok
setpriv --reuid 1000 --regid 1000 --clear-groups sh -c '
  echo "user-uid=$(id -u)"
  echo "user-caps=$(sed -n "s/^CapEff:\\t//p" /proc/self/status)"
  echo "user-amb=$(sed -n "s/^CapAmb:\\t//p" /proc/self/status)"
  ( echo x > /usr/bin/abx-user-probe ) 2>/dev/null && echo user-image-write=ok || echo user-image-write=refused
  /usr/bin/abx-root-probe 2>/dev/null; true'
`;

/** Runs ATTACK as root in a root sandbox over an idmapped host root; its output as key=value. */
async function attack(stage: string): Promise<Record<string, string>> {
  const [lower, upper, work, root] = ['lower', 'upper', 'work', 'root'].map((d) => join(stage, d));
  const bwrap = [
    ...asHostUid(ROOT_UID),
    '--no-new-privs',
    'bwrap',
    ...rootBwrapArgs(3, 4),
    '--unshare-pid',
    '--unshare-net',
    '--bind',
    root,
    '/',
    '--proc',
    '/proc',
    '--dev',
    '/dev',
    '--tmpfs',
    '/tmp',
    '--',
    '/bin/sh',
    '-c',
    ATTACK,
  ];
  const [command, ...args] = inPrivateMounts(
    'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3,nosuid,nodev" "$4" && shift 4 && exec "$@"',
    'sh',
    [lower, upper, work, root, ...bwrap] as string[],
  );
  const child = spawn(command, args, {
    stdio: ['ignore', 'pipe', 'pipe', 'pipe', 'pipe'],
    timeout: RUN_TIMEOUT_MS,
  });
  const [, stdout, stderr, block, info] = child.stdio as [
    null,
    NodeJS.ReadableStream,
    NodeJS.ReadableStream,
    NodeJS.WritableStream,
    NodeJS.ReadableStream,
  ];
  let out = '';
  let err = '';
  stdout.on('data', (chunk) => {
    out += chunk;
  });
  stderr.on('data', (chunk) => {
    err += chunk;
  });
  const exited = new Promise<number | null>((resolve) => child.on('close', resolve));
  try {
    let text = '';
    const pid = await new Promise<number>((resolve, reject) => {
      info.on('data', (chunk) => {
        text += chunk;
        try {
          resolve(childPidOf(text));
        } catch {
          // not whole yet
        }
      });
      info.on('end', () => reject(new Error(`bwrap gave no child pid: ${text} ${err}`)));
    });
    await mapRootUserns(pid, ROOT_UID, USER_UID);
    block.end('x');
    const code = await exited;
    if (code !== 0) throw new Error(`the attack ended with ${code}: ${err}`);
  } finally {
    if (child.exitCode === null) child.kill('SIGKILL');
  }
  return Object.fromEntries(
    out
      .trim()
      .split('\n')
      .map((line) => line.split('=', 2) as [string, string]),
  );
}

describe.runIf(IS_ROOT)('root inside a root sandbox (its own user namespace)', () => {
  let stage: string;
  let result: Record<string, string>;

  beforeAll(async () => {
    stage = mkdtempSync('/var/tmp/abx-root-');
    chmodSync(stage, 0o755);
    for (const d of ['lower', 'upper', 'work', 'root']) mkdirSync(join(stage, d));
    // The lower layer: the host's root file system, its root's files shown as the root uid's.
    await idmapMount('/', join(stage, 'lower'), 0, ROOT_UID, true);
    try {
      result = await attack(stage);
    } finally {
      detachMount(join(stage, 'lower'));
    }
  }, 30_000);

  afterAll(() => {
    if (stage) rmSync(stage, { recursive: true, force: true });
  });

  test('is uid 0 with the listed capabilities only, and owns the image through the overlay', () => {
    expect(result.uid).toBe('0');
    // CAP_CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6, SETUID 7, SETPCAP 8,
    // NET_BIND_SERVICE 10.
    expect(ROOT_CAPS).toHaveLength(9);
    expect(result.caps).toBe('00000000000005fb');
    expect(result['image-write']).toBe('ok');
    expect(result.chown).toBe('ok');
    // What root wrote is in the upper layer as the root uid (never host root); the host's own
    // /usr is untouched.
    const written = statSync(join(stage, 'upper', 'usr', 'bin', 'abx-root-probe'));
    expect(written.uid).toBe(ROOT_UID);
    expect(written.gid).toBe(ROOT_UID);
    expect(existsSync('/usr/bin/abx-root-probe')).toBe(false);
  });

  test('cannot make user namespaces, mounts, devices, or touch sysctls and the network', () => {
    expect(result['nested-userns']).toBe('refused');
    expect(result['userns-limit']).toBe('refused');
    expect(result.sysctl).toBe('refused');
    expect(result.mount).toBe('refused');
    expect(result.netadmin).toBe('refused');
    expect(result.mknod).toBe('refused');
  });

  test('the default user it switches to is uid 1000 with no capability at all', () => {
    expect(result['user-uid']).toBe('1000');
    expect(result['user-caps']).toBe('0000000000000000');
    expect(result['user-amb']).toBe('0000000000000000');
    expect(result['user-image-write']).toBe('refused');
  });

  test('a root uid is outside the allocation range and never 0', () => {
    expect(ROOT_UID).toBe(USER_UID + 1_000_000);
    expect(() => rootUidOf(0)).toThrow(/not a sandbox uid/);
  });
});
