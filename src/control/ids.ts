import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

const ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';

/** A sandbox id: 16 lowercase letters and digits, so it fits in a host name label. */
export function newSandboxId(): string {
  const bytes = randomBytes(16);
  let id = 'i';
  for (let i = 1; i < 16; i++) id += ALPHABET[(bytes[i] as number) % ALPHABET.length];
  return id;
}

export { newToken } from '../installation/secrets.js';

export function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

/** Compares a presented token with a stored hash in constant time. */
export function tokenMatches(token: string | undefined, hash: string): boolean {
  if (!token) return false;
  const a = Buffer.from(hashToken(token), 'hex');
  const b = Buffer.from(hash, 'hex');
  return a.length === b.length && timingSafeEqual(a, b);
}

/** Who a sandbox token is for: its users (`access`) or the control plane (`control`). */
export type TokenKind = 'access' | 'control';

/**
 * A sandbox's token, derived from the installation's secret and the sandbox id. The registry
 * stores only the access token's hash, yet the daemon can hand it again to an API-key holder
 * that connects to the sandbox by id from another process. The control token (every envd route,
 * whatever the template's capabilities) never leaves the daemon.
 */
export function sandboxToken(
  secret: string,
  sandboxId: string,
  kind: TokenKind = 'access',
): string {
  const label = kind === 'access' ? 'sandbox' : 'control';
  return createHmac('sha256', secret).update(`${label}:${sandboxId}`).digest('base64url');
}

/**
 * A volume's content token (E2B's volume content API takes it as `Authorization: Bearer`),
 * derived like a sandbox's from the installation's secret and the volume id: nothing is stored,
 * and it ends with the volume.
 */
export function volumeToken(secret: string, volumeId: string): string {
  return createHmac('sha256', secret).update(`volume:${volumeId}`).digest('base64url');
}
