/**
 * The daemon's API as the page calls it: same origin, the session cookie (HttpOnly, so no script
 * ever reads it), and the CSRF token on every call that changes something. The page keeps no key:
 * the one pasted at sign-in goes to `POST /ui/signin` once and is dropped.
 */
import type { SandboxInfo } from '../../runtime/protocol/wire.js';

export type { SandboxInfo, TemplateInfo } from '../../runtime/protocol/wire.js';

/** What `GET /ui/session` answers for a live session. */
export interface Session {
  keyId: string | null;
  name: string;
  admin: boolean;
  csrf: string;
  gatewayUrl: string;
  expiresAt: string;
}

/** A sample of a sandbox's use (docs/metrics.md). */
export interface SandboxMetric {
  timestamp: string;
  cpuUsedPct: number;
  cpuCount: number;
  memUsed: number;
  memCache: number;
  memTotal: number;
  diskUsed: number;
  diskTotal: number;
  processes: number;
  netRxBytes: number | null;
  netTxBytes: number | null;
}

/** An answer of the API that was not a success: its `error` text, `type` and status. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly type: string | undefined,
  ) {
    super(message);
  }
}

let current: Session | null = null;
const sessionListeners = new Set<(session: Session | null) => void>();

export function session(): Session | null {
  return current;
}

export function setSession(next: Session | null): void {
  current = next;
  for (const listener of sessionListeners) listener(next);
}

export function onSession(listener: (session: Session | null) => void): () => void {
  sessionListeners.add(listener);
  return () => sessionListeners.delete(listener);
}

/** Turns an error answer into an {@link ApiError} with the server's own words. */
export async function errorOf(response: Response, what: string): Promise<ApiError> {
  const text = await response.text().catch(() => '');
  let message = text.trim() || response.statusText || `status ${response.status}`;
  let type: string | undefined;
  try {
    const body = JSON.parse(text) as { error?: unknown; type?: unknown };
    if (typeof body.error === 'string') message = body.error;
    if (typeof body.type === 'string') type = body.type;
  } catch {
    // not JSON: the text itself
  }
  return new ApiError(`${what}: ${message}`, response.status, type);
}

const CHANGES = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

/**
 * A request to the daemon (`/v1/...`, `/ui/...`) with the cookie; a 401 means the session has
 * ended, and the page goes back to sign-in.
 */
export async function request(
  method: string,
  path: string,
  body?: unknown,
  init: { signal?: AbortSignal } = {},
): Promise<Response> {
  const headers: Record<string, string> = { accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (CHANGES.has(method) && current) headers['x-csrf-token'] = current.csrf;
  const response = await fetch(path, {
    method,
    headers,
    credentials: 'same-origin',
    cache: 'no-store',
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    ...(init.signal ? { signal: init.signal } : {}),
  });
  if (!response.ok) {
    const error = await errorOf(response, `${method} ${path}`);
    if (response.status === 401 && path !== '/ui/signin') setSession(null);
    throw error;
  }
  return response;
}

/** {@link request} with a JSON answer (none for 204). */
export async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const response = await request(method, path, body);
  if (response.status === 204) return undefined as T;
  return (await response.json()) as T;
}

/** The live session, or null when the cookie names none. */
export async function loadSession(): Promise<Session | null> {
  const response = await fetch('/ui/session', {
    credentials: 'same-origin',
    cache: 'no-store',
    headers: { accept: 'application/json' },
  });
  if (response.status === 401) return null;
  if (!response.ok) throw await errorOf(response, 'GET /ui/session');
  return (await response.json()) as Session;
}

export async function signIn(key: string): Promise<Session> {
  return api<Session>('POST', '/ui/signin', { key });
}

export async function signOut(): Promise<void> {
  await request('POST', '/ui/signout').catch(() => undefined);
  setSession(null);
}

/** Path segments are sandbox ids, template and volume names: always encoded. */
export const seg = encodeURIComponent;

export function sandboxPath(id: string, rest = ''): string {
  return `/v1/sandboxes/${seg(id)}${rest}`;
}

export type { SandboxInfo as Sandbox };
