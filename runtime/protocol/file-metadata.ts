/**
 * User metadata of files (`X-Metadata-<key>: <value>` on a write, `metadata` on stat and list
 * answers), checked as E2B's envd checks it. Both sides import it: envd, which keeps the
 * metadata, and the gateway's E2B face, which refuses a bad set before any byte is written.
 * Built-ins only (none needed).
 */

/** The request-header prefix that carries one metadata entry, as in E2B's envd. */
export const METADATA_HEADER_PREFIX = 'x-metadata-';

/**
 * E2B keeps each entry as the xattr `user.e2b.<key>`; its limits are counted on that name, and
 * so are abx's, so that a set one accepts the other does too.
 */
const XATTR_PREFIX_BYTES = 'user.e2b.'.length;

/** The longest key: Linux's 255-byte xattr name, less E2B's prefix. */
export const MAX_METADATA_KEY_BYTES = 255 - XATTR_PREFIX_BYTES;

/**
 * The most one file may carry: the sum over its entries of `user.e2b.` + key + value (E2B's
 * bound: one ext4 block).
 */
export const MAX_METADATA_BYTES = 4096;

/** A key: an HTTP token (what a header name can be), as the E2B SDK checks it. */
const KEY = /^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$/;
/** A value: printable US-ASCII, as E2B's envd checks it. */
const VALUE = /^[\x20-\x7e]*$/;

/** A metadata set that cannot be kept: the message says what and which limit. */
export class MetadataError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'MetadataError';
  }
}

const quoted = (text: string) => JSON.stringify(text.length > 64 ? `${text.slice(0, 64)}…` : text);

/** What a metadata set counts against {@link MAX_METADATA_BYTES}. */
export function metadataBytes(metadata: Record<string, string>): number {
  let total = 0;
  for (const [key, value] of Object.entries(metadata)) {
    total += XATTR_PREFIX_BYTES + Buffer.byteLength(key) + Buffer.byteLength(value);
  }
  return total;
}

/**
 * Checks a metadata set (keys already lowercased, as HTTP gives them): HTTP-token keys of at most
 * {@link MAX_METADATA_KEY_BYTES}, printable-ASCII values, at most {@link MAX_METADATA_BYTES} in
 * all. Throws a {@link MetadataError} naming the first fault.
 */
export function checkMetadata(metadata: Record<string, string>): Record<string, string> {
  for (const [key, value] of Object.entries(metadata)) {
    if (!KEY.test(key)) {
      throw new MetadataError(
        `metadata key ${quoted(key)} is not an HTTP token: use letters, digits and !#$%&'*+-.^_\`|~`,
      );
    }
    if (key.length > MAX_METADATA_KEY_BYTES) {
      throw new MetadataError(
        `metadata key ${quoted(key)} is ${key.length} bytes, over the limit of ${MAX_METADATA_KEY_BYTES}`,
      );
    }
    if (typeof value !== 'string' || !VALUE.test(value)) {
      throw new MetadataError(
        `metadata value for key ${quoted(key)} is not printable US-ASCII (0x20-0x7e)`,
      );
    }
  }
  const total = metadataBytes(metadata);
  if (total > MAX_METADATA_BYTES) {
    throw new MetadataError(
      `metadata of ${total} bytes is over the limit of ${MAX_METADATA_BYTES} per file (each entry counts as 'user.e2b.' + key + value, as E2B counts it)`,
    );
  }
  return metadata;
}

/**
 * The metadata of a request's `X-Metadata-*` headers (names lowercased, as Node gives them), checked
 * with {@link checkMetadata}; `{}` when there are none. A header repeated keeps its first value,
 * as in E2B's envd; a header with an empty key is ignored, as there.
 */
export function metadataFromHeaders(
  headers: Iterable<[string, string | readonly string[] | undefined]>,
): Record<string, string> {
  const found = new Map<string, string>();
  for (const [name, raw] of headers) {
    const lower = name.toLowerCase();
    if (!lower.startsWith(METADATA_HEADER_PREFIX)) continue;
    const key = lower.slice(METADATA_HEADER_PREFIX.length);
    const value = typeof raw === 'string' ? raw : raw?.[0];
    if (key === '' || value === undefined || found.has(key)) continue;
    found.set(key, value);
  }
  // fromEntries defines own properties: a key `__proto__` is a key like any other.
  return checkMetadata(Object.fromEntries(found));
}

/** `X-Metadata-*` request headers carrying `metadata`. */
export function metadataHeaders(
  metadata: Record<string, string> | undefined,
): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const [key, value] of Object.entries(metadata ?? {})) {
    headers[`${METADATA_HEADER_PREFIX}${key}`] = value;
  }
  return headers;
}
