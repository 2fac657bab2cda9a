import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { existsSync, readFileSync, statSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { extname, join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { readBody } from '../../runtime/server/http.js';
import {
  AuthenticationError,
  BadRequestError,
  errorResponse,
  PermissionDeniedError,
} from '../errors.js';
import { DASHBOARD_COOKIE } from './gateway-links.js';
import type { Caller, KeyService } from './key-service.js';

/** How long a dashboard session lasts from its sign-in (`ABX_DASHBOARD_SESSION_MS`). */
export const DASHBOARD_SESSION_MS = 12 * 60 * 60 * 1000;
/** How long a one-time sign-in link (`abx dashboard`) can be opened. */
export const DASHBOARD_LINK_MS = 2 * 60 * 1000;
/** Sessions and unredeemed links kept at most (the oldest go first beyond it). */
const MAX_SESSIONS = 10_000;
const MAX_LINKS = 1_000;

/** What the page learns of its session (`GET /ui/session`): never the key. */
export interface SessionInfo {
  keyId: string | null;
  name: string;
  admin: boolean;
  /** Sent back as `X-CSRF-Token` on every state-changing call made with the cookie. */
  csrf: string;
  /** Where the page reaches sandboxes (with each sandbox's own token, from connect). */
  gatewayUrl: string;
  expiresAt: string;
}

interface Session {
  /** Kept in the daemon only: every request authenticates it again, so a revocation holds. */
  key: string;
  csrf: string;
  expiresAt: number;
}

/**
 * The dashboard's sessions: an HttpOnly, SameSite=Strict cookie names one; the key it stands for
 * stays in the daemon's memory (never in a URL, a page or a script-readable store). Sessions live
 * in this daemon's memory only: a restart signs everyone out.
 */
export class DashboardSessions {
  private readonly sessions = new Map<string, Session>();
  private readonly links = new Map<string, { key: string; expiresAt: number }>();

  constructor(
    private readonly keys: KeyService,
    private readonly sessionMs = DASHBOARD_SESSION_MS,
    private readonly linkMs = DASHBOARD_LINK_MS,
  ) {}

  /** A new session for `key` (AuthenticationError for a wrong or revoked one). */
  async signIn(key: string): Promise<{ id: string; caller: Caller; session: Session }> {
    const caller = await this.keys.authenticateKey(key, 'a key from abx keys create');
    const id = randomBytes(32).toString('base64url');
    const session = {
      key,
      csrf: randomBytes(32).toString('base64url'),
      expiresAt: Date.now() + this.sessionMs,
    };
    prune(this.sessions, MAX_SESSIONS);
    this.sessions.set(hash(id), session);
    return { id, caller, session };
  }

  /** A one-time sign-in code for `key`, redeemable once within the link's life. */
  async mintLink(key: string): Promise<{ code: string; expiresAt: number }> {
    await this.keys.authenticateKey(key, 'Authorization: Bearer <key>');
    const code = randomBytes(32).toString('base64url');
    const expiresAt = Date.now() + this.linkMs;
    prune(this.links, MAX_LINKS);
    this.links.set(hash(code), { key, expiresAt });
    return { code, expiresAt };
  }

  /** Signs in with a link's code, which is spent whatever happens; undefined when it is not live. */
  async redeem(
    code: string,
  ): Promise<{ id: string; caller: Caller; session: Session } | undefined> {
    const name = hash(code);
    const link = this.links.get(name);
    this.links.delete(name);
    if (!link || link.expiresAt <= Date.now()) return undefined;
    return this.signIn(link.key).catch(() => undefined);
  }

  /** The session a cookie names, with its key's caller now; undefined when none is live. */
  async resolve(
    cookie: string | undefined,
  ): Promise<{ id: string; caller: Caller; session: Session } | undefined> {
    const id = dashboardCookieOf(cookie);
    if (id === undefined) return undefined;
    const session = this.sessions.get(hash(id));
    if (!session) return undefined;
    if (session.expiresAt <= Date.now()) {
      this.sessions.delete(hash(id));
      return undefined;
    }
    try {
      return { id, caller: await this.keys.authenticateKey(session.key, 'a key'), session };
    } catch (error) {
      // Revoked since: the session ends with it.
      if (error instanceof AuthenticationError) this.sessions.delete(hash(id));
      throw error;
    }
  }

  signOut(id: string): void {
    this.sessions.delete(hash(id));
  }
}

/** Drops expired entries, then the oldest while over `max`. */
function prune<T extends { expiresAt: number }>(map: Map<string, T>, max: number): void {
  if (map.size < max) return;
  const now = Date.now();
  for (const [name, entry] of map) if (entry.expiresAt <= now) map.delete(name);
  for (const name of map.keys()) {
    if (map.size < max) break;
    map.delete(name);
  }
}

/** Sessions and links are kept by hash: the map never holds what a cookie or link carries. */
function hash(value: string): string {
  return createHash('sha256').update(value).digest('base64url');
}

/** The dashboard cookie's value in a `Cookie` header, if any. */
export function dashboardCookieOf(cookie: string | undefined): string | undefined {
  if (cookie === undefined) return undefined;
  for (const pair of cookie.split(';')) {
    const eq = pair.indexOf('=');
    if (eq > 0 && pair.slice(0, eq).trim() === DASHBOARD_COOKIE) {
      const value = pair.slice(eq + 1).trim();
      return /^[A-Za-z0-9_-]{43}$/.test(value) ? value : undefined;
    }
  }
  return undefined;
}

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

/**
 * Refuses a state-changing request made with the cookie unless the page of this origin sent it:
 * the `X-CSRF-Token` of its session, and (when the browser says) the same origin. A cookie goes
 * to every port of its host, so SameSite alone would let a page a sandbox serves on the gateway's
 * loopback port post to the API.
 */
export function checkCsrf(req: IncomingMessage, session: { csrf: string }): void {
  if (SAFE_METHODS.has(req.method ?? 'GET')) return;
  const site = req.headers['sec-fetch-site'];
  if (site !== undefined && site !== 'same-origin') {
    throw new PermissionDeniedError(
      `a ${req.method} request from another origin (Sec-Fetch-Site: ${String(site).slice(0, 20)}) is not authorized by the dashboard's cookie: send Authorization: Bearer <key>`,
      { code: 'csrf_failed' },
    );
  }
  const origin = req.headers.origin;
  if (origin !== undefined && !sameOrigin(origin, req)) {
    throw new PermissionDeniedError(
      `a ${req.method} request from ${origin.slice(0, 100)} is not authorized by the dashboard's cookie: send Authorization: Bearer <key>`,
      { code: 'csrf_failed' },
    );
  }
  const sent = req.headers['x-csrf-token'];
  if (typeof sent !== 'string' || !equal(sent, session.csrf)) {
    throw new PermissionDeniedError(
      `${req.method} ${(req.url ?? '').split('?')[0]} with the dashboard's cookie needs the session's X-CSRF-Token header (from GET /ui/session)`,
      { code: 'csrf_failed' },
    );
  }
}

function equal(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/** The origin this request reached: its scheme and `Host`. */
function originOf(req: IncomingMessage): string {
  const tls = (req.socket as { encrypted?: boolean }).encrypted === true;
  return `${tls ? 'https' : 'http'}://${req.headers.host ?? 'localhost'}`;
}

function sameOrigin(origin: string, req: IncomingMessage): boolean {
  try {
    return new URL(origin).origin === new URL(originOf(req)).origin;
  } catch {
    return false;
  }
}

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.woff2': 'font/woff2',
  '.json': 'application/json',
  '.txt': 'text/plain; charset=utf-8',
};
const COMPRESSIBLE = new Set(['.html', '.js', '.css', '.svg', '.json', '.txt']);

/** What the dashboard serves, and its sign-in routes (`/`, `/assets/*`, `/ui/*`). */
export interface DashboardHost {
  sessions: DashboardSessions;
  /** The built page (`dist/ui`). */
  dir: string;
  /** Where sandboxes are reached: the page's `connect-src`, and what `/ui/session` tells. */
  gatewayUrl(): string;
}

/**
 * Serves the dashboard on the API's listener (never the gateway's: a sandbox's pages are served
 * there, and must not share the dashboard's origin). Answers true when it took the request.
 */
export class Dashboard {
  private readonly files = new Map<string, { body: Buffer; gzip?: Buffer; type: string }>();

  constructor(private readonly host: DashboardHost) {}

  /** Whether the request is the dashboard's: the page, its files, sign-in. */
  static claims(url: string | undefined): boolean {
    const path = (url ?? '/').split('?')[0] as string;
    return (
      path === '/' ||
      path === '/index.html' ||
      path.startsWith('/assets/') ||
      path.startsWith('/ui/') ||
      /^\/[A-Za-z0-9_-]+\.(svg|png|ico|txt)$/.test(path)
    );
  }

  async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      await this.serve(req, res);
    } catch (error) {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      const { status, body } = errorResponse(error);
      const text = JSON.stringify(body);
      res.writeHead(status, {
        'content-type': 'application/json; charset=utf-8',
        'content-length': String(Buffer.byteLength(text)),
        'cache-control': 'no-store',
      });
      res.end(text);
    }
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://dashboard');
    const path = url.pathname;
    const method = req.method ?? 'GET';
    const { sessions } = this.host;
    if (path.startsWith('/ui/')) {
      const route = `${method} ${path}`;
      switch (route) {
        case 'GET /ui/session': {
          const found = await sessions.resolve(req.headers.cookie).catch(() => undefined);
          if (!found) {
            throw new AuthenticationError(
              'not signed in to the dashboard: paste an API key, or open a link from abx dashboard',
            );
          }
          return this.json(res, 200, this.info(found));
        }
        case 'POST /ui/signin': {
          sameOriginOnly(req);
          const body = await readJson(req);
          const key = (body as { key?: unknown }).key;
          if (typeof key !== 'string' || key.trim() === '') {
            throw new BadRequestError('the body must be {"key": "<an API key>"}');
          }
          const found = await sessions.signIn(key.trim());
          return this.json(res, 200, this.info(found), { 'set-cookie': cookie(req, found) });
        }
        case 'GET /ui/signin': {
          const code = url.searchParams.get('code') ?? '';
          const found = code ? await sessions.redeem(code) : undefined;
          res.writeHead(303, {
            location: found ? '/' : '/#/signin?error=link',
            'cache-control': 'no-store',
            'referrer-policy': 'no-referrer',
            ...(found ? { 'set-cookie': cookie(req, found) } : {}),
          });
          res.end();
          return;
        }
        case 'POST /ui/signout': {
          const found = await sessions.resolve(req.headers.cookie).catch(() => undefined);
          if (found) {
            checkCsrf(req, found.session);
            sessions.signOut(found.id);
          }
          res.writeHead(204, {
            'set-cookie': `${DASHBOARD_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict`,
            'cache-control': 'no-store',
          });
          res.end();
          return;
        }
        case 'POST /ui/links': {
          const header = req.headers.authorization;
          const key = typeof header === 'string' ? /^Bearer (.+)$/i.exec(header)?.[1] : undefined;
          if (key === undefined) {
            throw new AuthenticationError(
              'POST /ui/links needs Authorization: Bearer <key> (abx dashboard sends it)',
            );
          }
          await readBody(req, { maxBytes: 4096, timeoutMs: 10_000 });
          const link = await sessions.mintLink(key);
          return this.json(res, 201, {
            url: `${originOf(req)}/ui/signin?code=${link.code}`,
            expiresAt: new Date(link.expiresAt).toISOString(),
          });
        }
        default:
          res.writeHead(404, { 'content-type': 'application/json; charset=utf-8' });
          res.end(
            JSON.stringify({
              error: `${route} is not a dashboard route (GET /ui/session, POST /ui/signin, GET /ui/signin?code=, POST /ui/signout, POST /ui/links)`,
              type: 'RouteNotFoundError',
            }),
          );
          return;
      }
    }
    if (method !== 'GET' && method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain; charset=utf-8' });
      res.end(`${method} ${path}: the dashboard's files are read with GET\n`);
      return;
    }
    const name = path === '/' ? 'index.html' : path.slice(1);
    const file = this.file(name);
    if (!file) {
      const built = existsSync(join(this.host.dir, 'index.html'));
      res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' });
      res.end(
        built
          ? `${path} is not a file of the dashboard\n`
          : `the dashboard is not built in this installation (${this.host.dir} is missing): run npm run build\n`,
      );
      return;
    }
    const gzip = file.gzip && /\bgzip\b/.test(String(req.headers['accept-encoding'] ?? ''));
    const body = gzip ? (file.gzip as Buffer) : file.body;
    res.writeHead(200, {
      'content-type': file.type,
      'content-length': String(body.length),
      ...(gzip ? { 'content-encoding': 'gzip' } : {}),
      vary: 'accept-encoding',
      'cache-control': name.startsWith('assets/')
        ? 'public, max-age=31536000, immutable'
        : 'no-cache',
      ...this.pageHeaders(),
    });
    res.end(method === 'HEAD' ? undefined : body);
  }

  /** A file of `dist/ui` by its path there; undefined for anything else. */
  private file(name: string): { body: Buffer; gzip?: Buffer; type: string } | undefined {
    // One folder level at most (assets/), plain names: no `..`, no hidden files.
    if (!/^(assets\/)?[A-Za-z0-9_-][A-Za-z0-9._-]*$/.test(name) || name.includes('..')) {
      return undefined;
    }
    const type = TYPES[extname(name)];
    if (!type) return undefined;
    const cached = this.files.get(name);
    if (cached) return cached;
    const full = join(this.host.dir, name);
    try {
      if (!statSync(full).isFile()) return undefined;
    } catch {
      return undefined;
    }
    const body = readFileSync(full);
    const entry = {
      body,
      type,
      ...(COMPRESSIBLE.has(extname(name)) && body.length > 512 ? { gzip: gzipSync(body) } : {}),
    };
    // index.html is read again each time (a rebuild shows at once); hashed assets never change.
    if (name !== 'index.html') this.files.set(name, entry);
    return entry;
  }

  /** The headers every page and file of the dashboard gets. */
  private pageHeaders(): Record<string, string> {
    let gateway = '';
    try {
      gateway = ` ${new URL(this.host.gatewayUrl()).origin}`;
    } catch {
      // no gateway yet: the page reaches no sandbox
    }
    return {
      'content-security-policy': [
        "default-src 'none'",
        "script-src 'self'",
        // xterm.js writes <style> elements; no script is ever inline.
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' blob: data:",
        "font-src 'self'",
        `connect-src 'self'${gateway}`,
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "frame-src 'none'",
        "object-src 'none'",
      ].join('; '),
      'x-content-type-options': 'nosniff',
      'x-frame-options': 'DENY',
      'referrer-policy': 'no-referrer',
      'cross-origin-opener-policy': 'same-origin',
      'cross-origin-resource-policy': 'same-origin',
    };
  }

  private info(found: { caller: Caller; session: Session }): SessionInfo {
    return {
      keyId: found.caller.keyId,
      name: found.caller.name,
      admin: found.caller.admin,
      csrf: found.session.csrf,
      gatewayUrl: this.host.gatewayUrl(),
      expiresAt: new Date(found.session.expiresAt).toISOString(),
    };
  }

  private json(
    res: ServerResponse,
    status: number,
    body: unknown,
    headers: Record<string, string> = {},
  ): void {
    const text = JSON.stringify(body);
    res.writeHead(status, {
      'content-type': 'application/json; charset=utf-8',
      'content-length': String(Buffer.byteLength(text)),
      'cache-control': 'no-store',
      ...headers,
    });
    res.end(text);
  }
}

