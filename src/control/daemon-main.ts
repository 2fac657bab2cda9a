import 'reflect-metadata';

// `node dist/daemon.js`: the daemon in the foreground. `abx daemon start` and the SDK start it
// detached with its output in $ABX_HOME/daemon.log. Imported after the polyfill on purpose.
const { Daemon } = await import('./daemon.js');
const { abxHome } = await import('../installation/paths.js');

/**
 * The provider `ABX_PROVIDER` names (`abx daemon start --provider`): `local` (the default,
 * bubblewrap) or `docker` (a Docker engine of this host; `ABX_DOCKER_BASE_IMAGE` is the image of
 * templates without one). A docker daemon refuses to start without an engine that answers.
 */
async function chooseProvider() {
  const name = process.env.ABX_PROVIDER || 'local';
  if (name === 'local') return undefined;
  if (name !== 'docker') {
    throw new Error(`ABX_PROVIDER is '${name}'; the providers are 'local' and 'docker'`);
  }
  const { join } = await import('node:path');
  const { packageInfo } = await import('../util/package-info.js');
  const { DockerProvider } = await import('../providers/docker/docker-provider.js');
  const provider = new DockerProvider({
    runtimeDir: join(packageInfo().root, 'dist', 'runtime'),
    // Root's cache is /run/abx-runtime; another user keeps it in its installation.
    ...(process.getuid?.() === 0 ? {} : { runtimeCacheDir: join(abxHome(), 'runtime') }),
    ...(process.env.ABX_DOCKER_BASE_IMAGE ? { baseImage: process.env.ABX_DOCKER_BASE_IMAGE } : {}),
  });
  await provider.engine();
  return provider;
}

/** A whole number ≥ `least` from the environment variable `name`, or undefined when unset. */
function wholeNumber(name: string, least: number): number | undefined {
  const text = process.env[name];
  if (!text) return undefined;
  const value = Number(text);
  if (!Number.isInteger(value) || value < least) {
    console.error(`abx daemon: ${name} must be a whole number ≥ ${least}, not '${text}'`);
    process.exit(1);
  }
  return value;
}

/**
 * `ABX_DATABASE_URL` (`abx daemon start --database-url`): the registry in PostgreSQL, shared with
 * the daemons given the same URL; unset: SQLite in the installation.
 */
function databaseUrl(): string | undefined {
  const url = process.env.ABX_DATABASE_URL;
  if (!url) return undefined;
  if (!/^postgres(ql)?:\/\//.test(url)) {
    console.error(
      `abx daemon: ABX_DATABASE_URL must be a postgres://user:password@host:port/database URL, not '${url.replace(/:[^:@/]*@/, ':***@')}'`,
    );
    process.exit(1);
  }
  return url;
}

const warmPool = wholeNumber('ABX_WARM_POOL', 0);
const database = databaseUrl();
const startConcurrency = wholeNumber('ABX_START_CONCURRENCY', 1);
const provider = await chooseProvider().catch((error: Error) => {
  console.error(`abx daemon: ${error.name}: ${error.message}`);
  process.exit(1);
});
const daemon = new Daemon({
  home: abxHome(),
  ...(process.env.ABX_API_PORT ? { apiPort: Number(process.env.ABX_API_PORT) } : {}),
  ...(process.env.ABX_GATEWAY_PORT ? { gatewayPort: Number(process.env.ABX_GATEWAY_PORT) } : {}),
  ...(process.env.ABX_DOMAIN ? { domain: process.env.ABX_DOMAIN } : {}),
  // The most sandboxes kept started per template (the pool follows demand up to it); 0: none.
  ...(warmPool === undefined ? {} : { warmPool }),
  ...(startConcurrency === undefined ? {} : { startConcurrency }),
  ...(provider ? { provider } : {}),
  ...(database ? { databaseUrl: database } : {}),
});
for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.on(signal, () => void daemon.stop());
}
const info = await daemon.start().catch(async (error: Error) => {
  console.error(`abx daemon: ${error.message}`);
  await daemon.stop().catch(() => undefined);
  process.exit(1);
});
console.log(JSON.stringify({ event: 'listening', ...info }));
await daemon.stopped;
console.log(JSON.stringify({ event: 'stopped', pid: process.pid }));
