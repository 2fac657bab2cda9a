import { createHash, randomBytes } from 'node:crypto';
import { type BigIntStats, readFileSync, statSync } from 'node:fs';
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { isAbsolute, join } from 'node:path';
import type { ShippedCommand } from '../commands/shipped-commands.js';
import { packageInfo } from '../util/package-info.js';
import {
  type AuthoringMode,
  type BuiltBundle,
  bundleCommands,
  bundlerFingerprint,
} from './bundler.js';

/** A bundle ready to upload: its code and the SHA-256 that names it in the sandbox. */
export interface CommandBundle {
  code: string;
  sha256: string;
}

/** One file a bundle was built from, as it was then. */
interface Input {
  path: string;
  sha256: string;
  /** dev, inode, size, mtime and ctime, kept only once they identify the content (see settled). */
  stat?: string;
}

interface Entry {
  format: typeof FORMAT;
  sha256: string;
  inputs: Input[];
  code: string;
}

/** Bumped when entries change shape or meaning: older files are then ignored. */
const FORMAT = 2;
const MEMORY_ENTRIES = 16;
const DISK_ENTRIES = 64;

/** How many times bundles were built, and found in memory or on disk, since the last reset. */
export interface BundleCacheStats {
  builds: number;
  memoryHits: number;
  diskHits: number;
}

/** Where bundles are kept between processes: a folder, or `false` for memory only. */
export type BundleCacheDir = string | false;

/**
 * `$ABX_CACHE_DIR/bundles`, else `$XDG_CACHE_HOME/agent-sandbox/bundles`, else
 * `~/.cache/agent-sandbox/bundles`. Read on every use, so a test (or a user) can point it
 * elsewhere at any time.
 */
export function defaultBundleCacheDir(): string {
  const xdg = process.env.XDG_CACHE_HOME;
  const root =
    process.env.ABX_CACHE_DIR ||
    join(xdg && isAbsolute(xdg) ? xdg : join(homedir(), '.cache'), 'agent-sandbox');
  return join(root, 'bundles');
}

/**
 * Command bundles by what they are built from, so starting the same classes again does not run
 * esbuild. The key holds everything but file contents (the entry modules, the shipped schemas,
 * this package's version, esbuild's version and options); each entry then lists every file
 * esbuild read with its SHA-256, and is used only while each of them still has that content.
 * Entries live in memory and, as JSON, in a folder shared by the processes of this user.
 */
export class BundleCache {
  private readonly memory = new Map<string, Entry>();
  private readonly building = new Map<string, Promise<CommandBundle>>();
  private counts: BundleCacheStats = { builds: 0, memoryHits: 0, diskHits: 0 };

  constructor(private readonly dir: () => BundleCacheDir = defaultBundleCacheDir) {}

  get stats(): BundleCacheStats {
    return { ...this.counts };
  }

  /** Forgets the entries held in memory (not those on disk) and zeroes {@link stats}. */
  reset(): void {
    this.memory.clear();
    this.counts = { builds: 0, memoryHits: 0, diskHits: 0 };
  }

  /**
   * The bundle of these modules with these schemas (and, per module, the classes it must keep:
   * see {@link bundleCommands}; and where its authoring half comes from): from the cache while
   * its inputs are unchanged.
   */
  async bundle(
    files: readonly string[],
    shipped: Record<string, ShippedCommand>,
    classes: Record<string, readonly string[]> = {},
    mode: AuthoringMode = 'inline',
  ): Promise<CommandBundle> {
    const key = sha256(
      JSON.stringify([
        FORMAT,
        packageInfo().version,
        bundlerFingerprint(mode),
        files,
        shipped,
        classes,
      ]),
    );
    const remembered = this.memory.get(key);
    if (remembered && current(remembered)) {
      this.counts.memoryHits++;
      this.remember(key, remembered);
      return remembered;
    }
    // Concurrent starts of the same classes share one build.
    let pending = this.building.get(key);
    if (!pending) {
      pending = this.load(key, files, shipped, classes, mode).finally(() =>
        this.building.delete(key),
      );
      this.building.set(key, pending);
    }
    return pending;
  }

  private async load(
    key: string,
    files: readonly string[],
    shipped: Record<string, ShippedCommand>,
    classes: Record<string, readonly string[]>,
    mode: AuthoringMode,
  ): Promise<CommandBundle> {
    const dir = this.dir();
    const stored = dir ? await readEntry(join(dir, `${key}.json`)) : undefined;
    if (stored && current(stored)) {
      this.counts.diskHits++;
      this.remember(key, stored);
      return stored;
    }
    const startedAt = Date.now();
    const built = await bundleCommands(files, shipped, classes, mode);
    this.counts.builds++;
    const entry = entryOf(built, startedAt);
    if (!entry) return { code: built.code, sha256: sha256(built.code) };
    this.remember(key, entry);
    if (dir) await writeEntry(dir, key, entry).catch(() => undefined);
    return entry;
  }

