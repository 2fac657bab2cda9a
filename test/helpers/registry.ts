import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** Debian's docker-registry (distribution 2.8): `apt-get install -y docker-registry`. */
export const REGISTRY_BINARY = '/usr/bin/docker-registry';

/** The user and password of a registry started with `auth: true`. */
export const REGISTRY_USER = { username: 'abx-test', password: 'abx-test-secret' };
// bcrypt (cost 4) of REGISTRY_USER.password, made once with glibc's crypt(3): the registry reads
// only bcrypt, and no bcrypt library is installed here.
const REGISTRY_HTPASSWD = 'abx-test:$2b$04$OCH7J8VgsJsQlbWl8VGeIeefZMqCWyh1/hkei6LMNBDvV43nrkwMS';

/** Why registry tests cannot run here, or undefined. */
export function registryUnavailable(): string | undefined {
  return existsSync(REGISTRY_BINARY)
    ? undefined
    : `${REGISTRY_BINARY} is not installed (apt-get install -y docker-registry, scripts/setup-system.sh)`;
}

/** A port nobody listens on at the moment (for a registry, or for one that is not there). */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** A registry of this test's own on 127.0.0.1 (the engine pushes to 127.0.0.0/8 over HTTP). */
export interface TestRegistry {
  /** `127.0.0.1:PORT`, as references name it. */
  address: string;
  /** The tags of `repository` the registry lists (none: an empty list). */
  tags(repository: string): Promise<string[]>;
  /** Whether the registry has a manifest for `repository:tag`. */
  hasManifest(repository: string, tag: string): Promise<boolean>;
  stop(): Promise<void>;
}

/**
 * Starts `docker-registry serve` with a config of its own (storage in a temp folder, loopback
 * only; with `auth`, htpasswd with {@link REGISTRY_USER} alone) and waits until `/v2/` answers.
 * `stop` ends it and removes its folder; call it in `afterAll`, it is safe to call twice.
 */
export async function startRegistry(options: { auth?: boolean } = {}): Promise<TestRegistry> {
  const dir = mkdtempSync(join(tmpdir(), 'abx-test-registry-'));
  const port = await freePort();
  const address = `127.0.0.1:${port}`;
  mkdirSync(join(dir, 'storage'));
  const config = [
    'version: 0.1',
    'log: { level: warn }',
    `storage: { filesystem: { rootdirectory: ${join(dir, 'storage')} }, delete: { enabled: true } }`,
    `http: { addr: "${address}", secret: abx-test }`,
    ...(options.auth
      ? [`auth: { htpasswd: { realm: abx-test, path: ${join(dir, 'htpasswd')} } }`]
      : []),
  ].join('\n');
  writeFileSync(join(dir, 'config.yml'), `${config}\n`);
  if (options.auth) writeFileSync(join(dir, 'htpasswd'), `${REGISTRY_HTPASSWD}\n`);
  let output = '';
  const child: ChildProcess = spawn(REGISTRY_BINARY, ['serve', join(dir, 'config.yml')], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout?.on('data', (chunk: Buffer) => {
    output = (output + chunk).slice(-4000);
  });
  child.stderr?.on('data', (chunk: Buffer) => {
    output = (output + chunk).slice(-4000);
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  let stopped = false;
  const stop = async () => {
    if (!stopped) {
      stopped = true;
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  const basic = `Basic ${Buffer.from(`${REGISTRY_USER.username}:${REGISTRY_USER.password}`).toString('base64')}`;
  const get = (path: string, method = 'GET') =>
    fetch(`http://${address}${path}`, {
      method,
      headers: {
        ...(options.auth ? { authorization: basic } : {}),
        accept: 'application/vnd.docker.distribution.manifest.v2+json',
      },
    });
  try {
    for (let tries = 0; ; tries++) {
      if (child.exitCode !== null) throw new Error(`docker-registry exited: ${output}`);
      const answered = await get('/v2/').then(
        (response) => response.status === 200,
        () => false,
      );
      if (answered) break;
      if (tries > 200) throw new Error(`docker-registry did not answer on ${address}: ${output}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  } catch (error) {
    await stop();
    throw error;
  }
  return {
    address,
    async tags(repository) {
      const response = await get(`/v2/${repository}/tags/list`);
      if (response.status === 404) return [];
      const body = (await response.json()) as { tags?: string[] | null };
      return body.tags ?? [];
    },
    async hasManifest(repository, tag) {
      return (await get(`/v2/${repository}/manifests/${tag}`, 'HEAD')).status === 200;
    },
    stop,
  };
}
