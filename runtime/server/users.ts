import { readFileSync } from 'node:fs';
import { NotFoundError, PermissionDeniedError } from './errors.js';

/** Who a process runs as: from the sandbox's own /etc/passwd. */
export interface Identity {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

/** The entry of `name` in /etc/passwd, if any. */
function passwdEntry(name: string): Identity | undefined {
  let text: string;
  try {
    text = readFileSync('/etc/passwd', 'utf8');
  } catch {
    return undefined;
  }
  for (const line of text.split('\n')) {
    const [user, , uid, gid, , home] = line.split(':');
    if (user === name && uid !== undefined && gid !== undefined) {
      return { name, uid: Number(uid), gid: Number(gid), home: home || '/' };
    }
  }
  return undefined;
}

/**
 * The identity to run a process as `user`, or undefined for "as this server". Only a server
 * running as root (envd in the throwaway sandbox of an image build) can run processes as another
 * user; anywhere else asking for one is refused, never silently ignored.
 */
export function identityFor(user: string | undefined): Identity | undefined {
  if (user === undefined) return undefined;
  const entry = passwdEntry(user);
  const self = process.getuid?.();
  if (entry && entry.uid === self) return undefined;
  if (self !== 0) {
    throw new PermissionDeniedError(
      `this sandbox runs as uid ${self}; it cannot run processes as ${user}`,
    );
  }
  if (!entry) {
    throw new NotFoundError(`no user ${JSON.stringify(user)} in this sandbox's /etc/passwd`);
  }
  return entry;
}

/** The spawn options and environment of an identity. */
export function spawnIdentity(identity: Identity | undefined): {
  uid?: number;
  gid?: number;
  env: Record<string, string>;
} {
  if (!identity) return { env: {} };
  return {
    uid: identity.uid,
    gid: identity.gid,
    env: { HOME: identity.home, USER: identity.name, LOGNAME: identity.name },
  };
}
