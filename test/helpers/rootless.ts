import { execFileSync, spawn } from 'node:child_process';
import { randomInt } from 'node:crypto';
import {
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stopDaemon } from '../../src/installation/daemon-connection.js';
import { uidProcesses } from '../../src/providers/local/sandbox-uids.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import { ensureBuilt, ROOT } from './build.js';
import { inPrivateMounts } from './host-ns.js';
import { makeInternet, ownedNamespace, type TestInternet } from './internet.js';
import { deleteNetns } from './netns.js';

const CONTROLLERS = ['memory', 'pids', 'cpu', 'freezer'] as const;

/** SIGKILLs every live process of `uid`; how many there were. */
function killUid(uid: number): number {
  const pids = uidProcesses(uid);
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  return pids.length;
}

/** Removes a cgroup folder and its children, deepest first. */
function removeCgroupTree(dir: string): void {
  if (!existsSync(dir)) return;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    if (entry.isDirectory()) removeCgroupTree(join(dir, entry.name));
  }
  try {
    rmdirSync(dir);
  } catch {
    // still has members; the caller killed them, a retry takes it
  }
}

export interface RootlessDaemon {
  home: string;
  uid: number;
  /** Its `$XDG_RUNTIME_DIR` (what a login session gives a user), 0700 and its own. */
  runtimeDir: string;
  close(): Promise<void>;
}

/**
 * A daemon running as an unprivileged host uid (rootless mode), as a user without root would run
 * it. Only root can set that up here, so this needs a root test process: it picks a uid with no
 * account, gives it a private `$ABX_HOME`, and — when `delegateCgroups` — a cgroup parent per
 * controller chowned to it (what an administrator does to let a rootless daemon enforce limits).
 * The package is bind-mounted at a path that uid may enter (the checkout may sit under /root),
 * in a mount namespace of the daemon's own. `close()` stops the daemon and every process of
 * that uid and removes what was made.
 */
/** A uid with no account, for a rootless daemon (and what it must own, made before it starts). */
export function rootlessUid(): number {
  return 1_400_000_000 + randomInt(1_000_000);
}

export async function startRootlessDaemon(
  options: {
    delegateCgroups?: boolean;
    uid?: number;
    env?: Record<string, string>;
    /** Internet sandboxes' egress from the host's namespace, as by default outside tests. */
    hostEgress?: boolean;
    /**
     * Host files bound over others (`[source, target]`) in the daemon's mount namespace only, so
     * its sandboxes see them and the rest of the host does not (e.g. another Node as /usr/bin/node).
     */
    binds?: readonly (readonly [string, string])[];
  } = {},
): Promise<RootlessDaemon> {
  ensureBuilt();
  const uid = options.uid ?? rootlessUid();
  // Unless the test gives one: an egress namespace of this uid's own with no route, so that no
  // sandbox of this daemon (internet by default) can send a packet off this machine.
  let egressNs: string | undefined;
  const env = { ...options.env };
  if (!options.hostEgress && !env.ABX_EGRESS_NETNS) {
    egressNs = `abx-rootless-egress-${uid}`;
    env.ABX_EGRESS_USERNS = await ownedNamespace(egressNs, uid);
    env.ABX_EGRESS_NETNS = `/run/netns/${egressNs}`;
    execFileSync('ip', ['-n', egressNs, 'link', 'set', 'lo', 'up'], { stdio: 'pipe' });
  }
  const home = mkdtempSync(join(tmpdir(), 'abx-rootless-'));
  chownSync(home, uid, uid);
  const cgroups: string[] = [];
  if (options.delegateCgroups) {
    for (const controller of CONTROLLERS) {
      const hierarchy = `/sys/fs/cgroup/${controller}`;
      if (!existsSync(join(hierarchy, 'cgroup.procs'))) continue;
      const dir = join(hierarchy, `abx-${uid}`);
      mkdirSync(dir);
      chownSync(dir, uid, uid);
      for (const file of ['cgroup.procs', 'tasks']) {
        if (existsSync(join(dir, file))) chownSync(join(dir, file), uid, uid);
      }
      cgroups.push(dir);
    }
  }
  const stage = `/run/abx-rootless/${uid}`;
  mkdirSync(stage, { recursive: true, mode: 0o755 });
  // A login session's /run/user/UID: where the daemon keeps the portable runtime its sandboxes
  // may run on (outside $ABX_HOME, whose path must not show inside them).
  const runtimeDir = `/run/abx-rootless/${uid}-run`;
  mkdirSync(runtimeDir, { mode: 0o700 });
  chownSync(runtimeDir, uid, uid);
  const log = openSync(join(home, 'daemon.log'), 'a');
  const script =
    'mount --bind "$1" "$2" && shift 2 && while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; shift; exec setpriv --reuid="$UID_" --regid="$UID_" --clear-groups "$@"';
  const [command, ...args] = inPrivateMounts(script, 'abx-rootless', [
    ROOT,
    stage,
    ...(options.binds ?? []).flat(),
    '--',
    process.execPath,
    join(stage, 'dist', 'daemon.js'),
  ]);
  const child = spawn(command, args, {
    detached: true,
    stdio: ['ignore', log, log],
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: home,
      ABX_HOME: home,
      XDG_RUNTIME_DIR: runtimeDir,
      UID_: String(uid),
      ...env,
    },
  });
  child.unref();
  const close = async () => {
    try {
      for (const info of await Sandbox.list({ home, state: 'running', autoStart: false })) {
        await Sandbox.kill(info.sandboxId, { home, autoStart: false });
      }
    } catch {
      // no daemon answers: the sweep below still cleans up
    }
    await stopDaemon(home).catch(() => undefined);
    for (let i = 0; i < 100 && killUid(uid) > 0; i++) await new Promise((r) => setTimeout(r, 20));
    for (const dir of cgroups) removeCgroupTree(dir);
    if (egressNs) deleteNetns(egressNs);
    rmSync(home, { recursive: true, force: true });
    rmSync(stage, { recursive: true, force: true });
    rmSync(runtimeDir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if (existsSync(join(home, 'daemon.json'))) return { home, uid, runtimeDir, close };
    if (child.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  const text = readFileSync(join(home, 'daemon.log'), 'utf8');
  await close();
  throw new Error(`the rootless daemon did not start:\n${text}`);
}

/**
 * A rootless daemon whose egress namespace is a test internet of the daemon user's own (no route
 * off this machine, the test's hosts file): its uid, the daemon and the internet, which the
 * caller removes after `daemon.close()`. The internet goes at once when the daemon fails to start.
 */
export async function startRootlessOnInternet(
  env: Record<string, string> = {},
): Promise<{ uid: number; daemon: RootlessDaemon; internet: TestInternet }> {
  const uid = rootlessUid();
  const internet = await makeInternet({ owner: uid });
  const daemon = await startRootlessDaemon({
    uid,
    delegateCgroups: true,
    env: {
      ABX_EGRESS_NETNS: internet.path,
      ABX_EGRESS_USERNS: internet.userns as string,
      ABX_EGRESS_HOSTS: internet.hostsFile,
      ...env,
    },
  }).catch((error) => {
    internet.remove();
    throw error;
  });
  return { uid, daemon, internet };
}
