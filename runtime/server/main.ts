// Loaded by a server's first listen (net asks cluster, and dns for the host): here, so that a
// pre-started server (`--prestart`) has them ahead.
import 'node:cluster';
import 'node:dns';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, readSync, realpathSync, rmSync } from 'node:fs';
import { rename, rm, writeFile } from 'node:fs/promises';
import { request } from 'node:http';
import Module, { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext, Script } from 'node:vm';
import { AUTHORING_GLOBAL_KEY, RUNTIME_AUTHORING_FILE } from '../protocol/constants.js';
import { SandboxServer } from './server.js';

const USAGE = `usage: node server.cjs [--host H] [--port P] [--socket PATH] [--token T] [--load FILE.cjs]... [--groups a,b]
  [--load-sha256 HEX]... [--authoring FILE.cjs --authoring-sha256 HEX] [--body-limit BYTES]
  [--body-timeout-ms MS] [--command-timeout-ms MS] [--grace-ms MS]
       node server.cjs --prestart
The token can also come from ABX_SERVER_TOKEN; it guards host:port, not --socket PATH (a Unix socket
only the gateway and the sandbox's own processes can open). Port 0 picks a free port. --load-sha256, once per --load
and in the same order, refuses (exit 3) a file that is missing or has other contents. --authoring-sha256 names the
agent-sandbox authoring half the bundles use: the runtime's own (authoring.cjs beside this file) when it has that
SHA-256, else --authoring FILE, refused (exit 4) when it has not either. --prestart loads the runtime and waits for
one JSON line on stdin, {"argv":[...],"env":{...}}, then runs as \`node server.cjs ARGV\` in that environment.`;

/** Exit status for a `--load` file that is missing or not the one `--load-sha256` names. */
const BUNDLE_REFUSED = 3;
/** Exit status when no authoring half has the SHA-256 `--authoring-sha256` names. */
const AUTHORING_REFUSED = 4;

function positiveInt(name: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const value = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(value)) {
    throw new Error(`--${name} must be a whole number, not ${JSON.stringify(text)}`);
  }
  return value;
}

/**
 * Exits with the status: 2 for a bad command line, 3 for a `--load` file that is missing or not
 * the one `--load-sha256` names, 4 for an authoring half that is neither the runtime's nor the
 * `--authoring` file (the SDK then uploads what was refused), 1 for a server that cannot start.
 */
function fail(message: string, status: number): never {
  process.stderr.write(`abx-server: ${message}\n`);
  process.exit(status);
}

const sha256 = (content: Buffer) => createHash('sha256').update(content).digest('hex');

/** Exits 3 unless each file has the SHA-256 given for it; gives the contents of those checked. */
function verifyLoads(files: readonly string[], digests: readonly string[]): Map<string, Buffer> {
  const verified = new Map<string, Buffer>();
  digests.forEach((digest, i) => {
    const file = files[i] as string;
    let content: Buffer;
    try {
      content = readFileSync(file);
    } catch (error) {
      fail(`cannot read ${file}: ${(error as Error).message}`, BUNDLE_REFUSED);
    }
    const actual = sha256(content);
    if (actual !== digest.toLowerCase()) {
      fail(
        `${file} does not have the expected SHA-256 ${digest} (it has ${actual})`,
        BUNDLE_REFUSED,
      );
    }
    verified.set(file, content);
  });
  return verified;
}

/** A CommonJS module run from checked content; `save` writes its V8 code cache when it had none. */
interface RunModule {
  module: Module;
  save: () => Promise<void>;
}

/**
 * Runs CommonJS `content` as the module at `path`, compiled with the V8 code cache `cacheFile`
 * when there is one: starting again from the same file skips most compiling, about half of the
 * time a bundle of ~1.4 MB takes to load. The cache is only used for content checked against its
 * SHA-256 (V8 itself checks little more than the source's length). `save` writes the cache when
 * there was none or V8 refused it (another node); without `cacheFile` it does nothing.
 */
function runModule(path: string, content: Buffer, cacheFile?: string): RunModule {
  let cachedData: Buffer | undefined;
  try {
    if (cacheFile) cachedData = readFileSync(cacheFile);
  } catch {
    // first start from this file
  }
  const script = new Script(Module.wrap(content.toString('utf8')), { filename: path, cachedData });
  const module = new Module(path);
  module.filename = path;
  try {
    script
      .runInThisContext()
      .call(module.exports, module.exports, createRequire(path), module, path, dirname(path));
  } catch (error) {
    // As server.load would say it.
    throw new Error(`cannot load ${path}: ${(error as Error).message}`, { cause: error });
  }
  module.loaded = true;
  if (!cacheFile || (cachedData && !script.cachedDataRejected)) {
    return { module, save: async () => {} };
  }
  return {
    module,
    save: async () => {
      const temp = `${cacheFile}.${randomBytes(6).toString('hex')}.tmp`;
      await writeFile(temp, script.createCachedData());
      await rename(temp, cacheFile).finally(() => rm(temp, { force: true }));
    },
  };
}

