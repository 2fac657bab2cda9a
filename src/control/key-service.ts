import { randomBytes } from 'node:crypto';
import type { ApiKeyInfo } from '../../runtime/protocol/wire.js';
import {
  AuthenticationError,
  InvalidArgumentError,
  NotFoundError,
  PermissionDeniedError,
} from '../errors.js';
import { hashToken, tokenMatches } from './ids.js';
import type { ApiKeyRecord, Registry } from './registry.js';
import type { KeyOwner } from './sandbox-service.js';

/** Who sent an API request: the daemon's own key, or a key of the registry. */
export interface Caller {
  /** The key's id; null for the daemon's own key (`$ABX_HOME/api-key`). */
  keyId: string | null;
  name: string;
  admin: boolean;
  /** The most sandboxes it may have running at once; null: no limit. */
  maxRunning: number | null;
}

/** The daemon's own key: an admin key that is no row of the registry. */
const BOOTSTRAP: Caller = { keyId: null, name: 'the daemon key', admin: true, maxRunning: null };

export function apiKeyJson(record: ApiKeyRecord & { running?: number }): ApiKeyInfo {
  const iso = (at: number | null) => (at === null ? null : new Date(at).toISOString());
  return {
    id: record.id,
    name: record.name,
    prefix: record.prefix,
    admin: record.admin,
    maxRunning: record.maxRunning,
    createdAt: new Date(record.createdAt).toISOString(),
    lastUsedAt: iso(record.lastUsedAt),
    revokedAt: iso(record.revokedAt),
    ...(record.running === undefined ? {} : { running: record.running }),
  };
}

/** What a key's name may be: what a list and a log show readably. */
const NAME = /^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$/;
/** The highest `maxRunning` a key may be given. */
const MAX_RUNNING_LIMIT = 100_000;
/** `lastUsedAt` is written at most this often per key and daemon: a list is not a log. */
const TOUCH_INTERVAL_MS = 60_000;

const ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';

/** `key_` and 12 letters and digits. */
function newKeyId(): string {
  const bytes = randomBytes(12);
  let id = 'key_';
  for (const byte of bytes) id += ALPHABET[byte % ALPHABET.length];
  return id;
}

/**
 * The control plane's API keys: the daemon's own key (`$ABX_HOME/api-key`, admin, per daemon)
 * and the keys in the registry (`abx keys create`), stored as SHA-256 hashes. Every request looks
 * its key up in the registry, uncached, so a revocation holds from the next request on, on every
 * replica sharing the database.
 */
export class KeyService {
  private readonly touched = new Map<string, number>();

  constructor(
    private readonly registry: Registry,
    /** SHA-256 of the daemon's own key. */
    private readonly bootstrapHash: string,
  ) {}

  /** The caller of a request with this `Authorization` header; AuthenticationError if none. */
  async authenticate(header: string | string[] | undefined): Promise<Caller> {
    const key = typeof header === 'string' ? /^Bearer (.+)$/i.exec(header)?.[1] : undefined;
    return this.authenticateKey(key, 'Authorization: Bearer <key>');
  }

  /**
   * The caller of a key however it was sent (`X-API-KEY` for E2B's API); AuthenticationError if
   * none. `how` says in the error how to send one.
   */
  async authenticateKey(key: string | undefined, how: string): Promise<Caller> {
    if (tokenMatches(key, this.bootstrapHash)) return BOOTSTRAP;
    // The lookup by hash leaks nothing useful through timing: the hash of a key nobody has.
    const record =
      key?.startsWith('abx_') || key?.startsWith('e2b_')
        ? await this.registry.findApiKey(hashToken(key))
        : undefined;
    if (!record || !tokenMatches(key, record.keyHash)) {
      throw new AuthenticationError(
        // Said to whoever asks, signed in or not: nothing about the host (the CLI says where the
        // local key lives).
        `missing or wrong API key: send ${how} with a key of this control plane (abx keys create makes one)`,
      );
    }
    if (record.revokedAt !== null) {
      throw new AuthenticationError(
        `the API key '${record.name}' (${record.id}, ${record.prefix}…) was revoked at ${new Date(record.revokedAt).toISOString()}: ask an admin of the control plane for a new key (abx keys create)`,
        { code: 'key_revoked' },
      );
    }
    this.touch(record.id);
    return {
      keyId: record.id,
      name: record.name,
      admin: record.admin,
      maxRunning: record.maxRunning,
    };
  }

