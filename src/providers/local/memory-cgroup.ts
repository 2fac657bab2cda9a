import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const CGROUP_ROOT = '/sys/fs/cgroup';

function tryWrite(file: string, value: string): boolean {
  try {
    writeFileSync(file, value);
    return true;
  } catch {
    return false;
  }
}

/**
 * A memory cgroup for one sandbox, limiting the memory of all its processes together. Uses
 * cgroup v2 (`memory.max`) when the host's unified hierarchy has the memory controller, else the
 * v1 memory controller (`memory.limit_in_bytes`). Returns the cgroup folder, or `undefined` when
 * this host has no writable memory cgroup (the limit is then not enforced; see the README).
 */
export function createMemoryCgroup(id: string, bytes: number): string | undefined {
  const v2Controllers = join(CGROUP_ROOT, 'cgroup.controllers');
  if (
    existsSync(v2Controllers) &&
    readFileSync(v2Controllers, 'utf8').split(/\s+/).includes('memory')
  ) {
    const parent = join(CGROUP_ROOT, 'abx');
    try {
      mkdirSync(parent, { recursive: true });
      tryWrite(join(CGROUP_ROOT, 'cgroup.subtree_control'), '+memory');
      tryWrite(join(parent, 'cgroup.subtree_control'), '+memory');
      const dir = join(parent, id);
      mkdirSync(dir);
      if (tryWrite(join(dir, 'memory.max'), String(bytes))) {
        tryWrite(join(dir, 'memory.swap.max'), '0');
        return dir;
      }
      rmdirSync(dir);
    } catch {
      // not ours to write: fall through to v1
    }
  }
  const v1 = join(CGROUP_ROOT, 'memory');
  if (!existsSync(join(v1, 'cgroup.procs'))) return undefined;
  try {
    const dir = join(v1, 'abx', id);
    mkdirSync(dir, { recursive: true });
    if (!tryWrite(join(dir, 'memory.limit_in_bytes'), String(bytes))) {
      rmdirSync(dir);
      return undefined;
    }
    // Without this the sandbox could swap instead of hitting the limit.
    tryWrite(join(dir, 'memory.memsw.limit_in_bytes'), String(bytes));
    return dir;
  } catch {
    return undefined;
  }
}

/** Removes a sandbox's cgroup once its processes are gone (a cgroup with members cannot go). */
export function removeMemoryCgroup(dir: string | undefined): void {
  if (!dir) return;
  try {
    rmdirSync(dir);
  } catch {
    // busy or gone
  }
}
