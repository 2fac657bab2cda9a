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
  if (name === 'kubernetes') return kubernetesProvider();
  if (name !== 'docker') {
    throw new Error(
      `ABX_PROVIDER is '${name}'; the providers are 'local', 'docker' and 'kubernetes'`,
    );
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

/**
 * `kubernetes`: pods in the cluster of `KUBECONFIG` (or `~/.kube/config`, or the daemon's own
 * service account in a pod), in `ABX_KUBE_NAMESPACE`; `ABX_KUBE_RUNTIME_IMAGE` is the init
 * container's image (the portable runtime), `ABX_KUBE_BASE_IMAGE` the image of templates without
 * one (`ABX_KUBE_IMAGE_REGISTRY`, where built image templates are pushed, goes to the daemon),
 * `ABX_KUBE_AGENT_SANDBOX` (auto, true, false, claims) whether sandboxes are agent-sandbox Sandboxes, or
 * SandboxClaims on a SandboxWarmPool per template (`ABX_WARM_POOL` its replicas, default 1). A daemon refuses to start when the API server does not answer.
 */
async function kubernetesProvider() {
  const { KubernetesProvider } = await import('../providers/kubernetes/kubernetes-provider.js');
  const { checkCluster } = await import('../providers/kubernetes/cluster-check.js');
  const env = process.env;
  const crds = env.ABX_KUBE_AGENT_SANDBOX || 'auto';
  if (!['auto', 'true', 'false', 'claims'].includes(crds)) {
    throw new Error(
      `ABX_KUBE_AGENT_SANDBOX is '${crds}'; use auto (the default), true, false or claims`,
    );
  }
  const replicas = env.ABX_WARM_POOL ? Number(env.ABX_WARM_POOL) : undefined;
  const home = env.ABX_KUBE_HOME || 'emptydir';
  if (!['emptydir', 'pvc'].includes(home)) {
    throw new Error(`ABX_KUBE_HOME is '${home}'; use emptydir (the default) or pvc`);
  }
  if (home === 'pvc' && crds === 'claims') {
    throw new Error(
      "ABX_KUBE_HOME=pvc (--kube-home pvc) needs sandboxes of their own: a warm pool's pods (--kube-agent-sandbox claims) share their template's; use --kube-agent-sandbox auto, true or false",
    );
  }
  const accessMode = env.ABX_KUBE_VOLUME_ACCESS_MODE || 'ReadWriteMany';
  if (accessMode !== 'ReadWriteMany' && accessMode !== 'ReadWriteOnce') {
    throw new Error(
      `ABX_KUBE_VOLUME_ACCESS_MODE is '${accessMode}'; use ReadWriteMany (the default) or ReadWriteOnce`,
    );
  }
  const provider = new KubernetesProvider({
    agentSandbox: crds === 'auto' || crds === 'claims' ? crds : crds === 'true',
    ...(crds === 'claims' && replicas !== undefined && Number.isInteger(replicas) && replicas >= 0
      ? { warmPoolReplicas: replicas }
      : {}),
    ...(env.ABX_KUBE_NAMESPACE ? { namespace: env.ABX_KUBE_NAMESPACE } : {}),
    ...(env.ABX_KUBE_CONTEXT ? { context: env.ABX_KUBE_CONTEXT } : {}),
    ...(env.ABX_KUBE_RUNTIME_IMAGE ? { runtimeImage: env.ABX_KUBE_RUNTIME_IMAGE } : {}),
    ...(env.ABX_KUBE_BASE_IMAGE ? { baseImage: env.ABX_KUBE_BASE_IMAGE } : {}),
    home: home === 'pvc' ? 'pvc' : 'emptyDir',
    ...(env.ABX_KUBE_HOME_STORAGE_CLASS
      ? { homeStorageClass: env.ABX_KUBE_HOME_STORAGE_CLASS }
      : {}),
    ...(env.ABX_KUBE_VOLUME_STORAGE_CLASS
      ? { volumeStorageClass: env.ABX_KUBE_VOLUME_STORAGE_CLASS }
      : {}),
    volumeAccessMode: accessMode,
  });
  const report = await checkCluster(provider, crds);
  if (!report.reachable) {
    await provider.close();
    throw new Error(report.problems.join('; '));
  }
  // Sandbox metrics where the cluster serves the resource metrics API (metrics-server).
  if (report.metricsApi) provider.useMetricsApi();
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

/**
 * `ABX_DOCTOR=kubernetes` (what `abx doctor --provider kubernetes` runs): checks the cluster the
 * provider would use, prints the report as one JSON line and exits 1 when it has problems.
 */
async function doctor(): Promise<never> {
  const { KubernetesProvider } = await import('../providers/kubernetes/kubernetes-provider.js');
  const { checkCluster } = await import('../providers/kubernetes/cluster-check.js');
  const env = process.env;
  const provider = new KubernetesProvider({
    ...(env.ABX_KUBE_NAMESPACE ? { namespace: env.ABX_KUBE_NAMESPACE } : {}),
    ...(env.ABX_KUBE_CONTEXT ? { context: env.ABX_KUBE_CONTEXT } : {}),
    watch: false,
  });
  const report = await checkCluster(provider, env.ABX_KUBE_AGENT_SANDBOX);
  await provider.close();
  console.log(JSON.stringify(report));
  process.exit(report.problems.length > 0 ? 1 : 0);
}

if (process.env.ABX_DOCTOR) {
  await doctor().catch((error: Error) => {
    console.log(
      JSON.stringify({
        reachable: false,
        permissions: [],
        agentSandbox: [],
        metricsApi: false,
        problems: [error.message],
      }),
    );
    process.exit(1);
  });
}

if (process.env.ABX_RUNTIME_IMAGE) {
  const { runtimeImageJob } = await import('./runtime-image-job.js');
  await runtimeImageJob(process.env.ABX_RUNTIME_IMAGE, process.env.ABX_RUNTIME_IMAGE_PUSH === '1');
}

if (process.env.ABX_KUBE_IMAGE_REGISTRY && process.env.ABX_PROVIDER !== 'kubernetes') {
  console.error(
    `abx daemon: --kube-image-registry (ABX_KUBE_IMAGE_REGISTRY) pushes image templates for a cluster; it needs --provider kubernetes, not '${process.env.ABX_PROVIDER || 'local'}'`,
  );
  process.exit(1);
}
const warmPool = wholeNumber('ABX_WARM_POOL', 0);
const database = databaseUrl();
const startConcurrency = wholeNumber('ABX_START_CONCURRENCY', 1);
const provider = await chooseProvider().catch((error: Error) => {
  console.error(`abx daemon: ${error.message}`);
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
  console.error(`abx daemon: ${error.message}`);
  process.exit(1);
}
const listen = await remoteListen().catch(fail);
// The loopback ports: ABX_API_PORT / ABX_GATEWAY_PORT (--api-port, --gateway-port), else the ones
// kept in $ABX_HOME/ports.json, else free ones chosen now and kept (src/installation/daemon-ports.ts).
const { keepPorts, planPorts, portInUseMessage } = await import('../installation/daemon-ports.js');
const { abxPaths } = await import('../installation/paths.js');
const portsFile = abxPaths(abxHome()).ports;
let ports: ReturnType<typeof planPorts>;
try {
  ports = planPorts(portsFile);
} catch (error) {
  fail(error as Error);
}
let daemon: InstanceType<typeof Daemon>;
try {
  daemon = new Daemon({
    home: abxHome(),
    apiPort: ports.api.ports,
    gatewayPort: ports.gateway.ports,
    ...(process.env.ABX_DASHBOARD === '0' ? { dashboard: false } : {}),
    ...(process.env.ABX_DOMAIN ? { domain: process.env.ABX_DOMAIN } : {}),
    // The most sandboxes kept started per template (the pool follows demand up to it); 0: none.
    ...(warmPool === undefined ? {} : { warmPool }),
    ...(startConcurrency === undefined ? {} : { startConcurrency }),
    ...(provider ? { provider } : {}),
    ...(listen ? { listen } : {}),
    ...(database ? { databaseUrl: database } : {}),
    // Where built image templates are pushed for the cluster to pull (kubernetes provider).
    ...(process.env.ABX_KUBE_IMAGE_REGISTRY
      ? { imageRegistry: process.env.ABX_KUBE_IMAGE_REGISTRY }
      : {}),
  });
} catch (error) {
  fail(error as Error);
}
for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.on(signal, () => void daemon.stop());
}
const info = await daemon.start().catch(async (error: Error) => {
  await daemon.stop().catch(() => undefined);
  const { PortInUseError } = await import('./daemon.js');
  if (error instanceof PortInUseError) {
    return fail(
      new Error(portInUseMessage(error.listener, ports[error.listener], error.port, portsFile)),
    );
  }
  return fail(error);
});
try {
  keepPorts(portsFile, ports, {
    api: Number(new URL(info.apiUrl).port),
    gateway: Number(new URL(info.gatewayUrl).port),
  });
} catch (error) {
  console.error(
    `warning: the daemon's ports were not kept in ${portsFile} (${(error as Error).message}): the next start may choose others`,
  );
}
console.log(JSON.stringify({ event: 'listening', ...info }));
await daemon.stopped;
console.log(JSON.stringify({ event: 'stopped', pid: process.pid }));
// Work still in flight when the daemon stops (a template build's streams to its build sandbox)
// does not keep the process alive: such a build is recorded as stopped, and the next daemon
// removes its sandbox (the orphan sweep). One second lets what is closing finish.
setTimeout(() => process.exit(0), 1000).unref();
