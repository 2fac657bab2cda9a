import { readdirSync, readFileSync, readlinkSync } from 'node:fs';

/**
 * The start time of a process (field 22 of /proc/PID/stat, in clock ticks since boot), or
 * `undefined` when no such process exists. Together with the pid it names one process for good:
 * a pid reused later has another start time.
 */
export function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (fields[0] === 'Z') return undefined;
    return fields[19];
  } catch {
    return undefined;
  }
}

/** True when `pid` runs and started at `startTime`. */
export function isSameProcess(pid: number, startTime: string): boolean {
  return processStartTime(pid) === startTime;
}

/** Clock ticks per second of /proc's times (USER_HZ: 100 on every Linux architecture abx runs on). */
const USER_HZ = 100;
/** Bytes per page of /proc/PID/statm (4 KiB on x86-64 and arm64's usual kernels). */
const PAGE_BYTES = 4096;

/**
 * The CPU time and resident memory of some processes, from /proc: each one's user and system time
 * with that of the children it reaped (so a command that ended still counts in envd's), and its
 * resident set (shared pages count once per process). For sandboxes without a cpu or memory
 * cgroup; a process that ended meanwhile is left out.
 */
export function processesUsage(pids: readonly number[]): { cpuTimeUs: number; rss: number } {
  let ticks = 0;
  let pages = 0;
  for (const pid of pids) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      // utime, stime, cutime, cstime: fields 14-17 of stat(5), the 3rd field being fields[0].
      for (let i = 11; i <= 14; i++) ticks += Number(fields[i]);
      pages += Number(readFileSync(`/proc/${pid}/statm`, 'utf8').split(' ')[1]);
    } catch {
      // ended meanwhile
    }
  }
  return { cpuTimeUs: (ticks * 1e6) / USER_HZ, rss: pages * PAGE_BYTES };
}

/**
 * `pid` and every process descended from it. Walked down from `pid` through each of its
 * threads' `/proc/PID/task/TID/children` (a few reads per process of the tree), not by reading
 * every process's stat on the host: the gateway's first request to a sandbox walks its tree, and
 * the whole-host scan cost 3–4 ms of it with a few hundred processes (issue 49). Where the kernel
 * has no `children` files (CONFIG_PROC_CHILDREN off), the parent pids of every process in /proc.
 * Either way a process forked or ended meanwhile may be missed or listed: callers that must get
 * every process (kill, freeze) go round until none is left.
 */
export function processTree(pid: number): number[] {
  const first = childrenOf(pid);
  if (first === 'unsupported') return scannedTree(pid);
  const tree = [pid, ...first];
  for (let i = 1; i < tree.length; i++) {
    const children = childrenOf(tree[i] as number);
    if (children !== 'unsupported') tree.push(...children);
  }
  return tree;
}

/** The children of every thread of `pid`; none when it ended; 'unsupported' without the files. */
function childrenOf(pid: number): number[] | 'unsupported' {
  let tasks: string[];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  const children: number[] = [];
  for (const tid of tasks) {
    let text: string;
    try {
      text = readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8');
    } catch (error) {
      // The thread ended meanwhile, or the kernel has no such file at all.
      if ((error as NodeJS.ErrnoException).code === 'ENOENT' && tid === String(pid)) {
        try {
          readdirSync(`/proc/${pid}/task/${tid}`);
          return 'unsupported';
        } catch {
          return children;
        }
      }
      continue;
    }
    for (const word of text.trim().split(/\s+/)) if (word !== '') children.push(Number(word));
  }
  return children;
}

/** `pid` and its descendants from the parent pid of every process in /proc. */
function scannedTree(pid: number): number[] {
  const children = new Map<number, number[]>();
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return [pid];
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const parent = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      const list = children.get(parent) ?? [];
      list.push(Number(entry));
      children.set(parent, list);
    } catch {
      // ended meanwhile
    }
  }
  const tree = [pid];
  for (let i = 0; i < tree.length; i++) tree.push(...(children.get(tree[i] as number) ?? []));
  return tree;
}

/** A process's state letter (field 3 of /proc/PID/stat: `R`, `S`, `T` stopped...), or undefined. */
export function processState(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
  } catch {
    return undefined;
  }
}

/**
 * The bytes a process's network namespace received and sent over its interfaces other than the
 * loopback, from /proc/PID/net/dev: the kernel's counters, growing since each interface came up.
 * For a sandbox on `internet` that is its slirp4netns link (`tap0`), which everything it exchanges
 * with the outside crosses (egress's DNS, HTTP and TLS ports, and raw TCP to allowed addresses);
 * on `none` there is only the loopback, so 0. `null` when the namespace is the daemon's own or the
 * host's (`network: host`): its counters are the host's, not the sandbox's; `null` too when the
 * files cannot be read. Reading them costs nothing on the data path.
 */
export function networkBytes(pid: number): { rx: number; tx: number } | null {
  let ns: string;
  let dev: string;
  try {
    ns = readlinkSync(`/proc/${pid}/ns/net`);
    dev = readFileSync(`/proc/${pid}/net/dev`, 'utf8');
  } catch {
    // Ended meanwhile (its other figures fail too), or not ours to read: not measured.
    return null;
  }
  for (const shared of ['/proc/self/ns/net', '/proc/1/ns/net']) {
    try {
      if (readlinkSync(shared) === ns) return null;
    } catch {
      // another uid's init (a rootless daemon): not comparable, and not needed
    }
  }
  let rx = 0;
  let tx = 0;
  // Two header lines, then `  name: rx_bytes packets … (8 fields) tx_bytes packets …`.
  for (const line of dev.split('\n').slice(2)) {
    const colon = line.indexOf(':');
    if (colon < 0 || line.slice(0, colon).trim() === 'lo') continue;
    const fields = line
      .slice(colon + 1)
      .trim()
      .split(/\s+/);
    rx += Number(fields[0]) || 0;
    tx += Number(fields[8]) || 0;
  }
  return { rx, tx };
}
