import { type BigIntStats, type FSWatcher, lstatSync, readdirSync, statSync, watch } from 'node:fs';
import { basename, join, relative } from 'node:path';
import { Readable } from 'node:stream';
import { LimitExceededError, NotFoundError } from '../protocol/errors.js';
import { BadRequestError, fsError } from '../server/errors.js';
import { safePath } from '../server/file-system.js';
import { randomBytes } from '../server/file-tools/random.js';
import { Reply } from '../server/http.js';
import { defineGroup, type RouteGroup } from '../server/route-group.js';
import { argList } from '../server/validate.js';
import { KEEPALIVE_MS } from './process-events.js';

/** What happened to a path, in the words of inotify's (and E2B's) event types. */
export type WatchEventType = 'create' | 'write' | 'remove' | 'rename' | 'chmod';

/** A path as the file routes describe it (`/files/stat`), when it still exists. */
export interface WatchEntry {
  path: string;
  type: 'file' | 'directory' | 'symlink' | 'other';
  size: number;
  mode: string;
  mtime: string;
}

/** One change below a watched directory. */
export interface WatchEvent {
  type: WatchEventType;
  /** Relative to the watched directory: `a.txt`, `sub/a.txt` in a recursive watch. */
  name: string;
  path: string;
  /** The path as it is now; absent when it is gone (remove, rename away). */
  entry?: WatchEntry;
}

/** Why a watch ended by itself: its directory went away, or it outgrew a bound. */
export interface WatchEnd {
  reason: 'removed' | 'limit' | 'error';
  message: string;
}

/** Bounds of the watches of one envd (each also bounds the kernel's inotify watches it uses). */
export interface WatchLimits {
  /** Live watches, streamed and polled together. */
  watches: number;
  /** Directories one recursive watch follows. */
  directories: number;
  /** Paths one watch remembers (to tell a write from a chmod, a remove from a rename). */
  entries: number;
  /** Events one watch holds for a slow reader; past it the oldest are dropped and counted. */
  events: number;
}

export const DEFAULT_WATCH_LIMITS: WatchLimits = {
  watches: 64,
  directories: 4096,
  entries: 100_000,
  events: 10_000,
};

/** envd's own temporary files of an atomic write (file-system.ts): never reported. */
const TEMP_NAME = /^\..+\.[0-9a-f]{12}\.tmp$/;

interface Known {
  ino: bigint;
  mode: bigint;
  mtime: bigint;
  ctime: bigint;
  dir: boolean;
}

function kindOf(s: BigIntStats): WatchEntry['type'] {
  if (s.isSymbolicLink()) return 'symlink';
  if (s.isDirectory()) return 'directory';
  return s.isFile() ? 'file' : 'other';
}

function entryOf(path: string, s: BigIntStats): WatchEntry {
  return {
    path,
    type: kindOf(s),
    size: Number(s.size),
    mode: `0${(Number(s.mode) & 0o7777).toString(8)}`,
    mtime: s.mtime.toISOString(),
  };
}

function lstatOrUndefined(path: string): BigIntStats | undefined {
  try {
    return lstatSync(path, { bigint: true });
  } catch {
    return undefined;
  }
}

function knownOf(s: BigIntStats): Known {
  return { ino: s.ino, mode: s.mode, mtime: s.mtimeNs, ctime: s.ctimeNs, dir: s.isDirectory() };
}

/** The watch ended because a bound was reached; the caller ends it with this. */
class WatchOverflow extends Error {}

/**
 * A watch of one directory (and, recursive, of every directory below it): one inotify watch per
 * directory through fs.watch, whose `rename`/`change` notices are turned into typed events by
 * looking at the path afterwards. Notices are handled in batches (everything the kernel had
 * queued), so a name made and gone within one batch (a temporary file) is not reported, and a
 * name that vanished while its inode appeared elsewhere is a rename.
 */
export class DirectoryWatch {
  readonly id = randomBytes(8).toString('hex');
  private readonly watchers = new Map<string, FSWatcher>();
  private readonly known = new Map<string, Known>();
  private pending: { dir: string; kind: string; name: string }[] = [];
  private flushing = false;
  private queue: WatchEvent[] = [];
  private dropped = 0;
  private waiter: (() => void) | undefined;
  ended: WatchEnd | undefined;
  private closed = false;

