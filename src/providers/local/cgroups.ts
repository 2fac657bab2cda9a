import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { SandboxStartError } from '../../errors.js';

const CGROUP_ROOT = '/sys/fs/cgroup';

/** What a sandbox's cgroups limit; unset means no limit of that kind. */
export interface CgroupLimits {
  /** Bytes of memory (and swap) for all its processes together. */
  memory?: number;
  /** Cores of CPU time (a CFS quota): `0.5` is half a core. */
  cpu?: number;
  /** Most tasks (processes and threads) alive at once. */
  processes?: number;
}

export type Controller = 'memory' | 'cpu' | 'pids';

/** The cgroups made for one sandbox, and the limits no cgroup could enforce on this host. */
export interface SandboxCgroups {
  /** cgroup folders whose `cgroup.procs` the sandbox's first process joins. */
  dirs: string[];
  /** Limits asked for that this host cannot enforce (no writable controller). */
  unenforced: Controller[];
}

const CFS_PERIOD_US = 100_000;

function tryWrite(file: string, value: string): boolean {
  try {
    writeFileSync(file, value);
    return true;
  } catch {
    return false;
  }
}

/** Two sandboxes must never share a cgroup: killing one would kill the other. */
function sharedCgroup(dir: string): SandboxStartError {
  return new SandboxStartError(
    `cgroup ${dir} exists already: another sandbox on this host has this id (or one that ended left it)`,
  );
}

/** True when the host mounts the unified (v2) hierarchy at the cgroup root. */
function unifiedRoot(): string[] | undefined {
  try {
    return readFileSync(join(CGROUP_ROOT, 'cgroup.controllers'), 'utf8').trim().split(/\s+/);
  } catch {
    return undefined;
  }
}

/**
 * The parent cgroup under which sandboxes' cgroups go, relative to each hierarchy: `abx` for a
 * root daemon; a rootless daemon needs a parent delegated to it (made by root and chowned to its
 * uid), named by `ABX_CGROUP_PARENT` or else `abx-<uid>`.
 */
export function cgroupParent(env: NodeJS.ProcessEnv = process.env): string {
  const uid = process.getuid?.() ?? 0;
  return env.ABX_CGROUP_PARENT?.replace(/^\/+|\/+$/g, '') || (uid === 0 ? 'abx' : `abx-${uid}`);
}

/** The v1 hierarchies a sandbox may have a cgroup in: its limits' and the freezer's. */
const V1_HIERARCHIES = ['memory', 'cpu', 'pids', 'freezer'] as const;

/** The folder where a v1 controller's hierarchy is mounted, when there is one. */
function v1Hierarchy(controller: Controller | 'freezer'): string | undefined {
  const dir = join(CGROUP_ROOT, controller);
  return existsSync(join(dir, 'cgroup.procs')) ? dir : undefined;
}

/** Writes the limit files of one controller; false when the kernel refused one. */
function writeLimits(
  version: 1 | 2,
  controller: Controller,
  dir: string,
  limits: CgroupLimits,
): boolean {
  if (controller === 'memory') {
    const bytes = String(limits.memory);
    if (version === 2) {
      if (!tryWrite(join(dir, 'memory.max'), bytes)) return false;
      tryWrite(join(dir, 'memory.swap.max'), '0');
      return true;
    }
    if (!tryWrite(join(dir, 'memory.limit_in_bytes'), bytes)) return false;
    // Without this the sandbox could swap instead of hitting the limit (absent without swap).
    tryWrite(join(dir, 'memory.memsw.limit_in_bytes'), bytes);
    return true;
  }
  if (controller === 'cpu') {
    const quota = String(Math.max(1000, Math.round((limits.cpu ?? 0) * CFS_PERIOD_US)));
    if (version === 2) return tryWrite(join(dir, 'cpu.max'), `${quota} ${CFS_PERIOD_US}`);
    return (
      tryWrite(join(dir, 'cpu.cfs_period_us'), String(CFS_PERIOD_US)) &&
      tryWrite(join(dir, 'cpu.cfs_quota_us'), quota)
    );
  }
  return tryWrite(join(dir, 'pids.max'), String(limits.processes));
}

function wanted(limits: CgroupLimits): Controller[] {
  const controllers: Controller[] = [];
  if (limits.memory) controllers.push('memory');
  if (limits.cpu) controllers.push('cpu');
  if (limits.processes) controllers.push('pids');
  return controllers;
}

