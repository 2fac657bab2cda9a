/**
 * Inside a sandbox, the page speaks to the gateway exactly as the SDK does: `POST
 * /v1/sandboxes/{id}/connect` gives the access token, then each request goes to the gateway with
 * the sandbox's id, the port and the token as headers, without cookies. The token stays in this
 * module's memory: never in storage, never in a URL.
 */
import { ENVD_PORT } from '../../runtime/protocol/constants.js';
import { api, errorOf, onSession, type SandboxInfo, sandboxPath } from './api.js';

interface Connection {
  sandboxId: string;
  accessToken: string;
  gatewayUrl: string;
}

const connections = new Map<string, Promise<Connection>>();
// Tokens belong to the session that fetched them: a sign-out (or another key) forgets them all.
onSession(() => connections.clear());

/** Connects to a running sandbox (a paused one is resumed by the daemon). */
export function connect(sandboxId: string): Promise<Connection> {
  let connection = connections.get(sandboxId);
  if (!connection) {
    connection = api<SandboxInfo & { accessToken: string; gatewayUrl: string }>(
      'POST',
      sandboxPath(sandboxId, '/connect'),
    ).then(({ accessToken, gatewayUrl }) => ({ sandboxId, accessToken, gatewayUrl }));
    connections.set(sandboxId, connection);
    connection.catch(() => connections.delete(sandboxId));
  }
  return connection;
}

/** Forgets a sandbox's token (when it ended, or the page leaves it). */
export function disconnect(sandboxId: string): void {
  connections.delete(sandboxId);
}

export interface PortRequest {
  query?: Record<string, string | number | boolean>;
  /** JSON, or with `raw` a body sent as it is (a File, bytes). */
  body?: unknown;
  raw?: boolean;
  port?: number;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

/** A request to a port of the sandbox (envd's by default) through the gateway. */
export async function sandboxFetch(
  sandboxId: string,
  method: string,
  path: string,
  options: PortRequest = {},
): Promise<Response> {
  const { accessToken, gatewayUrl } = await connect(sandboxId);
  const url = new URL(path, gatewayUrl);
  for (const [key, value] of Object.entries(options.query ?? {})) {
    url.searchParams.set(key, String(value));
  }
  const headers: Record<string, string> = {
    'x-sandbox-id': sandboxId,
    'x-sandbox-port': String(options.port ?? ENVD_PORT),
    'x-access-token': accessToken,
    ...options.headers,
  };
  let body: BodyInit | undefined;
  if (options.body !== undefined) {
    if (options.raw) {
      body = options.body as BodyInit;
      headers['content-type'] ??= 'application/octet-stream';
    } else {
      body = JSON.stringify(options.body);
      headers['content-type'] = 'application/json';
    }
  }
  const response = await fetch(url, {
    method,
    headers,
    credentials: 'omit',
    cache: 'no-store',
    referrerPolicy: 'no-referrer',
    ...(body === undefined ? {} : { body }),
    ...(options.signal ? { signal: options.signal } : {}),
  });
  if (!response.ok) {
    // A refused token: the sandbox was replaced or ended; connect again next time.
    if (response.status === 401) disconnect(sandboxId);
    throw await errorOf(response, `${method} ${path}`);
  }
  return response;
}

export async function sandboxJson<T>(
  sandboxId: string,
  method: string,
  path: string,
  options: PortRequest = {},
): Promise<T> {
  return (await (await sandboxFetch(sandboxId, method, path, options)).json()) as T;
}
