import { spawn } from 'node:child_process';
import { UnavailableError } from '../../errors.js';
import { type DockerEngine, followProgress } from './engine-client.js';
import { splitTag } from './image-reference.js';

export interface ImportFolderOptions {
  /** Where the folder's content lands in the image (`/opt/abx`); default the root. */
  at?: string;
  /** Every file owned by root (uid/gid 0) whatever its owner on the host; default: kept. */
  rootOwned?: boolean;
}

/**
 * `docker import` of a folder as a one-layer image `reference`, from a tar made by GNU tar
 * (devices, modes and numeric owners kept). Returns the reference.
 */
export async function importFolder(
  docker: DockerEngine,
  dir: string,
  reference: string,
  options: ImportFolderOptions = {},
): Promise<string> {
  const { repo, tag } = splitTag(reference);
  const at = options.at?.replace(/^\/+|\/+$/g, '');
  const tar = spawn(
    'tar',
    [
      '-C',
      dir,
      '--numeric-owner',
      ...(options.rootOwned ? ['--owner=0', '--group=0'] : []),
      ...(at ? [`--transform=s,^\\.,${at},S`] : []),
      '-cf',
      '-',
      '.',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let stderr = '';
  tar.stderr.on('data', (chunk: Buffer) => {
    stderr += chunk;
  });
  const tarred = new Promise<void>((resolve, reject) => {
    tar.on('error', reject);
    tar.on('close', (code) =>
      code === 0 ? resolve() : reject(new UnavailableError(`tar of ${dir} failed: ${stderr}`)),
    );
  });
  try {
    const progress = await docker.importImage(tar.stdout, { repo, tag });
    await followProgress(progress).catch((error: Error) => {
      throw new UnavailableError(`docker import ${reference} failed: ${error.message}`, {
        cause: error,
      });
    });
  } catch (error) {
    // The engine gave up: no tar is left writing into a pipe nobody reads.
    tar.kill();
    tarred.catch(() => undefined);
    throw error;
  }
  await tarred;
  return `${repo}:${tag}`;
}