/** The `Set-Cookie` of a new session: HttpOnly, SameSite=Strict, Secure over TLS. */
function cookie(req: IncomingMessage, found: { id: string; session: Session }): string {
  const tls = (req.socket as { encrypted?: boolean }).encrypted === true;
  const maxAge = Math.max(0, Math.floor((found.session.expiresAt - Date.now()) / 1000));
  return `${DASHBOARD_COOKIE}=${found.id}; Path=/; Max-Age=${maxAge}; HttpOnly; SameSite=Strict${tls ? '; Secure' : ''}`;
}

/** Sign-in by key is for the page of this origin only (no login CSRF from another port's page). */
function sameOriginOnly(req: IncomingMessage): void {
  const site = req.headers['sec-fetch-site'];
  const origin = req.headers.origin;
  if ((site !== undefined && site !== 'same-origin') || (origin && !sameOrigin(origin, req))) {
    throw new PermissionDeniedError(
      `sign-in is accepted from the dashboard's own page only (got Origin ${String(origin ?? 'none').slice(0, 100)}, Sec-Fetch-Site ${String(site ?? 'none').slice(0, 20)})`,
      { code: 'csrf_failed' },
    );
  }
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const raw = await readBody(req, { maxBytes: 8192, timeoutMs: 10_000 });
  try {
    const value = JSON.parse(raw.toString('utf8'));
    if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new Error();
    return value;
  } catch {
    throw new BadRequestError('the body must be a JSON object: {"key": "<an API key>"}');
  }
}
