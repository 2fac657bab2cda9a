/**
 * Workspaces uploaded by remote clients (docs/workspaces.md, "From a remote client"): a client
 * streams a tar of its folder to `POST /v1/workspaces/uploads`; the checking extractor writes it
 * into a folder of the daemon's own; a create's `workspace: { upload, path? }` then takes that
 * folder (once) as the base of the sandbox's workspace, the overlay's lower layer.
 *
 * The upload comes first, the sandbox after, so the base is complete before the overlay is
 * mounted on it: overlayfs leaves a lower layer changed under a mounted overlay undefined.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { rm } from 'node:fs/promises';
import { basename, dirname, join, posix } from 'node:path';
import { promisify } from 'node:util';
import { ArchiveError, InvalidArgumentError, NotFoundError } from '../errors.js';
import { type SandboxProvider, workspaceUnavailableOn } from '../providers/provider.js';
import { extractTar } from '../util/safe-extract.js';
import { checkMountPath } from './volume-service.js';

/** How long an upload waits for the create that takes it: 10 minutes. */
export const UPLOAD_TTL_MS = 10 * 60_000;
/** Uploads one key may have waiting at once. */
export const MAX_WAITING_UPLOADS = 4;
/** The largest upload (the tar's bytes), unless `ABX_WORKSPACE_UPLOAD_MAX_BYTES` says: 1 GiB. */
export const DEFAULT_UPLOAD_MAX_BYTES = 1024 ** 3;
/** The time an upload's whole body has, unless `ABX_WORKSPACE_UPLOAD_TIMEOUT_MS` says: 10 minutes. */
export const DEFAULT_UPLOAD_TIMEOUT_MS = 10 * 60_000;

/**
 * The folder of `$ABX_HOME` that holds the uploaded workspaces' bases in use, one folder each
 * (`ID/base`, `ID/upload.json`): shared by a sandbox and its forks, removed when no registry row
 * names it any more (see {@link UploadedBases}).
 */
export const BASES_DIR = 'workspace-bases';

/** An uploaded base's id: an upload's, or one a create from a snapshot made. */
const BASE_ID = /^wsu_[A-Za-z0-9_-]{16}$/;

/** The file next to a workspace's base that says it was uploaded, and when (client's clock). */
export const UPLOAD_INFO_FILE = 'upload.json';

/**
 * A create's `workspace: { upload, path? }` (a remote client's folder), checked; undefined when
 * the workspace names no upload (a host folder's, checked by checkWorkspaceRequest). No folder of
 * the daemon's host is named, so any key may: the upload itself is the key's own.
 */
export function checkUploadedWorkspace(
  value: unknown,
  provider: SandboxProvider,
  home: string,
  volumePaths: readonly string[],
): { upload: string; path: string } | undefined {
  if (typeof value !== 'object' || value === null || !('upload' in value)) return undefined;
  const { upload, path, ...rest } = value as Record<string, unknown>;
  const unknown = Object.keys(rest);
  if (unknown.length > 0) {
    throw new InvalidArgumentError(
      `workspace.${unknown[0]} is not a key of an uploaded workspace (upload, path): give from (a folder of the daemon's host) or upload, not both`,
    );
  }
  if (typeof upload !== 'string' || !BASE_ID.test(upload)) {
    throw new InvalidArgumentError(
      `workspace.upload must be the uploadId POST /v1/workspaces/uploads answered (wsu_…), not ${JSON.stringify(upload)}`,
    );
  }
  // Mounted as a host folder's workspace is, where this provider can mount one.
  const unavailable = workspaceUnavailableOn(provider);
  if (unavailable !== undefined) throw new InvalidArgumentError(`workspace: ${unavailable}`);
  const mountPath = checkMountPath(path ?? posix.join(home, 'workspace'), home, 'workspace');
  for (const other of volumePaths) {
    if (
      other === mountPath ||
      mountPath.startsWith(`${other}/`) ||
      other.startsWith(`${mountPath}/`)
    ) {
      throw new InvalidArgumentError(
        `workspace.path ${mountPath} overlaps the path of a volume (${other}): give each its own folder`,
      );
    }
  }
  return { upload, path: mountPath };
}

