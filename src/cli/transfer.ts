import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { PassThrough, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { SandboxError } from '../errors.js';
import type { Sandbox } from '../sandbox/sandbox.js';
import { ArchiveError, extractTar } from '../util/safe-extract.js';
import { ProgressBar } from './feedback.js';

/**
 * A stream that counts what passes through it on a progress bar. Destroying it (a failed
 * pipeline does) destroys the source too, so a download that stopped early does not leave its
 * connection open.
 */
function counted(source: Readable, bar: ProgressBar, count?: (bytes: number) => void): Readable {
  const through = new PassThrough();
  through.on('data', (chunk: Buffer) => {
    bar.advance(chunk.length);
    count?.(chunk.length);
  });
  source.on('error', (error) => through.destroy(error));
  through.once('close', () => source.destroy());
  return source.pipe(through);
}

/** Total size of the files under a local directory, for the progress bar's scale. */
async function treeSize(dir: string): Promise<number> {
  let total = 0;
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) total += await treeSize(path);
    else if (entry.isFile()) total += (await stat(path)).size;
  }
  return total;
}

/** A process's exit, as a promise that rejects with its stderr when it fails. */
function exited(child: ReturnType<typeof spawn>, what: string): Promise<void> {
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) =>
      code === 0 ? resolve() : reject(new Error(`${what} failed (exit ${code}): ${stderr.trim()}`)),
    );
  });
}

/** Copies a local file to `dest` in the sandbox (written atomically by envd). */
export async function uploadFile(sandbox: Sandbox, local: string, dest: string): Promise<number> {
  const { size } = await stat(local);
  // An absolute path on a local daemon: the gateway copies the file by descriptor (no bar: the
  // copy is the disk's speed); else the bytes are streamed with a bar.
  if (dest.startsWith('/')) return (await sandbox.files.upload(local, dest)).size;
  const bar = new ProgressBar(`→ ${dest}`, size);
  try {
    await sandbox.files.write(dest, counted(createReadStream(local), bar));
  } finally {
    bar.finish();
  }
  return size;
}

/**
 * Copies a local directory's contents into `dest` in the sandbox (created if missing): one tar
 * stream instead of a request per file, piped from the local tar straight into the sandbox's own
 * (no archive file on either side).
 */
export async function uploadDirectory(
  sandbox: Sandbox,
  local: string,
  dest: string,
): Promise<number> {
  const bar = new ProgressBar(`→ ${dest}`, await treeSize(local));
  const tar = spawn('tar', ['-cf', '-', '-C', local, '.'], { stdio: ['ignore', 'pipe', 'pipe'] });
  try {
    const [info] = await Promise.all([
      sandbox.files.writeArchive(dest, counted(tar.stdout, bar)),
      exited(tar, 'tar (packing locally)'),
    ]);
    return info.size;
  } finally {
    bar.finish();
  }
}

/**
 * Copies a sandbox file to a local path through a temporary file next to it, renamed into place
 * at the end: an interrupted copy never leaves half a file under the real name. The temporary
 * file is created new (`wx`: never an existing file, never through a symbolic link planted under
 * its name) with permission bits only, so no set-user-ID file can come of it.
 */
export async function downloadFile(
  sandbox: Sandbox,
  remote: string,
  size: number,
  local: string,
): Promise<number> {
  const partial = join(dirname(local), `.${randomBytes(6).toString('hex')}.abx-partial`);
  const bar = new ProgressBar(`← ${remote}`, size);
  try {
    await mkdir(dirname(local), { recursive: true });
    if (remote.startsWith('/')) {
      // By descriptor on a local daemon (files.download streams by itself where it cannot).
      await sandbox.files.download(remote, partial);
    } else {
      const body = await sandbox.files.read(remote, { format: 'stream' });
      await pipeline(counted(body, bar), createWriteStream(partial, { flags: 'wx', mode: 0o666 }));
    }
    await rename(partial, local);
  } catch (error) {
    await rm(partial, { force: true });
    throw error;
  } finally {
    bar.finish();
  }
  return (await stat(local)).size;
}

/** Why a directory download stopped, with what it leaves behind. */
function downloadFailure(error: unknown, remote: string, local: string): Error {
  const left = `entries extracted before the failure stay in ${local}`;
  if (error instanceof ArchiveError) {
    return new ArchiveError(`${error.message}; ${left}`, { cause: error });
  }
  if (error instanceof SandboxError) return error;
  // The stream broke: the sandbox ended, or envd cut it on a file it could no longer read.
  return new SandboxError(
    `the archive of ${remote} broke off (${(error as Error).message}); ${left}`,
    { cause: error },
  );
}

/**
 * Copies a sandbox directory's contents into a local directory (created if missing). envd packs
 * the tree and streams it (no archive file in the sandbox that something there could swap); this
 * side treats the stream as hostile and extracts it with {@link extractTar}: only directories,
 * regular files and symbolic links, no set-user-ID/set-group-ID/sticky bits, owned by the user
 * running abx, nothing outside `local`, nothing written through a symbolic link.
 */
export async function downloadDirectory(
  sandbox: Sandbox,
  remote: string,
  local: string,
): Promise<number> {
  const { stream, estimatedBytes } = await sandbox.files.readArchive(remote);
  const bar = new ProgressBar(`← ${remote}`, estimatedBytes);
  let received = 0;
  try {
    await extractTar(
      counted(stream, bar, (bytes) => {
        received += bytes;
      }),
      local,
    );
  } catch (error) {
    throw downloadFailure(error, remote, local);
  } finally {
    bar.finish();
  }
  return received;
}
