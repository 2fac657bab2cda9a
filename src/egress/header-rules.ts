import { canonicalName, PolicyError } from './policy.js';

/**
 * Per-host rules on egress (issue 45), E2B's `network.rules` shape: a host (an exact domain name
 * or a `*.` wildcard) to an ordered list of rules, each of which may set request headers. Values
 * hold placeholders (`${secrets.NAME}`, or E2B's `${e2b.secrets.NAME}`), never secret values:
 * egress resolves them as a request leaves, into that request only. The rules are kept with the
 * policy in the registry and shown in the sandbox's info as written.
 *
 * The data says nothing about the scheme: plain HTTP gets its headers from the proxy now, and
 * HTTPS (TLS terminated with a per-daemon CA, for hosts with rules only) will read the same
 * rules; until then a TLS connection to a host with rules is refused (service.ts).
 */
export interface HeaderTransform {
  headers?: Record<string, string>;
}

export interface HostRule {
  transform?: HeaderTransform;
}

export type HostRules = Record<string, HostRule[]>;

/** Most hosts a policy's rules may name, rules per host and headers per rule. */
export const MAX_RULE_HOSTS = 64;
export const MAX_RULES_PER_HOST = 16;
export const MAX_RULE_HEADERS = 32;
/** Longest header value a rule may set, placeholders unresolved. */
export const MAX_RULE_VALUE = 8192;

/** A placeholder: `${secrets.NAME}` or `${e2b.secrets.NAME}` (a secret's name, as secrets.md). */
const PLACEHOLDER = /\$\{(?:e2b\.)?secrets\.([A-Za-z0-9][A-Za-z0-9_.-]{0,63})\}/g;
/** What looks like a placeholder of ours or E2B's, valid or not: checked when rules are set. */
const PLACEHOLDER_LIKE = /\$\{(?:e2b\.|secrets\.)[^}]*\}?/g;
/** RFC 9110 token: a header name. */
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** Headers the proxy itself decides (framing, routing, hop-by-hop): a rule may not set them. */
const RESERVED = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'upgrade',
  'te',
  'trailer',
  'keep-alive',
  'proxy-connection',
  'proxy-authorization',
  'proxy-authenticate',
]);

/**
 * Checks `network.rules` and writes it canonically (hosts lower-case, without a trailing dot);
 * throws a PolicyError naming the first bad part. An empty object is no rules (undefined).
 */
export function parseHostRules(value: unknown, where = 'network.rules'): HostRules | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw new PolicyError(
      `${where} must be an object of host → [{ transform: { headers: { Name: 'value' } } }]`,
    );
  }
  const entries = Object.entries(value as Record<string, unknown>);
  if (entries.length > MAX_RULE_HOSTS) {
    throw new PolicyError(`${where} names ${entries.length} hosts; at most ${MAX_RULE_HOSTS}`);
  }
  const out: HostRules = {};
  for (const [hostText, list] of entries) {
    const host = ruleHost(hostText);
    if (!host) {
      throw new PolicyError(
        `${where}: '${hostText}' is not a domain name or a *.domain wildcard (rules name hosts, not addresses)`,
      );
    }
    if (out[host]) throw new PolicyError(`${where} names ${host} twice`);
    const at = `${where}['${host}']`;
    if (!Array.isArray(list)) throw new PolicyError(`${at} must be an array of rules`);
    if (list.length > MAX_RULES_PER_HOST) {
      throw new PolicyError(`${at} has ${list.length} rules; at most ${MAX_RULES_PER_HOST}`);
    }
    out[host] = list.map((rule, i) => parseRule(rule, `${at}[${i}]`));
  }
  return Object.keys(out).length > 0 ? out : undefined;
}

function ruleHost(text: string): string | undefined {
  if (text.startsWith('*.')) {
    const suffix = canonicalName(text.slice(2));
    return suffix ? `*.${suffix}` : undefined;
  }
  return canonicalName(text);
}

