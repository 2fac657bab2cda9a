/**
 * Who may do what with a secret: the one decision `/v1/secrets`, the SDK and CLI (through
 * `/v1`), the dashboard and E2B's `/secrets` all go through, in SecretService.
 *
 * - A secret belongs to the key that made it (the daemon's own key: `null`). Its owner reads its
 *   name and metadata, changes its value and metadata, and removes it; admin keys do all of that
 *   to every key's secrets. To every other key a secret answers exactly as a name or id that
 *   does not exist (404): it may not learn that the name is taken by someone else.
 * - A name is looked up among the caller's own secrets (names are unique per key, so two keys
 *   may both have `openai`); an admin reaches another key's secret by its id (`sec_…`), which
 *   its list shows with the owner.
 * - Nobody reads a value: no route answers one. Only the daemon resolves one, for the key that
 *   owns it (SecretService.resolve, the egress proxy's).
 */

/** Who asks: a key's id (null: the daemon's own key) and whether it is an admin key. */
export interface SecretPrincipal {
  keyId: string | null;
  admin: boolean;
}

/** `allowed`, or `hidden`: answer as for a secret that does not exist. */
export function secretAccess(
  who: SecretPrincipal,
  secret: { owner: string | null },
): 'allowed' | 'hidden' {
  if (who.admin) return 'allowed';
  return secret.owner === who.keyId ? 'allowed' : 'hidden';
}

/** Whose secrets a list shows: every key's for an admin (undefined), else the caller's own. */
export function secretListScope(who: SecretPrincipal): string | null | undefined {
  return who.admin ? undefined : who.keyId;
}
