/**
 * E2B's control API bodies as the `e2b` SDK reads them (sandboxApi.ts of e2b 2.51): field names
 * and their meaning on abx. See docs/e2b.md.
 */
import { availableParallelism, totalmem } from 'node:os';
import { InvalidArgumentError } from '../../errors.js';
import type { E2bSandboxRow, E2bTemplateTraits } from './backend.js';

/**
 * The envd version announced for every sandbox: the highest version e2b 2.51 switches a feature
 * on at (0.6.4, watching network mounts), so no feature of the SDK is switched off, and no higher,
 * so that a later SDK does not assume envd features abx has not been checked against.
 */
export const E2B_ENVD_VERSION = '0.6.4';

/** E2B's `clientID`, kept for the SDKs that still require it (Python); it means nothing here. */
export const E2B_CLIENT_ID = 'abx';

/** E2B's longest sandbox lifetime, and abx's: 24 h, in seconds. */
export const MAX_TIMEOUT_SECONDS = 86_400;

/** The server's default lifetime when create sends no `timeout`: E2B's 300 s. */
export const DEFAULT_TIMEOUT_SECONDS = 300;

/** What create and connect answer (`Sandbox` in E2B's spec). */
export function sandboxAnswer(row: E2bSandboxRow, accessToken: string, domain: string) {
  return {
    sandboxID: row.id,
    templateID: row.template,
    clientID: E2B_CLIENT_ID,
    envdVersion: E2B_ENVD_VERSION,
    envdAccessToken: accessToken,
    // `@e2b/code-interpreter` sends only this one on its context routes (`E2B-Traffic-Access-Token`):
    // the gateway takes it as the sandbox's token, so every request to a sandbox carries one.
    trafficAccessToken: accessToken,
    domain,
  };
}

/** The size limits a sandbox shows: its template's, else the host's (what it may use). */
function sizes(template: E2bTemplateTraits | undefined) {
  const resources = template?.resources;
  const mb = (bytes: number) => Math.floor(bytes / (1024 * 1024));
  return {
    cpuCount:
      resources?.cpu === undefined ? availableParallelism() : Math.max(1, Math.ceil(resources.cpu)),
    memoryMB: mb(resources?.memory ?? totalmem()),
    // abx's default disk quota (home and /tmp together) is 2 GiB.
    diskSizeMB: mb(resources?.disk ?? 2 * 1024 ** 3),
  };
}

/** One entry of a list (`ListedSandbox`). */
export function listedAnswer(row: E2bSandboxRow, template: E2bTemplateTraits | undefined) {
  return {
    sandboxID: row.id,
    templateID: row.template,
    clientID: E2B_CLIENT_ID,
    metadata: row.metadata,
    startedAt: new Date(row.createdAt).toISOString(),
    // As E2B's: when a paused one stopped running (its pause), when a running one will stop.
    endAt: new Date(row.paused ? row.paused.at : row.expiresAt).toISOString(),
    // Only running and paused sandboxes are shown (E2B forgets ended ones).
    state: row.state === 'paused' ? 'paused' : 'running',
    ...sizes(template),
    envdVersion: E2B_ENVD_VERSION,
    volumeMounts: (row.volumeMounts ?? []).map(({ name, path }) => ({ name, path })),
  };
}

/** An egress proxy as answers show it (`SandboxEgressProxyInfo`): never its password. */
function proxyAnswer(proxy: { address: string; username?: string }) {
  return {
    address: proxy.address,
    ...(proxy.username === undefined ? {} : { username: proxy.username }),
  };
}

/** `GET /sandboxes/{id}` (`SandboxDetail`). */
export function detailAnswer(
  row: E2bSandboxRow,
  template: E2bTemplateTraits | undefined,
  domain: string,
) {
  return {
    ...listedAnswer(row, template),
    ...(row.network
      ? {
          // E2B's flag is false when everything is denied (what allow_internet_access false sets).
          allowInternetAccess: !row.network.denyOut.includes('0.0.0.0/0'),
          network: {
            allowOut: row.network.allowOut,
            denyOut: row.network.denyOut,
            ...(row.network.rules ? { rules: row.network.rules } : {}),
            // Its address and username: E2B's API never answers the password, nor does abx's.
            ...(row.network.egressProxy
              ? { egressProxy: proxyAnswer(row.network.egressProxy) }
              : {}),
          },
        }
      : template
        ? { allowInternetAccess: template.network === 'host' }
        : {}),
    lifecycle: lifecycleAnswer(row),
    domain,
  };
}

/**
 * `SandboxLifecycle`: what its timeout does (`autoPause` at create: `pause`, with its memory or
 * only its disk alike), and `autoResume`: whether its traffic resumes it when paused.
 */
export function lifecycleAnswer(row: E2bSandboxRow) {
  return {
    onTimeout: row.lifecycle?.onTimeout ?? 'kill',
    autoResume: row.lifecycle?.autoResume === true,
  };
}

/** The body of a POST: a JSON object, or `{}` when empty. */
export function bodyObject(body: unknown): Record<string, unknown> {
  if (body === undefined) return {};
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new InvalidArgumentError(
      `the request body must be a JSON object, not ${Array.isArray(body) ? 'an array' : JSON.stringify(body)}`,
    );
  }
  return body as Record<string, unknown>;
}

/** `timeout`: whole seconds from 1 to 24 h; undefined when absent (or null). */
export function timeoutSeconds(body: Record<string, unknown>): number | undefined {
  const value = body.timeout;
  if (value === undefined || value === null) return undefined;
  if (
    typeof value !== 'number' ||
    !Number.isInteger(value) ||
    value < 1 ||
    value > MAX_TIMEOUT_SECONDS
  ) {
    throw new InvalidArgumentError(
      `timeout must be a whole number of seconds from 1 to ${MAX_TIMEOUT_SECONDS} (24 h), not ${JSON.stringify(value)}`,
    );
  }
  return value;
}

/** An object of strings (`metadata`, `envVars`); `{}` when absent or null. */
export function stringMap(body: Record<string, unknown>, field: string): Record<string, string> {
  const value = body[field];
  if (value === undefined || value === null) return {};
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw new InvalidArgumentError(
      `${field} must be an object of string values, not ${JSON.stringify(value)}`,
    );
  }
  for (const [key, item] of Object.entries(value)) {
    if (typeof item !== 'string') {
      throw new InvalidArgumentError(
        `${field}.${key} must be a string, not ${JSON.stringify(item)}`,
      );
    }
  }
  return value as Record<string, string>;
}

/** A field that must be a string when present. */
export function optionalString(body: Record<string, unknown>, field: string): string | undefined {
  const value = body[field];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'string' || value === '') {
    throw new InvalidArgumentError(
      `${field} must be a non-empty string, not ${JSON.stringify(value)}`,
    );
  }
  return value;
}

/** A field that must be a boolean when present. */
export function optionalBoolean(body: Record<string, unknown>, field: string): boolean | undefined {
  const value = body[field];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'boolean') {
    throw new InvalidArgumentError(`${field} must be true or false, not ${JSON.stringify(value)}`);
  }
  return value;
}
