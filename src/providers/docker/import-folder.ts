import { spawn } from 'node:child_process';
import type Docker from 'dockerode';
import { UnavailableError } from '../../errors.js';
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
  docker: Docker,
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
  const progress = await docker.importImage(tar.stdout, { repo, tag });
  await new Promise<void>((resolve, reject) => {
    docker.modem.followProgress(progress, (error: Error | null, events: { error?: string }[]) => {
      const failed = error?.message ?? events.find((event) => event.error)?.error;
      if (failed) reject(new UnavailableError(`docker import ${reference} failed: ${failed}`));
      else resolve();
    });
  });
  await tarred;
  return `${repo}:${tag}`;
}
