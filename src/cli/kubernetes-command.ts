import { join } from 'node:path';
import type { Command } from 'commander';
import { abxHome } from '../installation/paths.js';
import { packageInfo } from '../util/package-info.js';
import { withSpinner } from './feedback.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';

/**
 * `abx kubernetes runtime-image`: the init container's image (the portable runtime at /opt/abx)
 * built on the Docker engine of this host (`DOCKER_HOST`) and pushed to the cluster's registry.
 * The provider modules are loaded only here: the rest of the CLI does not need dockerode.
 */
export function addKubernetesCommand(program: Command): void {
  const kubernetes = withExamples(
    program
      .command('kubernetes')
      .description('Images a Kubernetes cluster needs to run sandboxes (docs/providers.md).'),
    'abx kubernetes runtime-image registry.example:5000/abx-runtime --push',
  );

  withExamples(
    kubernetes
      .command('runtime-image <repository>')
      .description(
        "Build the runtime image (Node and envd at /opt/abx, for the pods' init container) on this host's Docker engine; print the reference to give as --kube-runtime-image. Without a :TAG the tag is the version and the runtime's content hash.",
      )
      .option(
        '--push',
        'push it to its registry (credentials: docker login, or ABX_REGISTRY_USERNAME/ABX_REGISTRY_PASSWORD)',
      )
      .option('--json', 'print {reference, digest, pushed, runtimeHash} as JSON')
      .action(async (repository: string, options: { push?: boolean; json?: boolean }) => {
        const { parseImageReference } = await import('../providers/docker/image-reference.js');
        // A bad reference is refused before the runtime (~100 MB) is assembled.
        parseImageReference(repository, 'runtime image reference');
        const { dockerClient } = await import('../providers/docker/engine.js');
        const { portableRuntime } = await import('../providers/portable-runtime.js');
        const { makeRuntimeImage } = await import('../providers/kubernetes/runtime-image.js');
        const info = packageInfo();
        const { docker, close } = dockerClient();
        try {
          const made = await withSpinner(
            options.push ? `building and pushing ${repository}` : `building ${repository}`,
            async () => {
              const runtime = await portableRuntime({
                runtimeDir: join(info.root, 'dist', 'runtime'),
                // Root's cache is /run/abx-runtime, as the daemon's; another user's in ABX_HOME.
                ...(process.getuid?.() === 0 ? {} : { cacheDir: join(abxHome(), 'runtime') }),
              });
              return makeRuntimeImage(docker, runtime, repository, {
                push: options.push === true,
                version: info.version,
              });
            },
          );
          if (options.json) return printJson(made);
          printLine(made.reference);
          process.stderr.write(
            made.pushed
              ? `pushed${made.digest ? ` (${made.digest})` : ''}; start the daemon with --kube-runtime-image ${made.reference}\n`
              : `built on the local engine only; push it with --push (or docker push ${made.reference})\n`,
          );
        } finally {
          close();
        }
      }),
    'abx kubernetes runtime-image registry.example:5000/abx-runtime --push',
    'abx kubernetes runtime-image registry.example/team/abx-runtime:v1 --push --json',
    'abx kubernetes runtime-image abx-runtime  # build only, on the local engine',
  );
}