function parseRule(rule: unknown, at: string): HostRule {
  if (!rule || typeof rule !== 'object' || Array.isArray(rule)) {
    throw new PolicyError(`${at} must be an object { transform?: { headers? } }`);
  }
  const { transform, ...rest } = rule as Record<string, unknown>;
  const other = Object.keys(rest)[0];
  if (other) throw new PolicyError(`${at}.${other} is not a rule key (transform)`);
  if (transform === undefined || transform === null) return {};
  if (typeof transform !== 'object' || Array.isArray(transform)) {
    throw new PolicyError(`${at}.transform must be an object { headers? }`);
  }
  const { headers, ...more } = transform as Record<string, unknown>;
  const extra = Object.keys(more)[0];
  if (extra) throw new PolicyError(`${at}.transform.${extra} is not supported (headers)`);
  if (headers === undefined || headers === null) return { transform: {} };
  if (typeof headers !== 'object' || Array.isArray(headers)) {
    throw new PolicyError(`${at}.transform.headers must be an object of header name → value`);
  }
  const pairs = Object.entries(headers as Record<string, unknown>);
  if (pairs.length > MAX_RULE_HEADERS) {
    throw new PolicyError(
      `${at}.transform.headers has ${pairs.length} headers; at most ${MAX_RULE_HEADERS}`,
    );
  }
  const out: Record<string, string> = {};
  for (const [name, text] of pairs) {
    const where = `${at}.transform.headers['${name}']`;
    if (!TOKEN.test(name)) throw new PolicyError(`${where}: '${name}' is not a header name`);
    if (RESERVED.has(name.toLowerCase())) {
      throw new PolicyError(`${where}: ${name} is set by the proxy itself; a rule cannot set it`);
    }
    if (typeof text !== 'string') throw new PolicyError(`${where} must be a string`);
    if (Buffer.byteLength(text) > MAX_RULE_VALUE) {
      throw new PolicyError(`${where} is over ${MAX_RULE_VALUE} bytes`);
    }
    // Header values are visible ASCII, space and tab (and obs-text); never CR, LF or NUL.
    if (/[^\t\x20-\x7e\x80-\xff]/.test(text)) {
      throw new PolicyError(`${where} holds a character a header value cannot (CR, LF, NUL…)`);
    }
    // A misspelt placeholder would go out as its literal text: refused here instead.
    for (const like of text.match(PLACEHOLDER_LIKE) ?? []) {
      if (!new RegExp(`^${PLACEHOLDER.source}$`).test(like)) {
        throw new PolicyError(
          `${where}: '${like}' is not a placeholder abx resolves: \${secrets.NAME} or \${e2b.secrets.NAME}, NAME a secret's name (workload identity tokens are not supported)`,
        );
      }
    }
    out[name] = text;
  }
  return { transform: { headers: out } };
}

/**
 * The rules for a request to `name` (canonical): an exact entry first, else the longest wildcard
 * suffix that matches (a wildcard names subdomains, not the domain itself); never merged, as E2B.
 */
export function rulesFor(rules: HostRules | undefined, name: string): HostRule[] | undefined {
  if (!rules) return undefined;
  const exact = rules[name];
  if (exact) return exact;
  let best: string | undefined;
  for (const host of Object.keys(rules)) {
    if (host.startsWith('*.') && name.endsWith(host.slice(1))) {
      if (!best || host.length > best.length) best = host;
    }
  }
  return best ? rules[best] : undefined;
}

/** The secret names a host's rules refer to, lower-case, each once. */
export function placeholderNames(rules: HostRule[]): string[] {
  const names = new Set<string>();
  for (const rule of rules) {
    for (const value of Object.values(rule.transform?.headers ?? {})) {
      for (const match of value.matchAll(PLACEHOLDER))
        names.add((match[1] as string).toLowerCase());
    }
  }
  return [...names];
}

/**
 * The headers a host's rules set, their placeholders replaced with `values` (by lower-case
 * name), in one pass: a value that holds placeholder text is not resolved again. A later rule's
 * header replaces an earlier one's of the same name (case-insensitive). Keys are lower-case.
 */
export function ruleHeaders(
  rules: HostRule[],
  values: ReadonlyMap<string, string>,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const rule of rules) {
    for (const [name, text] of Object.entries(rule.transform?.headers ?? {})) {
      out[name.toLowerCase()] = text.replace(
        PLACEHOLDER,
        (_whole, secret: string) => values.get(secret.toLowerCase()) ?? '',
      );
    }
  }
  return out;
}
