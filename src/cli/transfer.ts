import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { PassThrough, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { Sandbox } from '../sandbox/sandbox.js';
import { ProgressBar } from './feedback.js';

/** A stream that counts what passes through it on a progress bar. */
function counted(source: Readable, bar: ProgressBar): Readable {
  const through = new PassThrough();
  through.on('data', (chunk: Buffer) => bar.advance(chunk.length));
  source.on('error', (error) => through.destroy(error));
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

/** A scratch file in the sandbox's own /tmp for a tar archive on its way in or out. */
function scratchArchive(): string {
  return `/tmp/abx-cp-${randomBytes(6).toString('hex')}.tar`;
}

/** Copies a local file to `dest` in the sandbox (written atomically by envd). */
export async function uploadFile(sandbox: Sandbox, local: string, dest: string): Promise<number> {
  const { size } = await stat(local);
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
 * stream instead of a request per file, unpacked by the sandbox's own tar. Paths travel in the
 * environment, never spliced into the shell line.
 */
export async function uploadDirectory(
  sandbox: Sandbox,
  local: string,
  dest: string,
): Promise<number> {
  const archive = scratchArchive();
  const bar = new ProgressBar(`→ ${dest}`, await treeSize(local));
  const tar = spawn('tar', ['-cf', '-', '-C', local, '.'], { stdio: ['ignore', 'pipe', 'pipe'] });
  try {
    const [info] = await Promise.all([
      sandbox.files.write(archive, counted(tar.stdout, bar)),
      exited(tar, 'tar (packing locally)'),
    ]);
    await sandbox.commands.run('mkdir -p -- "$DEST" && tar -xf "$ARCHIVE" -C "$DEST"', {
      envs: { DEST: dest, ARCHIVE: archive },
    });
    return info.size;
  } finally {
    bar.finish();
    await sandbox.files.remove(archive).catch(() => undefined);
  }
}

/**
 * Copies a sandbox file to a local path through a temporary file next to it, renamed into place
 * at the end: an interrupted copy never leaves half a file under the real name.
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
    const body = await sandbox.files.read(remote, { format: 'stream' });
    await pipeline(counted(body, bar), createWriteStream(partial));
    await rename(partial, local);
  } catch (error) {
    await rm(partial, { force: true });
    throw error;
  } finally {
    bar.finish();
  }
  return (await stat(local)).size;
}

/**
 * Copies a sandbox directory's contents into a local directory (created if missing): packed by
 * the sandbox's tar, unpacked by the local one. The archive comes from the sandbox, so it is
 * untrusted: GNU tar refuses `..` members and defers symlinks until the end (no writing through
 * them), and `--no-same-owner` keeps the sandbox's uids out of the host.
 */
export async function downloadDirectory(
  sandbox: Sandbox,
  remote: string,
  local: string,
): Promise<number> {
  const archive = scratchArchive();
  try {
    await sandbox.commands.run('tar -cf "$ARCHIVE" -C "$SRC" .', {
      envs: { SRC: remote, ARCHIVE: archive },
    });
    const { size } = await sandbox.files.stat(archive);
    const bar = new ProgressBar(`← ${remote}`, size);
    await mkdir(local, { recursive: true });
    const tar = spawn('tar', ['-xf', '-', '--no-same-owner', '-C', local], {
      stdio: ['pipe', 'ignore', 'pipe'],
    });
    try {
      const body = await sandbox.files.read(archive, { format: 'stream' });
      await Promise.all([
        pipeline(counted(body, bar), tar.stdin),
        exited(tar, 'tar (unpacking locally)'),
      ]);
    } finally {
      bar.finish();
    }
    return size;
  } finally {
    await sandbox.files.remove(archive).catch(() => undefined);
  }
}
