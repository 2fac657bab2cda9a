import {
  closeSync,
  constants,
  fchmodSync,
  futimesSync,
  lstatSync,
  mkdirSync,
  openSync,
  type Stats,
  symlinkSync,
  unlinkSync,
  writeSync,
} from 'node:fs';
import { join, resolve } from 'node:path';
import { type Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Header, Parser, type ReadEntry } from 'tar';

import { ArchiveError } from '../errors.js';

export { ArchiveError };

/** What {@link extractTar} created. */
export interface ExtractSummary {
  files: number;
  directories: number;
  symlinks: number;
}

const BLOCK = 512;
const FILE_TYPES = new Set(['File', 'OldFile', 'ContiguousFile']);
const KINDS: Record<string, string> = {
  Link: 'a hard link',
  CharacterDevice: 'a character device',
  BlockDevice: 'a block device',
  FIFO: 'a FIFO',
  GNUDumpDir: 'a GNU dump directory',
};

/** Stricter rules of {@link extractTar}, for an archive that becomes a workspace's base. */
export interface ExtractOptions {
  /** Refuse a file with a set-user-ID, set-group-ID or sticky bit (rather than dropping the bit). */
  refuseSpecialBits?: boolean;
  /** Refuse a symbolic link whose target is absolute or climbs above the destination. */
  refuseLinksOut?: boolean;
  /** Files get exactly their permission bits (the umask does not apply). */
  exactModes?: boolean;
}

/** Longest entry name taken: PATH_MAX, so the checks per entry stay cheap however deep the name. */
const MAX_NAME = 4096;

/** The directory part of a relative path (`''` for the root). */
function parentOf(rel: string): string {
  const slash = rel.lastIndexOf('/');
  return slash < 0 ? '' : rel.slice(0, slash);
}

/** True when link `target`, at relative path `rel`, is absolute or climbs above the root. */
function leavesRoot(rel: string, target: string): boolean {
  if (target.startsWith('/')) return true;
  let depth = rel.split('/').length - 1;
  for (const part of target.split('/')) {
    if (part === '' || part === '.') continue;
    depth += part === '..' ? -1 : 1;
    if (depth < 0) return true;
  }
  return false;
}

/** A name as messages show it: JSON quotes make newlines and terminal escapes visible, inert. */
const quote = (name: string) => JSON.stringify(name);

function lstatOrUndefined(path: string): Stats | undefined {
  return lstatSync(path, { throwIfNoEntry: false });
}

/** Permission bits only: set-user-ID, set-group-ID and sticky never come from an archive. */
function permissions(mode: unknown, fallback: number): number {
  return typeof mode === 'number' && Number.isInteger(mode) && mode >= 0 ? mode & 0o777 : fallback;
}

/**
 * One extraction into `root`. Entries are handled one at a time, synchronously, as the parser
 * emits them, so no entry can overtake another and nothing in this process changes the tree
 * between a check and the write it guards. Symbolic links are created only after every other
 * entry, so no entry can be written through a link the archive made; a link that already exists
 * in the destination is never followed either.
 */
class Extraction {
  readonly summary: ExtractSummary = { files: 0, directories: 0, symlinks: 0 };
  failure: Error | undefined;
  private readonly parser: Parser;
  /** Paths (relative) known to be real directories: created here or checked with lstat. */
  private readonly directories = new Set<string>(['']);
  /** Symbolic links to create at the end, by relative path, in archive order. */
  private readonly links = new Map<string, string>();
  private file: { fd: number; path: string; mtime: Date | undefined } | undefined;
  private sawEnd = false;
  /** Name of the entry being handled, for messages. */
  private current = '';
  private settle: (() => void) | undefined;

  constructor(
    private readonly root: string,
    private readonly options: ExtractOptions = {},
  ) {
    this.parser = new Parser({
      strict: true,
      zstd: false,
      onReadEntry: (entry) => this.onEntry(entry),
    });
    this.parser.on('error', (error: Error) => this.fail(error));
    this.parser.on('ignoredEntry', (entry: ReadEntry) =>
      this.fail(new ArchiveError(`entry ${quote(entry.path)} is of an unsupported kind`)),
    );
    this.parser.on('eof', () => {
      this.sawEnd = true;
    });
    this.parser.on('end', () => this.settle?.());
  }

