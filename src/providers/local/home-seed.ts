import { constants, createWriteStream, type Stats } from 'node:fs';
import { chmod, lstat, mkdir, open, readdir, readlink, symlink } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { SandboxStartError } from '../../errors.js';

/**
 * Copies the tree under `from` into `to` (made, 0700) for a sandbox's home: folders, regular
 * files and symbolic links only, with permission bits alone (no set-id or sticky bits, so no
 * setuid program comes along), owned by whoever copies; device nodes, FIFOs and sockets are left
 * out. Links are copied as links, never followed, and files are opened without following one:
 * whatever an image put in its home, the host reads nothing outside `from`. Stops with a
 * SandboxStartError once the files exceed `limit` bytes (they would not fit the disk anyway).
 */
export async function copyHomeTree(from: string, to: string, limit: number): Promise<void> {
  let total = 0;
  const tooBig = () =>
    new SandboxStartError(
      `the template's home (${from}) holds more than the sandbox's disk (${limit} bytes): raise the template's resources.disk or make the home smaller`,
    );
  const walk = async (src: string, dest: string): Promise<void> => {
    for (const name of (await readdir(src)).sort()) {
      const path = join(src, name);
      const target = join(dest, name);
      const stats = await lstat(path);
      // Each entry costs at least a block in the disk's file system.
      total += 4096;
      if (total > limit) throw tooBig();
      if (stats.isDirectory()) {
        await mkdir(target, { mode: 0o700 });
        await walk(path, target);
        await chmod(target, stats.mode & 0o777);
      } else if (stats.isSymbolicLink()) {
        await symlink(await readlink(path, { encoding: 'buffer' }), Buffer.from(target));
      } else if (stats.isFile()) {
        total += stats.size;
        if (total > limit) throw tooBig();
        await copyFile(path, target, stats);
      }
    }
  };
  await mkdir(to, { recursive: true, mode: 0o700 });
  await chmod(to, 0o700);
  await walk(from, to);
}

async function copyFile(path: string, target: string, stats: Stats): Promise<void> {
  const source = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  try {
    if (!(await source.stat()).isFile()) return;
    await pipeline(
      source.createReadStream({ autoClose: false }),
      createWriteStream(target, { flags: 'wx', mode: stats.mode & 0o777 }),
    );
    await chmod(target, stats.mode & 0o777);
  } finally {
    await source.close();
  }
}

/**
 * The host path of `path` (absolute, in the image) under an image's unpacked `rootfs`, when every
 * component that exists there is a real folder (the last may be missing). A symbolic link on the
 * way is refused: the launcher makes these paths as root in the host's view of the overlay, where
 * a link would point into the host's own file system (an image with `/home -> /etc` would have
 * root make folders in the host's /etc). Undefined when the path is not in the image.
 */
export async function folderInImage(
  rootfs: string,
  path: string,
  image: string,
): Promise<string | undefined> {
  const parts = posix.normalize(path).split('/').filter(Boolean);
  let at = rootfs;
  for (const [index, part] of parts.entries()) {
    at = join(at, part);
    let stats: Stats;
    try {
      stats = await lstat(at);
    } catch {
      return undefined;
    }
    if (!stats.isDirectory()) {
      const shown = `/${parts.slice(0, index + 1).join('/')}`;
      throw new SandboxStartError(
        `image ${image}: ${shown} is ${stats.isSymbolicLink() ? 'a symbolic link' : 'not a folder'}, and the local provider makes ${path} there as root; make it a real folder in the image (or use the docker provider)`,
      );
    }
  }
  return at;
}

/**
 * A file the launcher may create in an image's overlay (`/etc/resolv.conf`): refused when it is a
 * symbolic link, which the launcher's shell would follow into the host's file system.
 */
export async function fileInImage(rootfs: string, path: string, image: string): Promise<void> {
  const stats = await lstat(join(rootfs, path)).catch(() => undefined);
  if (stats && !stats.isFile()) {
    throw new SandboxStartError(
      `image ${image}: ${path} is ${stats.isSymbolicLink() ? 'a symbolic link' : 'not a regular file'}, and the local provider writes it as root; make it a regular file in the image (or use the docker provider)`,
    );
  }
}

/**
 * The text of a regular file in an image (`path` absolute), or undefined when it, or a folder on
 * its way, is missing, a symbolic link or not what it should be: nothing outside the image is
 * ever read through it.
 */
export async function regularFileInImage(
  rootfs: string,
  path: string,
  maxBytes = 4 * 1024 * 1024,
): Promise<string | undefined> {
  const parts = path.split('/').filter(Boolean);
  let at = rootfs;
  for (const [index, part] of parts.entries()) {
    at = join(at, part);
    const stats = await lstat(at).catch(() => undefined);
    const last = index === parts.length - 1;
    if (!stats || (last ? !stats.isFile() || stats.size > maxBytes : !stats.isDirectory())) {
      return undefined;
    }
  }
  // O_NOFOLLOW: a link put in its place since is not followed either.
  const handle = await open(at, constants.O_RDONLY | constants.O_NOFOLLOW).catch(() => undefined);
  if (!handle) return undefined;
  try {
    return await handle.readFile('utf8');
  } finally {
    await handle.close();
  }
}
