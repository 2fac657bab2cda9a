import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { AuthenticationError, DaemonUnavailableError, InvalidArgumentError } from '../errors.js';
import { type ConnectionOptions, connectDaemon, forgetDaemonAnswer } from './daemon-connection.js';
import type { DaemonInfo } from './daemon-info.js';
import { NodeJsonClient } from './json-client.js';

/** CAs a client trusts for a private control plane: the system's plus one more. */
export interface TlsTrust {
  /** Tells trusts apart in connection pools' keys. */
  id: string;
  ca: string[];
}

/** The control plane a client talks to: the local daemon, or a remote one by URL. */
export interface ControlConnection {
  apiUrl: string;
  apiKey: string;
  /** Names the control plane in messages: "the abx daemon", "the abx control plane at URL". */
  peer: string;
  /** The local installation's folder; undefined for a remote control plane. */
  home?: string;
  /** The local daemon's `daemon.json`; undefined for a remote control plane. */
  local?: DaemonInfo;
  /** A private CA to trust (remote only). */
  trust?: TlsTrust;
  /** The client's own gateway address (`ABX_GATEWAY_URL`), routed by headers. */
  gatewayUrl?: string;
  /**
   * Local only: finds the daemon again (as {@link connectDaemon}: its health checked, started if
   * the options allow) and points this connection at it. Its clients call it when the daemon it
   * named refused a connection (it ended, or is ending, since it last answered).
   */
  rediscover?: () => Promise<void>;
}

/** The remote control plane the options or the environment name, if any (nothing is read from `$ABX_HOME`). */
export function remoteControlPlane(
  options: ConnectionOptions = {},
  env: NodeJS.ProcessEnv = process.env,
): ControlConnection | undefined {
  // An explicit home means the local installation, whatever the environment says.
  const text = options.apiUrl ?? (options.home === undefined ? env.ABX_API_URL : undefined);
  if (!text) return undefined;
  const source = options.apiUrl === undefined ? 'ABX_API_URL' : 'apiUrl';
  const apiUrl = originOf(text, source, 'https://abx.example.com:8443');
  const apiKey = options.apiKey ?? env.ABX_API_KEY;
  if (!apiKey) {
    throw new InvalidArgumentError(
      `${source} names the abx control plane at ${apiUrl}, but no API key is given: set ABX_API_KEY (or --api-key, or the apiKey option) to the key in $ABX_HOME/api-key on its host`,
    );
  }
  const ca = options.caCert ?? env.ABX_CA_CERT;
  const gateway = options.gatewayUrl ?? env.ABX_GATEWAY_URL;
  return {
    apiUrl,
    apiKey,
    peer: `the abx control plane at ${apiUrl}`,
    ...(ca ? { trust: trustOf(ca, options.caCert === undefined ? 'ABX_CA_CERT' : 'caCert') } : {}),
    ...(gateway
      ? {
          gatewayUrl: originOf(
            gateway,
            options.gatewayUrl === undefined ? 'ABX_GATEWAY_URL' : 'gatewayUrl',
            'https://10.0.0.5:8444',
          ),
        }
      : {}),
  };
}

/**
 * The control plane to talk to: the remote one of `apiUrl` / `ABX_API_URL` (no local daemon is
 * looked for or started then), else the local daemon, started if needed.
 */
export async function connectControlPlane(
  options: ConnectionOptions = {},
): Promise<ControlConnection> {
  const remote = remoteControlPlane(options);
  if (remote) return remote;
  const { home, info, apiKey } = await connectDaemon(options);
  const connection: ControlConnection = {
    apiUrl: info.apiUrl,
    apiKey,
    peer: 'the abx daemon',
    home,
    local: info,
  };
  connection.rediscover = async () => {
    forgetDaemonAnswer(home);
    const again = await connectDaemon({ ...options, home });
    connection.apiUrl = again.info.apiUrl;
    connection.apiKey = again.apiKey;
    connection.local = again.info;
  };
  return connection;
}

/** An http(s) URL with no path, as its origin; an error names where it came from. */
function originOf(text: string, source: string, example: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new InvalidArgumentError(`${source} must be a URL such as ${example}, not '${text}'`);
  }
  if ((url.protocol !== 'https:' && url.protocol !== 'http:') || url.pathname !== '/') {
    throw new InvalidArgumentError(
      `${source} must be an http(s) URL with no path, such as ${example}, not '${text}'`,
    );
  }
  return url.origin;
}

/** The system's CAs plus a PEM CA (its text, or a file holding it). */
function trustOf(ca: string, source: string): TlsTrust {
  let pem = ca;
  if (!ca.includes('-----BEGIN')) {
    if (!existsSync(ca)) {
      throw new InvalidArgumentError(`${source} names ${ca}, which does not exist`);
    }
    pem = readFileSync(ca, 'utf8');
    if (!pem.includes('-----BEGIN CERTIFICATE-----')) {
      throw new InvalidArgumentError(`${source} names ${ca}, which holds no PEM certificate`);
    }
  }
  // `ca` replaces node's default trust: keep the system's CAs (and NODE_EXTRA_CA_CERTS, which
  // node adds to them) alongside the private one.
  // node:tls is loaded here, for a private CA only: a local client never needs it (it costs a
  // CLI command's start about as much as node:http does).
  const { rootCertificates } = createRequire(import.meta.url)(
    'node:tls',
  ) as typeof import('node:tls');
  return { id: pem, ca: [...rootCertificates, ...extraCas(), pem] };
}

function extraCas(): string[] {
  const file = process.env.NODE_EXTRA_CA_CERTS;
  try {
    return file ? [readFileSync(file, 'utf8')] : [];
  } catch {
    return [];
  }
}

/**
 * How a refused key (401) reads from a remote control plane: which one refused it and where the
 * key came from. The local daemon's own key needs no such word.
 */
export function keyRefused(
  connection: ControlConnection,
): ((error: AuthenticationError) => Error) | undefined {
  if (connection.local) return undefined;
  return (error) =>
    new AuthenticationError(
      `the API key was refused (401) by ${connection.peer}: check ABX_API_KEY (or --api-key, or the apiKey option): a key from abx keys create, or the admin key in $ABX_HOME/api-key on the control plane's host; it said: ${error.message}`,
      { cause: error },
    );
}

/** A JSON client of the control plane's REST API (see json-client.ts for why not undici). */
export function controlJsonClient(
  connection: ControlConnection,
  timeoutMs: number,
): NodeJsonClient {
  return new NodeJsonClient(
    connection.apiUrl,
    { authorization: `Bearer ${connection.apiKey}` },
    timeoutMs,
    connection.peer,
    DaemonUnavailableError,
    {
      trust: connection.trust,
      unauthorized: keyRefused(connection),
      rediscover:
        connection.rediscover &&
        (async () => {
          await connection.rediscover?.();
          return connection.apiUrl;
        }),
    },
  );
}