/** What an upload is, as the API answers it and a sandbox's workspace keeps it. */
export interface UploadInfo {
  uploadId: string;
  /** When the client began packing its folder, by its own clock (ms since the epoch), if it said. */
  since: number | null;
  /** When the daemon had it whole. */
  uploadedAt: number;
  files: number;
  directories: number;
  symlinks: number;
  expiresAt: number;
}

interface Waiting {
  info: UploadInfo;
  /** The key that sent it (undefined: the daemon's own user). */
  owner: string | undefined;
  timer: NodeJS.Timeout;
}

/** The daemon's uploads waiting for a create. */
export class WorkspaceUploads {
  private readonly waiting = new Map<string, Waiting>();
  private swept = false;

  /** `dir`: where uploads wait (made at the first upload). */
  constructor(private readonly dir: string) {}

  /** At the first upload: what a stopped daemon left is no one's any more (its creates will not come). */
  private ready(): void {
    if (this.swept) return;
    rmSync(this.dir, { recursive: true, force: true });
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    this.swept = true;
  }

  /**
   * Extracts `body` (a tar stream) into a new upload of `owner`. A refused archive (a link out,
   * `..`, a set-id bit, a device, …) leaves nothing: the partial folder is removed.
   */
  async receive(
    body: AsyncIterable<Buffer>,
    owner: string | undefined,
    since: number | null,
  ): Promise<UploadInfo> {
    const mine = [...this.waiting.values()].filter((w) => w.owner === owner).length;
    if (mine >= MAX_WAITING_UPLOADS) {
      throw new InvalidArgumentError(
        `${mine} workspace uploads of this key are waiting for a create (at most ${MAX_WAITING_UPLOADS}): create sandboxes with them (workspace: { upload }) or wait ${UPLOAD_TTL_MS / 60_000} minutes for them to expire`,
        { code: 'too_many_uploads' },
      );
    }
    this.ready();
    const uploadId = `wsu_${randomBytes(12).toString('base64url')}`;
    const folder = join(this.dir, uploadId);
    const base = join(folder, 'base');
    mkdirSync(folder, { mode: 0o700 });
    let summary: Awaited<ReturnType<typeof extractTar>>;
    try {
      summary = await extractTar(body, base, {
        refuseSpecialBits: true,
        refuseLinksOut: true,
        exactModes: true,
      });
    } catch (error) {
      rmSync(folder, { recursive: true, force: true });
      if (error instanceof ArchiveError) {
        throw new InvalidArgumentError(
          `the workspace archive was refused, and nothing of it kept: ${error.message}`,
          { code: 'workspace_archive_refused' },
        );
      }
      throw error;
    }
    const uploadedAt = Date.now();
    const info: UploadInfo = {
      uploadId,
      since,
      uploadedAt,
      ...summary,
      expiresAt: uploadedAt + UPLOAD_TTL_MS,
    };
    const timer = setTimeout(() => this.drop(uploadId), UPLOAD_TTL_MS);
    timer.unref();
    this.waiting.set(uploadId, { info, owner, timer });
    return info;
  }

  /**
   * Moves an upload of `owner` to `dest` (a sandbox's workspace folder: `dest/base`, and
   * `dest/upload.json`), once. Another key's upload is unknown, as one that never was.
   */
  take(uploadId: string, owner: string | undefined, dest: string): UploadInfo {
    const found = this.waiting.get(uploadId);
    if (!found || found.owner !== owner) throw notFound(uploadId);
    this.waiting.delete(uploadId);
    clearTimeout(found.timer);
    mkdirSync(dest, { recursive: true, mode: 0o700 });
    renameSync(join(this.dir, uploadId, 'base'), join(dest, 'base'));
    writeFileSync(join(dest, UPLOAD_INFO_FILE), JSON.stringify(found.info), { mode: 0o600 });
    rmSync(join(this.dir, uploadId), { recursive: true, force: true });
    return found.info;
  }