/**
 * Runs a verified bundle into require's cache (where `server.load` then finds it), with the V8
 * code cache kept next to it (`FILE.<node version>.v8cache`). Returns what writes the cache.
 */
function preload(file: string, content: Buffer): () => Promise<void> {
  const path = realpathSync(file);
  const { module, save } = runModule(path, content, `${path}.${process.version}.v8cache`);
  createRequire(path).cache[path] = module;
  return save;
}

/** agent-sandbox's authoring half, loaded once: what a bundle's import of the package gets. */
interface Authoring {
  sha256: string;
  exports: unknown;
}

/** The authoring half beside this file (the runtime's), as a `--prestart` process loads it ahead. */
let prestartedAuthoring: Authoring | undefined;

function runtimeAuthoringPath(): string {
  return join(dirname(resolve(process.argv[1] ?? '.')), RUNTIME_AUTHORING_FILE);
}

/**
 * Makes the authoring half of SHA-256 `digest` what bundles find: the one a `--prestart` process
 * loaded ahead, else the runtime's own file, else `file` (an SDK whose agent-sandbox differs from
 * the runtime's uploads its own). Exits 4 when none has that SHA-256. A file loaded here is
 * compiled with a V8 code cache in `cacheDir` (the bundles' folder); returns what writes it.
 */
function provideAuthoring(
  file: string | undefined,
  digest: string,
  cacheDir: string | undefined,
): () => Promise<void> {
  const wanted = digest.toLowerCase();
  let authoring = prestartedAuthoring?.sha256 === wanted ? prestartedAuthoring : undefined;
  let save = async () => {};
  const tried: string[] = [];
  for (const candidate of [runtimeAuthoringPath(), file]) {
    if (authoring || candidate === undefined) break;
    let content: Buffer;
    try {
      content = readFileSync(candidate);
    } catch (error) {
      tried.push(`${candidate}: ${(error as NodeJS.ErrnoException).code ?? 'unreadable'}`);
      continue;
    }
    const actual = sha256(content);
    if (actual !== wanted) {
      tried.push(`${candidate}: SHA-256 ${actual}`);
      continue;
    }
    const path = realpathSync(candidate);
    const cacheFile = cacheDir && `${cacheDir}/authoring-${actual}.${process.version}.v8cache`;
    const loaded = runModule(path, content, cacheFile);
    authoring = { sha256: actual, exports: loaded.module.exports };
    save = loaded.save;
  }
  if (!authoring) {
    fail(
      `no authoring half of agent-sandbox has the SHA-256 ${wanted} that --authoring-sha256 names (${tried.join('; ')}); upload the client's dist/runtime/authoring.cjs as --authoring`,
      AUTHORING_REFUSED,
    );
  }
  (globalThis as Record<symbol, unknown>)[Symbol.for(AUTHORING_GLOBAL_KEY)] = authoring.exports;
  return save;
}

function options(args: string[]) {
  try {
    const { values } = parseArgs({
      args,
      options: {
        host: { type: 'string', default: '127.0.0.1' },
        port: { type: 'string', default: '0' },
        token: { type: 'string' },
        load: { type: 'string', multiple: true, default: [] },
        groups: { type: 'string' },
        socket: { type: 'string' },
        'body-limit': { type: 'string' },
        'body-timeout-ms': { type: 'string' },
        'command-timeout-ms': { type: 'string' },
        'grace-ms': { type: 'string' },
        'load-sha256': { type: 'string', multiple: true, default: [] },
        authoring: { type: 'string' },
        'authoring-sha256': { type: 'string' },
        help: { type: 'boolean', default: false },
      },
      strict: true,
    });
    const loads = values.load ?? [];
    const digests = values['load-sha256'] ?? [];
    if (digests.length > 0 && digests.length !== loads.length) {
      throw new Error(
        `--load-sha256 goes once per --load, in the same order: ${loads.length} --load, ${digests.length} --load-sha256`,
      );
    }
    if (values.authoring !== undefined && values['authoring-sha256'] === undefined) {
      throw new Error('--authoring needs --authoring-sha256, the SHA-256 it must have');
    }
    return values;
  } catch (error) {
    fail(`${(error as Error).message}\n${USAGE}`, 2);
  }
}

