import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { InvalidArgumentError } from '../errors.js';

/** A `HOST:PORT` to listen on. */
export interface ListenAddress {
  host: string;
  port: number;
}

/** How the daemon serves remote clients, besides its loopback listeners for this host's SDK. */
export interface PublicListenOptions {
  /** Where the API listens, e.g. `0.0.0.0:8443`. */
  api: ListenAddress;
  /** Where the gateway listens; default the API's host, port + 1. */
  gateway?: ListenAddress;
  /** PEM certificate chain and key: both listeners serve TLS with them. */
  tls?: { cert: string; key: string };
  /**
   * Plain HTTP on an address that is not loopback (a proxy in front terminates TLS). Without it
   * the daemon refuses to start, as API keys and sandbox tokens would cross the network in clear.
   */
  insecure?: boolean;
  /**
   * The gateway's public origin when a proxy in front changes its scheme or port, e.g.
   * `https://sandboxes.example.com` (its host is the domain): gateway URLs are then
   * `https://{port}-{sandboxId}.sandboxes.example.com`.
   */
  publicUrl?: string;
}

/** Parses `HOST:PORT`, `[IPv6]:PORT` or `:PORT` (all addresses); `what` names the option. */
export function parseListenAddress(text: string, what: string): ListenAddress {
  const match = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]\s]*)):(\d{1,5})$/.exec(text.trim());
  const port = Number(match?.[3]);
  if (!match || !Number.isInteger(port) || port > 65535) {
    throw new InvalidArgumentError(
      `${what} must be HOST:PORT (e.g. 0.0.0.0:8443, 10.0.0.5:8443 or [::]:8443), not '${text}'`,
    );
  }
  const host = match[1] ?? (match[2] || '0.0.0.0');
  if (match[1] !== undefined && isIP(host) !== 6) {
    throw new InvalidArgumentError(`${what}: '${host}' in brackets is not an IPv6 address`);
  }
  return { host, port };
}

/** True for addresses only this host can reach: 127.0.0.0/8, ::1, `localhost`. */
export function isLoopback(host: string): boolean {
  const name = host.toLowerCase();
  return (
    name === 'localhost' ||
    name === '::1' ||
    name === '::ffff:127.0.0.1' ||
    (isIP(name) === 4 && name.startsWith('127.'))
  );
}

/** Reads a PEM file for `option`, with an error that names the option and the file. */
export function readPem(file: string, option: string, kind: 'CERTIFICATE' | 'PRIVATE KEY'): string {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (error) {
    throw new InvalidArgumentError(
      `${option} ${file} cannot be read: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`,
      { cause: error },
    );
  }
  if (!new RegExp(`-----BEGIN [A-Z ]*${kind}-----`).test(text)) {
    throw new InvalidArgumentError(`${option} ${file} holds no PEM ${kind.toLowerCase()}`);
  }
  return text;
}

/**
 * Checks what remote serving asks for and fills in the gateway's address. Plain HTTP on an
 * address that is not loopback needs `insecure`.
 */
export function checkPublicListen(
  options: PublicListenOptions,
): Required<Pick<PublicListenOptions, 'api' | 'gateway'>> & PublicListenOptions {
  const gateway = options.gateway ?? {
    host: options.api.host,
    port: options.api.port === 0 ? 0 : options.api.port + 1,
  };
  if (gateway.port > 65535) {
    throw new InvalidArgumentError(
      `the gateway's port would be ${gateway.port}: give --gateway-listen HOST:PORT`,
    );
  }
  if (!options.tls && !options.insecure) {
    const exposed = [options.api.host, gateway.host].find((host) => !isLoopback(host));
    if (exposed !== undefined) {
      throw new InvalidArgumentError(
        `refusing to serve plain HTTP on ${exposed}, which is not a loopback address: API keys and sandbox tokens would cross the network in clear text. Give --tls-cert FILE and --tls-key FILE (ABX_TLS_CERT, ABX_TLS_KEY), or --insecure (ABX_INSECURE=1) when a proxy in front of the daemon terminates TLS`,
      );
    }
  }
  if (options.publicUrl !== undefined) publicOrigin(options.publicUrl);
  return { ...options, gateway };
}

/** The scheme, host and port of a `--public-url`; an error names what is wrong with it. */
export function publicOrigin(text: string): URL {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new InvalidArgumentError(
      `--public-url must be an origin such as https://sandboxes.example.com, not '${text}'`,
    );
  }
  if (
    (url.protocol !== 'https:' && url.protocol !== 'http:') ||
    url.pathname !== '/' ||
    url.search ||
    url.username
  ) {
    throw new InvalidArgumentError(
      `--public-url must be an http(s) origin with no path, such as https://sandboxes.example.com, not '${text}'`,
    );
  }
  return url;
}

/**
 * The gateway's origin as clients see it, with the sandbox domain as its host name: a sandbox
 * port is then reached at `{scheme}://{port}-{sandboxId}.{domain}[:{port}]`.
 */
export function gatewayOrigin(options: {
  domain: string;
  tls: boolean;
  port: number;
  publicUrl?: string | undefined;
}): string {
  if (options.publicUrl !== undefined) {
    const url = publicOrigin(options.publicUrl);
    return `${url.protocol}//${options.domain}${url.port ? `:${url.port}` : ''}`;
  }
  const scheme = options.tls ? 'https' : 'http';
  const standard = options.port === (options.tls ? 443 : 80);
  return `${scheme}://${options.domain}${standard ? '' : `:${options.port}`}`;
}

/** `{scheme}://{port}-{sandboxId}.{domain}[:{port}]` from a {@link gatewayOrigin}. */
export function sandboxUrl(origin: string, sandboxId: string, port: number): string {
  const url = new URL(origin);
  return `${url.protocol}//${port}-${sandboxId}.${url.host}`;
}
