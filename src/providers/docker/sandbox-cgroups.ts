import { existsSync, readdirSync, realpathSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { cgroupPids, createCgroups } from '../local/cgroups.js';

const CGROUP_ROOT = '/sys/fs/cgroup';
/** Parent of every docker sandbox's cgroup, in each hierarchy. */
const PARENT = 'abx-docker';

/**
 * The cgroup (from each hierarchy's root) that holds one sandbox's container, given to Docker as
 * `CgroupParent` on the cgroupfs driver. Docker limits the container's own cgroup below it and
 * removes that one when the container ends; this parent stays until `kill` removes it, so the
 * kernel's OOM-kill count can outlive the container: that is how `endCause` tells `oom` from
 * `exited` synchronously, even in a daemon started after the end (see {@link adoptMemory}).
 */
export function sandboxCgroupParent(id: string): string {
  return `/${PARENT}/${id}`;
}

/** True when the host mounts cgroup v2 alone at /sys/fs/cgroup. */
function unified(): boolean {
  return existsSync(join(CGROUP_ROOT, 'cgroup.controllers'));
}

/**
 * cgroup v1 counts an OOM kill only in the victim's own memory cgroup, and Docker's goes with the
 * container. So on v1 the daemon makes the sandbox's memory cgroup itself, with the limit, and
 * {@link adoptMemory} moves the container's processes up into it once started: every process of
 * the sandbox then lives, is limited and is counted there. (v2 counts OOM kills up the hierarchy:
 * Docker's own parent is enough.) False when this daemon cannot (not root): OOM kills are then
 * learnt from the engine's events instead.
 */
export function prepareMemoryCgroup(id: string, memory: number | undefined): boolean {
  if (!memory || unified()) return false;
  try {
    return createCgroups(id, { memory }, PARENT, false).dirs.length > 0;
  } catch {
    return false;
  }
}

/** Moves the processes of the container's memory cgroup into the sandbox's (cgroup v1). */
export function adoptMemory(id: string, container: string): void {
  const parent = join(CGROUP_ROOT, 'memory', PARENT, id);
  // A process forked during a round lands in the old cgroup: take another round for it.
  for (let round = 0; round < 5; round++) {
    const pids = cgroupPids([join(parent, container)]);
    if (pids.length === 0) return;
    for (const pid of pids) {
      try {
        writeFileSync(join(parent, 'cgroup.procs'), String(pid));
      } catch {
        // ended meanwhile
      }
    }
  }
}

/** Hierarchies mounted on this host: the unified root (v2), or one folder per v1 hierarchy. */
function hierarchies(): string[] {
  if (existsSync(join(CGROUP_ROOT, 'cgroup.controllers'))) return [CGROUP_ROOT];
  let names: string[];
  try {
    names = readdirSync(CGROUP_ROOT);
  } catch {
    return [];
  }
  const found = names
    .map((name) => join(CGROUP_ROOT, name))
    .filter((dir) => existsSync(join(dir, 'cgroup.procs')));
  // v1 mounts `cpu,cpuacct` once and links `cpu` and `cpuacct` to it: one folder, several names.
  return [
    ...new Set(
      found.map((dir) => {
        try {
          return realpathSync(dir);
        } catch {
          return dir;
        }
      }),
    ),
  ];
}

/**
 * The folders of a sandbox's parent cgroup that exist, in every hierarchy (Docker makes it in all
 * of them), the memory one first when there is one (where `oom_kill` is read).
 */
export function sandboxCgroupDirs(id: string): string[] {
  const dirs = hierarchies()
    .map((hierarchy) => join(hierarchy, PARENT, id))
    .filter((dir) => existsSync(dir));
  return dirs.sort((a, b) => Number(b.includes('/memory/')) - Number(a.includes('/memory/')));
}