  /**
   * The key `id` as a sandbox's owner (its limit of running sandboxes), for a resume no key asked
   * for (a request's traffic); undefined when it is gone.
   */
  async ownerOf(id: string): Promise<KeyOwner | undefined> {
    const record = await this.registry.getApiKey(id);
    return (
      record && {
        keyId: record.id,
        name: record.name,
        maxRunning: record.maxRunning,
        admin: record.admin,
      }
    );
  }

  /** Records the use, at most once a minute per key; a failure to record it fails nothing. */
  private touch(id: string): void {
    const now = Date.now();
    if (now - (this.touched.get(id) ?? 0) < TOUCH_INTERVAL_MS) return;
    if (this.touched.size > 10_000) this.touched.clear();
    this.touched.set(id, now);
    this.registry.touchApiKey(id, now).catch(() => undefined);
  }

  /** Refuses a caller that is not an admin, naming what it tried. */
  requireAdmin(caller: Caller, what: string): void {
    if (caller.admin) return;
    throw new PermissionDeniedError(
      `${what} needs an admin API key, and the key '${caller.name}' (${caller.keyId}) is not one: ask an admin of the control plane (abx keys create --admin makes one)`,
      { code: 'admin_required' },
    );
  }

  /** Makes a key; the answer holds the key itself, which is never shown again. */
  async create(request: {
    name: string;
    admin: boolean;
    maxRunning: number | null;
    /** `abx` (default): `abx_` and base64url; `e2b`: `e2b_` and hex, the form E2B's SDKs check for. */
    format?: string;
  }): Promise<ApiKeyInfo & { key: string }> {
    const { name, admin, maxRunning, format = 'abx' } = request;
    if (format !== 'abx' && format !== 'e2b') {
      throw new InvalidArgumentError(
        `format must be abx (abx_ and base64url, the default) or e2b (e2b_ and hex, which E2B's SDKs accept as E2B_API_KEY), not ${JSON.stringify(format)}`,
      );
    }
    if (!NAME.test(name)) {
      throw new InvalidArgumentError(
        `name must be 1 to 64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit, not ${JSON.stringify(name)}`,
      );
    }
    if (
      maxRunning !== null &&
      (!Number.isSafeInteger(maxRunning) || maxRunning < 1 || maxRunning > MAX_RUNNING_LIMIT)
    ) {
      throw new InvalidArgumentError(
        `maxRunning must be a whole number from 1 to ${MAX_RUNNING_LIMIT} (or absent: no limit), not ${JSON.stringify(maxRunning)}`,
      );
    }
    // 32 random bytes either way; only the spelling differs. Both are looked up by their hash.
    const key =
      format === 'e2b'
        ? `e2b_${randomBytes(32).toString('hex')}`
        : `abx_${randomBytes(32).toString('base64url')}`;
    const record: ApiKeyRecord = {
      id: newKeyId(),
      name,
      prefix: key.slice(0, 10),
      keyHash: hashToken(key),
      admin,
      maxRunning,
      createdAt: Date.now(),
      lastUsedAt: null,
      revokedAt: null,
    };
    if (!(await this.registry.insertApiKey(record))) {
      throw new InvalidArgumentError(
        `an API key named '${name}' exists already (abx keys list): choose another name, or revoke that key first (abx keys revoke ID)`,
        { code: 'duplicate_name' },
      );
    }
    return { key, ...apiKeyJson(record) };
  }

  /** One key by its id (never the key itself); undefined when there is none. */
  async get(id: string): Promise<ApiKeyInfo | undefined> {
    const record = await this.registry.getApiKey(id);
    return record && apiKeyJson(record);
  }

  async list(): Promise<ApiKeyInfo[]> {
    return (await this.registry.listApiKeys()).map(apiKeyJson);
  }

  /** Revokes a key; `revoked` is false when it was revoked before (its first time stays). */
  async revoke(id: string): Promise<{ revoked: boolean; key: ApiKeyInfo }> {
    const now = Date.now();
    const record = await this.registry.revokeApiKey(id, now);
    if (!record) {
      throw new NotFoundError(
        `no API key has the id ${JSON.stringify(id)}: abx keys list shows the ids (key_…)`,
      );
    }
    return { revoked: record.revokedAt === now, key: apiKeyJson(record) };
  }
}