  constructor(
    readonly root: string,
    readonly recursive: boolean,
    private readonly limits: WatchLimits,
    private readonly onClose: (watch: DirectoryWatch) => void,
    /** Folders of envd's own state (the file metadata store): never reported, never followed. */
    private readonly hidden: readonly string[] = [],
  ) {}

  private isHidden(path: string): boolean {
    return this.hidden.some((dir) => path === dir || path.startsWith(`${dir}/`));
  }

  /** Checks the directory and starts watching it; throws the request's error when it cannot. */
  start(): void {
    let s: ReturnType<typeof statSync>;
    try {
      s = statSync(this.root);
    } catch (error) {
      throw fsError(error, `watch ${this.root}`);
    }
    if (!s.isDirectory()) {
      throw new BadRequestError(`${this.root} is not a directory: watch the directory it is in`, {
        code: 'ENOTDIR',
      });
    }
    try {
      this.addDir(this.root, false);
    } catch (error) {
      this.close();
      if (error instanceof WatchOverflow) throw new BadRequestError(error.message);
      throw error;
    }
  }

  /** Events so far (and how many were dropped for want of room), leaving none. */
  take(): { events: WatchEvent[]; dropped: number } {
    const taken = { events: this.queue, dropped: this.dropped };
    this.queue = [];
    this.dropped = 0;
    return taken;
  }

  /** Resolves when there are events, the watch ended, `ms` passed or `signal` aborted. */
  wait(ms: number, signal: AbortSignal): Promise<void> {
    if (this.queue.length > 0 || this.dropped > 0 || this.ended || signal.aborted) {
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener('abort', done);
        if (this.waiter === done) this.waiter = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal.addEventListener('abort', done, { once: true });
      this.waiter = done;
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const watcher of this.watchers.values()) watcher.close();
    this.watchers.clear();
    this.known.clear();
    this.pending = [];
    this.onClose(this);
    this.waiter?.();
  }

  private end(end: WatchEnd): void {
    if (this.ended) return;
    this.ended = end;
    for (const watcher of this.watchers.values()) watcher.close();
    this.watchers.clear();
    this.pending = [];
    this.waiter?.();
  }

  private push(event: WatchEvent): void {
    if (this.queue.length >= this.limits.events) {
      this.queue.shift();
      this.dropped++;
    }
    this.queue.push(event);
    this.waiter?.();
  }

  private remember(path: string, s: BigIntStats): void {
    if (!this.known.has(path) && this.known.size >= this.limits.entries) {
      throw new WatchOverflow(
        `the watch of ${this.root} reached ${this.limits.entries} paths: watch a smaller tree${this.recursive ? ' or without recursive' : ''}`,
      );
    }
    this.known.set(path, knownOf(s));
  }

