import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import type { DaemonInfo } from '../../src/index.js';
import { sandboxProcesses, sigkillAll } from '../helpers/abx-home.js';

/** `npm run soak` sets ABX_SOAK=1: the same suites with the full counts and sizes. */
export const SOAK = process.env.ABX_SOAK === '1';

/** `ci` in the default run, `soak` under `npm run soak`. */
export const scale = (ci: number, soak: number) => (SOAK ? soak : ci);

export const daemonInfo = (home: string) =>
  JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8')) as DaemonInfo;

export const gatewayPort = (home: string) => Number(new URL(daemonInfo(home).gatewayUrl).port);

/** SIGKILLs every process of a sandbox (its bwrap, envd and all it started), not via the API. */
export function sigkillSandbox(home: string, sandboxId: string): number {
  const pids = sandboxProcesses(sandboxId);
  sigkillAll(pids);
  return pids.length;
}

/** Open file descriptors of a process, by kind (`socket`, `pipe`, `file`, `anon_inode`...). */
export function openFds(pid: number): { total: number; sockets: number } {
  let sockets = 0;
  const entries = readdirSync(`/proc/${pid}/fd`);
  for (const fd of entries) {
    try {
      if (readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith('socket:')) sockets++;
    } catch {
      // closed meanwhile
    }
  }
  return { total: entries.length, sockets };
}

/** Resident memory of a process in bytes. */
export function rssBytes(pid: number): number {
  const line = readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB/m);
  return Number(line?.[1] ?? 0) * 1024;
}

/** Polls until `fn` returns true or `tries` × `ms` passed; returns the last answer. */
export async function settle(
  fn: () => boolean | Promise<boolean>,
  tries = 100,
  ms = 50,
): Promise<boolean> {
  for (let i = 0; i < tries; i++) {
    if (await fn()) return true;
    await new Promise((r) => setTimeout(r, ms));
  }
  return fn();
}

export interface RawAnswer {
  status: number;
  head: string;
  body: string;
  // biome-ignore lint/suspicious/noExplicitAny: error bodies are checked field by field
  json: any;
}

/**
 * Sends raw bytes on a new TCP connection to 127.0.0.1:port and reads the answer until the peer
 * closes (requests should say `Connection: close`). Raw, because node's and undici's clients
 * refuse to send what a hostile client would: NUL bytes, bad methods, lying lengths.
 * `parts` are written one after another, `gapMs` apart (a slow client).
 */
export function rawRequest(
  port: number,
  parts: (string | Buffer)[],
  options: { gapMs?: number; timeoutMs?: number } = {},
): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no answer within ${options.timeoutMs ?? 60_000} ms`));
    }, options.timeoutMs ?? 60_000);
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      const text = Buffer.concat(chunks).toString('utf8');
      const split = text.indexOf('\r\n\r\n');
      const head = split < 0 ? text : text.slice(0, split);
      let body = split < 0 ? '' : text.slice(split + 4);
      if (/^transfer-encoding:\s*chunked/im.test(head)) body = dechunk(body);
      let json: unknown;
      try {
        json = JSON.parse(body);
      } catch {
        json = undefined;
      }
      resolve({ status: Number(/^HTTP\/1\.[01] (\d{3})/.exec(head)?.[1] ?? 0), head, body, json });
    });
    socket.once('connect', async () => {
      for (const [i, part] of parts.entries()) {
        if (i > 0 && options.gapMs) await new Promise((r) => setTimeout(r, options.gapMs));
        if (socket.destroyed) return;
        socket.write(part);
      }
    });
  });
}

function dechunk(text: string): string {
  let out = '';
  let rest = text;
  while (rest.length > 0) {
    const end = rest.indexOf('\r\n');
    const size = Number.parseInt(rest.slice(0, end), 16);
    if (!size) break;
    out += rest.slice(end + 2, end + 2 + size);
    rest = rest.slice(end + 2 + size + 2);
  }
  return out;
}

/** A request as text: request line, headers (plus `Connection: close`), body. */
export function httpText(
  method: string,
  path: string,
  headers: Record<string, string>,
  body: string | Buffer = '',
): Buffer {
  const length = Buffer.byteLength(body);
  const lines = [`${method} ${path} HTTP/1.1`, 'Host: 127.0.0.1', 'Connection: close'];
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  if (length > 0 && !('content-length' in lowerKeys(headers))) {
    lines.push(`Content-Length: ${length}`);
  }
  return Buffer.concat([Buffer.from(`${lines.join('\r\n')}\r\n\r\n`, 'latin1'), Buffer.from(body)]);
}

const lowerKeys = (headers: Record<string, string>) =>
  Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.toLowerCase(), v]));

/** A small deterministic PRNG (mulberry32) for generated cases that replay the same each run. */
export function random(seed: number) {
  let state = seed >>> 0;
  const next = () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (n: number) => Math.floor(next() * n);
  const pick = <T>(items: readonly T[]): T => items[int(items.length)] as T;
  return { next, int, pick };
}
