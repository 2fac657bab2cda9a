/**
 * A remote client's workspace (docs/workspaces.md, "From a remote client"): the client packs its
 * folder as a tar stream and uploads it before the create; the sandbox's changes come back as
 * files of its view, which the core's `apply()` writes into the client's folder with the same
 * refusals and conflict rule as on the daemon's host.
 */
import { execFile } from 'node:child_process';
import { createReadStream, createWriteStream, existsSync } from 'node:fs';
import {
  chmod,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readlink,
  realpath,
  rm,
  symlink,
} from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { promisify } from 'node:util';
import {
  END_OF_ARCHIVE,
  entryHeader,
  padding,
  type TarEntry,
} from '../../runtime/envd/tar-format.js';
import { InvalidArgumentError } from '../errors.js';
import { type ApplyResult, apply } from '../workspace/index.js';
import type { WorkspaceChange } from '../workspace/types.js';
import type { HttpClient } from './http-client.js';

const execFileAsync = promisify(execFile);

/** How long an upload may take (the daemon's own limit is ABX_WORKSPACE_UPLOAD_TIMEOUT_MS). */
export const UPLOAD_TIMEOUT_MS = 10 * 60_000;

/** What the daemon answers for an upload. */
export interface WorkspaceUpload {
  uploadId: string;
  since: number | null;
  uploadedAt: number;
  files: number;
  directories: number;
  symlinks: number;
  expiresAt: number;
}

/**
 * The relative paths to pack: with `gitignore`, what `git ls-files -co --exclude-standard` lists
 * (tracked and untracked files that .gitignore does not exclude) and the `.git` folder; else
 * everything. Folders are walked by {@link entries}.
 */
async function chosenPaths(dir: string, gitignore: boolean): Promise<string[]> {
  if (!gitignore) return (await readdir(dir)).sort();
  const top = await execFileAsync('git', ['-C', dir, 'rev-parse', '--show-toplevel'], {
    encoding: 'utf8',
  }).catch(() => undefined);
  if (!top) {
    throw new InvalidArgumentError(
      `workspace.gitignore: ${dir} is not in a git work tree, and .gitignore is read by git (git ls-files): leave gitignore out, or run git init there`,
    );
  }
  const { stdout } = await execFileAsync(
    'git',
    ['-C', dir, 'ls-files', '-co', '--exclude-standard', '-z', '--', '.'],
    { encoding: 'buffer', maxBuffer: 1024 ** 3 },
  );
  const listed = stdout
    .toString('utf8')
    .split('\0')
    .filter((p) => p !== '');
  // The repository's own metadata goes too, so that git works in the sandbox.
  return [...(existsSync(join(dir, '.git')) ? ['.git'] : []), ...listed];
}

/** The tar entries of `rel` (and what is under it, for a folder), depth first. */
async function* entries(dir: string, rel: string): AsyncGenerator<Buffer> {
  const path = join(dir, rel);
  const st = await lstat(path).catch(() => undefined);
  if (!st) return; // listed by git but gone from the work tree
  const base = {
    mode: st.mode & 0o7777,
    uid: 0,
    gid: 0,
    mtime: Math.floor(st.mtimeMs / 1000),
  };
  if (st.isDirectory()) {
    yield entryHeader({ ...base, name: Buffer.from(`${rel}/`), type: '5', size: 0 });
    for (const name of (await readdir(path)).sort()) yield* entries(dir, `${rel}/${name}`);
  } else if (st.isSymbolicLink()) {
    const link = Buffer.from(await readlink(path));
    yield entryHeader({ ...base, name: Buffer.from(rel), type: '2', size: 0, link });
  } else if (st.isFile()) {
    const entry: TarEntry = { ...base, name: Buffer.from(rel), type: '0', size: st.size };
    yield entryHeader(entry);
    let sent = 0;
    for await (const chunk of createReadStream(path, { end: Math.max(0, st.size - 1) })) {
      const bytes = (chunk as Buffer).subarray(0, st.size - sent);
      sent += bytes.length;
      yield bytes;
      if (sent >= st.size) break;
    }
    if (sent !== st.size) {
      throw new InvalidArgumentError(
        `workspace upload: ${path} changed size while it was packed (${st.size} bytes, then ${sent}): pack again`,
      );
    }
    yield padding(st.size);
  } else {
    throw new InvalidArgumentError(
      `workspace upload: ${path} is not a file, folder or symbolic link (a FIFO, socket or device): only those are uploaded; remove it or add it to .gitignore (gitignore: true)`,
    );
  }
}