  /** Watches `dir` (and, recursive, the directories in it); `report`: its entries are new. */
  private addDir(dir: string, report: boolean): void {
    if (this.watchers.has(dir)) return;
    if (this.watchers.size >= this.limits.directories) {
      throw new WatchOverflow(
        `the watch of ${this.root} reached ${this.limits.directories} directories: watch a smaller tree or without recursive`,
      );
    }
    let watcher: FSWatcher;
    try {
      watcher = watch(dir, { persistent: false }, (kind, name) => {
        if (typeof name === 'string') this.notice(dir, kind, name);
      });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOSPC') {
        throw new LimitExceededError(
          `cannot watch ${dir}: the kernel's limit of inotify watches (fs.inotify.max_user_watches) is reached`,
        );
      }
      // Gone or unreadable below the top: not followed (the top's errors are the request's).
      if (dir !== this.root) return;
      throw fsError(error, `watch ${dir}`);
    }
    watcher.on('error', (error) =>
      this.end({ reason: 'error', message: `the watch of ${dir} failed: ${error.message}` }),
    );
    this.watchers.set(dir, watcher);
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch (error) {
      if (dir !== this.root) return;
      throw fsError(error, `list ${dir}`);
    }
    for (const name of names.sort()) {
      if (TEMP_NAME.test(name)) continue;
      const path = join(dir, name);
      if (this.isHidden(path)) continue;
      const s = lstatOrUndefined(path);
      if (!s) continue;
      this.remember(path, s);
      if (report) this.report('create', path, s);
      if (this.recursive && s.isDirectory()) this.addDir(path, report);
    }
  }

  private report(type: WatchEventType, path: string, s: BigIntStats | undefined): void {
    this.push({
      type,
      name: relative(this.root, path),
      path,
      ...(s ? { entry: entryOf(path, s) } : {}),
    });
  }

  private notice(dir: string, kind: string, name: string): void {
    if (this.ended || this.closed || TEMP_NAME.test(name) || this.isHidden(join(dir, name))) return;
    this.pending.push({ dir, kind, name });
    if (!this.flushing) {
      this.flushing = true;
      // Everything the kernel queued is dispatched before setImmediate runs: one batch.
      setImmediate(() => {
        this.flushing = false;
        try {
          this.flush();
        } catch (error) {
          if (error instanceof WatchOverflow) this.end({ reason: 'limit', message: error.message });
          else this.end({ reason: 'error', message: (error as Error).message });
        }
      });
    }
  }

  /** Stops following `dir` and everything below it, and forgets their paths. */
  private forget(path: string): void {
    const prefix = `${path}/`;
    for (const [dir, watcher] of this.watchers) {
      if (dir === path || dir.startsWith(prefix)) {
        watcher.close();
        this.watchers.delete(dir);
      }
    }
    for (const known of this.known.keys()) if (known.startsWith(prefix)) this.known.delete(known);
    this.known.delete(path);
  }

  private flush(): void {
    const batch = this.pending;
    this.pending = [];
    if (batch.length === 0 || this.ended || this.closed) return;
    const now = new Map<string, BigIntStats | undefined>();
    const selfGone = new Set<string>();
    const items: { dir: string; kind: string; path: string }[] = [];
    for (const { dir, kind, name } of batch) {
      // inotify names the watched directory itself by its basename when it goes.
      if (name === basename(dir) && !selfGone.has(dir) && !lstatOrUndefined(dir)) {
        selfGone.add(dir);
      }
      if (selfGone.has(dir)) continue;
      const path = join(dir, name);
      if (!now.has(path)) now.set(path, lstatOrUndefined(path));
      items.push({ dir, kind, path });
    }
    if (selfGone.has(this.root)) {
      this.end({ reason: 'removed', message: `the watched directory ${this.root} was removed` });
      return;
    }
    for (const dir of selfGone) this.forget(dir);
    // Inodes that appeared (at a path other than where they were): renames' new names.
    const appeared = new Map<bigint, string>();
    for (const [path, s] of now) {
      if (s && this.known.get(path)?.ino !== s.ino) appeared.set(s.ino, path);
    }
    // Inodes that vanished from a known path: a directory that appears with one was moved.
    const vanished = new Set<bigint>();
    for (const [path, s] of now) {
      const before = this.known.get(path);
      if (!s && before) vanished.add(before.ino);
    }
    const reported = new Set<string>();
    const once = (type: WatchEventType, path: string, s: BigIntStats | undefined) => {
      const key = `${type}\0${path}`;
      if (reported.has(key)) return;
      reported.add(key);
      this.report(type, path, s);
    };
    for (const { kind, path } of items) {
      const s = now.get(path);
      const before = this.known.get(path);
      if (!s) {
        // Gone. A name never seen (made and gone within this batch) was never reported either.
        if (!before) continue;
        const movedTo = appeared.get(before.ino);
        once(movedTo !== undefined && movedTo !== path ? 'rename' : 'remove', path, undefined);
        if (before.dir) this.forget(path);
        else this.known.delete(path);
        continue;
      }
      if (kind === 'rename' || !before || before.ino !== s.ino) {
        if (before && before.ino === s.ino) continue;
        this.remember(path, s);
        // A file replaced by another (an atomic write over it) had its content changed.
        if (before && !before.dir && s.isFile()) {
          once('write', path, s);
          continue;
        }
        if (before?.dir) this.forget(path);
        once('create', path, s);
        // A new file with content was written too (an atomic write makes it whole at once); a
        // file moved here was not.
        if (s.isFile() && s.size > 0n && !vanished.has(s.ino)) once('write', path, s);
        // A new directory's entries are new too (`mkdir -p a/b` is one notice); a moved one's not.
        if (this.recursive && s.isDirectory()) this.addDir(path, !vanished.has(s.ino));
        continue;
      }
      // `change`: contents (mtime moves) or attributes (only ctime or the mode moves).
      this.remember(path, s);
      if (s.mtimeNs === before.mtime && (s.mode !== before.mode || s.ctimeNs !== before.ctime)) {
        once('chmod', path, s);
      } else {
        once('write', path, s);
      }
    }
  }

  /** Live inotify watches of this watch (one per followed directory). */
  get directories(): number {
    return this.watchers.size;
  }
}

