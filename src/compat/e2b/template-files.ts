/**
 * The files E2B's Template SDK uploads for `copy()` steps, kept once by content: each upload is a
 * (gzipped) tar, stored under the SHA-256 of its bytes (`blobs/<sha256>`), and a key's index maps
 * the SDK's `filesHash` to it (`index/<key>/<filesHash>`). A key is told a hash is present only
 * for its own uploads: E2B's `filesHash` is computed by the client over file modes and sizes a tar
 * does not carry, so it cannot be recomputed here, and a shared index would let one key's upload
 * stand in for another key's files.
 *
 * Uploads are pruned (prune()): a key's entry not used for TEMPLATE_FILES_UNUSED_MS (an upload, a
 * build that copies from it, or an answer "present" each count as a use) is removed, and so are
 * a key's least recently used entries past TEMPLATE_FILES_MAX_BYTES_PER_KEY; a blob no entry
 * names any more goes with them. An entry a running build holds (hold()) is never removed.
 */
import { createHash, randomBytes } from 'node:crypto';
import {
  closeSync,
  createReadStream,
  createWriteStream,
  existsSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { join, resolve } from 'node:path';
import { type Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { ArchiveError, InvalidArgumentError, PayloadTooLargeError } from '../../errors.js';
import { extractTar } from '../../util/safe-extract.js';

/** Largest upload taken (the compressed tar as sent). */
export const TEMPLATE_FILE_MAX_BYTES = 256 * 1024 ** 2;
/** Largest unpacked size of one upload (a gzip bomb stops here). */
export const TEMPLATE_FILE_MAX_UNPACKED = 1024 ** 3;
/** How long an upload link the daemon hands out stays valid. */
export const UPLOAD_LINK_TTL_MS = 10 * 60_000;
/** A key's upload no build has used for this long is removed (the SDK uploads it again). */
export const TEMPLATE_FILES_UNUSED_MS = 24 * 3600_000;
/** The most stored upload bytes one key keeps; its least recently used uploads go first. */
export const TEMPLATE_FILES_MAX_BYTES_PER_KEY = 1024 ** 3;
/** How often at most a whole prune runs (at an upload or a build); a key's cap is kept at once. */
const PRUNE_EVERY_MS = 10 * 60_000;

const HASH = /^[0-9a-f]{64}$/;

/** A `filesHash` as the SDK sends it (hex SHA-256); InvalidArgumentError otherwise. */
export function checkFilesHash(hash: string): string {
  if (!HASH.test(hash)) {
    throw new InvalidArgumentError(
      `files hash ${JSON.stringify(hash.slice(0, 80))} is not a SHA-256 in hex (64 characters 0-9a-f), as E2B's SDK computes it`,
    );
  }
  return hash;
}

/** Counts bytes through a stream and fails once there are more than `max`. */
function capped(max: number, what: string): Transform {
  let seen = 0;
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      seen += chunk.length;
      if (seen > max) {
        done(new PayloadTooLargeError(`${what} is larger than ${max} bytes, the most abx takes`));
        return;
      }
      done(null, chunk);
    },
  });
}

/** The tar inside an upload: gunzipped when it starts with gzip's magic bytes. */
function tarOf(path: string): Readable {
  const head = Buffer.alloc(2);
  const fd = openSync(path, 'r');
  try {
    readSync(fd, head, 0, 2, 0);
  } finally {
    closeSync(fd);
  }
  const unpacked = capped(TEMPLATE_FILE_MAX_UNPACKED, 'the unpacked upload');
  const done = (error?: Error | null) => {
    if (error) unpacked.destroy(error);
  };
  if (head[0] === 0x1f && head[1] === 0x8b) {
    pipeline(createReadStream(path), createGunzip(), unpacked).catch(done);
  } else pipeline(createReadStream(path), unpacked).catch(done);
  return unpacked;
}

/** The content-addressed store of E2B template files, and the one-time links uploads go to. */
export class TemplateFiles {
  private readonly links = new Map<string, { owner: string; hash: string; expires: number }>();
  /** Entries (`<key dir>/<filesHash>`) running builds use, with how many hold each. */
  private readonly held = new Map<string, number>();
  private lastPrune = 0;

  constructor(
    private readonly dir: string,
    private readonly limits: {
      unusedMs?: number;
      maxBytesPerKey?: number;
      /** The clock, for tests. */
      now?: () => number;
    } = {},
  ) {}

  private now(): number {
    return this.limits.now?.() ?? Date.now();
  }

  /** Records a use of an index entry: its modification time is its last use. */
  private touch(index: string): void {
    const seconds = this.now() / 1000;
    try {
      utimesSync(index, seconds, seconds);
    } catch {
      // removed meanwhile: the next upload makes it again
    }
  }

  private ownerDir(owner: string | null): string {
    return join(this.dir, 'index', owner ?? 'daemon');
  }

