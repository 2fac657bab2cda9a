// `--only images` (bench/README.md).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox, Template, Templates } from 'abx-sandbox';
import { log, ms, ROOT, results, row, scale } from '../runner.js';
import { round, type Summary, summarize } from '../stats.js';

/** True when a Docker engine answers on the default socket (images need one). */
function dockerAnswers(): boolean {
  return spawnSync('docker', ['info'], { stdio: 'ignore', timeout: 10_000 }).status === 0;
}

/** The first of these images the engine has, to build image templates from (no registry here). */
function localImage(): string | undefined {
  const wanted = process.env.ABX_BENCH_IMAGE
    ? [process.env.ABX_BENCH_IMAGE]
    : ['abx-test/debian:12', 'debian:bookworm-slim', 'debian:12-slim', 'python:3.12-slim'];
  return wanted.find(
    (image) => spawnSync('docker', ['image', 'inspect', image], { stdio: 'ignore' }).status === 0,
  );
}

/**
 * Images (issue 15): an image template's build time, and create → first command for a sandbox
 * of it on the local provider (overlay) and on the docker provider, beside the local provider's
 * host-system sandbox measured the same way in the same run.
 */
export async function images(baseTemplate: string) {
  if (!dockerAnswers()) {
    row('9 images', 'skipped', '—', 'no Docker engine answers');
    return;
  }
  const image = localImage();
  if (!image) {
    row('9 images', 'skipped', '—', 'no local image: set ABX_BENCH_IMAGE (e.g. after docker pull)');
    return;
  }
  log(`images from ${image}`);
  const tpl = Template.fromImage(image).runCmd('echo built > /etc/abx-bench');
  const t0 = performance.now();
  await Templates.build(tpl, { name: 'bench-image' });
  const buildMs = performance.now() - t0;
  const firstCommand = async (template: string, home?: string) => {
    const samples: number[] = [];
    for (let i = 0; i < scale(15, 5); i++) {
      const t = performance.now();
      const box = await Sandbox.create({ template, ...(home ? { home } : {}) });
      await box.commands.run('true');
      samples.push(performance.now() - t);
      await box.kill();
    }
    return summarize(samples);
  };
  const host = await firstCommand(baseTemplate);
  const localImageRun = await firstCommand('bench-image');
  // The docker provider: a second installation whose daemon the SDK starts with ABX_PROVIDER.
  const dockerHome = mkdtempSync(join(tmpdir(), 'abx-bench-docker-'));
  let docker: Summary | undefined;
  let dockerBuildMs = Number.NaN;
  try {
    process.env.ABX_PROVIDER = 'docker';
    process.env.ABX_DOCKER_BASE_IMAGE = image;
    const t1 = performance.now();
    await Templates.build(tpl, { name: 'bench-image', home: dockerHome });
    dockerBuildMs = performance.now() - t1;
    docker = await firstCommand('bench-image', dockerHome);
    await Templates.remove('bench-image', { home: dockerHome });
  } finally {
    delete process.env.ABX_PROVIDER;
    delete process.env.ABX_DOCKER_BASE_IMAGE;
    spawnSync(process.execPath, [join(ROOT, 'dist', 'cli.js'), 'daemon', 'stop'], {
      env: { ...process.env, ABX_HOME: dockerHome },
    });
    rmSync(dockerHome, { recursive: true, force: true });
  }
  await Templates.remove('bench-image');
  results.images = {
    image,
    buildMs: { local: round(buildMs, 0), docker: round(dockerBuildMs, 0) },
    createToFirstCommand: { hostSystem: host, localImage: localImageRun, docker },
  };
  row(
    '9 images',
    `image template build (${image} + 1 step)`,
    `local ${round(buildMs, 0)} ms · docker ${round(dockerBuildMs, 0)} ms`,
    'a build: prepare the image (user added), one root step, commit',
  );
  const ratio = (s?: Summary) => (s ? `${round(s.p50 / host.p50, 2)}×` : '—');
  row('9 images', 'create → first command, host system (local)', ms(host), 'baseline');
  row(
    '9 images',
    'create → first command, image (local, overlay)',
    ms(localImageRun),
    `${ratio(localImageRun)} the baseline; the first sandbox of an image exports its file system (the p99)`,
  );
  if (docker)
    row(
      '9 images',
      'create → first command, image (docker)',
      ms(docker),
      `${ratio(docker)} the baseline`,
    );
}