  private remember(key: string, entry: Entry): void {
    // A Map keeps insertion order: re-inserting makes this the newest, the first is the oldest.
    this.memory.delete(key);
    this.memory.set(key, entry);
    for (const oldest of this.memory.keys()) {
      if (this.memory.size <= MEMORY_ENTRIES) break;
      this.memory.delete(oldest);
    }
  }
}

/** The cache `sandbox.server.start()` uses. */
export const bundleCache = new BundleCache();

function sha256(data: string | Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

function statOf(path: string): BigIntStats {
  return statSync(path, { bigint: true });
}

function statKey(stats: BigIntStats): string {
  const { dev, ino, size, mtimeNs, ctimeNs } = stats;
  return `${dev}:${ino}:${size}:${mtimeNs}:${ctimeNs}`;
}

/**
 * Whether a file's last change lies safely before `time`: its timestamps come from a coarse
 * clock, so a change just before `time` and another just after can carry the same ctime. Files
 * with sub-second timestamps tick at most every 10 ms (a kernel jiffy); whole seconds mean a
 * file system that may round to 2 s.
 */
function settled(stats: BigIntStats, time: number): boolean {
  const margin = stats.ctimeNs % 1_000_000_000n === 0n ? 2000 : 50;
  return Number(stats.ctimeNs / 1_000_000n) < time - margin;
}

/**
 * The entry of a fresh build, or undefined when an input changed around the build (esbuild may
 * have read it before or after that change, so no content can vouch for the bundle).
 */
function entryOf(built: BuiltBundle, startedAt: number): Entry | undefined {
  const inputs: Input[] = [];
  for (const path of built.inputs) {
    let stats: BigIntStats;
    let content: Buffer;
    try {
      stats = statOf(path);
      content = readFileSync(path);
    } catch {
      return undefined;
    }
    if (!settled(stats, startedAt)) return undefined;
    inputs.push({ path, sha256: sha256(content), stat: statKey(stats) });
  }
  return { format: FORMAT, sha256: sha256(built.code), inputs, code: built.code };
}

/**
 * Whether every input still has the content the bundle was built from. An unchanged stat
 * signature (kept only when settled, so a later change must alter it) answers without reading
 * the file; otherwise the content's hash decides (a `touch` or a fresh checkout does not force a
 * build).
 */
function current(entry: Entry): boolean {
  for (const input of entry.inputs) {
    let stats: BigIntStats;
    try {
      stats = statOf(input.path);
      if (input.stat === statKey(stats)) continue;
      const checkedAt = Date.now();
      if (sha256(readFileSync(input.path)) !== input.sha256) return false;
      if (settled(stats, checkedAt)) input.stat = statKey(stats);
      else delete input.stat;
    } catch {
      return false;
    }
  }
  return true;
}

async function readEntry(file: string): Promise<Entry | undefined> {
  try {
    const entry = JSON.parse(await readFile(file, 'utf8')) as Entry;
    if (entry.format !== FORMAT || !Array.isArray(entry.inputs)) return undefined;
    // A damaged file is a miss, never a wrong bundle.
    return typeof entry.code === 'string' && sha256(entry.code) === entry.sha256
      ? entry
      : undefined;
  } catch {
    return undefined;
  }
}

/** Writes the entry atomically (a temp file renamed), then keeps the newest {@link DISK_ENTRIES}. */
async function writeEntry(dir: string, key: string, entry: Entry): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const file = join(dir, `${key}.json`);
  const temp = `${file}.${randomBytes(6).toString('hex')}.tmp`;
  try {
    await writeFile(temp, JSON.stringify(entry), { mode: 0o600 });
    await rename(temp, file);
  } finally {
    await rm(temp, { force: true });
  }
  const names = (await readdir(dir)).filter((name) => name.endsWith('.json'));
  if (names.length <= DISK_ENTRIES) return;
  const aged = await Promise.all(
    names.map(async (name) => ({
      name,
      mtime: await stat(join(dir, name)).then(
        (s) => s.mtimeMs,
        () => 0,
      ),
    })),
  );
  aged.sort((a, b) => a.mtime - b.mtime);
  for (const { name } of aged.slice(0, aged.length - DISK_ENTRIES)) {
    await rm(join(dir, name), { force: true });
  }
}
