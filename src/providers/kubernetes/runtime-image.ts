import { SANDBOX_RUNTIME_DIR } from '../../../runtime/protocol/constants.js';
import { engineAddress, engineError } from '../docker/engine.js';
import type { DockerEngine } from '../docker/engine-client.js';
import { parseImageReference } from '../docker/image-reference.js';
import { importFolder } from '../docker/import-folder.js';
import { pushImage } from '../docker/registry-push.js';
import type { PortableRuntime } from '../portable-runtime.js';

/**
 * Makes the init container's image on a Docker engine: the portable runtime (Node, the libraries
 * it links and their loader, envd.cjs, server.cjs) at /opt/abx and nothing else, imported from a
 * tar of the runtime's folder. Push it to a registry the cluster pulls from and give it to the
 * provider (`--kube-runtime-image`); `abx kubernetes runtime-image REPO --push` does both. Its
 * node runs without any libc of the image's own.
 */
export async function buildRuntimeImage(
  docker: DockerEngine,
  runtime: PortableRuntime,
  tag: string,
): Promise<string> {
  return importFolder(docker, runtime.dir, tag, { at: SANDBOX_RUNTIME_DIR, rootOwned: true });
}

/**
 * The runtime image's default tag: the package's version and the runtime's content hash, so one
 * tag always names the same bytes (a changed runtime is a new tag, never an overwritten one).
 */
export function runtimeImageTag(runtime: PortableRuntime, version: string): string {
  return `${version.replace(/[^\w.-]/g, '_')}-${runtime.hash.slice(0, 12)}`;
}

/** What {@link makeRuntimeImage} made. */
export interface RuntimeImage {
  /** The reference to give as `--kube-runtime-image`. */
  reference: string;
  /** The registry's digest of the pushed manifest (when pushed). */
  digest?: string;
  pushed: boolean;
  /** The portable runtime's content hash. */
  runtimeHash: string;
}

/**
 * Builds the runtime image as `reference` (`[registry/]repository[:tag]`; without a tag,
 * {@link runtimeImageTag}) and, with `push`, pushes it through the same engine. A reference that
 * is not valid fails before anything is built; a push that fails removes the image it built.
 */
export async function makeRuntimeImage(
  docker: DockerEngine,
  runtime: PortableRuntime,
  reference: string,
  options: { push?: boolean; version: string },
): Promise<RuntimeImage> {
  const parsed = parseImageReference(reference, 'runtime image reference');
  const target = `${parsed.repository}:${parsed.tag ?? runtimeImageTag(runtime, options.version)}`;
  const address = engineAddress(docker);
  const existed = await docker
    .getImage(target)
    .inspect()
    .then(
      () => true,
      () => false,
    );
  try {
    await buildRuntimeImage(docker, runtime, target);
  } catch (error) {
    throw engineError(error, `cannot build the runtime image ${target}`, address);
  }
  if (!options.push) return { reference: target, pushed: false, runtimeHash: runtime.hash };
  try {
    const pushed = await pushImage(docker, target, target);
    return { ...pushed, pushed: true, runtimeHash: runtime.hash };
  } catch (error) {
    if (!existed) {
      await docker
        .getImage(target)
        .remove()
        .catch(() => undefined);
    }
    throw error;
  }
}
