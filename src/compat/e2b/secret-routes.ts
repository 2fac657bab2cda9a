/**
 * E2B's secrets on abx's (docs/secrets.md): `POST /secrets`, `GET /secrets` (paged: `limit`,
 * `nextToken`, the next page's token in `X-Next-Token`), and `GET`, `POST` (a new version) and
 * `DELETE /secrets/{secretID}`, where `secretID` is an id (`sec_…`) or a name, as E2B's SDK sends
 * either. The answers are E2B's `Secret` (`secretID`, `name`, `currentVersion`, `metadata`,
 * `createdAt`, `updatedAt`): never a value. A key sees its own secrets (an admin key: all).
 */
import type { E2bBackend, E2bCaller, E2bSecret } from './backend.js';
import { page, parseListQuery } from './list-query.js';

/** What a secret route gets: the caller, its path's parameters, its query and its JSON body. */
export interface SecretCall {
  params: Record<string, string>;
  query: URLSearchParams;
  body: Record<string, unknown>;
  caller: E2bCaller;
  backend: E2bBackend;
}

/** A status, a JSON body (undefined: none) and headers. */
export interface SecretAnswer {
  status: number;
  body: unknown;
  headers?: Record<string, string>;
}

/** E2B's `Secret`. */
function secretJson(secret: E2bSecret) {
  return {
    secretID: secret.id,
    name: secret.name,
    currentVersion: secret.version,
    metadata: secret.metadata,
    createdAt: new Date(secret.createdAt).toISOString(),
    updatedAt: new Date(secret.updatedAt).toISOString(),
  };
}

/** `Secret.create(name, value, { metadata })`: **201** Secret; 409 for a taken name. */
export async function createSecret(call: SecretCall): Promise<SecretAnswer> {
  return { status: 201, body: secretJson(await call.backend.createSecret(call.body, call.caller)) };
}

/** `Secret.list()`: a page of the caller's secrets, oldest first. */
export async function listSecrets(call: SecretCall): Promise<SecretAnswer> {
  const query = parseListQuery(call.query);
  const secrets = await call.backend.listSecrets(call.caller);
  const { items, nextToken } = page(secrets, { ...query, order: 'asc' });
  return {
    status: 200,
    body: items.map(secretJson),
    ...(nextToken ? { headers: { 'x-next-token': nextToken } } : {}),
  };
}

/** `Secret.getInfo(secret)`, `Secret.exists(secret)`: Secret; 404 (the SDK's SecretNotFoundError). */
export async function getSecret(call: SecretCall): Promise<SecretAnswer> {
  return {
    status: 200,
    body: secretJson(await call.backend.getSecret(call.params.id as string, call.caller)),
  };
}

/** `Secret.update(secret, value, { metadata })`: the next version; 200 Secret. */
export async function updateSecret(call: SecretCall): Promise<SecretAnswer> {
  const secret = await call.backend.updateSecret(call.params.id as string, call.body, call.caller);
  return { status: 200, body: secretJson(secret) };
}

/** `Secret.destroy(secret)`: **204**; 404 (the SDK's `false`). */
export async function removeSecret(call: SecretCall): Promise<SecretAnswer> {
  await call.backend.removeSecret(call.params.id as string, call.caller);
  return { status: 204, body: undefined };
}
