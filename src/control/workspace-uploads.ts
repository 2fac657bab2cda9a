/**
 * Workspaces uploaded by remote clients (docs/workspaces.md, "From a remote client"): a client
 * streams a tar of its folder to `POST /v1/workspaces/uploads`; the checking extractor writes it
 * into a folder of the daemon's own; a create's `workspace: { upload, path? }` then takes that
 * folder (once) as the base of the sandbox's workspace, the overlay's lower layer.
 *
 * The upload comes first, the sandbox after, so the base is complete before the overlay is
 * mounted on it: overlayfs leaves a lower layer changed under a mounted overlay undefined.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, posix } from 'node:path';
import { ArchiveError, InvalidArgumentError, NotFoundError } from '../errors.js';
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

/** The folder of a sandbox's own folder that holds its uploaded workspace's base. */
export const UPLOADED_DIR = 'workspace-upload';

/** The file next to a workspace's base that says it was uploaded, and when (client's clock). */
export const UPLOAD_INFO_FILE = 'upload.json';

/**
 * A create's `workspace: { upload, path? }` (a remote client's folder), checked; undefined when
 * the workspace names no upload (a host folder's, checked by checkWorkspaceRequest). No folder of
 * the daemon's host is named, so any key may: the upload itself is the key's own.
 */
export function checkUploadedWorkspace(
  value: unknown,
  provider: { name: string },
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
  if (typeof upload !== 'string' || !/^wsu_[A-Za-z0-9_-]{16}$/.test(upload)) {
    throw new InvalidArgumentError(
      `workspace.upload must be the uploadId POST /v1/workspaces/uploads answered (wsu_…), not ${JSON.stringify(upload)}`,
    );
  }
  if (provider.name !== 'local') {
    throw new InvalidArgumentError(
      `workspace: the ${provider.name} provider cannot mount an uploaded one yet; the local provider on a root daemon can (abx daemon start --provider local)`,
    );
  }
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
  if (!base.endsWith(`/${UPLOADED_DIR}/base`)) return undefined;
  try {
    return JSON.parse(readFileSync(join(dirname(base), UPLOAD_INFO_FILE), 'utf8')) as UploadInfo;
  } catch {
    return undefined;
  }
}
