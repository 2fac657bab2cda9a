import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { chmod, mkdir, readdir, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { SandboxStartError } from '../../errors.js';
import { pidAlive } from '../../util/pid-alive.js';
import { engineError, imageNotFound, statusOf } from '../docker/engine.js';
import type { DockerEngine } from '../docker/engine-client.js';

/**
 * Where the local provider keeps image file systems, one folder per image id (on disk, not in
 * /run: an image is hundreds of MB). Root-only: the folders keep the image's owners and modes.
 */
export const ROOTFS_ROOT = '/var/lib/abx/rootfs';
const COMPLETE = '.complete';

/** A half-made folder whose maker is gone (a daemon that crashed mid-export). */
async function removeAbandoned(root: string): Promise<void> {
  for (const name of await readdir(root).catch(() => [] as string[])) {
    const pid = /\.partial-(\d+)-/.exec(name)?.[1];
    if (pid && !pidAlive(Number(pid))) await rm(join(root, name), { recursive: true, force: true });
  }
}

/**
 * The file system of `image` (on the host's Docker engine) as a read-only folder the local
 * provider lays an overlay over: exported once per image id with `docker export` of a container
 * that never starts, unpacked by the host's GNU tar keeping owners and modes, then renamed into
 * place (concurrent exports of one image end with one folder). Returns the `rootfs` path.
 */
export async function imageRootfs(
  docker: DockerEngine,
  image: string,
  root: string = ROOTFS_ROOT,
): Promise<string> {
  let id: string;
  try {
    id = (await docker.getImage(image).inspect()).Id;
  } catch (error) {
    if (statusOf(error) === 404) throw imageNotFound(image, error);
    throw engineError(error, `inspecting image ${image}`);
  }
  const dir = join(root, id.replace(/^sha256:/, '').slice(0, 24));
  const rootfs = join(dir, 'rootfs');
  if (existsSync(join(dir, COMPLETE))) return rootfs;
  await mkdir(root, { recursive: true, mode: 0o755 });
  await chmod(root, 0o755);
  await removeAbandoned(root);
  const partial = `${dir}.partial-${process.pid}-${randomBytes(4).toString('hex')}`;
  const container = await docker
    .createContainer({
      Image: image,
      // Never started: any command will do, and the image needs none of its own.
      Entrypoint: ['/abx-never-started'],
      Cmd: [],
      Labels: { 'abx.export': image },
      NetworkDisabled: true,
    })
    .catch((error: unknown) => {
      throw engineError(error, `exporting image ${image}`);
    });
  try {
    await mkdir(join(partial, 'rootfs'), { recursive: true, mode: 0o755 });
    const tar = spawn(
      'tar',
      ['-x', '--numeric-owner', '-p', '-C', join(partial, 'rootfs'), '-f', '-'],
      {
        stdio: ['pipe', 'ignore', 'pipe'],
      },
    );
    let stderr = '';
    tar.stderr.on('data', (chunk: Buffer) => {
      if (stderr.length < 4000) stderr += chunk.toString('utf8');
    });
    const exited = new Promise<number | null>((resolve, reject) => {
      tar.once('error', reject);
      tar.once('close', resolve);
    });
    const stream = await container.export();
    await pipeline(stream, tar.stdin);
    const code = await exited;
    if (code !== 0) {
      throw new SandboxStartError(
        `unpacking image ${image} for the local provider failed (tar exit ${code}): ${stderr.trim()}`,
      );
    }
    await writeFile(join(partial, COMPLETE), `${image}\n`);
    try {
      await rename(partial, dir);
    } catch (error) {
      // Another export of the same image finished first: theirs is as good as ours.
      if (!existsSync(join(dir, COMPLETE))) throw error;
    }
    return rootfs;
  } finally {
    await rm(partial, { recursive: true, force: true });
    await container.remove({ force: true }).catch(() => undefined);
  }
}

/** True when a process's mount table still has `path` (an overlay's lower layer) in it. */
function mountedAnywhere(path: string): boolean {
  for (const pid of readdirSyncSafe('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/mountinfo`, 'utf8').includes(path)) return true;
    } catch {
      // gone, or not ours to read
    }
  }
  return false;
}

function readdirSyncSafe(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

/**
 * Removes the cached file systems of images the engine no longer has (a template rebuilt or
 * removed) that no sandbox runs on any more (no mount table names them). Returns what it removed.
 */
export async function pruneRootfs(
  docker: DockerEngine,
  root: string = ROOTFS_ROOT,
): Promise<string[]> {
  const names = readdirSyncSafe(root).filter((name) => /^[0-9a-f]{24}$/.test(name));
  if (names.length === 0) return [];
  const ids = (await docker.listImages({ all: true })).map((image) =>
    image.Id.replace(/^sha256:/, '').slice(0, 24),
  );
  const removed: string[] = [];
  for (const name of names) {
    const dir = join(root, name);
    if (ids.includes(name) || mountedAnywhere(`${dir}/rootfs`)) continue;
    await rm(dir, { recursive: true, force: true });
    removed.push(dir);
  }
  return removed;
}