async function main(args: string[]): Promise<void> {
  const values = options(args);
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  const loads = values.load ?? [];
  const verified = verifyLoads(loads, values['load-sha256'] ?? []);
  const saveCodeCaches: (() => Promise<void>)[] = [];
  const digest = values['authoring-sha256'];
  if (digest !== undefined) {
    // The code cache goes beside the bundles (a missing one is reported by its load below).
    let cacheDir: string | undefined;
    try {
      cacheDir = loads[0] === undefined ? undefined : dirname(realpathSync(loads[0]));
    } catch {
      cacheDir = undefined;
    }
    try {
      saveCodeCaches.push(provideAuthoring(values.authoring, digest, cacheDir));
    } catch (error) {
      fail((error as Error).message, 2);
    }
  }
  let server: SandboxServer;
  try {
    const port = positiveInt('port', values.port) ?? 0;
    if (port > 65535) throw new Error(`--port must be at most 65535, not ${port}`);
    server = new SandboxServer({
      host: values.host,
      port,
      token: values.token ?? (process.env.ABX_SERVER_TOKEN || undefined),
      groups: values.groups,
      extraSocketPath: values.socket,
      bodyLimitBytes: positiveInt('body-limit', values['body-limit']),
      bodyTimeoutMs: positiveInt('body-timeout-ms', values['body-timeout-ms']),
      commandTimeoutMs: positiveInt('command-timeout-ms', values['command-timeout-ms']),
      graceMs: positiveInt('grace-ms', values['grace-ms']),
    });
    for (const file of loads) {
      const content = verified.get(file);
      // Once per file, as require would run it.
      verified.delete(file);
      if (content) saveCodeCaches.push(preload(file, content));
      server.load(file);
    }
  } catch (error) {
    fail(`${(error as Error).message}\n${USAGE}`, 2);
  }
  let address: { host: string; port: number };
  try {
    address = await server.start();
  } catch (error) {
    fail(`cannot listen: ${(error as Error).message}`, 1);
  }
  for (const signal of ['SIGTERM', 'SIGINT'] as const) {
    process.once(signal, () => void server.stop());
  }
  process.stdout.write(`${JSON.stringify({ event: 'listening', ...address, pid: process.pid })}\n`);
  // After the line, so it does not delay it; and the code compiled while starting is included.
  for (const save of saveCodeCaches) save().catch(() => undefined);
  await server.stopped;
  process.exit(0);
}

/** What a `--prestart` process reads on stdin: the command line to run and its environment. */
interface PrestartRequest {
  argv: string[];
  env: Record<string, string>;
}

/**
 * The first line of stdin, or undefined when it ends first. Read blocking from fd 0, never
 * through `process.stdin`: an idle process then waits in one `read` (no event loop turns), and
 * only the line is consumed. The rest of stdin stays for the server (envd closes it after the line).
 */
function firstLine(): string | undefined {
  const chunk = Buffer.alloc(64 * 1024);
  const parts: Buffer[] = [];
  for (;;) {
    let size: number;
    try {
      size = readSync(0, chunk, 0, chunk.length, null);
    } catch (error) {
      // A non-blocking pipe with nothing yet: wait a moment without spinning.
      if ((error as NodeJS.ErrnoException).code !== 'EAGAIN') return undefined;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5);
      continue;
    }
    if (size === 0) return undefined;
    const at = chunk.subarray(0, size).indexOf(0x0a);
    if (at >= 0) {
      parts.push(Buffer.from(chunk.subarray(0, at)));
      return Buffer.concat(parts).toString('utf8');
    }
    parts.push(Buffer.from(chunk.subarray(0, size)));
  }
}

function prestartRequest(line: string): PrestartRequest {
  let request: Partial<PrestartRequest>;
  try {
    request = JSON.parse(line);
  } catch (error) {
    throw new Error(`--prestart: stdin's first line is not JSON: ${(error as Error).message}`);
  }
  const { argv, env } = request;
  if (!Array.isArray(argv) || !argv.every((arg) => typeof arg === 'string')) {
    throw new Error('--prestart: argv must be a list of strings');
  }
  if (
    typeof env !== 'object' ||
    env === null ||
    !Object.values(env).every((value) => typeof value === 'string')
  ) {
    throw new Error('--prestart: env must be an object of strings');
  }
  return { argv, env };
}

/** Full garbage collections without `gc` on the global object (it needs --expose-gc at start). */
function collectGarbage(times: number): void {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  setFlagsFromString('--no-expose-gc');
  for (let i = 0; i < times; i++) gc();
}

/** The parts of the authoring half a start runs through, as a bundle reaches them. */
interface AuthoringApi {
  sandbox: { register(options: object): (target: object, key: string, d?: object) => void };
  commandRegistry(): { registerClass(cls: unknown): unknown };
}

/**
 * Runs once, ahead, what every start runs for the first time (Node compiles a function on its
 * first call, and loads some built-ins on first use): the command line's parsing, a server's
 * construction, a forced removal (fs's rimraf), and the authoring half's handling of a
 * bundle's shipped commands (class-validator), on a class and registry of its own that no bundle
 * sees. Best effort: a start does all of it anyway.
 */