const NDJSON = {
  'content-type': 'application/x-ndjson; charset=utf-8',
  'cache-control': 'no-store',
};

const line = (value: unknown) => `${JSON.stringify(value)}\n`;

/**
 * A watch's NDJSON lines: `start`, then each event, `dropped` when a slow reader lost some,
 * `keepalive` when quiet, and `end` if the watch ended by itself. Stops when the reader goes.
 */
async function* watchLines(watch: DirectoryWatch, closed: AbortSignal): AsyncGenerator<string> {
  try {
    yield line({ start: { id: watch.id, path: watch.root, recursive: watch.recursive } });
    while (!closed.aborted) {
      await watch.wait(KEEPALIVE_MS, closed);
      if (closed.aborted) return;
      const { events, dropped } = watch.take();
      if (dropped > 0) yield line({ dropped });
      for (const event of events) yield line({ event });
      if (watch.ended) {
        yield line({ end: watch.ended });
        return;
      }
      if (events.length === 0 && dropped === 0) yield line({ keepalive: true });
    }
  } finally {
    watch.close();
  }
}

/** The WATCH group with its own watches, bounded by `limits`; `closeAll` ends every watch. */
export function watchGroup(
  limits: Partial<WatchLimits> = {},
  /** Folders of envd's own state, left out of every watch. */
  hidden: readonly string[] = [],
): RouteGroup & { closeAll(): void; count(): number } {
  const bounds = { ...DEFAULT_WATCH_LIMITS, ...limits };
  const watches = new Map<string, DirectoryWatch>();
  const polled = new Map<string, DirectoryWatch>();

  const open = (path: string, recursive: boolean): DirectoryWatch => {
    if (watches.size >= bounds.watches) {
      throw new LimitExceededError(
        `envd already has ${bounds.watches} watches: stop one (DELETE /files/watch/{id}, or close a stream) first`,
      );
    }
    const watch = new DirectoryWatch(
      path,
      recursive,
      bounds,
      (w) => {
        watches.delete(w.id);
        polled.delete(w.id);
      },
      hidden,
    );
    watch.start();
    watches.set(watch.id, watch);
    return watch;
  };

  const polledWatch = (id: string): DirectoryWatch => {
    const watch = polled.get(id);
    if (!watch) {
      throw new NotFoundError(
        `no watcher ${JSON.stringify(id.slice(0, 64))}: it was removed, or never made (POST /files/watch makes one)`,
      );
    }
    return watch;
  };

  const args = argList({
    path: ['str', undefined, 'the directory to watch'],
    'recursive?': ['bool', false, 'watch every directory below it too'],
  });

  const group = defineGroup('WATCH', '/files/watch', 'directory watches', [
    {
      method: 'GET',
      path: '/files/watch',
      summary:
        'Streams NDJSON changes below a directory (`start`, then `event`s: create, write, remove, rename, chmod) until the client goes.',
      args,
      handler: ({ args: a, closed }) => {
        const watch = open(safePath(a.path as string), a.recursive as boolean);
        return new Reply(200, Readable.from(watchLines(watch, closed)), NDJSON);
      },
    },
    {
      method: 'POST',
      path: '/files/watch',
      summary:
        'Makes a polled watcher of a directory; its events are kept (bounded) until read with GET /files/watch/{id}.',
      args,
      handler: ({ args: a }) => {
        const watch = open(safePath(a.path as string), a.recursive as boolean);
        polled.set(watch.id, watch);
        return { id: watch.id, path: watch.root, recursive: watch.recursive };
      },
    },
    {
      method: 'GET',
      path: '/files/watch/{id}',
      summary:
        'The events of a polled watcher since the last read (`events`, `dropped`, and `end` once it ended by itself).',
      handler: ({ params }) => {
        const watch = polledWatch(params.id ?? '');
        const { events, dropped } = watch.take();
        return { id: watch.id, events, dropped, ...(watch.ended ? { end: watch.ended } : {}) };
      },
    },
    {
      method: 'DELETE',
      path: '/files/watch/{id}',
      summary: 'Removes a polled watcher and what it kept.',
      body: 'none',
      handler: ({ params }) => {
        const watch = polledWatch(params.id ?? '');
        watch.close();
        return { id: watch.id, removed: true };
      },
    },
  ]);
  return {
    ...group,
    closeAll: () => {
      for (const watch of [...watches.values()]) watch.close();
    },
    count: () => watches.size,
  };
}
