import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { type Command, Option } from 'commander';
import { findDaemon, startDaemon, stopDaemon } from '../installation/daemon-connection.js';
import type { DaemonInfo } from '../installation/daemon-info.js';
import { PORT_SETTINGS, parsePort } from '../installation/daemon-ports.js';
import { abxHome, abxPaths } from '../installation/paths.js';
import {
  checkPublicListen,
  parseListenAddress,
  readPem,
  sandboxUrl,
} from '../installation/public-listen.js';
import { ExitCode, UsageError } from './errors.js';
import { withSpinner } from './feedback.js';
import { withExamples } from './options.js';
import { printJson, printLine } from './output.js';

interface DaemonStartOptions {
  /** false with --no-dashboard. */
  dashboard?: boolean;
  json?: boolean;
  provider?: string;
  dockerBaseImage?: string;
  kubeNamespace?: string;
  kubeRuntimeImage?: string;
  kubeBaseImage?: string;
  kubeImageRegistry?: string;
  kubeAgentSandbox?: string;
  kubeHome?: string;
  kubeHomeStorageClass?: string;
  kubeVolumeStorageClass?: string;
  kubeVolumeAccessMode?: string;
  databaseUrl?: string;
  listen?: string;
  gatewayListen?: string;
  tlsCert?: string;
  tlsKey?: string;
  domain?: string;
  publicUrl?: string;
  insecure?: boolean;
  egressNetns?: string;
  egressUserns?: string;
  egressHosts?: string;
  egressPermit?: string;
  apiPort?: string;
  gatewayPort?: string;
}

/** The egress options (docs/network.md) as the daemon process reads them: absolute paths. */
const EGRESS_FLAGS = [
  ['egressNetns', 'ABX_EGRESS_NETNS', true],
  ['egressUserns', 'ABX_EGRESS_USERNS', true],
  ['egressHosts', 'ABX_EGRESS_HOSTS', true],
  ['egressPermit', 'ABX_EGRESS_PERMIT', false],
] as const;

/**
 * Checks the remote-serving options here, so a mistake is a usage error at once rather than a
 * daemon that fails in the background, and gives the environment the daemon reads them from.
 */