  /** A writable stream that takes the archive's bytes; it fails as soon as the archive does. */
  sink(): Writable {
    let head: Buffer | undefined = Buffer.alloc(0);
    return new Writable({
      write: (chunk: Buffer, _encoding, done) => {
        let bytes = chunk;
        let first = false;
        if (head) {
          head = Buffer.concat([head, chunk]);
          if (head.length < BLOCK) return done();
          [bytes, head, first] = [head, undefined, true];
        }
        // Hostile bytes can make the parser throw rather than warn (a bad base-256 number).
        try {
          // Entries are consumed synchronously, so the parser never holds more than this chunk.
          if (!this.failure && (!first || this.checkStart(bytes))) this.parser.write(bytes);
        } catch (error) {
          this.fail(error);
        }
        done(this.failure);
      },
      final: (done) => {
        if (head) {
          this.fail(
            new ArchiveError(`the archive is ${head.length} bytes long: not a tar archive`),
          );
        }
        if (this.failure) return done(this.failure);
        this.settle = () => {
          this.settle = undefined;
          if (!this.failure) this.finish();
          done(this.failure);
        };
        try {
          this.parser.end();
        } catch (error) {
          this.fail(error);
        }
      },
      // A failed pipeline (the source broke off) destroys the sink: the file being written goes.
      destroy: (error, done) => {
        if (this.file) this.fail(error ?? new ArchiveError('the extraction was stopped'));
        done(error);
      },
    });
  }

  /**
   * The first block must be a tar header. The parser would otherwise take a gzip or zstd stream
   * and decompress it: nothing this side asked for.
   */
  private checkStart(head: Buffer): boolean {
    const first = head.subarray(0, BLOCK);
    let header: Header | undefined;
    try {
      header = new Header(first);
    } catch {
      // not a header
    }
    if ((first[0] === 0x1f && first[1] === 0x8b) || !header?.cksumValid) {
      this.fail(new ArchiveError('the data is not a tar archive (its first block is no header)'));
      return false;
    }
    return true;
  }

  fail(error: unknown): void {
    if (!this.failure) {
      this.failure = this.explain(error);
      // Never leave a half-written file under its real name.
      if (this.file) {
        const { fd, path } = this.file;
        this.file = undefined;
        try {
          closeSync(fd);
          unlinkSync(path);
        } catch {
          // already gone
        }
      }
    }
    this.settle?.();
  }

  private explain(error: unknown): Error {
    if (error instanceof ArchiveError) return error;
    const e = error as NodeJS.ErrnoException;
    // Not from the file system: the parser's own complaints (warnings made errors, or throws).
    if (e.syscall === undefined) {
      return new ArchiveError(`the archive is malformed: ${e.message}`, { cause: e });
    }
    // node's message ends with the path, which the archive chose: name it quoted instead.
    return new ArchiveError(
      `cannot extract ${quote(this.current)} into ${this.root}: ${e.message.split(',')[0]}`,
      { cause: e },
    );
  }

  private onEntry(entry: ReadEntry): void {
    if (this.failure) {
      entry.resume();
      return;
    }
    this.current = entry.path;
    try {
      this.place(entry);
    } catch (error) {
      this.fail(error);
      entry.resume();
    }
  }

  /** The entry's path relative to the root, refused when it could point outside of it. */
  private relative(entry: ReadEntry): string {
    const name = entry.path;
    if (name.includes('\0'))
      throw new ArchiveError(`entry ${quote(name)} has a NUL byte in its name`);
    if (name.startsWith('/')) {
      throw new ArchiveError(
        `entry ${quote(name)} has an absolute path; only relative ones are extracted`,
      );
    }
    if (name.length > MAX_NAME) {
      throw new ArchiveError(
        `entry ${quote(name.slice(0, 80))}… has a name over ${MAX_NAME} characters`,
      );
    }
    const parts = name.split('/').filter((part) => part !== '' && part !== '.');
    if (parts.includes('..')) {
      throw new ArchiveError(
        `entry ${quote(name)} climbs out with '..'; such entries are never extracted`,
      );
    }
    return parts.join('/');
  }