  /** Throws what {@link take} would when `owner` has no upload `uploadId` waiting. */
  check(uploadId: string, owner: string | undefined): void {
    if (this.waiting.get(uploadId)?.owner !== owner) throw notFound(uploadId);
  }

  private drop(uploadId: string): void {
    this.waiting.delete(uploadId);
    rmSync(join(this.dir, uploadId), { recursive: true, force: true });
  }

  /** Removes every waiting upload (the daemon stops). */
  close(): void {
    for (const [id, found] of this.waiting) {
      clearTimeout(found.timer);
      this.drop(id);
    }
  }
}

function notFound(uploadId: string): NotFoundError {
  return new NotFoundError(
    `workspace upload ${JSON.stringify(uploadId)} does not exist (or was used, or expired after ${UPLOAD_TTL_MS / 60_000} minutes): upload the folder again (POST /v1/workspaces/uploads)`,
    { code: 'upload_not_found' },
  );
}

/**
 * What a sandbox's workspace folder says of its upload (`dir/upload.json`), or undefined when
 * its workspace is a host folder. `base`: the workspace's `from`.
 */
export function uploadedWorkspace(base: string): UploadInfo | undefined {
  const folder = dirname(base);
  if (basename(base) !== 'base' || basename(dirname(folder)) !== BASES_DIR) return undefined;
  if (!BASE_ID.test(basename(folder))) return undefined;
  try {
    return JSON.parse(readFileSync(join(dirname(base), UPLOAD_INFO_FILE), 'utf8')) as UploadInfo;
  } catch {
    return undefined;
  }
}

/** The running, paused and pooled sandboxes' rows (what UploadedBases counts). */
interface LiveRows {
  listSandboxes(filter: {
    state: readonly ('running' | 'paused' | 'pooled')[];
  }): Promise<{ handle: { workspace?: { from: string } } }[]>;
}

const execFileAsync = promisify(execFile);

/**
 * The uploaded workspaces' bases in use (`$ABX_HOME/workspace-bases/ID`): a sandbox's, shared
 * with its forks. The count of users is the registry's: a base is removed when no row of a
 * running, paused or pooled sandbox names it as its workspace's `from` (so a daemon restart
 * counts again from the rows, and a sandbox ended on another replica of a shared registry is
 * counted out as well), plus the creates and forks under way in this daemon, which have no row
 * yet (`pin`).
 */
export class UploadedBases {
  private readonly pins = new Map<string, number>();

  constructor(
    /** `$ABX_HOME/workspace-bases`. */
    readonly dir: string,
    private readonly rows: LiveRows,
  ) {}

  /** The base folder of id `id` (its `base`, the workspace's `from`). */
  baseOf(id: string): string {
    return join(this.dir, id, 'base');
  }

  /** Whether `from` is one of this daemon's bases (exactly `dir/ID/base`): the id, or undefined. */
  idOf(from: string | undefined): string | undefined {
    if (from === undefined || dirname(dirname(from)) !== this.dir) return undefined;
    const id = basename(dirname(from));
    return BASE_ID.test(id) && basename(from) === 'base' ? id : undefined;
  }

  /** Upload `uploadId` of `owner` becomes a base, pinned until the caller unpins it. */
  take(uploads: WorkspaceUploads, uploadId: string, owner: string | undefined): string {
    this.pin(this.baseOf(uploadId));
    try {
      uploads.take(uploadId, owner, join(this.dir, uploadId));
    } catch (error) {
      this.pins.delete(this.baseOf(uploadId));
      throw error;
    }
    return this.baseOf(uploadId);
  }

