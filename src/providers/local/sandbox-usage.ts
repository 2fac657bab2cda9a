import { statfs } from 'node:fs/promises';
import { availableParallelism, totalmem } from 'node:os';
import { SANDBOX_HOME } from '../../../runtime/protocol/constants.js';
import type { SandboxUsage } from '../provider.js';
import type { CgroupUsage } from './cgroups.js';
import { networkBytes, processesUsage } from './proc.js';

/**
 * A sandbox's {@link SandboxUsage} from what its cgroups say (`cgroup`), with /proc's figures for
 * its processes (`pids`) where no cgroup of that kind measures it, and the disk from the file
 * system of its home seen through `/proc/{pid}/root` (an image template's user may have another
 * home: then that of /tmp), and its network bytes from the counters of its namespace's interfaces
 * (see {@link networkBytes}).
 */
export async function sandboxUsage(
  cgroup: CgroupUsage,
  pids: readonly number[],
  pid: number,
): Promise<SandboxUsage> {
  const proc =
    cgroup.cpuTimeUs === undefined || cgroup.memUsed === undefined
      ? processesUsage(pids)
      : undefined;
  const root = `/proc/${pid}/root`;
  const disk = await statfs(`${root}${SANDBOX_HOME}`).catch(() => statfs(`${root}/tmp`));
  const net = networkBytes(pid);
  return {
    cpuTimeUs: cgroup.cpuTimeUs ?? proc?.cpuTimeUs ?? 0,
    cpuCount: cgroup.cpuLimit ?? availableParallelism(),
    memUsed: cgroup.memUsed ?? proc?.rss ?? 0,
    memCache: cgroup.memCache ?? 0,
    memTotal: Math.min(cgroup.memLimit ?? Number.POSITIVE_INFINITY, totalmem()),
    diskUsed: (disk.blocks - disk.bfree) * disk.bsize,
    diskTotal: disk.blocks * disk.bsize,
    processes: pids.length,
    netRxBytes: net?.rx ?? null,
    netTxBytes: net?.tx ?? null,
  };
}
