import { InvalidArgumentError } from '../../errors.js';

/** Docker Hub, where a reference without a registry host goes. */
export const DOCKER_HUB = 'docker.io';

/** A reference split as a registry sees it. */
export interface ImageReference {
  /** The registry's host (and port): `registry.example:5000`, or {@link DOCKER_HUB}. */
  registry: string;
  /** The repository as written, registry included when given (`registry.example/team/abx`). */
  repository: string;
  /** The tag, when the reference has one. */
  tag?: string;
}

// distribution/reference's grammar (reference/regexp.go), without digests: a push names a tag.
const DOMAIN_COMPONENT = '(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])';
const DOMAIN = `${DOMAIN_COMPONENT}(?:\\.${DOMAIN_COMPONENT})*(?::[0-9]+)?`;
const PATH_COMPONENT = '[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*';
const TAG = /^[\w][\w.-]{0,127}$/;
const DOMAIN_RE = new RegExp(`^${DOMAIN}$`);
const PATH_RE = new RegExp(`^${PATH_COMPONENT}(?:/${PATH_COMPONENT})*$`);

/** `repo:tag` split at the last colon that is not part of a registry's port; default `latest`. */
export function splitTag(reference: string): { repo: string; tag: string } {
  const at = reference.lastIndexOf(':');
  if (at > reference.lastIndexOf('/')) {
    return { repo: reference.slice(0, at), tag: reference.slice(at + 1) };
  }
  return { repo: reference, tag: 'latest' };
}

/**
 * A name (a template's: letters of either case, digits, ".", "_", "-") as one repository path
 * component: lower-cased, each run of other characters one "-". `My_Template.2` → `my-template-2`.
 */
export function repositoryComponent(name: string): string {
  return (
    name
      .toLowerCase()
      .replace(/[^a-z0-9]+/g, '-')
      .replace(/^-+|-+$/g, '') || 'x'
  );
}

const EXAMPLE = 'such as registry.example:5000/team/abx-runtime:1.0';

/**
 * Parses `[registry[:port]/]path[:tag]` as Docker does; anything else (upper case in the path, a
 * digest, a scheme, spaces) is an InvalidArgumentError saying what `what` must look like.
 */
export function parseImageReference(reference: string, what = 'image reference'): ImageReference {
  const bad = (why: string) =>
    new InvalidArgumentError(
      `${what} ${JSON.stringify(reference)} is not valid: ${why}; give [REGISTRY[:PORT]/]REPOSITORY[:TAG], ${EXAMPLE}`,
    );
  if (/^[a-z]+:\/\//i.test(reference)) throw bad('no scheme (http:// or https://)');
  if (reference.includes('@')) throw bad('a digest cannot be pushed to; name a tag');
  const { repo, tag } = splitTag(reference);
  const tagged = repo !== reference;
  if (tagged && !TAG.test(tag)) {
    throw bad('a tag is letters, digits, "_", "." and "-" (128 at most, not starting with . or -)');
  }
  const slash = repo.indexOf('/');
  const first = slash < 0 ? '' : repo.slice(0, slash);
  // As Docker decides: the first part names a registry when it has a dot or a port, or is localhost.
  const hasRegistry = first !== '' && (/[.:]/.test(first) || first === 'localhost');
  const registry = hasRegistry ? first : DOCKER_HUB;
  const path = hasRegistry ? repo.slice(slash + 1) : repo;
  if (hasRegistry && !DOMAIN_RE.test(registry))
    throw bad(`registry ${registry} is not a host[:port]`);
  if (!PATH_RE.test(path)) {
    throw bad(
      'a repository is lower-case letters, digits and separators (".", "_", "-") in parts joined by "/"',
    );
  }
  if (repo.length > 255) throw bad('a repository is 255 characters at most');
  return { registry, repository: repo, ...(tagged ? { tag } : {}) };
}

/**
 * A registry (`host[:port]`) with an optional path prefix (`registry.example/team`), to which
 * repository names are appended: checked by parsing a reference under it.
 */
export function parseRegistryPrefix(prefix: string, what = 'image registry'): string {
  const trimmed = prefix.replace(/\/+$/, '');
  const bad = (why: string) =>
    new InvalidArgumentError(
      `${what} ${JSON.stringify(prefix)} is not valid: ${why}; give REGISTRY[:PORT][/PATH], such as registry.example:5000/sandboxes`,
    );
  if (/^[a-z]+:\/\//i.test(trimmed)) throw bad('no scheme (http:// or https://)');
  if (trimmed === '' || /[@\s]/.test(trimmed)) throw bad('it is empty or has "@" or spaces');
  const last = trimmed.lastIndexOf('/');
  if (last >= 0 && trimmed.lastIndexOf(':') > last) throw bad('a registry prefix has no tag');
  try {
    parseImageReference(`${trimmed}/x`, what);
  } catch (error) {
    throw bad((error as Error).message.replace(/^.*is not valid: |; give .*$/g, ''));
  }
  return trimmed;
}
