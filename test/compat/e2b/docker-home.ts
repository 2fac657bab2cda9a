import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startDaemon } from '../../../src/installation/daemon-connection.js';
import type { DaemonInfo } from '../../../src/installation/daemon-info.js';
import { sandboxesDirHash } from '../../../src/providers/docker/container-config.js';
import type { DockerEngine } from '../../../src/providers/docker/engine-client.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { DEBIAN_IMAGE, ensureDebianImage } from '../../helpers/docker-images.js';

/** A private installation whose daemon runs sandboxes as Docker containers of a Debian image. */
export interface DockerHome {
  home: string;
  info: DaemonInfo;
  /** The daemon's own (admin) key. */
  apiKey: string;
  /** Kills its sandboxes, stops the daemon, removes the folder and restores the environment. */
  close(): Promise<void>;
}

/** The E2B Docker tests' installation: the daemon inherits the provider's settings from the environment. */
export async function dockerHome(docker: DockerEngine): Promise<DockerHome> {
  await ensureDebianImage(docker);
  process.env.ABX_PROVIDER = 'docker';
  process.env.ABX_DOCKER_BASE_IMAGE = DEBIAN_IMAGE;
  process.env.ABX_WARM_POOL = '0';
  const abx = await createAbxHome();
  const info = await startDaemon(abx.home);
  return {
    home: abx.home,
    info,
    apiKey: readFileSync(join(abx.home, 'api-key'), 'utf8').trim(),
    async close() {
      try {
        await abx.close();
      } finally {
        // Containers outlive a daemon that died (a failed restart): the engine still has them.
        const left = await docker
          .listContainers({
            all: true,
            filters: {
              label: [`abx.sandboxes-dir=${sandboxesDirHash(join(abx.home, 'sandboxes'))}`],
            },
          })
          .catch(() => []);
        for (const container of left) {
          await docker
            .getContainer(container.Id)
            .remove({ force: true })
            .catch(() => {});
        }
        delete process.env.ABX_PROVIDER;
        delete process.env.ABX_DOCKER_BASE_IMAGE;
        delete process.env.ABX_WARM_POOL;
      }
    },
  };
}
