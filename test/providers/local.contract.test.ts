import {
  existsSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmdirSync,
  unlinkSync,
} from 'node:fs';
import { join } from 'node:path';
import { cgroupParent, cgroupPids } from '../../src/providers/local/cgroups.js';
import { LocalProvider } from '../../src/providers/local/local-provider.js';
import { UID_LOCK_DIR, uidProcesses } from '../../src/providers/local/sandbox-uids.js';
import type { SandboxHandle } from '../../src/providers/provider.js';
import { processesMentioning, sandboxProcesses } from '../helpers/abx-home.js';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { providerContract } from './contract.js';

const CGROUP_ROOT = '/sys/fs/cgroup';

/** The sandbox's cgroup folders: in the v2 tree, or in any v1 hierarchy. */
function cgroupsOf(id: string): string[] {
  const parent = cgroupParent();
  const hierarchies = [CGROUP_ROOT, ...readdirSync(CGROUP_ROOT).map((n) => join(CGROUP_ROOT, n))];
  const found = hierarchies.map((h) => join(h, parent, id)).filter((dir) => existsSync(dir));
  // v1 links `cpu` and `cpuacct` to `cpu,cpuacct`: one folder, several names.
  return [...new Set(found.map((dir) => realpathSync(dir)))];
}

/** Uid lock files (root mode) handed to this sandbox. */
function uidLocksOf(id: string): string[] {
  if (!existsSync(UID_LOCK_DIR)) return [];
  return readdirSync(UID_LOCK_DIR)
    .map((name) => join(UID_LOCK_DIR, name))
    .filter((lock) => {
      try {
        return (JSON.parse(readFileSync(lock, 'utf8')) as { sandbox?: string }).sandbox === id;
      } catch {
        return false;
      }
    });
}

/** Loop devices (root mode's disk images) backed by a file of the sandbox's folder. */
function loopDevicesOf(dir: string): string[] {
  return readdirSync('/sys/block')
    .filter((name) => name.startsWith('loop'))
    .flatMap((name) => {
      try {
        const file = readFileSync(`/sys/block/${name}/loop/backing_file`, 'utf8').trim();
        return file.startsWith(`${dir}/`) ? [`/dev/${name} on ${file}`] : [];
      } catch {
        return [];
      }
    });
}

/**
 * Every process of the sandbox: its bwrap processes (`--hostname <id>`) and their descendants,
 * what names its folder (the root launcher, the rootless log reader), the members of its
 * cgroups (a launcher's child before it execs), and whatever runs as its own host uid.
 */
function processesOf(id: string, dir: string, handle?: SandboxHandle): number[] {
  return [
    ...new Set([
      ...sandboxProcesses(id),
      ...processesMentioning(`${dir}/`),
      ...cgroupPids(cgroupsOf(id)),
      ...(handle?.uid !== undefined ? uidProcesses(handle.uid) : []),
    ]),
  ];
}

function describeProcess(pid: number): string {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const state = /^State:\s+(.*)$/m.exec(status)?.[1];
    const uid = /^Uid:\s+(\d+)/m.exec(status)?.[1];
    const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
    return `process ${pid} (uid ${uid}, ${state}): ${argv.slice(0, 200)}`;
  } catch {
    return `process ${pid} (ended meanwhile)`;
  }
}

function leftovers(id: string, dir: string, handle?: SandboxHandle): string[] {
  return [
    ...processesOf(id, dir, handle).map(describeProcess),
    ...cgroupsOf(id).map((cgroup) => `cgroup ${cgroup}`),
    ...uidLocksOf(id).map((lock) => `uid lock ${lock}`),
    ...loopDevicesOf(dir).map((loop) => `loop device ${loop}`),
  ];
}

async function removeLeftovers(id: string, dir: string): Promise<void> {
  for (let i = 0; i < 100; i++) {
    const pids = processesOf(id, dir);
    if (pids.length === 0) break;
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  for (const cgroup of cgroupsOf(id)) {
    try {
      rmdirSync(cgroup);
    } catch {
      // still busy: the daemon's sweep of empty cgroups takes it later
    }
  }
  for (const lock of uidLocksOf(id)) unlinkSync(lock);
}

providerContract(
  'local (bubblewrap)',
  (options) => {
    ensureBuilt();
    return new LocalProvider({ runtimeDir: join(ROOT, 'dist', 'runtime'), ...options });
  },
  {
    mode: process.getuid?.() === 0 ? 'root' : 'rootless',
    leftovers,
    removeLeftovers,
  },
);