/**
 * Makes the cgroups that hold one sandbox's limits. Uses cgroup v2 when the host mounts the
 * unified hierarchy at /sys/fs/cgroup, else a v1 hierarchy per controller. The folders belong to
 * the daemon's uid, never to the sandbox's: a sandbox cannot raise its own limits even if it
 * reached cgroupfs (it does not: no /sys, no mount, no user namespaces).
 */
export function createCgroups(
  id: string,
  limits: CgroupLimits,
  parent = cgroupParent(),
  /** v1: a freezer cgroup too, for pauses (v2's cgroups each have a freezer). */
  freezer = true,
): SandboxCgroups {
  const controllers = wanted(limits);
  const result: SandboxCgroups = { dirs: [], unenforced: [] };
  if (controllers.length === 0) return result;
  const available = unifiedRoot();
  if (available) {
    const parentDir = join(CGROUP_ROOT, parent);
    const dir = join(parentDir, id);
    try {
      mkdirSync(parentDir, { recursive: true });
      // Every level down to the parent must hand the controllers on.
      const levels = parent.split('/');
      for (let i = 0; i <= levels.length; i++) {
        const level = join(CGROUP_ROOT, ...levels.slice(0, i));
        for (const c of controllers) tryWrite(join(level, 'cgroup.subtree_control'), `+${c}`);
      }
      try {
        mkdirSync(dir);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === 'EEXIST') throw sharedCgroup(dir);
        throw error;
      }
      for (const controller of controllers) {
        if (!available.includes(controller) || !writeLimits(2, controller, dir, limits)) {
          result.unenforced.push(controller);
        }
      }
      result.dirs.push(dir);
    } catch (error) {
      if (error instanceof SandboxStartError) throw error;
      result.unenforced = controllers;
    }
    return result;
  }
  for (const controller of controllers) {
    const hierarchy = v1Hierarchy(controller);
    if (!hierarchy) {
      result.unenforced.push(controller);
      continue;
    }
    const dir = join(hierarchy, parent, id);
    try {
      mkdirSync(join(hierarchy, parent), { recursive: true });
      mkdirSync(dir);
      if (writeLimits(1, controller, dir, limits)) result.dirs.push(dir);
      else {
        rmdirSync(dir);
        result.unenforced.push(controller);
      }
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'EEXIST') throw sharedCgroup(dir);
      result.unenforced.push(controller);
    }
  }
  // The freezer pauses the sandbox (no limit of its own; without it a pause stops each process).
  const freezerRoot = freezer ? v1Hierarchy('freezer') : undefined;
  if (freezerRoot) {
    const dir = join(freezerRoot, parent, id);
    try {
      mkdirSync(join(freezerRoot, parent), { recursive: true });
      mkdirSync(dir);
      result.dirs.push(dir);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'EEXIST') throw sharedCgroup(dir);
    }
  }
  return result;
}

/** The cgroup folders a sandbox of this id has, wherever they exist (for orphan sweeps). */
export function cgroupDirsOf(id: string, parent = cgroupParent()): string[] {
  const candidates = unifiedRoot()
    ? [join(CGROUP_ROOT, parent, id)]
    : V1_HIERARCHIES.flatMap((controller) => {
        const hierarchy = v1Hierarchy(controller);
        return hierarchy ? [join(hierarchy, parent, id)] : [];
      });
  return candidates.filter((dir) => existsSync(dir));
}

/**
 * Removes sandbox cgroups under `parent` that hold no process and are older than `graceMs` (a
 * sandbox starting now has an empty one for a moment): what a daemon that died, or a test whose
 * installation was deleted, left behind. Host-wide, like the cgroups themselves.
 */
export function sweepEmptyCgroups(parent = cgroupParent(), graceMs = 60_000): number {
  const parents = unifiedRoot()
    ? [join(CGROUP_ROOT, parent)]
    : V1_HIERARCHIES.flatMap((controller) => {
        const hierarchy = v1Hierarchy(controller);
        return hierarchy ? [join(hierarchy, parent)] : [];
      });
  let removed = 0;
  for (const dir of parents) {
    let names: string[];
    try {
      names = readdirSync(dir, { withFileTypes: true })
        .filter((entry) => entry.isDirectory())
        .map((entry) => entry.name);
    } catch {
      continue;
    }
    for (const name of names) {
      const cgroup = join(dir, name);
      try {
        if (Date.now() - statSync(cgroup).mtimeMs < graceMs) continue;
        if (cgroupPids([cgroup]).length > 0) continue;
        rmdirSync(cgroup);
        removed++;
      } catch {
        // busy, or gone meanwhile
      }
    }
  }
  return removed;
}

