import { homedir } from 'node:os';
import { join, resolve } from 'node:path';

/** Where the control plane keeps its state: `$ABX_HOME`, default `~/.abx`. */
export function abxHome(env: NodeJS.ProcessEnv = process.env): string {
  return resolve(env.ABX_HOME || join(homedir(), '.abx'));
}

/** The files and folders under `$ABX_HOME`. */
export function abxPaths(home = abxHome()) {
  return {
    home,
    /** SQLite registry of sandboxes and templates. */
    database: join(home, 'abx.db'),
    /** The daemon's API key (mode 0600). */
    apiKey: join(home, 'api-key'),
    /** The secret sandbox access tokens are derived from (mode 0600). */
    tokenSecret: join(home, 'token-secret'),
    /** The key secrets are sealed with at rest, unless the operator gives one (mode 0600). */
    secretsKey: join(home, 'secrets-key'),
    /** Held while a process starts the daemon, so two do not start two. */
    startLock: join(home, 'daemon.lock'),
    /** `{ pid, apiUrl, gatewayUrl, domain }` of the running daemon. */
    daemonInfo: join(home, 'daemon.json'),
    daemonLog: join(home, 'daemon.log'),
    /** `{ api, gateway }`: the loopback ports the daemon keeps across starts (mode 0600). */
    ports: join(home, 'ports.json'),
    sandboxes: join(home, 'sandboxes'),
    templates: join(home, 'templates'),
    /** One folder per volume: its storage, where the provider keeps it on this host. */
    volumes: join(home, 'volumes'),
  };
}

export type AbxPaths = ReturnType<typeof abxPaths>;
