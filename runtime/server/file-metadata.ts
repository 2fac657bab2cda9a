import { type BigIntStats, constants } from 'node:fs';
import { lstat, mkdir, open, rename, rm, stat, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { checkMetadata, MetadataError, metadataBytes } from '../protocol/file-metadata.js';
import { BadRequestError, fsError } from './errors.js';
import { randomBytes } from './file-tools/random.js';

/** The most files that may carry metadata at once in one sandbox. */
export const MAX_METADATA_FILES = 10_000;
/** The most metadata one sandbox may keep, counted as per file (`user.e2b.` + key + value). */
export const MAX_METADATA_STORE_BYTES = 4 * 1024 * 1024;
/** A store file bigger than this is not read (it cannot have been written by envd). */
const MAX_STORE_FILE_BYTES = 32 * 1024 * 1024;

/**
 * A file's identity: its device, inode and birth time (statx's btime, which Node reads on Linux),
 * so that a rename keeps it and an inode number reused by a new file does not match. On a file
 * system without birth times the time is 0 and the identity is the device and inode alone.
 */
export function identityOf(s: BigIntStats): string {
  return `${s.dev}:${s.ino}:${s.birthtimeNs}`;
}

interface Kept {
  /** Where envd last saw the file: a hint, used to tell a kept entry from a stale one. */
  path: string;
  metadata: Record<string, string>;
  bytes: number;
}

interface StoredFile {
  dev: string;
  ino: string;
  btime: string;
  path: string;
  metadata: Record<string, string>;
}

const under = (path: string, dir: string) =>
  path === dir || path.startsWith(dir.endsWith('/') ? dir : `${dir}/`);

/**
 * User metadata of files, kept by envd since Node has no xattr call: what E2B's envd keeps as
 * `user.e2b.*` extended attributes. Entries are keyed by the file's identity ({@link identityOf}),
 * not its path, so they follow the file through renames and go with it; they are kept in one JSON
 * file, rewritten atomically (temporary file, then rename) before a write that set metadata is
 * answered, so a restarted envd has them.
 */
export class FileMetadataStore {
  private readonly entries = new Map<string, Kept>();
  private bytes = 0;
  private loaded: Promise<void> | undefined;
  private saving: Promise<void> = Promise.resolve();

  private readonly maxFiles: number;
  private readonly maxBytes: number;
  private readonly warn: (message: string) => void;

  constructor(
    /** The JSON file (its folder is made on the first save). */
    readonly file: string,
    options: {
      /** Default {@link MAX_METADATA_FILES}. */
      maxFiles?: number;
      /** Default {@link MAX_METADATA_STORE_BYTES}. */
      maxBytes?: number;
      warn?: (message: string) => void;
    } = {},
  ) {
    this.maxFiles = options.maxFiles ?? MAX_METADATA_FILES;
    this.maxBytes = options.maxBytes ?? MAX_METADATA_STORE_BYTES;
    this.warn = options.warn ?? ((m) => process.stderr.write(`envd: ${m}\n`));
  }

  /** How many files carry metadata, and how much. */
  get usage(): { files: number; bytes: number } {
    return { files: this.entries.size, bytes: this.bytes };
  }

  private ready(): Promise<void> {
    this.loaded ??= this.load();
    return this.loaded;
  }

  /**
   * Reads the store, trusting nothing in it (it lies in the sandbox's home, which the sandbox's
   * processes may write): never a FIFO, a device or a huge file; each entry checked as a write's.
   */
  private async load(): Promise<void> {
    let text: string;
    try {
      const handle = await open(
        this.file,
        constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOFOLLOW | constants.O_NOCTTY,
      );
      try {
        const s = await handle.stat();
        if (!s.isFile() || s.size > MAX_STORE_FILE_BYTES) {
          this.warn(
            `${this.file} is not a regular file of at most 32 MiB: file metadata starts empty`,
          );
          return;
        }
        text = await handle.readFile('utf8');
      } finally {
        await handle.close();
      }
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') {
        this.warn(
          `cannot read ${this.file} (${(error as Error).message}): file metadata starts empty`,
        );
      }
      return;
    }
    let files: unknown;
    try {
      files = (JSON.parse(text) as { files?: unknown }).files;
    } catch {
      files = undefined;
    }
    if (!Array.isArray(files)) {
      this.warn(`${this.file} is not envd's metadata store: file metadata starts empty`);
      return;
    }
    let dropped = 0;
    for (const item of files as StoredFile[]) {
      try {
        const { dev, ino, btime, path, metadata } = item;
        if (![dev, ino, btime].every((n) => typeof n === 'string' && /^\d{1,24}$/.test(n))) {
          throw new Error('bad identity');
        }
        if (typeof path !== 'string' || typeof metadata !== 'object' || metadata === null) {
          throw new Error('bad entry');
        }
        const checked = checkMetadata(Object.fromEntries(Object.entries(metadata)));
        const bytes = metadataBytes(checked);
        if (
          bytes === 0 ||
          this.entries.size >= this.maxFiles ||
          this.bytes + bytes > this.maxBytes
        ) {
          throw new Error('over the limits');
        }
        this.entries.set(`${dev}:${ino}:${btime}`, { path, metadata: checked, bytes });
        this.bytes += bytes;
      } catch {
        dropped++;
      }
    }
    if (dropped > 0)
      this.warn(`${this.file}: ${dropped} entries dropped (malformed or over the limits)`);
  }

  /** Writes the store whole, atomically; calls are queued, each writing the state when it runs. */
  private save(): Promise<void> {
    const run = this.saving.then(async () => {
      const files: StoredFile[] = [];
      for (const [key, kept] of this.entries) {
        const [dev, ino, btime] = key.split(':') as [string, string, string];
        files.push({ dev, ino, btime, path: kept.path, metadata: kept.metadata });
      }
      const temp = join(dirname(this.file), `.file-metadata.${randomBytes(6).toString('hex')}.tmp`);
      try {
        await mkdir(dirname(this.file), { recursive: true, mode: 0o700 });
        await writeFile(temp, JSON.stringify({ version: 1, files }), { flag: 'wx', mode: 0o600 });
        await rename(temp, this.file);
      } catch (error) {
        await rm(temp, { force: true }).catch(() => undefined);
        throw fsError(error, `save file metadata to ${this.file}`);
      }
    });
    // A failed save does not stop the next one.
    this.saving = run.catch(() => undefined);
    return run;
  }

  /** The identity of what is at `path` now (not following a final symlink), if anything. */
  private async identityAt(path: string): Promise<string | undefined> {
    return lstat(path, { bigint: true }).then(identityOf, () => undefined);
  }

  /** Drops the entries whose file is no longer where envd last saw it. */
  private async collect(filter: (path: string) => boolean = () => true): Promise<boolean> {
    let changed = false;
    for (const [key, kept] of [...this.entries]) {
      if (!filter(kept.path) || (await this.identityAt(kept.path)) === key) continue;
      this.entries.delete(key);
      this.bytes -= kept.bytes;
      changed = true;
    }
    return changed;
  }

  /**
   * The metadata of the file a stat (`s`, from an lstat) describes, if any; a symlink has its
   * target's, as an xattr read through a path has. Notes `path` as where the file is.
   */
  async metadataOf(path: string, s: BigIntStats): Promise<Record<string, string> | undefined> {
    await this.ready();
    if (this.entries.size === 0) return undefined;
    const target = s.isSymbolicLink()
      ? await stat(path, { bigint: true }).catch(() => undefined)
      : s;
    const kept = target && this.entries.get(identityOf(target));
    if (!kept) return undefined;
    if (!s.isSymbolicLink()) kept.path = path;
    return { ...kept.metadata };
  }

  /**
   * Checks, before a write, that `metadata` can be kept for the file about to be written at `path`
   * (whose current file's metadata it replaces): the per-file limits, then the store's. Throws a
   * 400 naming the limit; nothing is changed.
   */
  async admit(path: string, metadata: Record<string, string>): Promise<void> {
    try {
      checkMetadata(metadata);
    } catch (error) {
      if (error instanceof MetadataError)
        throw new BadRequestError(`invalid metadata: ${error.message}`);
      throw error;
    }
    const bytes = metadataBytes(metadata);
    if (bytes === 0) return;
    await this.ready();
    const fits = async () => {
      const replaced = this.entries.get((await this.identityAt(path)) ?? '');
      const files = this.entries.size + 1 - (replaced ? 1 : 0);
      const total = this.bytes + bytes - (replaced?.bytes ?? 0);
      return files <= this.maxFiles && total <= this.maxBytes;
    };
    if (await fits()) return;
    if ((await this.collect()) && (await fits())) return;
    throw new BadRequestError(
      `the sandbox keeps metadata of at most ${this.maxFiles} files and ${this.maxBytes} bytes in all (it has ${this.entries.size} files, ${this.bytes} bytes): remove files that carry metadata, or write this one without`,
    );
  }

  /**
   * After a write: the new file (`written`, its stat) at `path` has exactly `metadata`, and the
   * file it replaced (`replaced`, its identity before the write) has none left to keep.
   */
  async written(
    path: string,
    written: BigIntStats | undefined,
    metadata: Record<string, string>,
    replaced: string | undefined,
  ): Promise<void> {
    await this.ready();
    const key = written ? identityOf(written) : '';
    const before = new Map(
      [key, replaced ?? ''].map((k) => [k, this.entries.get(k)] as const).filter(([, v]) => v),
    );
    for (const [k, kept] of before) {
      this.entries.delete(k);
      this.bytes -= (kept as Kept).bytes;
    }
    const bytes = written ? metadataBytes(metadata) : 0;
    if (bytes > 0) {
      this.entries.set(key, { path, metadata: { ...metadata }, bytes });
      this.bytes += bytes;
    }
    if (bytes === 0 && before.size === 0) return;
    try {
      await this.save();
    } catch (error) {
      // Not kept: the answer says so, and memory matches the disk again.
      if (bytes > 0) {
        this.entries.delete(key);
        this.bytes -= bytes;
      }
      for (const [k, kept] of before) {
        this.entries.set(k, kept as Kept);
        this.bytes += (kept as Kept).bytes;
      }
      throw error;
    }
  }

  /**
   * Before a write to `path`: the identity of the file there if it carries metadata (the write
   * replaces it, and {@link written} drops its entry), else undefined.
   */
  async replacing(path: string): Promise<string | undefined> {
    await this.ready();
    if (this.entries.size === 0) return undefined;
    const key = await this.identityAt(path);
    return key !== undefined && this.entries.has(key) ? key : undefined;
  }

  /** After `path` was deleted: the entries of files under it that are gone are dropped. */
  async deleted(path: string): Promise<void> {
    await this.ready();
    if (this.entries.size === 0) return;
    if (await this.collect((p) => under(p, path))) await this.save().catch(() => undefined);
  }

  /**
   * Runs a move of `from` to `to`: entries follow the moved files (their identity is unchanged; the
   * paths envd notes are updated), and those of files the move replaced at `to` are dropped.
   */
  async moving<T>(from: string, to: string, move: () => Promise<T>): Promise<T> {
    await this.ready();
    const result = await move();
    if (this.entries.size === 0) return result;
    let changed = await this.collect((p) => under(p, to));
    for (const kept of this.entries.values()) {
      if (!under(kept.path, from)) continue;
      kept.path = to + kept.path.slice(from.length);
      changed = true;
    }
    if (changed) await this.save().catch(() => undefined);
    return result;
  }
}
