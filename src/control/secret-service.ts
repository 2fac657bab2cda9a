/**
 * Secrets: values a sandbox's requests will carry without the sandbox (or anyone) ever reading
 * them. The control plane keeps them write-only: a create or update takes a value, every answer
 * holds only the name, metadata, version and times. Each value is sealed (secret-crypto.ts)
 * before it reaches the registry; each change of the value is the next version, which readers
 * get from the next request on. Who may do what: secret-access.ts.
 */

import { randomBytes } from 'node:crypto';
import { InvalidArgumentError, SecretConflictError, SecretNotFoundError } from '../errors.js';
import type { Registry, SealedSecretVersion, SecretRecord } from './registry.js';
import { type SecretPrincipal, secretAccess, secretListScope } from './secret-access.js';
import { openSecret, type SecretsKey, sealSecret } from './secret-crypto.js';

/**
 * A secret's name: a letter or digit, then up to 63 letters, digits, `_`, `-` and `.`. Names are
 * case-insensitive and kept lower-case, as E2B's are; `sec_` starts ids, never names.
 */
export const SECRET_NAME = /^[a-z0-9][a-z0-9_.-]{0,63}$/;
/** The largest value, in bytes of UTF-8. */
export const MAX_SECRET_VALUE_BYTES = 64 * 1024;
/** Metadata limits (E2B's): entries, bytes per key, bytes per value, bytes in all. */
export const MAX_SECRET_METADATA = {
  entries: 32,
  keyBytes: 128,
  valueBytes: 1024,
  totalBytes: 8192,
};

/** The form of a name, for messages. */
const NAME_FORM =
  'a secret name is 1 to 64 letters, digits, _, - and ., starting with a letter or digit (case does not matter: names are kept lower-case), and does not start with sec_ (that starts ids)';

/** A name as given (any case), checked and made lower-case. */
export function checkSecretName(name: unknown): string {
  const lower = typeof name === 'string' ? name.toLowerCase() : undefined;
  if (lower === undefined || !SECRET_NAME.test(lower) || lower.startsWith('sec_')) {
    const shown = typeof name === 'string' ? JSON.stringify(name.slice(0, 100)) : typeof name;
    throw new InvalidArgumentError(`${NAME_FORM}; not ${shown}`, { code: 'invalid_secret_name' });
  }
  return lower;
}

/** A value: a non-empty string of at most 64 KiB. Messages never quote it. */
export function checkSecretValue(value: unknown): string {
  if (typeof value !== 'string') {
    throw new InvalidArgumentError(`value must be a string, not ${typeof value}`, {
      code: 'invalid_secret_value',
    });
  }
  if (value === '') {
    throw new InvalidArgumentError('value must not be empty', { code: 'invalid_secret_value' });
  }
  const bytes = Buffer.byteLength(value, 'utf8');
  if (bytes > MAX_SECRET_VALUE_BYTES) {
    throw new InvalidArgumentError(
      `value is ${bytes} bytes; a secret's value is at most ${MAX_SECRET_VALUE_BYTES} bytes (64 KiB)`,
      { code: 'invalid_secret_value' },
    );
  }
  return value;
}

/** Metadata: string values, within E2B's limits; `{}` when absent. */
export function checkSecretMetadata(value: unknown): Record<string, string> {
  if (value === undefined || value === null) return {};
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw new InvalidArgumentError('metadata must be an object of string values');
  }
  const entries = Object.entries(value);
  const limits = MAX_SECRET_METADATA;
  if (entries.length > limits.entries) {
    throw new InvalidArgumentError(
      `metadata has ${entries.length} entries; a secret has at most ${limits.entries}`,
    );
  }
  let total = 0;
  for (const [key, item] of entries) {
    if (typeof item !== 'string') {
      throw new InvalidArgumentError(`metadata.${key} must be a string, not ${typeof item}`);
    }
    const keyBytes = Buffer.byteLength(key);
    const itemBytes = Buffer.byteLength(item);
    if (key === '' || keyBytes > limits.keyBytes) {
      throw new InvalidArgumentError(
        `a metadata key is 1 to ${limits.keyBytes} bytes, not ${keyBytes}`,
      );
    }
    if (itemBytes > limits.valueBytes) {
      throw new InvalidArgumentError(
        `metadata.${key} is ${itemBytes} bytes; a metadata value is at most ${limits.valueBytes}`,
      );
    }
    total += keyBytes + itemBytes;
  }
  if (total > limits.totalBytes) {
    throw new InvalidArgumentError(
      `metadata is ${total} bytes in all; a secret's metadata is at most ${limits.totalBytes}`,
    );
  }
  return { ...(value as Record<string, string>) };
}

/** A secret as `/v1` shows it (never its value); `owner` for admin callers. */
export function secretJson(record: SecretRecord, withOwner = false) {
  return {
    secretId: record.id,
    name: record.name,
    version: record.version,
    metadata: record.metadata,
    createdAt: new Date(record.createdAt).toISOString(),
    updatedAt: new Date(record.updatedAt).toISOString(),
    ...(withOwner ? { owner: record.owner } : {}),
  };
}

/** What a create takes. */
export interface CreateSecretRequest {
  name?: unknown;
  value?: unknown;
  metadata?: unknown;
}

/** What an update takes: a new value (the next version), new metadata, or both. */
export interface UpdateSecretRequest {
  value?: unknown;
  metadata?: unknown;
}