  /**
   * A new base made from a snapshot's copy (`kept`: its `base` and `upload.json`), pinned: hard
   * links to the copy's files (nothing writes a base: the overlay's writes go to the upper
   * layer), so it costs no data and outlives the snapshot; a full copy where links cannot be made.
   */
  async fromCopy(kept: string): Promise<string> {
    const id = `wsu_${randomBytes(12).toString('base64url')}`;
    const base = this.baseOf(id);
    this.pin(base);
    try {
      mkdirSync(join(this.dir, id), { recursive: true, mode: 0o700 });
      await copyTree(join(kept, 'base'), base, true);
      writeFileSync(
        join(this.dir, id, UPLOAD_INFO_FILE),
        readFileSync(join(kept, UPLOAD_INFO_FILE)),
        { mode: 0o600 },
      );
    } catch (error) {
      await this.unpin(base);
      throw error;
    }
    return base;
  }

  /** Counts a create or fork under way that will name `base` (no row yet). */
  pin(base: string): void {
    this.pins.set(base, (this.pins.get(base) ?? 0) + 1);
  }

  /**
   * Ends a {@link pin}; a base no row names then (the create or fork failed) is removed. Never
   * throws: a base left because the registry did not answer goes at the daemon's next start.
   */
  async unpin(base: string): Promise<void> {
    const left = (this.pins.get(base) ?? 1) - 1;
    if (left > 0) this.pins.set(base, left);
    else this.pins.delete(base);
    await this.dropIfUnused(base).catch(() => undefined);
  }

  /** Removes the base `from` (a sandbox's workspace that ended) if nothing uses it any more. */
  async dropIfUnused(from: string | undefined): Promise<void> {
    const id = this.idOf(from);
    if (id === undefined || this.pins.has(this.baseOf(id))) return;
    if ((await this.inUse()).has(id)) return;
    // Checked again: a create or fork may have pinned it while the rows were read.
    if (this.pins.has(this.baseOf(id))) return;
    await rm(join(this.dir, id), { recursive: true, force: true });
  }

  /** The ids of the bases live rows name. */
  private async inUse(): Promise<Set<string>> {
    const rows = await this.rows.listSandboxes({ state: ['running', 'paused', 'pooled'] });
    const ids = new Set<string>();
    for (const row of rows) {
      const id = this.idOf(row.handle.workspace?.from);
      if (id !== undefined) ids.add(id);
    }
    return ids;
  }

  /**
   * Removes the bases no row names (a daemon that died between a release and its removal; an
   * orphan swept while the daemon runs): at the daemon's start, after the dead sandboxes were
   * released, and after each sweep of orphans. The ids removed. In this order, so that a create
   * or fork under way is never taken for unused: the folders are listed, then the pins noted,
   * then the rows read. A listed base was pinned before it was made; if it is no longer pinned
   * when the pins are noted, its row was written before they were, so the rows name it.
   */
  async sweep(): Promise<string[]> {
    if (!existsSync(this.dir)) return [];
    const listed = readdirSync(this.dir);
    const pinned = new Set(this.pins.keys());
    const used = await this.inUse();
    const gone: string[] = [];
    for (const id of listed) {
      const base = this.baseOf(id);
      if (used.has(id) || pinned.has(base) || this.pins.has(base)) continue;
      await rm(join(this.dir, id), { recursive: true, force: true });
      gone.push(id);
    }
    return gone;
  }
}

/**
 * Copies folder `from` to `to` (which must not exist) with modes, times and links as they are
 * (`cp -a`); `link`: hard links where the file system allows, else a copy.
 */
export async function copyTree(from: string, to: string, link = false): Promise<void> {
  if (link) {
    try {
      await execFileAsync('cp', ['-a', '--link', '--', from, to]);
      return;
    } catch {
      await rm(to, { recursive: true, force: true });
    }
  }
  await execFileAsync('cp', ['-a', '--', from, to]);
}
