import { SecretNotFoundError } from '../errors.js';
import type { ConnectionOptions } from '../installation/daemon-connection.js';
import { openControl } from './sandbox-api.js';

/** A secret as the control plane shows it: never its value. */
export interface SecretInfo {
  /** `sec_…`: never reused. */
  secretId: string;
  /** Lower-case, unique among its key's secrets. */
  name: string;
  /** The version of the value in use: 1 at create, one more at each new value. */
  version: number;
  metadata: Record<string, string>;
  /** ISO 8601. */
  createdAt: string;
  updatedAt: string;
  /** The key that owns it (null: the daemon's own key); shown to admin keys only. */
  owner?: string | null;
}

const secretPath = (ref: string) => `/v1/secrets/${encodeURIComponent(ref)}`;

/**
 * Secrets (docs/secrets.md): values a sandbox's requests will carry without the sandbox, or
 * anyone, reading them back. A value is write-only: `create` and `update` take it, and nothing
 * answers it again. Each belongs to the API key that made it; a new value is the next version.
 * `secret` below is a name (any case) or an id (`sec_…`).
 *
 * @example
 * const key = await readFile('openai.key', 'utf8');
 * await Secret.create('openai', key, { metadata: { team: 'ml' } });
 * await Secret.update('openai', rotatedKey); // version 2, used from the next request on
 */
export class Secret {
  private constructor() {}

  /**
   * Makes a secret at version 1. A name is 1 to 64 letters, digits, `_`, `-` and `.` (kept
   * lower-case); a value 1 byte to 64 KiB. A name taken already is a SecretConflictError.
   */
  static async create(
    name: string,
    value: string,
    options: ConnectionOptions & { metadata?: Record<string, string> } = {},
  ): Promise<SecretInfo> {
    const { metadata, ...connection } = options;
    const { client } = await openControl(connection);
    return client.json<SecretInfo>('POST', '/v1/secrets', {
      body: { name, value, ...(metadata === undefined ? {} : { metadata }) },
    });
  }

  /**
   * A new value: the secret's next version, used from the next request on. `metadata`, when
   * given, replaces its metadata. SecretNotFoundError when there is none (or it is another key's).
   */
  static async update(
    secret: string,
    value: string,
    options: ConnectionOptions & { metadata?: Record<string, string> } = {},
  ): Promise<SecretInfo> {
    const { metadata, ...connection } = options;
    const { client } = await openControl(connection);
    return client.json<SecretInfo>('POST', secretPath(secret), {
      body: { value, ...(metadata === undefined ? {} : { metadata }) },
    });
  }

  /** Replaces a secret's metadata only (its value and version stay). */
  static async setMetadata(
    secret: string,
    metadata: Record<string, string>,
    options: ConnectionOptions = {},
  ): Promise<SecretInfo> {
    const { client } = await openControl(options);
    return client.json<SecretInfo>('POST', secretPath(secret), { body: { metadata } });
  }

  /** A secret's name, version, metadata and times; SecretNotFoundError when there is none. */
  static async getInfo(secret: string, options: ConnectionOptions = {}): Promise<SecretInfo> {
    const { client } = await openControl(options);
    return client.json<SecretInfo>('GET', secretPath(secret));
  }

  /** The caller's secrets (an admin key's: every key's), by name. */
  static async list(options: ConnectionOptions = {}): Promise<SecretInfo[]> {
    const { client } = await openControl(options);
    return (await client.json<{ secrets: SecretInfo[] }>('GET', '/v1/secrets')).secrets;
  }

  /** Whether the caller has a secret of that name or id. */
  static async exists(secret: string, options: ConnectionOptions = {}): Promise<boolean> {
    try {
      await Secret.getInfo(secret, options);
      return true;
    } catch (error) {
      if (error instanceof SecretNotFoundError) return false;
      throw error;
    }
  }

  /** Removes a secret and every version of its value; false when there was none. */
  static async destroy(secret: string, options: ConnectionOptions = {}): Promise<boolean> {
    const { client } = await openControl(options);
    try {
      return (await client.json<{ removed: boolean }>('DELETE', secretPath(secret))).removed;
    } catch (error) {
      if (error instanceof SecretNotFoundError) return false;
      throw error;
    }
  }
}