export class SecretService {
  constructor(
    private readonly registry: Registry,
    private readonly key: SecretsKey,
  ) {}

  /**
   * Whether the registry holds versions sealed with another key: the message to refuse a start
   * with (or to log), naming where this daemon's key came from; undefined when all is well.
   */
  async otherKeys(): Promise<string | undefined> {
    const others = (await this.registry.secretKeyChecks()).filter((c) => c !== this.key.check);
    if (others.length === 0) return undefined;
    return `the registry ${this.registry.location} holds secrets sealed with another secrets key than this daemon's (${this.key.source}): give every daemon on it the same key (copy the other daemons' $ABX_HOME/secrets-key here, or set the same ABX_SECRETS_KEY on all of them)`;
  }

  private seal(at: { id: string; name: string; version: number }, value: string) {
    return {
      version: at.version,
      sealed: sealSecret(this.key.key, at, value),
      keyCheck: this.key.check,
      createdAt: Date.now(),
    } satisfies SealedSecretVersion;
  }

  /** Makes a secret for `who` (its owner) at version 1. */
  async create(who: SecretPrincipal, request: CreateSecretRequest): Promise<SecretRecord> {
    const name = checkSecretName(request.name);
    const value = checkSecretValue(request.value);
    const metadata = checkSecretMetadata(request.metadata);
    const now = Date.now();
    const record: SecretRecord = {
      id: `sec_${randomBytes(10).toString('hex')}`,
      name,
      owner: who.keyId,
      metadata,
      version: 1,
      createdAt: now,
      updatedAt: now,
    };
    if (!(await this.registry.insertSecret(record, this.seal(record, value)))) {
      throw new SecretConflictError(
        `a secret named ${name} exists already; update it (abx secret update ${name}), or remove it first (abx secret rm ${name})`,
        { code: 'secret_exists' },
      );
    }
    return record;
  }

  /**
   * The secret `ref` (a name among `who`'s own, or an id `sec_…`) if `who` may see it, else
   * SecretNotFoundError, the same for one that does not exist and another key's.
   */
  async find(who: SecretPrincipal, ref: string): Promise<SecretRecord> {
    const secret = ref.startsWith('sec_')
      ? await this.registry.getSecret(ref)
      : await this.registry.findSecret(who.keyId, checkSecretName(ref));
    if (!secret || secretAccess(who, secret) !== 'allowed') {
      throw new SecretNotFoundError(
        `no secret ${JSON.stringify(ref.slice(0, 100))} among this key's secrets; see abx secret list, or make it (abx secret create NAME)`,
      );
    }
    return secret;
  }

  /** The secrets `who` may see, by name. */
  list(who: SecretPrincipal): Promise<SecretRecord[]> {
    return this.registry.listSecrets(secretListScope(who));
  }

  /**
   * A new value (the next version, used from the next request on) and/or new metadata. Two
   * updates racing are both applied, one after the other: each is written only on the version
   * it read, and the one that lost reads again.
   */
  async update(
    who: SecretPrincipal,
    ref: string,
    request: UpdateSecretRequest,
  ): Promise<SecretRecord> {
    const value = request.value === undefined ? undefined : checkSecretValue(request.value);
    const metadata =
      request.metadata === undefined ? undefined : checkSecretMetadata(request.metadata);
    if (value === undefined && metadata === undefined) {
      throw new InvalidArgumentError('an update needs a new value, new metadata, or both');
    }
    for (let attempt = 0; ; attempt++) {
      const secret = await this.find(who, ref);
      const updated = await this.registry.updateSecret(secret.id, {
        from: secret.version,
        ...(value === undefined
          ? {}
          : { value: this.seal({ ...secret, version: secret.version + 1 }, value) }),
        ...(metadata === undefined ? {} : { metadata }),
        at: Date.now(),
      });
      if (updated) return updated;
      // Removed meanwhile: find() answers 404 on the next turn. Changed: retry on the new version.
      if (attempt >= 20) throw new Error(`secret ${secret.name} changes too often to update it`);
    }
  }

  /** Removes a secret and every version of it; false when it was gone already. */
  async remove(
    who: SecretPrincipal,
    ref: string,
  ): Promise<{ removed: boolean; secret: SecretRecord }> {
    const secret = await this.find(who, ref);
    return { removed: await this.registry.removeSecret(secret.id), secret };
  }

  /**
   * The current value of the secret `name` of the key `ownerKeyId` (null: the daemon's own key),
   * or undefined when it has none of that name. The daemon's own use only (the egress proxy
   * puts it into a request as it leaves); no route calls it.
   */
  async resolve(ownerKeyId: string | null, name: string): Promise<string | undefined> {
    const lower = name.toLowerCase();
    if (!SECRET_NAME.test(lower)) return undefined;
    const secret = await this.registry.findSecret(ownerKeyId, lower);
    if (!secret) return undefined;
    const current = await this.registry.currentSecretVersion(secret.id);
    // Removed between the two reads.
    if (!current) return undefined;
    if (current.keyCheck !== this.key.check) {
      throw new Error(
        `secret ${secret.name} was sealed with another secrets key than this daemon's (${this.key.source}): give every daemon on the registry the same key`,
      );
    }
    return openSecret(
      this.key.key,
      { id: secret.id, name: secret.name, version: current.version },
      current.sealed,
    );
  }
}
