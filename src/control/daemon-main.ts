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

const warmPool = wholeNumber('ABX_WARM_POOL', 0);
const startConcurrency = wholeNumber('ABX_START_CONCURRENCY', 1);
const provider = await chooseProvider().catch((error: Error) => {
  console.error(`abx daemon: ${error.name}: ${error.message}`);
  process.exit(1);
});
/**
 * Remote serving from the environment (`abx daemon start --listen ...` sets these): the API and
 * gateway addresses, TLS files, plain HTTP beyond loopback, the gateway's public origin.
 */
async function remoteListen() {
  const listen = process.env.ABX_LISTEN;
  if (!listen) {
    const stray = ['ABX_GATEWAY_LISTEN', 'ABX_TLS_CERT', 'ABX_TLS_KEY', 'ABX_PUBLIC_URL'].find(
      (name) => process.env[name],
    );
    if (stray) throw new Error(`${stray} is set but ABX_LISTEN (--listen HOST:PORT) is not`);
    return undefined;
  }
  const { parseListenAddress, readPem } = await import('../installation/public-listen.js');
  const cert = process.env.ABX_TLS_CERT;
  const key = process.env.ABX_TLS_KEY;
  if (Boolean(cert) !== Boolean(key)) {
    throw new Error('give both --tls-cert and --tls-key (ABX_TLS_CERT, ABX_TLS_KEY), or neither');
  }
  const gateway = process.env.ABX_GATEWAY_LISTEN;
  return {
    api: parseListenAddress(listen, '--listen'),
    ...(gateway ? { gateway: parseListenAddress(gateway, '--gateway-listen') } : {}),
    ...(cert && key
      ? {
          tls: {
            cert: readPem(cert, '--tls-cert', 'CERTIFICATE'),
            key: readPem(key, '--tls-key', 'PRIVATE KEY'),
          },
        }
      : {}),
    insecure: /^(1|true|yes)$/i.test(process.env.ABX_INSECURE ?? ''),
    ...(process.env.ABX_PUBLIC_URL ? { publicUrl: process.env.ABX_PUBLIC_URL } : {}),
  };
}

function fail(error: Error): never {
  console.error(`abx daemon: ${error.name}: ${error.message}`);
  process.exit(1);
}
const listen = await remoteListen().catch(fail);
let daemon: InstanceType<typeof Daemon>;
try {
  daemon = new Daemon({
    home: abxHome(),
    ...(process.env.ABX_API_PORT ? { apiPort: Number(process.env.ABX_API_PORT) } : {}),
    ...(process.env.ABX_GATEWAY_PORT ? { gatewayPort: Number(process.env.ABX_GATEWAY_PORT) } : {}),
    ...(process.env.ABX_DOMAIN ? { domain: process.env.ABX_DOMAIN } : {}),
    // The most sandboxes kept started per template (the pool follows demand up to it); 0: none.
    ...(warmPool === undefined ? {} : { warmPool }),
    ...(startConcurrency === undefined ? {} : { startConcurrency }),
    ...(provider ? { provider } : {}),
    ...(listen ? { listen } : {}),
  });
} catch (error) {
  fail(error as Error);
}
for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.on(signal, () => void daemon.stop());
}
const info = await daemon.start().catch(async (error: Error) => {
  await daemon.stop().catch(() => undefined);
  return fail(error);
});
console.log(JSON.stringify({ event: 'listening', ...info }));
await daemon.stopped;
console.log(JSON.stringify({ event: 'stopped', pid: process.pid }));