function remoteListen(options: DaemonStartOptions): {
  listen: boolean;
  env: Record<string, string | undefined>;
} {
  const given = (['gatewayListen', 'tlsCert', 'tlsKey', 'publicUrl', 'insecure'] as const).find(
    (name) => options[name] !== undefined,
  );
  if (!options.listen) {
    if (given) {
      const flag = `--${given.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;
      throw new UsageError(`${flag} needs --listen HOST:PORT`, 'abx daemon start --help');
    }
    return { listen: false, env: { ABX_DOMAIN: options.domain } };
  }
  if (Boolean(options.tlsCert) !== Boolean(options.tlsKey)) {
    throw new UsageError(
      'give both --tls-cert and --tls-key, or neither',
      'abx daemon start --help',
    );
  }
  try {
    checkPublicListen({
      api: parseListenAddress(options.listen, '--listen'),
      ...(options.gatewayListen
        ? { gateway: parseListenAddress(options.gatewayListen, '--gateway-listen') }
        : {}),
      ...(options.tlsCert && options.tlsKey
        ? {
            tls: {
              cert: readPem(options.tlsCert, '--tls-cert', 'CERTIFICATE'),
              key: readPem(options.tlsKey, '--tls-key', 'PRIVATE KEY'),
            },
          }
        : {}),
      ...(options.insecure ? { insecure: true } : {}),
      ...(options.publicUrl ? { publicUrl: options.publicUrl } : {}),
    });
  } catch (error) {
    throw new UsageError((error as Error).message, 'abx daemon start --help');
  }
  const file = (path: string | undefined) => (path ? resolve(path) : undefined);
  return {
    listen: true,
    env: {
      ABX_LISTEN: options.listen,
      ABX_GATEWAY_LISTEN: options.gatewayListen,
      ABX_TLS_CERT: file(options.tlsCert),
      ABX_TLS_KEY: file(options.tlsKey),
      ABX_DOMAIN: options.domain,
      ABX_PUBLIC_URL: options.publicUrl,
      ABX_INSECURE: options.insecure ? '1' : undefined,
    },
  };
}

/**
 * `--api-port`, `--gateway-port` (or their variables): checked here, given to the daemon through
 * its environment. A daemon already running on other ports is an error, not a silent no-op.
 */
function loopbackPorts(options: DaemonStartOptions, running: DaemonInfo | undefined): void {
  for (const [listener, given] of [
    ['api', options.apiPort],
    ['gateway', options.gatewayPort],
  ] as const) {
    const setting = PORT_SETTINGS[listener];
    if (given === undefined || given === '') continue;
    const port = parsePort(given, setting.flag);
    if (typeof port === 'string') throw new UsageError(port, 'abx daemon start --help');
    process.env[setting.env] = String(port);
    const url = running && (listener === 'api' ? running.apiUrl : running.gatewayUrl);
    if (url && port !== 0 && Number(new URL(url).port) !== port) {
      throw new UsageError(
        `a daemon runs already (pid ${running?.pid}) with its ${setting.what} on ${url}; stop it first (abx daemon stop) to start one with ${setting.flag} ${port}`,
        'abx daemon stop',
      );
    }
  }
}

/** `abx daemon start|stop|status|logs`. */
export function addDaemonCommand(program: Command): void {
  const daemon = withExamples(
    program
      .command('daemon')
      .description(
        'Manage the local control plane (API, gateway, reaper); the SDK starts it on demand.',
      ),
    'abx daemon status --json',
  );

  withExamples(
    daemon
      .command('start')
      .description(
        'Start the daemon in the background (no-op when one runs). With --listen it also serves remote SDKs and CLIs (ABX_API_URL, ABX_API_KEY): over TLS with --tls-cert/--tls-key, or plain HTTP behind a proxy that terminates TLS (--insecure beyond loopback).',
      )
      .option('--json', 'print the daemon info as JSON')
      .addOption(
        new Option(
          '--provider <name>',
          'where sandboxes run: local (bubblewrap on this host), docker (the Docker engine of this host) or kubernetes (pods of the cluster of KUBECONFIG)',
        )
          .choices(['local', 'docker', 'kubernetes'])
          .env('ABX_PROVIDER'),
      )
      .addOption(
        new Option(
          '--docker-base-image <image>',
          'docker: the image of templates without one (default debian:bookworm-slim); it must be on the engine',
        ).env('ABX_DOCKER_BASE_IMAGE'),
      )
      .addOption(
        new Option(
          '--kube-namespace <name>',
          'kubernetes: the namespace sandboxes run in (default: the context’s, else default)',
        ).env('ABX_KUBE_NAMESPACE'),
      )
      .addOption(
        new Option(
          '--kube-runtime-image <image>',
          'kubernetes: the init container’s image, holding the portable runtime at /opt/abx (docs/providers.md)',
        ).env('ABX_KUBE_RUNTIME_IMAGE'),
      )
      .addOption(
        new Option(
          '--kube-image-registry <registry>',
          'kubernetes: push each built image template to REGISTRY[:PORT][/PATH] (abx-template-NAME:HASH) and start its pods from there',
        ).env('ABX_KUBE_IMAGE_REGISTRY'),
      )
      .addOption(
        new Option(
          '--kube-base-image <image>',
          'kubernetes: the image of templates without one (default debian:bookworm-slim)',
        ).env('ABX_KUBE_BASE_IMAGE'),
      )
      .addOption(
        new Option(
          '--kube-agent-sandbox <mode>',
          'kubernetes: make sandboxes as agent-sandbox Sandboxes: auto (when the cluster has the CRDs), true or false; claims: SandboxClaims on a SandboxWarmPool per template (ABX_WARM_POOL its replicas, default 1)',
        )
          .choices(['auto', 'true', 'false', 'claims'])
          .env('ABX_KUBE_AGENT_SANDBOX'),
      )
      .addOption(
        new Option(
          '--kube-home <storage>',
          'kubernetes: where a sandbox’s home and /tmp live: emptydir (the default, gone with its pod) or pvc (a PersistentVolumeClaim each, which a hibernate keeps: sandboxes can pause with memory: false)',
        )
          .choices(['emptydir', 'pvc'])
          .env('ABX_KUBE_HOME'),
      )
      .addOption(
        new Option(
          '--kube-home-storage-class <name>',
          'kubernetes: the StorageClass of --kube-home pvc claims (default: the cluster’s default class)',
        ).env('ABX_KUBE_HOME_STORAGE_CLASS'),
      )
      .addOption(
        new Option(
          '--kube-volume-storage-class <name>',
          'kubernetes: the StorageClass of volumes’ claims (default: the cluster’s default class); for ReadWriteMany it must give that access mode',
        ).env('ABX_KUBE_VOLUME_STORAGE_CLASS'),
      )
      .addOption(
        new Option(
          '--kube-volume-access-mode <mode>',
          'kubernetes: volumes’ claims are ReadWriteMany (the default: sandboxes on any node share one) or ReadWriteOnce (only sandboxes on one node can mount one at once)',
        )
          .choices(['ReadWriteMany', 'ReadWriteOnce'])
          .env('ABX_KUBE_VOLUME_ACCESS_MODE'),
      )
      .addOption(
        new Option(
          '--database-url <url>',
          'keep the registry in PostgreSQL (postgres://user:password@host:port/database), shared by every daemon given the same URL; default: SQLite in $ABX_HOME',
        ).env('ABX_DATABASE_URL'),
      )
      .addOption(
        new Option(
          '--listen <host:port>',
          'serve the API to remote clients on this address too (e.g. 0.0.0.0:8443); the key is $ABX_HOME/api-key on this host',
        ).env('ABX_LISTEN'),
      )
      .addOption(
        new Option(
          '--gateway-listen <host:port>',
          "the gateway's address for remote clients (default: --listen's host, port + 1)",
        ).env('ABX_GATEWAY_LISTEN'),
      )
      .addOption(
        new Option(
          '--tls-cert <file>',
          'PEM certificate chain both listeners serve (for --domain: one valid for *.DOMAIN)',
        ).env('ABX_TLS_CERT'),
      )
      .addOption(new Option('--tls-key <file>', 'PEM private key of --tls-cert').env('ABX_TLS_KEY'))
      .addOption(
        new Option(
          '--domain <name>',
          'sandbox ports are reached at https://{port}-{sandboxId}.DOMAIN (wildcard DNS *.DOMAIN to this host or its proxy)',
        ).env('ABX_DOMAIN'),
      )
      .addOption(
        new Option(
          '--public-url <url>',
          "behind a proxy: the gateway's public origin, e.g. https://sandboxes.example.com (its scheme and port go in gateway URLs; its host is the domain)",
        ).env('ABX_PUBLIC_URL'),
      )
      .addOption(
        new Option(
          '--insecure',
          'allow plain HTTP on an address that is not loopback (only behind a proxy that terminates TLS)',
        ).env('ABX_INSECURE'),
      )
      .addOption(
        new Option(
          '--egress-netns <path>',
          "internet sandboxes reach the network from this namespace (e.g. /run/netns/NAME) rather than the daemon's own",
        ).env('ABX_EGRESS_NETNS'),
      )
      .addOption(
        new Option(
          '--egress-userns <path>',
          'without root: the user namespace of your uid that owns --egress-netns (default: /proc/PID/ns/user when --egress-netns is /proc/PID/ns/net)',
        ).env('ABX_EGRESS_USERNS'),
      )
      .addOption(
        new Option(
          '--egress-hosts <file>',
          "a hosts file whose names egress's DNS answers before its resolvers",
        ).env('ABX_EGRESS_HOSTS'),
      )
      .addOption(
        new Option(
          '--egress-permit <cidrs>',
          'always-denied ranges internet sandboxes may reach after all, each named (comma-separated CIDRs, e.g. 10.20.0.0/16); the policy still applies',
        ).env('ABX_EGRESS_PERMIT'),
      )
      .addOption(
        new Option(
          '--api-port <port>',
          "the API's port on 127.0.0.1. Chosen free at the first start and kept in $ABX_HOME/ports.json, so printed addresses (abx e2b env) stay valid across restarts; a port given here is kept from now on; 0: a random port this start, not kept",
        ).env('ABX_API_PORT'),
      )
      .addOption(
        new Option(
          '--gateway-port <port>',
          "the gateway's port on 127.0.0.1 (sandbox ports, E2B's SDKs), kept the same way",
        ).env('ABX_GATEWAY_PORT'),
      )
      .addOption(
        new Option(
          '--no-dashboard',
          'do not serve the web dashboard at / of the API (ABX_DASHBOARD=0); abx dashboard opens it',
        ),
      )
      .action(async (options: DaemonStartOptions) => {
        const remote = remoteListen(options);
        if (options.dashboard === false) process.env.ABX_DASHBOARD = '0';
        for (const [key, name, isPath] of EGRESS_FLAGS) {
          const value = options[key];
          if (value) process.env[name] = isPath ? resolve(value) : value;
        }
        // The daemon process reads them from its environment (it inherits this one's).
        if (options.provider) process.env.ABX_PROVIDER = options.provider;
        if (options.dockerBaseImage) process.env.ABX_DOCKER_BASE_IMAGE = options.dockerBaseImage;
        if (options.kubeNamespace) process.env.ABX_KUBE_NAMESPACE = options.kubeNamespace;
        if (options.kubeRuntimeImage) process.env.ABX_KUBE_RUNTIME_IMAGE = options.kubeRuntimeImage;
        if (options.kubeBaseImage) process.env.ABX_KUBE_BASE_IMAGE = options.kubeBaseImage;
        if (options.kubeImageRegistry)
          process.env.ABX_KUBE_IMAGE_REGISTRY = options.kubeImageRegistry;
        if (options.kubeAgentSandbox) process.env.ABX_KUBE_AGENT_SANDBOX = options.kubeAgentSandbox;
        if (options.kubeHome) process.env.ABX_KUBE_HOME = options.kubeHome;
        if (options.kubeHomeStorageClass)
          process.env.ABX_KUBE_HOME_STORAGE_CLASS = options.kubeHomeStorageClass;
        if (options.kubeVolumeStorageClass)
          process.env.ABX_KUBE_VOLUME_STORAGE_CLASS = options.kubeVolumeStorageClass;
        if (options.kubeVolumeAccessMode)
          process.env.ABX_KUBE_VOLUME_ACCESS_MODE = options.kubeVolumeAccessMode;
        if (options.databaseUrl) process.env.ABX_DATABASE_URL = options.databaseUrl;
        for (const [name, value] of Object.entries(remote.env)) {
          if (value === undefined) delete process.env[name];
          else process.env[name] = value;
        }
        const running = await findDaemon(abxHome());
        loopbackPorts(options, running);
        const wanted = options.provider ?? 'local';
        if (running && (running.provider ?? 'local') !== wanted) {
          throw new UsageError(
            `a daemon with the ${running.provider ?? 'local'} provider runs already (pid ${running.pid}); stop it first (abx daemon stop) to start one with ${wanted}`,
            'abx daemon stop',
          );
        }
        if (running && remote.listen && !running.remote) {
          throw new UsageError(
            `a daemon that serves this host only runs already (pid ${running.pid}); stop it first (abx daemon stop) to start one with --listen ${options.listen}`,
            'abx daemon stop',
          );
        }
        const info = await withSpinner('starting the daemon', () => startDaemon(abxHome()));
        if (options.json) return printJson(info);
        printLine(`daemon ${info.pid} listening: API ${info.apiUrl}, gateway ${info.gatewayUrl}`);
        if (info.remote) {
          printLine(
            `remote clients: API ${info.remote.apiUrl}, gateway ${info.remote.gatewayUrl}, sandbox ports at ${sandboxUrl(info.remote.publicGatewayUrl, '{sandboxId}', 0).replace('0-', '{port}-')}${info.remote.tls ? '' : ' (plain HTTP)'}`,
          );
        }
      }),
    'abx daemon start',
    'abx daemon start --api-port 7420 --gateway-port 7421  # kept from now on',
    'abx daemon start --provider docker --docker-base-image debian:bookworm-slim',
    'abx daemon start --provider kubernetes --kube-namespace sandboxes --kube-runtime-image registry.example/abx-runtime:1',
    'abx daemon start --provider kubernetes --kube-runtime-image registry.example/abx-runtime:0.9.0-3f2a1c9d0b7e --kube-image-registry registry.example/sandboxes',
    'abx daemon start --database-url postgres://abx:secret@db.internal:5432/abx',
    'abx daemon start --egress-netns /run/netns/egress --egress-permit 10.20.0.0/16',
    'abx daemon start --listen 0.0.0.0:8443 --tls-cert cert.pem --tls-key key.pem --domain sandboxes.example.com',
    'abx daemon start --listen 127.0.0.1:8080 --domain sandboxes.example.com --public-url https://sandboxes.example.com  # behind a TLS proxy on this host',
  );

  withExamples(
    daemon
      .command('stop')
      .description('Stop the daemon; sandboxes keep running and are adopted by the next one.')
      .action(async () => {
        const stopped = await stopDaemon(abxHome());
        printLine(stopped ? 'daemon stopped' : 'no daemon was running');
      }),
    'abx daemon stop',
  );

  withExamples(
    daemon
      .command('status')
      .description(
        'Whether a daemon runs, where, and how it isolates sandboxes (root or rootless mode, which limits hold); exits 1 when none runs.',
      )
      .option('--json', 'print the daemon info as JSON (null when none runs)')
      .action(async (options: { json?: boolean }) => {
        const info = await findDaemon(abxHome());
        if (options.json) printJson(info ?? null);
        else if (info) {
          printLine(
            `running: pid ${info.pid}, provider ${info.provider ?? 'local'}, API ${info.apiUrl}, gateway ${info.gatewayUrl}, since ${info.startedAt}`,
          );
          if (info.registry) printLine(`registry: ${info.registry}`);
          if (info.remote) {
            printLine(
              `remote clients: API ${info.remote.apiUrl}, gateway ${info.remote.gatewayUrl} (${info.remote.tls ? 'TLS' : 'plain HTTP'}), gateway URLs ${info.remote.publicGatewayUrl}`,
            );
          }
          const isolation = info.isolation;
          if (isolation) {
            printLine(
              isolation.mode === 'root'
                ? 'isolation: root mode (each sandbox runs as a host uid of its own)'
                : 'isolation: rootless mode (sandboxes share one host uid: the daemon’s, or docker’s uid 1000)',
            );
            for (const [name, limit] of Object.entries(isolation.limits)) {
              printLine(
                `  ${name.padEnd(10)} ${limit.enforced ? 'enforced' : 'NOT enforced'}: ${limit.how}`,
              );
            }
            for (const warning of isolation.warnings) printLine(`warning: ${warning}`);
          }
        } else printLine(`not running (home ${abxHome()})`);
        if (!info) throw new ExitCode(1);
      }),
    'abx daemon status --json',
  );

  withExamples(
    daemon
      .command('logs')
      .description("Print the daemon's log.")
      .option('-n, --lines <n>', 'only the last n lines', (v) => Number.parseInt(v, 10))
      .action((options: { lines?: number }) => {
        let text = '';
        try {
          text = readFileSync(abxPaths().daemonLog, 'utf8');
        } catch {
          // no log yet
        }
        const lines = text.split('\n');
        process.stdout.write(options.lines ? lines.slice(-options.lines - 1).join('\n') : text);
      }),
    'abx daemon logs -n 50',
  );
}
