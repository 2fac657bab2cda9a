import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { deleteNetns } from './helpers/netns.js';

/**
 * Sandboxes are on the `internet` network unless their template names another, and their
 * egress leaves from the daemon's network namespace. So that no test sandbox can send a packet
 * off this machine, every daemon a test starts as root gets an egress namespace with only a
 * loopback and no route (ABX_EGRESS_NETNS, inherited by the test workers), unless the run names
 * one. Tests that need a reachable "internet" make their own (test/helpers/internet.ts); rootless
 * daemons get one of their uid's own (test/helpers/rootless.ts).
 */
export default function setup(): (() => void) | undefined {
  // A daemon keeps its ports across starts (src/installation/daemon-ports.ts); test daemons take
  // random ones each start instead, so that files running in parallel never race for a port one
  // of them kept. Tests of the kept ports (test/cli/daemon-ports.test.ts) unset these.
  process.env.ABX_API_PORT ??= '0';
  process.env.ABX_GATEWAY_PORT ??= '0';
  if (process.env.ABX_EGRESS_NETNS || process.getuid?.() !== 0) return undefined;
  if (spawnSync('ip', ['-V'], { stdio: 'ignore' }).status !== 0) return undefined;
  removeStaleNamespaces();
  // The run's pid in the name: a run killed before its teardown leaves one the next run removes.
  const ns = `abx-test-egress-${process.pid}-${randomBytes(3).toString('hex')}`;
  execFileSync('ip', ['netns', 'add', ns], { stdio: 'pipe' });
  execFileSync('ip', ['-n', ns, 'link', 'set', 'lo', 'up'], { stdio: 'pipe' });
  process.env.ABX_EGRESS_NETNS = `/run/netns/${ns}`;
  return () => {
    delete process.env.ABX_EGRESS_NETNS;
    deleteNetns(ns);
  };
}

/** The egress namespaces of earlier runs whose process is gone (killed before their teardown). */
function removeStaleNamespaces(): void {
  const listed = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout ?? '';
  for (const line of listed.split('\n')) {
    const name = line.split(' ')[0] ?? '';
    const pid = /^abx-test-egress-(\d+)-[0-9a-f]+$/.exec(name)?.[1];
    // Names without a pid are from runs before it was put there: their teardown never ran either.
    const stale =
      pid === undefined ? /^abx-test-egress-[0-9a-f]{6}$/.test(name) : !alive(Number(pid));
    if (stale) deleteNetns(name);
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}
