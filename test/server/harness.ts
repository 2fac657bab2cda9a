import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Dispatcher, request } from 'undici';

export const ROOT = join(import.meta.dirname, '..', '..');
export const SERVER_BUNDLE = join(ROOT, 'dist', 'runtime', 'server.cjs');
export const CONTRACT_COMMANDS = join(ROOT, 'test', 'fixtures', 'contract-commands.cjs');

/** `npm test` builds first; this covers running a server test file on its own. */
export function ensureServerBuilt(): void {
  if (existsSync(SERVER_BUNDLE)) return;
  execFileSync('npm', ['run', 'build'], { cwd: ROOT, stdio: 'pipe', timeout: 300_000 });
}

/**
 * The bundle copied alone into an empty folder, as it will sit in a sandbox: if it needed
 * node_modules, starting it from there would fail.
 */
export function isolatedBundle(): string {
  ensureServerBuilt();
  const dir = mkdtempSync(join(tmpdir(), 'abx-server-test-'));
  const file = join(dir, 'server.cjs');
  copyFileSync(SERVER_BUNDLE, file);
  return file;
}

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  // biome-ignore lint/suspicious/noExplicitAny: response bodies are checked field by field
  json: any;
}

/** A server child process and a client for it. */
export interface RunningServer {
  url: string;
  port: number;
  pid: number;
  child: ChildProcess;
  /** Resolves with the exit code (or signal name) once the process is gone. */
  exited: Promise<number | string | null>;
  stderr(): string;
  call(path: string, options?: CallOptions): Promise<Answer>;
}

export interface CallOptions {
  method?: 'GET' | 'POST' | 'PUT' | 'DELETE' | 'PATCH';
  /** Sent as JSON unless it is a string or Buffer. */
  body?: unknown;
  /** Bearer token; `null` sends none. Defaults to the server's own token. */
  token?: string | null;
  headers?: Record<string, string>;
  /** Where the call goes (a Unix socket's agent); undici's global one by default. */
  dispatcher?: Dispatcher;
}

const running = new Set<ChildProcess>();

/**
 * Starts `node server.cjs --port 0 ...args` and waits for its listening line. Every server is
 * remembered so {@link killLeftovers} can stop it even when a test fails half way.
 */
export async function startServer(
  args: string[] = [],
  options: { token?: string; env?: Record<string, string>; cwd?: string; bundle?: string } = {},
): Promise<RunningServer> {
  const bundle = options.bundle ?? isolatedBundle();
  const tokenArgs = options.token === undefined ? [] : ['--token', options.token];
  const child = spawn(process.execPath, [bundle, '--port', '0', ...tokenArgs, ...args], {
    cwd: options.cwd ?? join(bundle, '..'),
    env: { ...process.env, ...options.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  running.add(child);
  const exited = new Promise<number | string | null>((resolve) =>
    child.once('exit', (code, signal) => {
      running.delete(child);
      resolve(code ?? signal);
    }),
  );
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const line = await new Promise<string>((resolve, reject) => {
    let stdout = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      stdout += chunk.toString();
      const end = stdout.indexOf('\n');
      if (end >= 0) resolve(stdout.slice(0, end));
    });
    void exited.then((code) =>
      reject(new Error(`server exited (${code}) before listening: ${stderr}`)),
    );
  });
  const listening = JSON.parse(line) as { event: string; host: string; port: number; pid: number };
  const url = `http://${listening.host}:${listening.port}`;
  return {
    url,
    port: listening.port,
    pid: listening.pid,
    child,
    exited,
    stderr: () => stderr,
    call: (path, callOptions = {}) => call(url, path, { token: options.token, ...callOptions }),
  };
}

/** Runs the server with arguments that should make it refuse to start; its exit code and stderr. */
export async function failToStart(
  args: string[],
): Promise<{ code: number | null; stderr: string }> {
  const child = spawn(process.execPath, [isolatedBundle(), '--port', '0', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  running.add(child);
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  running.delete(child);
  return { code, stderr };
}

/** One HTTP call with undici. */
export async function call(url: string, path: string, options: CallOptions = {}): Promise<Answer> {
  const { method = options.body === undefined ? 'GET' : 'POST', body, token } = options;
  const headers: Record<string, string> = { ...options.headers };
  if (token) headers.authorization = `Bearer ${token}`;
  let payload: string | Buffer | undefined;
  if (typeof body === 'string' || Buffer.isBuffer(body)) payload = body;
  else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers['content-type'] = 'application/json';
  }
  const response = await request(`${url}${path}`, {
    method,
    headers,
    body: payload,
    ...(options.dispatcher ? { dispatcher: options.dispatcher } : {}),
  });
  const text = await response.body.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.statusCode, headers: response.headers, text, json };
}

/** SIGTERM, then SIGKILL, every server still running; for `afterAll`/`afterEach`. */
export async function killLeftovers(): Promise<void> {
  await Promise.all(
    [...running].map(async (child) => {
      const gone = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
      await gone;
      clearTimeout(timer);
      running.delete(child);
    }),
  );
}

/** True while a process with this pid exists. */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Polls `check` until it is true; vitest's test timeout bounds how long. */
export async function eventually(check: () => boolean | Promise<boolean>): Promise<void> {
  while (!(await check())) await new Promise((resolve) => setTimeout(resolve, 25));
}