/**
 * The cgroup version sandboxes' limits use here: 2 when the unified hierarchy is mounted at
 * /sys/fs/cgroup, 1 when v1 hierarchies are (a controller-less cgroup2 beside them, systemd's
 * hybrid layout, does not count), undefined when neither is (for `abx doctor`).
 */
export function cgroupVersion(): 1 | 2 | undefined {
  if (unifiedRoot()) return 2;
  return (['memory', 'cpu', 'pids'] as const).some((c) => v1Hierarchy(c)) ? 1 : undefined;
}

/** Which controllers this daemon can use for sandboxes (for `abx daemon status`). */
export function cgroupSupport(parent = cgroupParent()): Record<Controller, boolean> {
  const probe = `probe-${process.pid}-${Date.now()}`;
  const limits = { memory: 1024 ** 3, cpu: 1, processes: 1024 };
  const made = createCgroups(probe, limits, parent);
  removeCgroups(made.dirs);
  const support = { memory: true, cpu: true, pids: true };
  for (const controller of made.unenforced) support[controller] = false;
  return support;
}

/** A sandbox's freezer: v2's `cgroup.freeze` in its cgroup, or its v1 freezer cgroup. */
function freezerOf(dirs: readonly string[]): { dir: string; version: 1 | 2 } | undefined {
  for (const dir of dirs) {
    if (existsSync(join(dir, 'freezer.state'))) return { dir, version: 1 };
    if (existsSync(join(dir, 'cgroup.freeze'))) return { dir, version: 2 };
  }
  return undefined;
}

/** True once every process of the freezer's cgroup is frozen. */
function frozen(freezer: { dir: string; version: 1 | 2 }): boolean {
  try {
    if (freezer.version === 1) {
      return readFileSync(join(freezer.dir, 'freezer.state'), 'utf8').trim() === 'FROZEN';
    }
    return /^frozen 1$/m.test(readFileSync(join(freezer.dir, 'cgroup.events'), 'utf8'));
  } catch {
    return false;
  }
}

/**
 * Freezes every process of a sandbox's cgroups and waits (up to `timeoutMs`) until the kernel
 * says they all are. False when the sandbox has no freezer this daemon may write (then nothing
 * was changed); throws when the kernel did not finish freezing in time (the freeze is undone).
 */
export async function freezeCgroups(dirs: readonly string[], timeoutMs = 5000): Promise<boolean> {
  const freezer = freezerOf(dirs);
  if (!freezer) return false;
  const file = join(freezer.dir, freezer.version === 1 ? 'freezer.state' : 'cgroup.freeze');
  if (!tryWrite(file, freezer.version === 1 ? 'FROZEN' : '1')) return false;
  const deadline = Date.now() + timeoutMs;
  for (let wait = 1; !frozen(freezer); wait = Math.min(wait * 2, 20)) {
    if (Date.now() >= deadline) {
      thawCgroups(dirs);
      throw new Error(`the kernel did not finish freezing ${freezer.dir} within ${timeoutMs} ms`);
    }
    // A v1 freezer stuck in FREEZING is asked again (a task that was mid-fork).
    if (freezer.version === 1) tryWrite(file, 'FROZEN');
    await new Promise((resolve) => setTimeout(resolve, wait));
  }
  return true;
}

/** Lets the processes of a sandbox's frozen cgroups run again; false without a freezer. */
export function thawCgroups(dirs: readonly string[]): boolean {
  const freezer = freezerOf(dirs);
  if (!freezer) return false;
  return freezer.version === 1
    ? tryWrite(join(freezer.dir, 'freezer.state'), 'THAWED')
    : tryWrite(join(freezer.dir, 'cgroup.freeze'), '0');
}

