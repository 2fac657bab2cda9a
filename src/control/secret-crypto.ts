/**
 * How secrets are kept at rest: AES-256-GCM (node:crypto), a random 12-byte IV per version, and
 * the secret's id, name and version as associated data, so a sealed value copied onto another
 * secret, name or version fails to open instead of answering another secret's value.
 *
 * The key is 32 bytes: the operator's (`ABX_SECRETS_KEY`, or the daemon's `secretsKey` option),
 * else `$ABX_HOME/secrets-key` (mode 0600), made on the daemon's first start. Daemons sharing a
 * PostgreSQL registry must all have the same key (docs/registry.md).
 */

import { createCipheriv, createDecipheriv, createHmac, randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';

const IV_BYTES = 12;
const TAG_BYTES = 16;
export const SECRETS_KEY_BYTES = 32;

/** The key secrets are sealed with, and where it came from (for messages; never the key). */
export interface SecretsKey {
  key: Buffer;
  /** `ABX_SECRETS_KEY`, `the secretsKey option`, or the file's path. */
  source: string;
  /** A check value of the key (see {@link keyCheck}). */
  check: string;
}

/**
 * 32 bytes from their text form: 64 hex digits, or base64 / base64url of 32 bytes (what
 * `openssl rand -base64 32` prints, and what the key file holds).
 */
export function parseSecretsKey(text: string, source: string): Buffer {
  const trimmed = text.trim();
  const key = /^[0-9a-fA-F]{64}$/.test(trimmed)
    ? Buffer.from(trimmed, 'hex')
    : /^[A-Za-z0-9+/_-]{43}=?$/.test(trimmed)
      ? Buffer.from(trimmed.replace(/\+/g, '-').replace(/\//g, '_').replace(/=$/, ''), 'base64url')
      : undefined;
  if (key?.length !== SECRETS_KEY_BYTES) {
    // Never echo the text: it is (meant to be) a key.
    throw new Error(
      `${source} is not a secrets key: it must be 32 bytes as 64 hex digits or as base64 (openssl rand -base64 32)`,
    );
  }
  return key;
}

/**
 * A check value of `key`: what the registry keeps beside each sealed version, so a daemon can
 * tell that versions were sealed with another key (an HMAC, from which the key cannot be had).
 */
export function keyCheck(key: Buffer): string {
  return createHmac('sha256', key).update('abx secrets key check').digest('hex').slice(0, 32);
}

/**
 * The operator's key (`option`, else `ABX_SECRETS_KEY`), else the one in `file`, made (mode
 * 0600, 32 random bytes) when there is none.
 */
export function loadSecretsKey(
  file: string,
  option?: string,
  env: NodeJS.ProcessEnv = process.env,
): SecretsKey {
  const given =
    option !== undefined
      ? { text: option, source: 'the secretsKey option' }
      : env.ABX_SECRETS_KEY
        ? { text: env.ABX_SECRETS_KEY, source: 'ABX_SECRETS_KEY' }
        : undefined;
  if (given) {
    const key = parseSecretsKey(given.text, given.source);
    return { key, source: given.source, check: keyCheck(key) };
  }
  if (!existsSync(file)) {
    mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
    try {
      writeFileSync(file, `${randomBytes(SECRETS_KEY_BYTES).toString('base64url')}\n`, {
        mode: 0o600,
        flag: 'wx',
      });
      chmodSync(file, 0o600);
    } catch (error) {
      // Another process made it first: use theirs.
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    }
  }
  const key = parseSecretsKey(readFileSync(file, 'utf8'), file);
  return { key, source: file, check: keyCheck(key) };
}

/** What a sealed value is bound to: opening it as anything else fails. */
export interface SealedFor {
  id: string;
  name: string;
  version: number;
}

function associatedData(at: SealedFor): Buffer {
  // JSON: no choice of id and name can make two different triples give the same bytes.
  return Buffer.from(JSON.stringify(['abx secret v1', at.id, at.name, at.version]));
}

/** `value` sealed for `at`: base64 of IV, ciphertext and tag. */
export function sealSecret(key: Buffer, at: SealedFor, value: string): string {
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv('aes-256-gcm', key, iv);
  cipher.setAAD(associatedData(at));
  const body = Buffer.concat([cipher.update(value, 'utf8'), cipher.final()]);
  return Buffer.concat([iv, body, cipher.getAuthTag()]).toString('base64');
}

/**
 * The value sealed for `at`; throws when it was sealed with another key or for another secret,
 * name or version, or was altered (the message never holds any of the value).
 */
export function openSecret(key: Buffer, at: SealedFor, sealed: string): string {
  const bytes = Buffer.from(sealed, 'base64');
  if (bytes.length < IV_BYTES + TAG_BYTES) {
    throw new Error(`the stored version ${at.version} of secret ${at.name} is damaged`);
  }
  const decipher = createDecipheriv('aes-256-gcm', key, bytes.subarray(0, IV_BYTES));
  decipher.setAAD(associatedData(at));
  decipher.setAuthTag(bytes.subarray(bytes.length - TAG_BYTES));
  try {
    return Buffer.concat([
      decipher.update(bytes.subarray(IV_BYTES, bytes.length - TAG_BYTES)),
      decipher.final(),
    ]).toString('utf8');
  } catch {
    throw new Error(
      `version ${at.version} of secret ${at.name} does not open with this daemon's secrets key: it was sealed with another key or for another secret`,
    );
  }
}