function warmUp(authoring: Authoring | undefined): void {
  try {
    options([]);
    new SandboxServer({ token: randomBytes(16).toString('hex'), port: 0 });
    rmSync(`/nonexistent/abx-prestart-${process.pid}`, { force: true });
  } catch {
    // the start loads them itself
  }
  if (!authoring) return;
  const shippedKey = Symbol.for('agent-sandbox.shipped-commands');
  const global = globalThis as Record<symbol, unknown>;
  try {
    const api = authoring.exports as AuthoringApi;
    class PrestartWarmUp {
      echo(text: string): string {
        return text;
      }
    }
    const method = Object.getOwnPropertyDescriptor(PrestartWarmUp.prototype, 'echo');
    api.sandbox.register({ description: 'warm-up' })(PrestartWarmUp.prototype, 'echo', method);
    global[shippedKey] = {
      'PrestartWarmUp.echo': {
        name: 'echo',
        description: 'warm-up',
        args: [{ name: 'text', type: 'str', required: true }],
        template: 'base',
      },
    };
    // A registry of its own: the process's registry (what bundles fill) stays empty.
    const Registry = Object.getPrototypeOf(api.commandRegistry()).constructor as new () => {
      registerClass(cls: unknown): unknown;
    };
    new Registry().registerClass(PrestartWarmUp);
  } catch {
    // an authoring half of another shape: its first start compiles it
  } finally {
    delete global[shippedKey];
  }
}

/**
 * A few requests through a throwaway server on a Unix socket in a private folder (a health check,
 * a command call, a bad request): the first call to the real server then runs code that has run,
 * HTTP parsing, routing, argument checks and the answer's writing. Best effort.
 */
async function warmRequests(): Promise<void> {
  let dir: string | undefined;
  try {
    dir = mkdtempSync(join(tmpdir(), 'abx-prestart-'));
    const socketPath = join(dir, 'server.sock');
    const token = randomBytes(16).toString('hex');
    const server = new SandboxServer({ socketPath, token, groups: 'commands' });
    server.register('echo', ({ text }) => text, [{ name: 'text', type: 'str', required: true }]);
    await server.start();
    const send = (method: string, path: string, body?: unknown) =>
      new Promise<void>((done) => {
        const payload = body === undefined ? undefined : JSON.stringify(body);
        const req = request(
          {
            socketPath,
            method,
            path,
            headers: {
              authorization: `Bearer ${token}`,
              ...(payload ? { 'content-type': 'application/json' } : {}),
            },
          },
          (res) => res.resume().once('end', done).once('error', done),
        );
        req.once('error', () => done());
        req.end(payload);
      });
    for (let round = 0; round < 2; round++) {
      await send('GET', '/health');
      await send('POST', '/commands/echo', { text: 'warm-up' });
      await send('POST', '/commands/echo', { text: 1 });
    }
    await server.stop();
  } catch {
    // the first real call compiles what this did not
  } finally {
    if (dir) rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * `node server.cjs --prestart`: a server started ahead of its command line. envd keeps one idle
 * in a sandbox that serves ports: Node has started, this file and the runtime's authoring half are
 * loaded, garbage is collected; then it waits for one JSON line on stdin, takes the environment it
 * names (replacing its own: the sandbox's may have changed since) and runs as that command line.
 * It exits when stdin ends first (envd went away).
 */
async function prestart(): Promise<void> {
  const path = runtimeAuthoringPath();
  let content: Buffer | undefined;
  try {
    content = readFileSync(path);
  } catch {
    // A runtime without the authoring half: bundles bring their own.
  }
  if (content) {
    try {
      const { module } = runModule(path, content);
      prestartedAuthoring = { sha256: sha256(content), exports: module.exports };
    } catch {
      // Loaded again, with the error reported, by the start that needs it.
    }
  }
  warmUp(prestartedAuthoring);
  await warmRequests();
  // What loading left behind: the idle process keeps only what it uses.
  collectGarbage(4);
  process.stdout.write(`${JSON.stringify({ event: 'prestarted', pid: process.pid })}\n`);
  const line = firstLine();
  if (line === undefined) process.exit(0);
  let request: PrestartRequest;
  try {
    request = prestartRequest(line);
  } catch (error) {
    fail((error as Error).message, 2);
  }
  for (const name of Object.keys(process.env)) {
    if (!Object.hasOwn(request.env, name)) delete process.env[name];
  }
  Object.assign(process.env, request.env);
  process.argv.splice(2, process.argv.length - 2, ...request.argv);
  await main(request.argv);
}

const args = process.argv.slice(2);
if (args.length === 1 && args[0] === '--prestart') void prestart();
else void main(args);
