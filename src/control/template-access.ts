/**
 * Who may do what with a template: the one decision `/v1`, the SDK and CLI (through `/v1`) and
 * E2B's control API (snapshots, `DELETE /templates/{id}`) all go through, in TemplateService.
 *
 * - A template is **shared** (the catalogue: what admin keys build, `base`, every template made
 *   before templates had owners, and what an admin publishes) or **private** to the key that
 *   built it or took it as a snapshot.
 * - `use` (list it, read it, create a sandbox from it): a shared template, any key; a private
 *   one, its owner and admin keys. To every other key a private template answers exactly as a
 *   name that does not exist.
 * - `replace` (a rebuild, a snapshot of the same name) and `remove`: admin keys any template;
 *   another key only its own private ones (a shared one is the catalogue's, curated by admins).
 * - `publish` (into the catalogue, or back out of it): admin keys only.
 */

/** Who asks: a key's id (null: the daemon's own key) and whether it is an admin key. */
export interface TemplatePrincipal {
  keyId: string | null;
  admin: boolean;
  /** The key's name, for messages. */
  name?: string;
}

/** What a template's access depends on. */
export interface TemplateOwnership {
  owner: string | null;
  shared: boolean;
}

export type TemplateAction = 'use' | 'replace' | 'remove' | 'publish';

/**
 * What `who` may do with `template`: `allowed`; `hidden` (answer as an unknown name: the caller
 * may not know it exists); or `admin_required` (it may see it, not change it).
 */
export function templateAccess(
  who: TemplatePrincipal,
  template: TemplateOwnership,
  action: TemplateAction,
): 'allowed' | 'hidden' | 'admin_required' {
  if (who.admin) return 'allowed';
  const own = !template.shared && who.keyId !== null && template.owner === who.keyId;
  if (!template.shared && !own) return 'hidden';
  if (action === 'use') return 'allowed';
  if (action === 'publish') return 'admin_required';
  return own ? 'allowed' : 'admin_required';
}

/** The daemon's own work (the warm pool, adoption, a resume): no key asks, nothing is hidden. */
export const DAEMON: TemplatePrincipal = { keyId: null, admin: true };
