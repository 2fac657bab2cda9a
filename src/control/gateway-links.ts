import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import {
  AuthenticationError,
  BadRequestError,
  InvalidArgumentError,
  PermissionDeniedError,
} from '../errors.js';

/**
 * Browser access to a sandbox port without the sandbox's token in a URL that stays in history: a
 * holder of the token mints a one-time, short-lived link; the gateway answers the link by setting
 * an HttpOnly cookie for that sandbox port's own host name (`{port}-{id}.{domain}`) and
 * redirecting to the same path without it. Links and cookies are HMACs of the installation's
 * token secret, so every daemon sharing that secret checks them alike.
 */

/** The query parameter that carries a link on a sandbox host. */
export const LINK_PARAM = 'abx_link';
/** The dashboard's session cookie (src/control/dashboard.ts), set by the API's listener. */
export const DASHBOARD_COOKIE = 'abx_dashboard';

/** The cookie a redeemed link sets (host-only: it goes to that sandbox port's host alone). */
export const SESSION_COOKIE = 'abx_session';
/** How long a link can be redeemed by default, and at most. */
export const LINK_DEFAULT_MS = 60_000;
export const LINK_MAX_MS = 3_600_000;
/** How long the cookie a link sets lasts by default, and at most. */
export const SESSION_DEFAULT_MS = 3_600_000;
export const SESSION_MAX_MS = 86_400_000;

const ID = /^[a-z0-9-]{1,64}$/;
const MAC = /^[A-Za-z0-9_-]{43}$/;

function mac(secret: string, text: string): string {
  return createHmac('sha256', secret).update(text).digest('base64url');
}

function macMatches(given: string, expected: string): boolean {
  return MAC.test(given) && timingSafeEqual(Buffer.from(given), Buffer.from(expected));
}

/** A duration option in milliseconds, checked against its bounds; `name` is for the error. */
export function durationOption(
  text: string | null | undefined,
  name: string,
  fallback: number,
  max: number,
): number {
  if (text === null || text === undefined || text === '') return fallback;
  const value = /^\d{1,12}$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isInteger(value) || value < 1000 || value > max) {
    throw new InvalidArgumentError(
      `${name} must be a number of milliseconds from 1000 to ${max}, not ${JSON.stringify(text.slice(0, 40))}`,
    );
  }
  return value;
}

/** What a valid link grants. */
export interface LinkGrant {
  id: string;
  port: number;
  /** When the link stops being redeemable (ms since the epoch). */
  expiresAt: number;
  /** How long the cookie it sets lasts (ms). */
  sessionMs: number;
  nonce: string;
}

/** Signs and checks links and session cookies; remembers redeemed links until they expire. */
export class PortLinks {
  /** Redeemed links' nonces, with when they expire (a replay within that time is refused). */
  private readonly redeemed = new Map<string, number>();

  constructor(readonly secret: string) {}

  /** A one-time link for `id`'s `port`: `v1.{expiresAt}.{sessionMs}.{nonce}.{mac}`. */
  mint(
    id: string,
    port: number,
    expiresInMs: number,
    sessionMs: number,
  ): LinkGrant & { link: string } {
    const expiresAt = Date.now() + expiresInMs;
    const nonce = randomBytes(12).toString('base64url');
    const body = `${expiresAt}.${sessionMs}.${nonce}`;
    const link = `v1.${body}.${mac(this.secret, `link:${id}:${port}:${body}`)}`;
    return { id, port, expiresAt, sessionMs, nonce, link };
  }

  /**
   * Redeems a link presented on `id`'s `port`: signed for them, not expired, not redeemed
   * before. Throws a 401 that says which, and records it as redeemed.
   */
  redeem(link: string, id: string, port: number, now = Date.now()): LinkGrant {
    const parts = link.split('.');
    const [version, expires, session, nonce, given] = parts;
    if (parts.length !== 5 || version !== 'v1' || !/^\d{1,15}$/.test(expires ?? '')) {
      throw new AuthenticationError(`the ${LINK_PARAM} link is not a link of this gateway`);
    }
    const body = `${expires}.${session}.${nonce}`;
    if (!macMatches(given as string, mac(this.secret, `link:${id}:${port}:${body}`))) {
      throw new AuthenticationError(
        `the ${LINK_PARAM} link was not signed for port ${port} of sandbox ${id}: ask for a new one (sandbox.getSignedUrl, abx url)`,
      );
    }
    const expiresAt = Number(expires);
    if (expiresAt <= now) {
      throw new AuthenticationError(
        `the ${LINK_PARAM} link expired at ${new Date(expiresAt).toISOString()}: ask for a new one (sandbox.getSignedUrl, abx url)`,
      );
    }
    this.forgetExpired(now);
    if (this.redeemed.has(nonce as string)) {
      throw new AuthenticationError(
        `the ${LINK_PARAM} link was used already (a link opens once): ask for a new one (sandbox.getSignedUrl, abx url)`,
      );
    }
    this.redeemed.set(nonce as string, expiresAt);
    return { id, port, expiresAt, sessionMs: Number(session), nonce: nonce as string };
  }