/**
 * `dir` as a tar stream (see {@link chosenPaths}); owners are not sent, modes and mtimes are.
 * `failed()` is why packing stopped, if it did (the request then fails for want of a body).
 */
export function packFolder(
  dir: string,
  gitignore: boolean,
): { stream: Readable; failed(): unknown } {
  let failure: unknown;
  async function* archive(): AsyncGenerator<Buffer> {
    try {
      for (const rel of await chosenPaths(dir, gitignore)) yield* entries(dir, rel);
    } catch (error) {
      failure = error;
      throw error;
    }
    yield END_OF_ARCHIVE;
  }
  return { stream: Readable.from(archive(), { objectMode: false }), failed: () => failure };
}

/**
 * Packs `dir` and uploads it (`POST /v1/workspaces/uploads`); `since` (this machine's clock,
 * taken before packing) is what a later apply's conflicts count from.
 */
export async function uploadFolder(
  client: HttpClient,
  dir: string,
  gitignore: boolean,
): Promise<WorkspaceUpload> {
  const st = await lstat(dir).catch(() => undefined);
  if (!dir.startsWith('/') || !st?.isDirectory()) {
    throw new InvalidArgumentError(
      `workspace.from must be an absolute path of a folder on this machine to upload, not ${JSON.stringify(dir)}`,
    );
  }
  const since = Date.now();
  const body = packFolder(dir, gitignore);
  try {
    return await client.json<WorkspaceUpload>('POST', '/v1/workspaces/uploads', {
      query: { since },
      body: body.stream,
      raw: true,
      headers: { 'content-type': 'application/x-tar' },
      timeoutMs: UPLOAD_TIMEOUT_MS,
    });
  } catch (error) {
    // What stopped the packing says more than the broken request it caused.
    throw body.failed() ?? error;
  } finally {
    body.stream.destroy();
  }
}

/** What `sandbox.workspace.applyLocal()` takes. */
export interface WorkspaceApplyLocalRequest {
  /** The client's folder to write (default: the one this Sandbox object uploaded). */
  dir?: string;
  /** Only these changes: a path (either path of a rename) or a folder (`src/`). */
  paths?: string[];
  /** Check everything, write nothing. */
  dryRun?: boolean;
  /** Write over edits made in `dir` since it was uploaded. */
  force?: boolean;
}

/** What applyLocal needs of a sandbox: its workspace's place and its files. */
export interface ApplyLocalSource {
  /** `GET /v1/sandboxes/{id}/workspace`. */
  info(): Promise<{ path: string; uploaded: boolean; since: number }>;
  changes(): Promise<WorkspaceChange[]>;
  /** A file of the sandbox as a stream (the files API). */
  read(path: string): Promise<Readable>;
}

/**
 * Applies a sandbox's workspace changes to `dir` on this machine: the changed files are
 * downloaded into a staging folder (the view the core's apply() reads, which checks each against
 * the hash changes() gave), and apply() writes them into `dir` with `since` the upload's time.
 */
export async function applyLocal(
  source: ApplyLocalSource,
  dir: string,
  request: Omit<WorkspaceApplyLocalRequest, 'dir'>,
): Promise<ApplyResult> {
  const base = await realpath(dir).catch(() => {
    throw new InvalidArgumentError(`applyLocal: ${dir} is not a folder on this machine`);
  });
  const info = await source.info();
  if (!info.uploaded) {
    throw new InvalidArgumentError(
      `applyLocal: this sandbox's workspace is a folder of the daemon's host, not an upload: apply it there (sandbox.workspace.apply())`,
    );
  }
  const entries = await source.changes();
  const view = await realpath(await mkdtemp(join(tmpdir(), 'abx-apply-')));
  try {
    for (const change of entries) {
      const after = change.after;
      if (!after || change.path.split('/').includes('..') || change.path.startsWith('/')) continue;
      const target = join(view, change.path);
      await mkdir(dirname(target), { recursive: true });
      if (after.kind === 'file') {
        const stream = await source.read(`${info.path}/${change.path}`);
        await pipeline(stream, createWriteStream(target, { flags: 'wx', mode: 0o600 }));
        await chmod(target, after.mode & 0o777);
      } else if (after.kind === 'symlink' && after.target !== undefined) {
        await symlink(after.target, target);
      }
      // Other kinds are not fetched: apply() refuses them by name.
    }
    return await apply({ base, view, entries }, { since: info.since, ...request });
  } finally {
    await rm(view, { recursive: true, force: true });
  }
}