  /** The stored blob of `hash` for `owner`; undefined when that key has not uploaded it. */
  private blobOf(owner: string | null, hash: string): string | undefined {
    const index = join(this.ownerDir(owner), checkFilesHash(hash));
    if (!existsSync(index)) return undefined;
    const blob = join(this.dir, 'blobs', readFileSync(index, 'utf8').trim());
    return existsSync(blob) ? blob : undefined;
  }

  /** Whether `owner` has uploaded the files of `hash` (and they are still kept): a use. */
  present(owner: string | null, hash: string): boolean {
    if (this.blobOf(owner, hash) === undefined) return false;
    this.touch(join(this.ownerDir(owner), hash));
    return true;
  }

  /**
   * Keeps `owner`'s files of `hashes` from every prune until the returned release is called (a
   * build, from its start until it ends).
   */
  hold(owner: string | null, hashes: readonly string[]): () => void {
    const keys = hashes.map((hash) => join(this.ownerDir(owner), checkFilesHash(hash)));
    for (const key of keys) this.held.set(key, (this.held.get(key) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      for (const key of keys) {
        const left = (this.held.get(key) ?? 1) - 1;
        if (left > 0) this.held.set(key, left);
        else this.held.delete(key);
      }
    };
  }

  /**
   * Removes what is no longer kept: entries unused for TEMPLATE_FILES_UNUSED_MS, each key's least
   * recently used entries past TEMPLATE_FILES_MAX_BYTES_PER_KEY (only `only`'s keys when given),
   * blobs no entry names, and uploads a stopped daemon left half-written. Held entries stay.
   * Synchronous: no upload or build of this process changes the folder meanwhile.
   */
  prune(only?: { owner: string | null }): { removed: number; freed: number } {
    const now = this.now();
    const unusedMs = this.limits.unusedMs ?? TEMPLATE_FILES_UNUSED_MS;
    const cap = this.limits.maxBytesPerKey ?? TEMPLATE_FILES_MAX_BYTES_PER_KEY;
    const blobs = join(this.dir, 'blobs');
    const sizeOf = (path: string) => {
      try {
        return statSync(path).size;
      } catch {
        return 0;
      }
    };
    const list = (dir: string) => {
      try {
        return readdirSync(dir);
      } catch {
        return [];
      }
    };
    let removed = 0;
    const owners = only
      ? [this.ownerDir(only.owner)]
      : list(join(this.dir, 'index')).map((o) => join(this.dir, 'index', o));
    for (const ownerDir of owners) {
      const entries = list(ownerDir)
        .map((name) => {
          const path = join(ownerDir, name);
          let sha = '';
          let used = 0;
          try {
            sha = readFileSync(path, 'utf8').trim();
            used = statSync(path).mtimeMs;
          } catch {
            // unreadable: removed below
          }
          return { path, sha, used, size: HASH.test(sha) ? sizeOf(join(blobs, sha)) : 0 };
        })
        // Most recently used first: what is past the cap is the least recently used.
        .sort((a, b) => b.used - a.used);
      let total = 0;
      for (const entry of entries) {
        if (this.held.has(entry.path)) {
          total += entry.size;
          continue;
        }
        const stale = !HASH.test(entry.sha) || entry.size === 0 || now - entry.used > unusedMs;
        if (stale || total + entry.size > cap) {
          rmSync(entry.path, { force: true });
          removed++;
          continue;
        }
        total += entry.size;
      }
    }
    let freed = 0;
    if (!only || removed > 0) {
      const named = new Set<string>();
      for (const owner of list(join(this.dir, 'index'))) {
        for (const name of list(join(this.dir, 'index', owner))) {
          try {
            named.add(readFileSync(join(this.dir, 'index', owner, name), 'utf8').trim());
          } catch {
            // gone meanwhile
          }
        }
      }
      for (const sha of list(blobs)) {
        if (named.has(sha)) continue;
        freed += sizeOf(join(blobs, sha));
        rmSync(join(blobs, sha), { force: true });
      }
    }
    if (!only) {
      // A part file of an upload under way is younger than the longest upload a link allows.
      for (const part of list(join(this.dir, 'staging'))) {
        const path = join(this.dir, 'staging', part);
        const age = now - (statSync(path, { throwIfNoEntry: false })?.mtimeMs ?? now);
        if (age > unusedMs) rmSync(path, { recursive: true, force: true });
      }
      this.lastPrune = now;
    }
    return { removed, freed };
  }

  /** A whole prune when the last was PRUNE_EVERY_MS ago or more (at uploads and builds). */
  pruneIfDue(): void {
    if (this.now() - this.lastPrune < PRUNE_EVERY_MS) return;
    try {
      this.prune();
    } catch {
      // What could not be removed now is tried again at the next prune; the request goes on.
      this.lastPrune = this.now();
    }
  }

  /** A one-time token for `owner` to upload the files of `hash` (UPLOAD_LINK_TTL_MS). */
  uploadToken(owner: string | null, hash: string): string {
    const now = Date.now();
    for (const [token, link] of this.links) if (link.expires < now) this.links.delete(token);
    const token = randomBytes(24).toString('base64url');
    this.links.set(token, {
      owner: owner ?? 'daemon',
      hash: checkFilesHash(hash),
      expires: now + UPLOAD_LINK_TTL_MS,
    });
    return token;
  }

  /**
   * Takes an upload sent to a link: at most TEMPLATE_FILE_MAX_BYTES, a tar (gzipped or not) that
   * extracts safely, stored by its SHA-256 and indexed for the link's key. A used, unknown or
   * expired token is refused before a byte is read.
   */
  async receive(token: string, hash: string, body: Readable): Promise<void> {
    const link = this.links.get(token);
    if (!link || link.expires < Date.now() || link.hash !== hash) {
      throw new InvalidArgumentError(
        'this upload link is unknown, used or expired (links last 10 minutes, one upload each): ask for a new one with GET /templates/{templateID}/files/{hash}',
      );
    }
    this.links.delete(token);
    const staging = join(this.dir, 'staging');
    mkdirSync(staging, { recursive: true, mode: 0o700 });
    const part = join(staging, `${randomBytes(8).toString('hex')}.part`);
    const check = `${part}.check`;
    const digest = createHash('sha256');
    try {
      await pipeline(
        body,
        capped(TEMPLATE_FILE_MAX_BYTES, 'the upload'),
        new Transform({
          transform(chunk: Buffer, _encoding, done) {
            digest.update(chunk);
            done(null, chunk);
          },
        }),
        createWriteStream(part, { mode: 0o600 }),
      );
      // Refused now rather than at the build: not tar, a link or `..` out, a device, too big.
      // An archive the client made is its own mistake: 400 (ArchiveError is a sandbox's, 502).
      await extractTar(tarOf(part), check).catch((error: unknown) => {
        if (error instanceof PayloadTooLargeError) throw error;
        throw new InvalidArgumentError(
          `the upload is refused: ${error instanceof ArchiveError ? '' : 'not a tar archive: '}${(error as Error).message}`,
        );
      });
      const sha = digest.digest('hex');
      mkdirSync(join(this.dir, 'blobs'), { recursive: true, mode: 0o700 });
      renameSync(part, join(this.dir, 'blobs', sha));
      const owner = link.owner === 'daemon' ? null : link.owner;
      mkdirSync(this.ownerDir(owner), { recursive: true });
      writeFileSync(join(this.ownerDir(owner), hash), sha);
      this.touch(join(this.ownerDir(owner), hash));
      // This key's cap at once (its new upload is the most recently used); the rest now and then.
      const release = this.hold(owner, [hash]);
      try {
        this.prune({ owner });
      } catch {
        // Kept; the next prune tries again.
      } finally {
        release();
      }
      this.pruneIfDue();
    } finally {
      rmSync(part, { force: true });
      rmSync(check, { recursive: true, force: true });
    }
  }

  /**
   * Extracts `owner`'s files of `hash` into `dest` (a new folder) with the checking extractor:
   * no name leaves `dest`, nothing is written through a link, no devices or hard links.
   */
  async extract(owner: string | null, hash: string, dest: string): Promise<void> {
    const blob = this.blobOf(owner, hash);
    if (!blob) {
      throw new InvalidArgumentError(
        `the files of hash ${hash} were not uploaded by this key: build with E2B's SDK, which uploads them first`,
      );
    }
    this.touch(join(this.ownerDir(owner), hash));
    await extractTar(tarOf(blob), dest);
  }
}

/**
 * The file or folder `src` (a path relative to the uploaded context, as the SDK's `copy` names
 * it) inside an extracted upload `root`: refused when it leaves `root` or passes through a link,
 * so a copy never reaches a file of the host.
 */
export function sourceInside(root: string, src: string): string {
  const base = realpathSync(root);
  const path = resolve(base, src);
  if (path !== base && !path.startsWith(`${base}/`)) {
    throw new InvalidArgumentError(`copy source ${JSON.stringify(src)} leaves the uploaded files`);
  }
  if (!existsSync(path)) {
    throw new InvalidArgumentError(
      `copy source ${JSON.stringify(src)} is not in the uploaded files (a glob pattern is not expanded by abx: name the file or folder)`,
    );
  }
  if (lstatSync(path).isSymbolicLink() || realpathSync(path) !== path) {
    throw new InvalidArgumentError(
      `copy source ${JSON.stringify(src)} is a symbolic link or passes through one: copy the file or folder itself (resolveSymlinks: true)`,
    );
  }
  return path;
}