  /** The session cookie's value for `id`'s `port`: `v1.{expiresAt}.{mac}`. */
  session(id: string, port: number, sessionMs: number): string {
    const expiresAt = Date.now() + sessionMs;
    return `v1.${expiresAt}.${mac(this.secret, `session:${id}:${port}:${expiresAt}`)}`;
  }

  /**
   * When `value`, a session cookie for `id`'s `port`, ends (ms since the epoch), or undefined
   * when it is not one or has ended.
   */
  sessionEnds(value: string, id: string, port: number, now = Date.now()): number | undefined {
    const [version, expires, given, ...rest] = value.split('.');
    if (version !== 'v1' || rest.length > 0 || !/^\d{1,15}$/.test(expires ?? '')) return undefined;
    const ends = Number(expires);
    if (ends <= now) return undefined;
    return macMatches(given ?? '', mac(this.secret, `session:${id}:${port}:${expires}`))
      ? ends
      : undefined;
  }

  private forgetExpired(now: number): void {
    if (this.redeemed.size < 1024) return;
    for (const [nonce, expiresAt] of this.redeemed) {
      if (expiresAt <= now) this.redeemed.delete(nonce);
    }
  }
}

/** The value of the session cookie in a `Cookie` header, if any. */
export function sessionCookieOf(cookie: string | undefined): string | undefined {
  if (cookie === undefined) return undefined;
  for (const pair of cookie.split(';')) {
    const eq = pair.indexOf('=');
    if (eq > 0 && pair.slice(0, eq).trim() === SESSION_COOKIE) return pair.slice(eq + 1).trim();
  }
  return undefined;
}

/**
 * A `Cookie` header without the gateway's session cookie and the dashboard's (a cookie is sent to
 * every port of its host, so a page on the gateway's loopback address gets the dashboard's
 * cookie too): neither a sandbox nor the API behind the gateway ever sees them. `''` when empty.
 */
export function withoutSessionCookie(cookie: string): string {
  return cookie
    .split(';')
    .filter((pair) => {
      const eq = pair.indexOf('=');
      const name = (eq < 0 ? pair : pair.slice(0, eq)).trim();
      return name !== SESSION_COOKIE && name !== DASHBOARD_COOKIE;
    })
    .map((pair) => pair.trim())
    .join('; ');
}

/**
 * Refuses a cookie-authenticated request another site's page made the browser send (Fetch
 * Metadata): every `*.{domain}` host is the same site, so SameSite alone would let a page of
 * sandbox A post to sandbox B with B's cookie. Top-level navigations (GET, HEAD) stay allowed, so
 * a link from elsewhere still opens; requests from browsers without Fetch Metadata pass.
 */
export function checkFetchSite(
  method: string,
  site: string | undefined,
  mode: string | undefined,
): void {
  if (site === undefined || site === 'same-origin' || site === 'none') return;
  if (mode === 'navigate' && (method === 'GET' || method === 'HEAD')) return;
  throw new PermissionDeniedError(
    `a ${method} request from another site (Sec-Fetch-Site: ${site.slice(0, 20)}) is not authorized by the sandbox port's session cookie: send X-Access-Token`,
  );
}

/** `/sandboxes/{id}/ports/{port}[/rest]` → the parts; `/sandboxes/{id}/links/{port}` too. */
export function parseSandboxPath(
  pathname: string,
): { id: string; port: number; rest: string; kind: 'port' | 'link' } | undefined {
  const match = /^\/sandboxes\/([^/]*)\/(ports|links)\/([^/]*)(\/.*)?$/.exec(pathname);
  if (!match) return undefined;
  const id = match[1] as string;
  const portText = match[3] as string;
  if (!ID.test(id)) {
    throw new BadRequestError(
      `${JSON.stringify(id.slice(0, 70))} in ${match[2] === 'ports' ? '/sandboxes/{id}/ports/{port}' : '/sandboxes/{id}/links/{port}'} is not a sandbox id`,
    );
  }
  const port = /^\d{1,5}$/.test(portText) ? Number(portText) : Number.NaN;
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new BadRequestError(
      `${JSON.stringify(portText.slice(0, 20))} in /sandboxes/${id}/${match[2]}/{port} is not a TCP port (1-65535)`,
    );
  }
  if (match[2] === 'links' && match[4] !== undefined) {
    throw new BadRequestError(
      `POST /sandboxes/${id}/links/${port} takes no path after the port: give ?path=/where`,
    );
  }
  return { id, port, rest: match[4] ?? '/', kind: match[2] === 'ports' ? 'port' : 'link' };
}