/** Whether sandboxes here get a freezer this daemon may write (for the isolation report). */
export function freezerSupport(parent = cgroupParent()): boolean {
  const made = createCgroups(`probe-${process.pid}-${Date.now()}`, { processes: 1024 }, parent);
  const found = freezerOf(made.dirs) !== undefined;
  removeCgroups(made.dirs);
  return found;
}

/** Pids in a sandbox's cgroups (every process that joined, and their descendants). */
export function cgroupPids(dirs: readonly string[]): number[] {
  const pids = new Set<number>();
  for (const dir of dirs) {
    try {
      for (const line of readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n')) {
        if (line) pids.add(Number(line));
      }
    } catch {
      // gone
    }
  }
  return [...pids];
}

/** How many processes the kernel's OOM killer killed in a sandbox's memory cgroup. */
export function oomKills(dirs: readonly string[]): number {
  for (const dir of dirs) {
    for (const file of ['memory.events', 'memory.oom_control']) {
      try {
        const match = /^oom_kill (\d+)$/m.exec(readFileSync(join(dir, file), 'utf8'));
        if (match) return Number(match[1]);
      } catch {
        // not this version's file
      }
    }
  }
  return 0;
}

/** Removes a sandbox's cgroups once its processes are gone (one with members cannot go). */
export function removeCgroups(dirs: readonly string[]): boolean {
  let all = true;
  for (const dir of dirs) {
    try {
      rmdirSync(dir);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') all = false;
    }
  }
  return all;
}

/** What a sandbox's cgroups say it uses; a field is absent where no cgroup of it exists here. */
export interface CgroupUsage {
  /** CPU time used, in microseconds (v2 `cpu.stat` usage_usec, v1 `cpuacct.usage`). */
  cpuTimeUs?: number;
  /** Its CPU limit in cores (a CFS quota), when it has one. */
  cpuLimit?: number;
  /** Memory charged to it, page cache included (v2 `memory.current`, v1 `usage_in_bytes`). */
  memUsed?: number;
  /** Of that, page cache (`file` in v2's memory.stat, `cache` in v1's). */
  memCache?: number;
  /** Its memory limit in bytes, when it has one. */
  memLimit?: number;
}

function readText(file: string): string | undefined {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
}

function statField(text: string | undefined, name: string): number | undefined {
  const match = text === undefined ? null : new RegExp(`^${name} (\\d+)$`, 'm').exec(text);
  return match ? Number(match[1]) : undefined;
}

/**
 * Reads usage from a sandbox's cgroups, v2 or v1 (each v1 folder answers for its controller; v1
 * mounts cpuacct with cpu, so the cpu folder has `cpuacct.usage`). A limit of "max" (or v1's
 * near-2^63 "no limit") is no limit.
 */
export function cgroupUsage(dirs: readonly string[]): CgroupUsage {
  const usage: CgroupUsage = {};
  for (const dir of dirs) {
    const cpuStat = readText(join(dir, 'cpu.stat'));
    const usec = statField(cpuStat, 'usage_usec');
    if (usec !== undefined) usage.cpuTimeUs = usec;
    const ns = readText(join(dir, 'cpuacct.usage'));
    if (ns !== undefined && usage.cpuTimeUs === undefined) usage.cpuTimeUs = Number(ns) / 1000;
    const max = readText(join(dir, 'cpu.max'))?.trim().split(/\s+/);
    if (max && max[0] !== 'max') usage.cpuLimit = Number(max[0]) / Number(max[1]);
    const quota = Number(readText(join(dir, 'cpu.cfs_quota_us')) ?? -1);
    if (quota > 0) {
      usage.cpuLimit = quota / Number(readText(join(dir, 'cpu.cfs_period_us')) ?? CFS_PERIOD_US);
    }
    const current =
      readText(join(dir, 'memory.current')) ?? readText(join(dir, 'memory.usage_in_bytes'));
    if (current !== undefined) {
      usage.memUsed = Number(current);
      const stat = readText(join(dir, 'memory.stat'));
      usage.memCache = statField(stat, 'file') ?? statField(stat, 'cache') ?? 0;
      const limit =
        readText(join(dir, 'memory.max')) ?? readText(join(dir, 'memory.limit_in_bytes'));
      const bytes = limit === undefined || limit.trim() === 'max' ? Number.NaN : Number(limit);
      if (bytes > 0 && bytes < 2 ** 62) usage.memLimit = bytes;
    }
  }
  return usage;
}
