import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox, Templates } from '../../src/index.js';
import { createAbxHome, removeTemplates } from '../helpers/abx-home.js';
import { dockerEngine, ensureDebianImage } from '../helpers/docker-images.js';
import { readmeBlock } from '../helpers/readme.js';
import { userProject } from '../helpers/user-project.js';

// The README's image example ("Need packages?"), taken from README.md, run as a user would: one
// file of a project, compiled with the README's tsconfig, against the default provider (local,
// a root daemon) with a Docker engine for the build. No registry is reachable here, so the base
// image the example names is this machine's debootstrapped Debian under that name when the engine
// does not have it already (and the name is removed again afterwards).
const engine = process.getuid?.() === 0 ? await dockerEngine() : { reason: 'not root' };
const block = readmeBlock('ts', 'Need packages?');
const baseImage = /Template\.fromImage\('([^']+)'\)/.exec(block.code)?.[1];

if (!('docker' in engine) || !engine.docker) {
  describe.skip(`the README's image example: skipped, ${engine.reason}`, () => {
    test('image example', () => undefined);
  });
} else {
  const docker = engine.docker;
  let abx: Awaited<ReturnType<typeof createAbxHome>>;
  let project: ReturnType<typeof userProject>;
  let taggedBase = false;

  beforeAll(async () => {
    expect(baseImage).toBeDefined();
    const image = docker.getImage(baseImage as string);
    if (
      !(await image.inspect().then(
        () => true,
        () => false,
      ))
    ) {
      const [repo, tag] = (baseImage as string).split(':') as [string, string];
      await docker.getImage(await ensureDebianImage(docker)).tag({ repo, tag });
      taggedBase = true;
    }
    abx = await createAbxHome();
    const tsconfig = JSON.parse(
      readmeBlock('json', 'Use it in your project', 'compilerOptions').code,
    ) as {
      compilerOptions: Record<string, unknown>;
    };
    project = userProject(tsconfig.compilerOptions, abx.home);
    mkdirSync(join(project.dir, 'data'));
    writeFileSync(join(project.dir, 'data', 'cities.csv'), 'city,people\nOslo,3\n');
    project.addScript('image', block.code);
    project.compile();
  }, 900_000);

  afterAll(async () => {
    await removeTemplates(abx?.home);
    await abx?.close();
    project?.remove();
    if (taggedBase) await docker.getImage(baseImage as string).remove({ noprune: true });
  });

  test('the image example: apt package, the copied folder in the home, the env, a snapshot; nothing left running', async () => {
    const result = project.run('image');
    expect(result.stderr).toBe('');
    expect(result.status).toBe(0);
    expect(result.stdout).toMatch(/^jq-\d[\d.]*\ncities\.csv\nmode: batch\n/);
    const names = (await Templates.list({ home: abx.home })).map((t) => t.name);
    expect(names).toEqual(expect.arrayContaining(['data-tools-image', 'data-tools-warm']));
    expect(await Sandbox.list({ home: abx.home, autoStart: false })).toEqual([]);
  }, 900_000);
}
