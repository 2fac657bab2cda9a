import { spawn } from 'node:child_process';
import { join } from 'node:path';
import type { Command } from 'commander';
import { errorFromBody } from '../../runtime/protocol/errors.js';
import { packageInfo } from '../util/package-info.js';
import { withSpinner } from './feedback.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';

/** What the daemon program's runtime image job prints (src/control/runtime-image-job.ts). */
interface RuntimeImageResult {
  reference: string;
  digest?: string;
  pushed: boolean;
  runtimeHash: string;
}

/** Runs the job in the daemon's program (which holds the providers) and returns its JSON line. */
function runtimeImageJob(repository: string, push: boolean): Promise<RuntimeImageResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(packageInfo().root, 'dist', 'daemon.js')], {
      env: {
        ...process.env,
        ABX_RUNTIME_IMAGE: repository,
        ...(push ? { ABX_RUNTIME_IMAGE_PUSH: '1' } : {}),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => {
      stdout += chunk;
    });
    child.stderr.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk).slice(-2000);
    });
    child.on('error', reject);
    child.on('close', () => {
      let result: Record<string, unknown>;
      try {
        result = JSON.parse(stdout.trim().split('\n').pop() ?? '');
      } catch {
        return reject(new Error(`the runtime image job printed no result: ${stderr || stdout}`));
      }
      if (typeof result.error === 'string') {
        return reject(errorFromBody(Number(result.status) || 500, result));
      }
      resolve(result as unknown as RuntimeImageResult);
    });
  });
}

/**
 * `abx kubernetes runtime-image`: the init container's image (the portable runtime at /opt/abx)
 * built on the Docker engine of this host (`DOCKER_HOST`) and pushed to the cluster's registry.
 * The work runs in the daemon's program, as `abx doctor`'s: the CLI does not load providers.
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
        const made = await withSpinner(
          options.push ? `building and pushing ${repository}` : `building ${repository}`,
          () => runtimeImageJob(repository, options.push === true),
        );
        if (options.json) return printJson(made);
        printLine(made.reference);
        process.stderr.write(
          made.pushed
            ? `pushed${made.digest ? ` (${made.digest})` : ''}; start the daemon with --kube-runtime-image ${made.reference}\n`
            : `built on the local engine only; push it with --push (or docker push ${made.reference})\n`,
        );
      }),
    'abx kubernetes runtime-image registry.example:5000/abx-runtime --push',
    'abx kubernetes runtime-image registry.example/team/abx-runtime:v1 --push --json',
    'abx kubernetes runtime-image abx-runtime  # build only, on the local engine',
  );
}
