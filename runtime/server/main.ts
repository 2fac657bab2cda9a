import { createHash, randomBytes } from 'node:crypto';
import { readFileSync, realpathSync } from 'node:fs';
import { rename, rm, writeFile } from 'node:fs/promises';
import Module, { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { Script } from 'node:vm';
import { SandboxServer } from './server.js';

const USAGE = `usage: node server.cjs [--host H] [--port P] [--socket PATH] [--token T] [--load FILE.cjs]... [--groups a,b]
  [--load-sha256 HEX]... [--body-limit BYTES] [--body-timeout-ms MS] [--command-timeout-ms MS] [--grace-ms MS]
The token can also come from ABX_SERVER_TOKEN; it guards host:port, not --socket PATH (a Unix socket
only the gateway and the sandbox's own processes can open). Port 0 picks a free port. --load-sha256, once per --load
and in the same order, refuses (exit 3) a file that is missing or has other contents.`;

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
 * the one `--load-sha256` names (the SDK then uploads it again), 1 for a server that cannot start.
 */
function fail(message: string, status: number): never {
  process.stderr.write(`abx-server: ${message}\n`);
  process.exit(status);
}

/** Exits 3 unless each file has the SHA-256 given for it; gives the contents of those checked. */
function verifyLoads(files: readonly string[], digests: readonly string[]): Map<string, Buffer> {
  const verified = new Map<string, Buffer>();
  digests.forEach((digest, i) => {
    const file = files[i] as string;
    let content: Buffer;
    try {
      content = readFileSync(file);
    } catch (error) {
      fail(`cannot read ${file}: ${(error as Error).message}`, 3);
    }
    const actual = createHash('sha256').update(content).digest('hex');
    if (actual !== digest.toLowerCase()) {
      fail(`${file} does not have the expected SHA-256 ${digest} (it has ${actual})`, 3);
    }
    verified.set(file, content);
  });
  return verified;
}

/**
 * Runs a verified bundle into require's cache (where `server.load` then finds it) compiled with
 * the V8 code cache kept next to it: starting again from the same bundle skips most compiling,
 * about half of the time a bundle of ~1.4 MB takes to load. The cache is only used for content
 * checked against its SHA-256 (V8 itself checks little more than the source's length). Returns
 * what writes the cache, when there was none or V8 refused it (another node).
 */
function preload(file: string, content: Buffer): () => Promise<void> {
  const path = realpathSync(file);
  const cacheFile = `${path}.${process.version}.v8cache`;
  let cachedData: Buffer | undefined;
  try {
    cachedData = readFileSync(cacheFile);
  } catch {
    // first start from this bundle
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
  createRequire(path).cache[path] = module;
  if (cachedData && !script.cachedDataRejected) return async () => {};
  return async () => {
    const temp = `${cacheFile}.${randomBytes(6).toString('hex')}.tmp`;
    await writeFile(temp, script.createCachedData());
    await rename(temp, cacheFile).finally(() => rm(temp, { force: true }));
  };
}

function options() {
  try {
    const { values } = parseArgs({
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
    return values;
  } catch (error) {
    fail(`${(error as Error).message}\n${USAGE}`, 2);
  }
}

async function main(): Promise<void> {
  const values = options();
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  const verified = verifyLoads(values.load ?? [], values['load-sha256'] ?? []);
  const saveCodeCaches: (() => Promise<void>)[] = [];
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
    for (const file of values.load ?? []) {
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

void main();