  private place(entry: ReadEntry): void {
    const rel = this.relative(entry);
    if (rel === '') {
      // `./`: the destination itself, whose mode and owner stay as they are.
      if (entry.type !== 'Directory') {
        throw new ArchiveError(
          `entry ${quote(entry.path)} would replace the destination directory`,
        );
      }
      entry.resume();
      return;
    }
    this.refuseThroughLinks(rel, entry.path);
    if (
      this.options.refuseSpecialBits &&
      typeof entry.mode === 'number' &&
      entry.mode & 0o7000 &&
      entry.type !== 'SymbolicLink'
    ) {
      throw new ArchiveError(
        `entry ${quote(entry.path)} has a set-user-ID, set-group-ID or sticky bit (mode ${entry.mode.toString(8)}); such entries are refused here`,
      );
    }
    if (entry.type === 'SymbolicLink') {
      const target = String(entry.linkpath ?? '');
      if (target === '' || target.includes('\0')) {
        throw new ArchiveError(`symbolic link ${quote(entry.path)} has an empty or invalid target`);
      }
      if (this.options.refuseLinksOut && leavesRoot(rel, target)) {
        throw new ArchiveError(
          `symbolic link ${quote(entry.path)} points out of the folder (${quote(target)}); links here must stay inside it, relative`,
        );
      }
      // Refused now rather than at the end; it also keeps every queued link off the directories
      // known here, which lets refuseThroughLinks stop at a known parent.
      if (this.directories.has(rel) || lstatOrUndefined(this.parents(rel))?.isDirectory()) {
        throw new ArchiveError(
          `symbolic link ${quote(entry.path)} would replace a directory of the same name`,
        );
      }
      // The last entry of a name wins, so a later link moves to the end of the queue.
      this.links.delete(rel);
      this.links.set(rel, target);
      entry.resume();
    } else if (entry.type === 'Directory') {
      this.links.delete(rel);
      this.makeDirectory(rel, permissions(entry.mode, 0o755) | 0o700);
      entry.resume();
    } else if (FILE_TYPES.has(entry.type)) {
      this.links.delete(rel);
      this.writeFile(rel, entry);
    } else {
      throw new ArchiveError(
        `entry ${quote(entry.path)} is ${KINDS[entry.type] ?? `of type ${quote(String(entry.type))}`}; only directories, regular files and symbolic links are extracted`,
      );
    }
  }

  /**
   * Refuses an entry below a symbolic link the archive queued earlier. A parent known to be a real
   * directory has no queued link above it (links over directories are refused), so the common
   * case costs one lookup.
   */
  private refuseThroughLinks(rel: string, name: string): void {
    if (this.links.size === 0 || this.directories.has(parentOf(rel))) return;
    for (let i = rel.indexOf('/'); i !== -1; i = rel.indexOf('/', i + 1)) {
      const above = rel.slice(0, i);
      if (this.links.has(above)) {
        throw new ArchiveError(
          `entry ${quote(name)} would be written through the archive's own symbolic link ${quote(above)}`,
        );
      }
    }
  }

  /** Makes sure every directory above `rel` is a real directory, creating missing ones. */
  private parents(rel: string): string {
    if (this.directories.has(parentOf(rel))) return join(this.root, rel);
    const parts = rel.split('/');
    for (let i = 1; i < parts.length; i++) {
      const dir = parts.slice(0, i).join('/');
      if (this.directories.has(dir)) continue;
      const path = join(this.root, dir);
      const stats = lstatOrUndefined(path);
      if (!stats) mkdirSync(path);
      else if (stats.isSymbolicLink()) {
        throw new ArchiveError(
          `${quote(rel)} would be written through the symbolic link ${quote(dir)} in ${this.root}; links are never followed`,
        );
      } else if (!stats.isDirectory()) {
        throw new ArchiveError(
          `${quote(rel)} needs ${quote(dir)} to be a directory, and it is not`,
        );
      }
      this.directories.add(dir);
    }
    return join(this.root, rel);
  }

