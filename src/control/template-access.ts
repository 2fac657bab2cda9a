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
 * - What a template may *say* (templateBuildRefusals): what reaches past its sandboxes into the
 *   daemon's host — the host's network, files of the host copied in (`copy` steps), a
 *   `dockerfile` on the host, where its pods run (`kubernetes`), another template's built image
 *   (which may be another key's snapshot) — only an admin key builds; a key builds on the image of
 *   a template it may use only when it names that template (E2B's `fromTemplate`). A
 *   key's own build also runs its setup steps on the template's own network (its egress policy),
 *   never the host's (templateBuildNetwork).
 */
import { resolve } from 'node:path';

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

/** What of a template's definition a build looks at here. */
export interface BuildableTemplate {
  network: 'none' | 'host' | 'internet';
  image?: string;
  dockerfile?: string;
  setup: readonly ({ copy: string } | { run: string })[];
  kubernetes?: unknown;
}

/**
 * Why `who` may not build `template` (none: it may): each a part of the definition that reaches
 * into the daemon's host, which only an admin key may give a template.
 */
export function templateBuildRefusals(
  who: TemplatePrincipal,
  template: BuildableTemplate,
  /**
   * A folder of files the key itself uploaded for this build (E2B's template files, extracted by
   * the daemon): copy steps from inside it copy the key's own files, not the host's.
   */
  uploaded?: string,
  /** The image of the template the build names as its base, which `who` may use (checked). */
  baseImage?: string,
): string[] {
  if (who.admin) return [];
  const refusals: string[] = [];
  if (template.network === 'host') refusals.push("network: host (the daemon host's own network)");
  // Template builds are images of their own (abx-template/NAME:TIME on the engine,
  // REGISTRY/abx-template-NAME:HASH pushed): another key's private snapshot among them.
  if (
    template.image !== undefined &&
    template.image !== baseImage &&
    /(^|\/)abx-template[/-]/.test(template.image)
  ) {
    refusals.push(
      `image: ${template.image} (a template's own build; start from that template instead)`,
    );
  }
  if (template.dockerfile !== undefined) {
    refusals.push("dockerfile: (a file on the daemon's host; use image:)");
  }
  const own = (path: string) =>
    uploaded !== undefined && resolve(path).startsWith(`${resolve(uploaded)}/`);
  if (template.setup.some((step) => 'copy' in step && !own(step.copy))) {
    refusals.push("setup copy steps (they copy files of the daemon's host; use run steps)");
  }
  if (template.kubernetes !== undefined) refusals.push('kubernetes: (where its pods run)');
  return refusals;
}

/**
 * The network a build's setup steps run on: an admin key's, the host's (setup steps usually
 * download things); another key's, the template's own, as its sandboxes get it.
 */
export function templateBuildNetwork(who: TemplatePrincipal): 'host' | 'template' {
  return who.admin ? 'host' : 'template';
}

/** The daemon's own work (the warm pool, adoption, a resume): no key asks, nothing is hidden. */
export const DAEMON: TemplatePrincipal = { keyId: null, admin: true };
