import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';

/** A secret of the installation (API key, token secret), created (mode 0600) on first use. */
export function readOrCreateSecret(file: string): string {
  if (existsSync(file)) return readFileSync(file, 'utf8').trim();
  mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
  const secret = newToken();
  try {
    writeFileSync(file, `${secret}\n`, { mode: 0o600, flag: 'wx' });
  } catch (error) {
    // Another process created it first: use theirs.
    if ((error as NodeJS.ErrnoException).code === 'EEXIST')
      return readFileSync(file, 'utf8').trim();
    throw error;
  }
  chmodSync(file, 0o600);
  return secret;
}

/**
 * A secret token: 32 random bytes, base64url. node:crypto is taken when one is made, not when
 * this module loads: loading it costs a CLI command that reads the secrets only (`abx list`).
 */
export function newToken(): string {
  return process.getBuiltinModule('node:crypto').randomBytes(32).toString('base64url');
}
