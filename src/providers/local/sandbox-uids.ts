import { randomInt } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';

/** Host uids reserved for sandboxes: `first` up to `first + count - 1`. */
export interface UidRange {
  first: number;
  count: number;
}

/**
 * The default range: far above login users (1000+), system users and the 65 536-wide subuid
 * ranges `useradd` hands out from 100 000, and below 2^31 (tools that read uids as signed ints).
 */
export const DEFAULT_UID_RANGE: UidRange = { first: 1_500_000_000, count: 1_000_000 };

/** Host-wide (not per `$ABX_HOME`): two daemons on one host must never hand out the same uid. */
export const UID_LOCK_DIR = '/run/abx-uids';

/** Parses `ABX_UID_RANGE=FIRST-LAST`; the default when unset. */
export function uidRangeFromEnv(env: NodeJS.ProcessEnv = process.env): UidRange {
  const text = env.ABX_UID_RANGE;
  if (!text) return DEFAULT_UID_RANGE;
  const match = /^(\d+)-(\d+)$/.exec(text.trim());
  const first = Number(match?.[1]);
  const last = Number(match?.[2]);
  if (!match || first < 65_536 || last < first || last >= 2 ** 31) {
    throw new Error(
      `ABX_UID_RANGE=${text}: expected FIRST-LAST with 65536 <= FIRST <= LAST < 2147483648, e.g. 1500000000-1500999999`,
    );
  }
  return { first, count: last - first + 1 };
}

/** True when a process runs (or a thread lives) with `uid` as its real uid. */
export function uidHasProcesses(uid: number): boolean {
  return uidProcesses(uid).length > 0;
}

/**
 * Pids of the live processes whose real uid is `uid`. Zombies do not count: they run nothing and
 * hold nothing but their pid until their parent (often the host's init, which may be slow) reaps
 * them.
 */
export function uidProcesses(uid: number): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const status = readFileSync(`/proc/${entry}/status`, 'utf8');
      if (/^State:\s+Z/m.test(status)) continue;
      if (Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]) === uid) pids.push(Number(entry));
    } catch {
      // ended meanwhile
    }
  }
  return pids;
}

interface UidLock {
  /** The sandbox folder the uid was handed to; once it is gone, so is the sandbox. */
  dir: string;
  sandbox: string;
}

/**
 * Hands out one host uid per live sandbox, from a reserved range, with a lock file per uid under
 * {@link UID_LOCK_DIR} (a tmpfs: a reboot, which ends every sandbox, frees them all). A lock whose
 * sandbox folder is gone and whose uid runs nothing is stale (a daemon died between the two) and
 * is taken over.
 */
export class SandboxUids {
  constructor(
    private readonly range: UidRange = DEFAULT_UID_RANGE,
    private readonly lockDir = UID_LOCK_DIR,
  ) {}

  allocate(sandbox: string, dir: string): number {
    mkdirSync(this.lockDir, { recursive: true, mode: 0o700 });
    for (let attempt = 0; attempt < 1000; attempt++) {
      const uid = this.range.first + randomInt(this.range.count);
      const lock = join(this.lockDir, String(uid));
      const owner: UidLock = { dir, sandbox };
      try {
        writeFileSync(lock, JSON.stringify(owner), { flag: 'wx', mode: 0o600 });
        return uid;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
        if (this.isStale(lock, uid)) this.release(uid);
      }
    }
    throw new Error(
      `no free sandbox uid in ${this.range.first}-${this.range.first + this.range.count - 1} after 1000 tries; widen ABX_UID_RANGE`,
    );
  }

  /**
   * Takes `uid` again for a sandbox that had it (a hibernated one waking): true when the lock is
   * this sandbox's or was free; false when another sandbox holds it now.
   */
  reclaim(uid: number, sandbox: string, dir: string): boolean {
    mkdirSync(this.lockDir, { recursive: true, mode: 0o700 });
    const lock = join(this.lockDir, String(uid));
    try {
      writeFileSync(lock, JSON.stringify({ dir, sandbox } satisfies UidLock), {
        flag: 'wx',
        mode: 0o600,
      });
      return true;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    }
    try {
      const owner = JSON.parse(readFileSync(lock, 'utf8')) as UidLock;
      return owner.sandbox === sandbox && owner.dir === dir;
    } catch {
      return false;
    }
  }

  release(uid: number | undefined): void {
    if (uid === undefined) return;
    try {
      unlinkSync(join(this.lockDir, String(uid)));
    } catch {
      // released already
    }
  }

  /** The uids handed out now (by any daemon on this host), with whom they were handed to. */
  held(): (UidLock & { uid: number })[] {
    let names: string[];
    try {
      names = readdirSync(this.lockDir);
    } catch {
      return [];
    }
    return names.flatMap((name) => {
      const uid = Number(name);
      if (!Number.isSafeInteger(uid)) return [];
      try {
        const lock = JSON.parse(readFileSync(join(this.lockDir, name), 'utf8')) as UidLock;
        return [{ ...lock, uid }];
      } catch {
        return [];
      }
    });
  }

  /** Frees the uids whose sandbox folder is gone and that run nothing (host-wide). */
  sweepStale(): number {
    let freed = 0;
    for (const lock of this.held()) {
      if (!existsSync(lock.dir) && !uidHasProcesses(lock.uid)) {
        this.release(lock.uid);
        freed++;
      }
    }
    return freed;
  }

  private isStale(lock: string, uid: number): boolean {
    try {
      const owner = JSON.parse(readFileSync(lock, 'utf8')) as UidLock;
      return !existsSync(owner.dir) && !uidHasProcesses(uid);
    } catch {
      return false;
    }
  }
}