  /** Removes what stands at `path` (never following it) unless it is a directory. */
  private clear(path: string, rel: string, what: string): void {
    const stats = lstatOrUndefined(path);
    if (!stats) return;
    if (stats.isDirectory()) {
      throw new ArchiveError(`${what} ${quote(rel)} would replace a directory of the same name`);
    }
    unlinkSync(path);
  }

  private makeDirectory(rel: string, mode: number): void {
    const path = this.parents(rel);
    if (!this.directories.has(rel)) {
      const stats = lstatOrUndefined(path);
      if (stats && !stats.isDirectory()) unlinkSync(path);
      if (!stats?.isDirectory()) mkdirSync(path, mode);
      this.directories.add(rel);
    }
    this.summary.directories++;
  }

  private writeFile(rel: string, entry: ReadEntry): void {
    const path = this.parents(rel);
    this.clear(path, rel, 'file');
    // O_EXCL: a new file of our own, never an existing one, never through a symbolic link.
    const flags = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;
    const mode = permissions(entry.mode, 0o644);
    const fd = openSync(path, flags, mode);
    this.file = { fd, path, mtime: entry.mtime };
    if (this.options.exactModes) {
      try {
        fchmodSync(fd, mode);
      } catch (error) {
        this.fail(error);
        entry.resume();
        return;
      }
    }
    entry.on('data', (chunk: Buffer) => {
      if (this.file?.fd !== fd) return;
      try {
        for (let done = 0; done < chunk.length; ) done += writeSync(fd, chunk, done);
      } catch (error) {
        this.fail(error);
      }
    });
    entry.on('end', () => {
      if (this.file?.fd !== fd) return;
      this.file = undefined;
      try {
        const { mtime } = entry;
        if (mtime instanceof Date && Number.isFinite(mtime.getTime()))
          futimesSync(fd, mtime, mtime);
        closeSync(fd);
        this.summary.files++;
      } catch (error) {
        this.fail(error);
      }
    });
  }

  /** After the last entry: the archive must have ended properly; then the symbolic links. */
  private finish(): void {
    try {
      if (!this.sawEnd) {
        throw new ArchiveError(
          'the archive ended before its end-of-archive marker: the sender stopped part way',
        );
      }
      for (const [rel, target] of this.links) {
        this.current = rel;
        const path = this.parents(rel);
        this.clear(path, rel, 'symbolic link');
        symlinkSync(target, path);
        this.summary.symlinks++;
      }
    } catch (error) {
      this.fail(error);
    }
  }
}

/**
 * Extracts a tar stream from an untrusted source into `dest` (created if missing), as the user
 * running this process. Only directories, regular files and symbolic links are created; anything
 * else (hard links, devices, FIFOs, unknown kinds) fails the extraction with an
 * {@link ArchiveError} that names the entry. Modes keep their permission bits only (no
 * set-user-ID, set-group-ID or sticky bit) and the umask applies; owners in the archive are
 * ignored. No entry may leave `dest`: absolute names and `..` fail; no entry is written through a
 * symbolic link, whether the archive made it or it was there before. Links themselves are kept
 * as they are, targets unchanged and never followed.
 *
 * A malformed archive (bad checksum, truncated, no end marker, not tar at all) fails too. On any
 * failure the entries completed before it stay; the file being written is removed, and symbolic
 * links, which come last, are not created.
 */
export async function extractTar(
  source: Readable | AsyncIterable<Buffer>,
  dest: string,
  options: ExtractOptions = {},
): Promise<ExtractSummary> {
  const root = resolve(dest);
  try {
    mkdirSync(root, { recursive: true });
  } catch (error) {
    throw new ArchiveError(`cannot extract into ${root}: ${(error as Error).message}`, {
      cause: error,
    });
  }
  const extraction = new Extraction(root, options);
  await pipeline(source, extraction.sink());
  return extraction.summary;
}
