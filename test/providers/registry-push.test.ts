import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { InvalidArgumentError, PermissionDeniedError, UnavailableError } from '../../src/errors.js';
import { type DockerEngine, followProgress } from '../../src/providers/docker/engine-client.js';
import {
  parseImageReference,
  parseRegistryPrefix,
  repositoryComponent,
} from '../../src/providers/docker/image-reference.js';
import { pushError, pushImage, registryAuth } from '../../src/providers/docker/registry-push.js';
import { makeRuntimeImage, runtimeImageTag } from '../../src/providers/kubernetes/runtime-image.js';
import { type PortableRuntime, portableRuntime } from '../../src/providers/portable-runtime.js';
import { packageInfo } from '../../src/util/package-info.js';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { dockerEngine, ensureBusyboxImage } from '../helpers/docker-images.js';
import {
  freePort,
  REGISTRY_USER,
  registryUnavailable,
  startRegistry,
  type TestRegistry,
} from '../helpers/registry.js';

describe('image references', () => {
  test('registry, repository and tag as Docker reads them', () => {
    expect(parseImageReference('127.0.0.1:5000/abx-runtime:0.1.0-abc')).toEqual({
      registry: '127.0.0.1:5000',
      repository: '127.0.0.1:5000/abx-runtime',
      tag: '0.1.0-abc',
    });
    expect(parseImageReference('registry.example/team/abx')).toEqual({
      registry: 'registry.example',
      repository: 'registry.example/team/abx',
    });
    expect(parseImageReference('localhost/abx:1').registry).toBe('localhost');
    expect(parseImageReference('team/abx:1').registry).toBe('docker.io');
  });

  test.each([
    ['Registry.example/Abx:1', 'lower-case'],
    ['https://registry.example/abx', 'no scheme'],
    ['registry.example/abx@sha256:0123', 'digest'],
    ['registry.example/abx:-bad', 'a tag is'],
    ['registry.example/abx:', 'a tag is'],
    ['registry.example//abx', 'lower-case'],
    ['registry..example/abx', 'host[:port]'],
    ['registry.example:port/abx', 'host[:port]'],
    ['abx runtime', 'lower-case'],
  ])('%s is refused, saying what a reference looks like', (reference, why) => {
    let error: unknown;
    try {
      parseImageReference(reference);
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect((error as Error).message).toContain(JSON.stringify(reference));
    expect((error as Error).message).toContain(why);
    expect((error as Error).message).toContain('[REGISTRY[:PORT]/]REPOSITORY[:TAG]');
  });

  test('a registry prefix: host, port and path; no tag, scheme or digest', () => {
    expect(parseRegistryPrefix('127.0.0.1:5000')).toBe('127.0.0.1:5000');
    expect(parseRegistryPrefix('registry.example/sandboxes/')).toBe('registry.example/sandboxes');
    for (const bad of ['http://registry.example', 'registry.example/x:1', 'a b', '', 'Reg/X']) {
      expect(() => parseRegistryPrefix(bad)).toThrow(/REGISTRY\[:PORT\]\[\/PATH\]/);
    }
  });

  test('a template name as a repository component', () => {
    expect(repositoryComponent('My_Template.2')).toBe('my-template-2');
    expect(repositoryComponent('web')).toBe('web');
    expect(repositoryComponent('-._')).toBe('x');
  });

  test('the runtime tag is the version and the runtime hash: a new runtime is a new tag', () => {
    const runtime = { hash: 'f'.repeat(64) } as PortableRuntime;
    expect(runtimeImageTag(runtime, '0.1.0')).toBe('0.1.0-ffffffffffff');
    expect(runtimeImageTag(runtime, '1.0.0+build')).toBe('1.0.0_build-ffffffffffff');
  });
});

describe('registry credentials', () => {
  const dir = mkdtempSync(join(tmpdir(), 'abx-docker-config-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test('ABX_REGISTRY_USERNAME/PASSWORD first, else the auths of DOCKER_CONFIG/config.json', () => {
    const auth = (user: string) => Buffer.from(`${user}:pw:with:colons`).toString('base64');
    writeFileSync(
      join(dir, 'config.json'),
      JSON.stringify({
        auths: {
          'registry.example:5000': { auth: auth('alice') },
          'https://index.docker.io/v1/': { auth: auth('bob') },
          'https://token.example': { identitytoken: 'tok' },
        },
      }),
    );
    const env = { DOCKER_CONFIG: dir };
    expect(registryAuth('registry.example:5000', env)).toEqual({
      username: 'alice',
      password: 'pw:with:colons',
      serveraddress: 'registry.example:5000',
    });
    expect(registryAuth('docker.io', env)?.username).toBe('bob');
    expect(registryAuth('token.example', env)).toEqual({
      identitytoken: 'tok',
      serveraddress: 'token.example',
    });
    expect(registryAuth('other.example', env)).toBeUndefined();
    expect(
      registryAuth('other.example', {
        ...env,
        ABX_REGISTRY_USERNAME: 'carol',
        ABX_REGISTRY_PASSWORD: 'secret',
      }),
    ).toEqual({ username: 'carol', password: 'secret', serveraddress: 'other.example' });
    expect(registryAuth('registry.example:5000', { DOCKER_CONFIG: join(dir, 'none') })).toBe(
      undefined,
    );
  });

  test("the engine's push errors become errors naming the registry and what to do", () => {
    const refused = pushError(
      'unauthorized: authentication required',
      'r.example:5000/abx:1',
      '/var/run/docker.sock',
    );
    expect(refused).toBeInstanceOf(PermissionDeniedError);
    expect(refused.message).toMatch(
      /registry r\.example:5000 refused.*docker login r\.example:5000/,
    );
    const unreachable = pushError(
      'Get "http://r.example:5000/v2/": dial tcp 10.0.0.1:5000: connect: connection refused',
      'r.example:5000/abx:1',
      '/var/run/docker.sock',
    );
    expect(unreachable).toBeInstanceOf(UnavailableError);
    expect(unreachable.message).toMatch(/registry r\.example:5000 cannot be reached/);
  });
});

const engine = await dockerEngine();
const noRegistry = registryUnavailable();
const skipped = engine.docker ? noRegistry : engine.reason;

describe.skipIf(skipped)(
  `pushing to a real registry (docker-registry on loopback)${skipped ? `: skipped, ${skipped}` : ''}`,
  () => {
    const docker = engine.docker as DockerEngine;
    const scratch = mkdtempSync(join(tmpdir(), 'abx-registry-push-'));
    const registries: TestRegistry[] = [];
    const made = new Set<string>();
    let registry: TestRegistry;
    let runtime: PortableRuntime;
    const version = packageInfo().version;
    const hasImage = (reference: string) =>
      docker
        .getImage(reference)
        .inspect()
        .then(
          () => true,
          () => false,
        );

    beforeAll(async () => {
      ensureBuilt();
      registry = await startRegistry();
      registries.push(registry);
      runtime = await portableRuntime({
        runtimeDir: join(ROOT, 'dist', 'runtime'),
        cacheDir: join(scratch, 'runtime'),
      });
    }, 300_000);

    afterAll(async () => {
      for (const reference of made) {
        await docker
          .getImage(reference)
          .remove({ force: true })
          .catch(() => undefined);
      }
      for (const started of registries) await started.stop();
      rmSync(scratch, { recursive: true, force: true });
    });

    test('the runtime image is built, pushed, and pulled back from the registry', async () => {
      const pushed = await makeRuntimeImage(docker, runtime, `${registry.address}/abx-runtime`, {
        push: true,
        version,
      });
      made.add(pushed.reference);
      const tag = runtimeImageTag(runtime, version);
      expect(pushed).toMatchObject({
        reference: `${registry.address}/abx-runtime:${tag}`,
        pushed: true,
        runtimeHash: runtime.hash,
      });
      expect(pushed.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
      expect(await registry.tags('abx-runtime')).toEqual([tag]);
      expect(await registry.hasManifest('abx-runtime', tag)).toBe(true);

      // Gone from the engine, then pulled back: the registry holds the whole image.
      await docker.getImage(pushed.reference).remove({ force: true });
      expect(await hasImage(pushed.reference)).toBe(false);
      await followProgress(await docker.pull(pushed.reference));
      const image = await docker.getImage(pushed.reference).inspect();
      expect(image.RepoDigests).toContain(`${registry.address}/abx-runtime@${pushed.digest}`);
      // What the init container runs: node and envd at /opt/abx, from the pulled image.
      const container = await docker.createContainer({
        Image: pushed.reference,
        Cmd: ['/opt/abx/bin/node', '-e', ''],
      });
      try {
        const archive = await container.getArchive({ path: '/opt/abx/envd.cjs' });
        archive.resume();
        await new Promise((resolve) => archive.on('end', resolve));
      } finally {
        await container.remove({ force: true });
      }
    });

    test('abx kubernetes runtime-image --push --json prints the reference it pushed', async () => {
      const reference = `${registry.address}/team/abx-runtime:cli-test`;
      made.add(reference);
      const stdout = await new Promise<string>((resolve, reject) =>
        execFile(
          process.execPath,
          [
            join(ROOT, 'dist', 'cli.js'),
            'kubernetes',
            'runtime-image',
            reference,
            '--push',
            '--json',
          ],
          { env: { ...process.env, ABX_HOME: join(scratch, 'abx-home') }, timeout: 240_000 },
          (error, out, err) =>
            error ? reject(new Error(`${error.message}\n${err}`)) : resolve(out),
        ),
      );
      const printed = JSON.parse(stdout) as { reference: string; pushed: boolean };
      expect(printed).toMatchObject({ reference, pushed: true });
      expect(await registry.tags('team/abx-runtime')).toEqual(['cli-test']);
    }, 240_000);

    test('abx kubernetes runtime-image: a bad reference exits 2 (usage), a registry that does not answer 1, each saying why', async () => {
      const abx = (reference: string) =>
        new Promise<{ code: number | null; stderr: string }>((resolve) => {
          execFile(
            process.execPath,
            [join(ROOT, 'dist', 'cli.js'), 'kubernetes', 'runtime-image', reference, '--push'],
            { env: { ...process.env, ABX_HOME: join(scratch, 'abx-home') }, timeout: 240_000 },
            (error, _out, stderr) => resolve({ code: error ? (error.code as number) : 0, stderr }),
          );
        });
      const bad = await abx('Registry.example/ABX');
      expect(bad.code).toBe(2);
      expect(bad.stderr).toContain(
        'InvalidArgumentError: runtime image reference "Registry.example/ABX"',
      );
      const address = `127.0.0.1:${await freePort()}`;
      made.add(`${address}/abx-runtime:down`);
      const down = await abx(`${address}/abx-runtime:down`);
      expect(down.code).toBe(1);
      expect(down.stderr).toContain(
        `UnavailableError: cannot push ${address}/abx-runtime:down: the registry ${address} cannot be reached`,
      );
      expect(await hasImage(`${address}/abx-runtime:down`)).toBe(false);
    }, 240_000);

    test('a registry that does not answer: an error naming it, and no image left behind', async () => {
      const address = `127.0.0.1:${await freePort()}`;
      const reference = `${address}/abx-runtime:unreachable`;
      made.add(reference);
      const failed = await makeRuntimeImage(docker, runtime, reference, {
        push: true,
        version,
      }).then(
        () => undefined,
        (error: unknown) => error,
      );
      expect(failed).toBeInstanceOf(UnavailableError);
      expect((failed as Error).message).toContain(`registry ${address} cannot be reached`);
      expect(await hasImage(reference)).toBe(false);
    });

    test('a reference that is not valid is refused before anything is built', async () => {
      await expect(
        makeRuntimeImage(docker, runtime, `${registry.address}/ABX:1`, { push: true, version }),
      ).rejects.toThrow(InvalidArgumentError);
    });

    test('a registry that refuses the push: an error saying how to log in; with credentials it goes', async () => {
      const locked = await startRegistry({ auth: true });
      registries.push(locked);
      const source = await ensureBusyboxImage(docker);
      const reference = `${locked.address}/locked/busybox:1`;
      made.add(reference);
      const refused = await pushImage(docker, source, reference, {}).then(
        () => undefined,
        (error: unknown) => error,
      );
      expect(refused).toBeInstanceOf(PermissionDeniedError);
      expect((refused as Error).message).toContain(`registry ${locked.address} refused`);
      expect((refused as Error).message).toContain(`docker login ${locked.address}`);
      // The tag made for the push is gone again; the source image stays.
      expect(await hasImage(reference)).toBe(false);
      expect(await hasImage(source)).toBe(true);

      const pushed = await pushImage(docker, source, reference, {
        auth: { ...REGISTRY_USER, serveraddress: locked.address },
      });
      expect(pushed.reference).toBe(reference);
      expect(await locked.tags('locked/busybox')).toEqual(['1']);
    });
  },
);
