import { request } from 'undici';
import type { DaemonInfo } from '../../src/installation/daemon-info.js';

// biome-ignore lint/suspicious/noExplicitAny: response bodies are checked field by field
export type Json = any;

/** One request to a daemon's API or gateway: the status and the body, parsed when it is JSON. */
export async function call(
  url: string,
  options: { method?: string; headers?: Record<string, string>; body?: unknown } = {},
): Promise<{ status: number; body: Json }> {
  const response = await request(url, {
    method: (options.method ?? 'GET') as 'GET',
    headers: {
      ...(options.body === undefined ? {} : { 'content-type': 'application/json' }),
      ...options.headers,
    },
    ...(options.body === undefined ? {} : { body: JSON.stringify(options.body) }),
  });
  const text = await response.body.text();
  let body: Json = text;
  try {
    body = text ? JSON.parse(text) : undefined;
  } catch {
    // not JSON (a sandbox port's plain answer): the text itself
  }
  return { status: response.statusCode, body };
}

/** The API as one key sees it. */
export interface Api {
  get(path: string): Promise<{ status: number; body: Json }>;
  post(path: string, body?: unknown): Promise<{ status: number; body: Json }>;
  delete(path: string): Promise<{ status: number; body: Json }>;
}

/** A daemon's API called with `key` (`Authorization: Bearer`). */
export function apiAs(info: DaemonInfo, key: string): Api {
  const headers = { authorization: `Bearer ${key}` };
  return {
    get: (path) => call(`${info.apiUrl}${path}`, { headers }),
    post: (path, body = {}) => call(`${info.apiUrl}${path}`, { method: 'POST', headers, body }),
    delete: (path) => call(`${info.apiUrl}${path}`, { method: 'DELETE', headers }),
  };
}
