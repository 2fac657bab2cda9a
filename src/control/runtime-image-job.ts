import { join } from 'node:path';
import { errorResponse } from '../../runtime/protocol/errors.js';
import { abxHome } from '../installation/paths.js';
import { dockerClient } from '../providers/docker/engine.js';
import { parseImageReference } from '../providers/docker/image-reference.js';
import { makeRuntimeImage } from '../providers/kubernetes/runtime-image.js';
import { portableRuntime } from '../providers/portable-runtime.js';
import { packageInfo } from '../util/package-info.js';

/**
 * `ABX_RUNTIME_IMAGE=REF [ABX_RUNTIME_IMAGE_PUSH=1]` (what `abx kubernetes runtime-image` runs in
 * the daemon's program, which holds the providers): builds the runtime image on the engine of
 * `DOCKER_HOST` (or the default socket), pushes it when asked, and prints one JSON line, the
 * RuntimeImage or an error body (`{error, type, status}`); exits 0 or 1.
 */
export async function runtimeImageJob(reference: string, push: boolean): Promise<never> {
  const { docker, close } = dockerClient();
  let code = 0;
  try {
    // A bad reference is refused before the runtime (~100 MB) is assembled.
    parseImageReference(reference, 'runtime image reference');
    const info = packageInfo();
    const runtime = await portableRuntime({
      runtimeDir: join(info.root, 'dist', 'runtime'),
      // Root's cache is /run/abx-runtime, as the daemon's; another user's in its ABX_HOME.
      ...(process.getuid?.() === 0 ? {} : { cacheDir: join(abxHome(), 'runtime') }),
    });
    const made = await makeRuntimeImage(docker, runtime, reference, {
      push,
      version: info.version,
    });
    console.log(JSON.stringify(made));
  } catch (error) {
    const { status, body } = errorResponse(error);
    console.log(JSON.stringify({ ...body, status }));
    code = 1;
  } finally {
    close();
  }
  process.exit(code);
}
