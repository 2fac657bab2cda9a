import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';

/** Why two test hosts cannot be made here (not root, no `ip`, no `openssl`), or undefined. */
export function netnsUnavailable(): string | undefined {
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  if (spawnSync('ip', ['-V'], { stdio: 'ignore' }).status !== 0) {
    return "no 'ip' command (Debian's iproute2)";
  }
  if (spawnSync('openssl', ['version'], { stdio: 'ignore' }).status !== 0) {
    return "no 'openssl' command (Debian's openssl), which makes the test CA";
  }
  return undefined;
}

/**
 * Deletes a test's network namespace, SIGKILLing what still runs in it first: a process left in
 * a deleted namespace would keep it alive, unseen.
 */
export function deleteNetns(ns: string): void {
  const pids = spawnSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' }).stdout ?? '';
  for (const pid of pids.split(/\s+/).filter(Boolean)) {
    try {
      process.kill(Number(pid), 'SIGKILL');
    } catch {
      // gone
    }
  }
  spawnSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
}

/** One end of the link: a network namespace and its address. */
export interface TestHost {
  ns: string;
  ip: string;
}

/**
 * Two "hosts": network namespaces joined by a veth pair on 10.231.N.0/30, each with loopback up.
 * Names carry a random suffix, so parallel runs do not collide (addresses cannot: each namespace
 * has its own). `remove()` kills what still runs in them and deletes them.
 */
export function makeTwoHosts(): { server: TestHost; client: TestHost; remove(): void } {
  const suffix = randomBytes(3).toString('hex');
  const net = randomBytes(1)[0] as number;
  const server = { ns: `abxsrv-${suffix}`, ip: `10.231.${net}.1` };
  const client = { ns: `abxcli-${suffix}`, ip: `10.231.${net}.2` };
  const made: string[] = [];
  const [a, b] = [`abxs${suffix}`, `abxc${suffix}`];
  const remove = () => {
    // Only still here when it could not be moved into its namespace.
    spawnSync('ip', ['link', 'del', a], { stdio: 'ignore' });
    for (const ns of made.splice(0)) deleteNetns(ns);
  };
  const ip = (...args: string[]) => execFileSync('ip', args, { stdio: 'pipe' });
  try {
    for (const host of [server, client]) {
      ip('netns', 'add', host.ns);
      made.push(host.ns);
      ip('-n', host.ns, 'link', 'set', 'lo', 'up');
    }
    ip('link', 'add', a, 'type', 'veth', 'peer', 'name', b);
    ip('link', 'set', a, 'netns', server.ns);
    ip('link', 'set', b, 'netns', client.ns);
    ip('-n', server.ns, 'addr', 'add', `${server.ip}/30`, 'dev', a);
    ip('-n', client.ns, 'addr', 'add', `${client.ip}/30`, 'dev', b);
    ip('-n', server.ns, 'link', 'set', a, 'up');
    ip('-n', client.ns, 'link', 'set', b, 'up');
  } catch (error) {
    remove();
    throw error;
  }
  return { server, client, remove };
}
