import { spawn } from 'node:child_process';
import type Docker from 'dockerode';
import { SANDBOX_RUNTIME_DIR } from '../../../runtime/protocol/constants.js';
import { UnavailableError } from '../../errors.js';
import type { PortableRuntime } from '../portable-runtime.js';

/**
 * Makes the init container's image on a Docker engine: the portable runtime (Node, the libraries
 * it links and their loader, envd.cjs, server.cjs) at /opt/abx and nothing else, imported from a
 * tar of the runtime's folder. Push it to a registry the cluster pulls from and give it to the
 * provider (`--kube-runtime-image`). Its node runs without any libc of the image's own.
 */
export async function buildRuntimeImage(
  docker: Docker,
  runtime: PortableRuntime,
  tag: string,
): Promise<string> {
  const [repo, version = 'latest'] = tag.split(/:(?=[^/:]+$)/) as [string, string?];
  const tar = spawn(
    'tar',
    [
      '-C',
      runtime.dir,
      '--numeric-owner',
      '--owner=0',
      '--group=0',
      `--transform=s,^\\.,${SANDBOX_RUNTIME_DIR.slice(1)},S`,
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
      code === 0
        ? resolve()
        : reject(new UnavailableError(`tar of ${runtime.dir} failed: ${stderr}`)),
    );
  });
  const progress = await docker.importImage(tar.stdout, { repo, tag: version });
  await new Promise<void>((resolve, reject) => {
    docker.modem.followProgress(progress, (error: Error | null, events: { error?: string }[]) => {
      const failed = error?.message ?? events.find((event) => event.error)?.error;
      if (failed) reject(new UnavailableError(`docker import ${tag} failed: ${failed}`));
      else resolve();
    });
  });
  await tarred;
  return `${repo}:${version}`;
}
