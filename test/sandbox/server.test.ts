import { execFileSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  ArgumentError,
  CapabilityError,
  CommandNotFoundError,
  commandRegistry,
  describeCommand,
  listCommands,
  Sandbox,
  SandboxError,
  ServerCommandError,
  Templates,
} from '../../src/index.js';
import { bundleCache } from '../../src/sandbox/bundle-cache.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;
let sandbox: Sandbox;
let cacheDir: string;
const cacheDirBefore = process.env.ABX_CACHE_DIR;

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
  // Bundles cached on disk go with this file's installation, not into the user's ~/.cache.
  cacheDir = join(home, 'bundle-cache');
  process.env.ABX_CACHE_DIR = cacheDir;
  await Templates.build(join(ROOT, 'test', 'fixtures', 'templates', 'server-e2e.yaml'), { home });
  sandbox = await Sandbox.create({ home, template: 'server-e2e' });
}, 300_000);

afterAll(async () => {
  await sandbox?.kill().catch(() => undefined);
  await abx?.close();
  if (cacheDirBefore === undefined) delete process.env.ABX_CACHE_DIR;
  else process.env.ABX_CACHE_DIR = cacheDirBefore;
});

// test/setup.ts empties the registry before each test; the fixture class registers again.
const register = () => commandRegistry().registerClass(SandboxCommands);

describe('sandbox.server', () => {
  test('serves decorated methods from inside the sandbox, keeping state between calls', async () => {
    register();
    await sandbox.server.start({ commands: [SandboxCommands] });
    expect(sandbox.server.url).toBe(`http://${sandbox.getHost(8080)}`);
    expect(await sandbox.server.call('add', { x: 1.5 })).toBe(3.5);
    expect(await sandbox.server.call('add', { x: 1, y: 40 })).toBe(41);
    const counts = [];
    for (let i = 0; i < 3; i++) counts.push(await sandbox.server.call('increment'));
    expect(counts).toEqual([1, 2, 3]);
    expect(await sandbox.server.call('whereAmI')).toEqual({
      hostname: sandbox.sandboxId,
      cwd: '/home/user',
      uid: 1000,
    });
  });

  test('discovery equals listCommands on the client for the same class', async () => {
    register();
    const expected = listCommands('server-e2e')
      .filter((c) => c.source === 'decorator')
      .map(describeCommand);
    const served = (await sandbox.server.discover()).filter((c) =>
      expected.some((e) => e.name === c.name),
    );
    expect(served).toEqual(expected);
    expect((await sandbox.server.discover()).map((c) => c.name)).toEqual(
      expect.arrayContaining(['upload', 'download', 'runshell']),
    );
  });

  test('50 concurrent calls each get their own result', async () => {
    const values = Array.from({ length: 50 }, (_, i) => `value-${i}`);
    const results = await Promise.all(
      values.map((value, i) => sandbox.server.call('slowEcho', { value, delayMs: (i % 5) * 10 })),
    );
    expect(results).toEqual(values);
  });

  test('errors: bad kwargs refused on the client, remote errors keep their type', async () => {
    await expect(sandbox.server.call('add', { x: 'one' })).rejects.toThrow(ArgumentError);
    const thrown = (await sandbox.server
      .call('fail', { message: 'no luck' })
      .catch((e) => e)) as ServerCommandError;
    expect(thrown).toBeInstanceOf(ServerCommandError);
    expect([thrown.type, thrown.status, thrown.message]).toEqual(['RangeError', 500, 'no luck']);
    // The server's own errors arrive as the same classes the client would throw.
    const unknown = (await sandbox.server.call('nope').catch((e) => e)) as CommandNotFoundError;
    expect(unknown).toBeInstanceOf(CommandNotFoundError);
    expect(unknown.status).toBe(404);
    expect(unknown.available).toContain('add');
    // Built-ins are not known on this side: the server itself refuses their bad kwargs, with the
    // same ArgumentError (problems and usage included) the client raises for its own.
    const builtin = (await sandbox.server
      .call('download', { path: 5 })
      .catch((e) => e)) as ArgumentError;
    expect(builtin).toBeInstanceOf(ArgumentError);
    expect([builtin.type, builtin.status]).toEqual(['ArgumentError', 400]);
    expect(builtin.problems).toEqual(['path must be a string, not the number 5']);
    expect(builtin.usage).toMatch(/^download -a path=<str>/);
  });

  test('files written by a command are visible to files.read, and the other way round', async () => {
    expect(
      await sandbox.server.call('writeNote', { path: 'note.txt', text: 'from the server' }),
    ).toBe(15);
    expect(await sandbox.files.read('note.txt')).toBe('from the server');
    await sandbox.files.write('note.txt', 'from the SDK');
    expect(await sandbox.server.call('readNote', { path: 'note.txt' })).toBe('from the SDK');
  });

  test('a second start returns the running server; restart starts afresh', async () => {
    register();
    const before = await sandbox.server.call<number>('increment');
    await sandbox.server.start({ commands: [SandboxCommands] });
    expect(await sandbox.server.call('increment')).toBe(before + 1);
    await sandbox.server.start({ commands: [SandboxCommands], restart: true });
    expect(await sandbox.server.call('increment')).toBe(1);
  });

  test('the same bundle reuses the server (one process, no bundling); other options replace it', async () => {
    register();
    await sandbox.server.start({ commands: [SandboxCommands] });
    const pid = await serverPid();
    const builds = bundleCache.stats.builds;
    await sandbox.server.start({ commands: [SandboxCommands] });
    expect(await serverPid()).toBe(pid);
    expect(bundleCache.stats.builds).toBe(builds);

    // Other groups: another command line, so a new server (and the old one is gone).
    await sandbox.server.start({ commands: [SandboxCommands], groups: 'commands,files' });
    const replaced = await serverPid();
    expect(replaced).not.toBe(pid);
    expect(await sandbox.server.call('increment')).toBe(1);
    await sandbox.server.start({ commands: [SandboxCommands] });
    expect(await serverPid()).not.toBe(replaced);
    expect(bundleCache.stats.builds).toBe(builds);
    const processes = await sandbox.commands.list();
    expect(processes.filter((p) => p.running && p.cmd.includes('--port 8080 '))).toHaveLength(1);
  });

  test('another process uses the running server by sandbox id', async () => {
    const script = `
      import 'reflect-metadata';
      const { Sandbox } = await import(${JSON.stringify(join(ROOT, 'dist', 'index.js'))});
      const sandbox = await Sandbox.connect(process.argv[1], { home: process.argv[2] });
      console.log(JSON.stringify(await sandbox.run('add', { x: 2, y: 3 })));
    `;
    const output = execFileSync(
      process.execPath,
      ['--input-type=module', '-e', script, sandbox.sandboxId, home],
      { cwd: ROOT, encoding: 'utf8', timeout: 60_000 },
    );
    expect(JSON.parse(output)).toBe(5);
  });
});

describe('sandbox.run and listCommands', () => {
  test('YAML commands run in a shell with quoted arguments; decorated ones on the server', async () => {
    expect(await sandbox.run('shout', { text: "it's $(id)" })).toEqual({
      stdout: "IT'S $(ID)",
      stderr: '',
      exitCode: 0,
    });
    expect(await sandbox.run('add', { x: 1 })).toBe(3);
    await expect(sandbox.run('shout', {})).rejects.toThrow('missing required argument: text');
    const missing = (await sandbox.run('nope').catch((e) => e)) as CommandNotFoundError;
    expect(missing).toBeInstanceOf(CommandNotFoundError);
    expect(missing.message).toContain(
      'available: shout, add, increment, slowEcho, whereAmI, writeNote, readNote, fail',
    );
  });

  test('listCommands merges both kinds', async () => {
    const commands = await sandbox.listCommands();
    expect(commands.map((c) => [c.name, c.source])).toEqual([
      ['shout', 'yaml'],
      ['add', 'decorator'],
      ['increment', 'decorator'],
      ['slowEcho', 'decorator'],
      ['whereAmI', 'decorator'],
      ['writeNote', 'decorator'],
      ['readNote', 'decorator'],
      ['fail', 'decorator'],
    ]);
  });
});

/** The OS pid of the server on the client's port: the parent of the shell runshell starts. */
async function serverPid(): Promise<string> {
  const { stdout } = await sandbox.server.call<{ stdout: string }>('runshell', {
    cmd: 'echo $PPID',
  });
  return stdout.trim();
}

/** A TypeScript command module in a folder of its own, importing a helper module. */
async function commandModule(className: string, greeting: string, slowImportMs = 0) {
  const dir = await mkdtemp(join(tmpdir(), 'abx-server-module-'));
  const module = join(dir, 'tools.ts');
  const helper = join(dir, 'helper.ts');
  await writeFile(helper, `export const greeting = '${greeting}';\n`);
  await writeFile(
    module,
    [
      `import { sandbox } from ${JSON.stringify(join(ROOT, 'src', 'authoring.js'))};`,
      "import { greeting } from './helper.js';",
      // Slow to import inside the sandbox only: the server takes that long to listen. A
      // declaration the class uses, so server.start keeps it (a bare top-level statement would
      // be script code, which never runs in the sandbox).
      `const loaded = process.env.ABX_SANDBOX_ID ? Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ${slowImportMs}) : 'here';`,
      "@sandbox('server-e2e')",
      `export class ${className} {`,
      '  @sandbox.register',
      '  hello(): string {',
      '    void loaded; // the slow import goes with the class',
      '    return greeting;',
      '  }',
      '}',
      '',
    ].join('\n'),
  );
  // The cache trusts files whose last change is a little older than the build.
  await new Promise((resolve) => setTimeout(resolve, 120));
  const exports = (await import(module)) as Record<string, DecoratedClass>;
  const register = () => commandRegistry().registerClass(exports[className] as DecoratedClass);
  return { dir, module, helper, register };
}

type DecoratedClass = Parameters<ReturnType<typeof commandRegistry>['registerClass']>[0];

/** Runs `body` with the client on `port`, and stops that server after it, whatever happens. */
async function onPort(port: number, body: () => Promise<void>): Promise<void> {
  try {
    await body();
  } finally {
    await sandbox.server.attach(port);
    await sandbox.server.stop();
    await sandbox.server.attach(8080);
  }
}

describe('server.start: bundle cache, uploads, readiness', () => {
  test('a changed module is bundled again while an unchanged one comes from the cache', async () => {
    const tools = await commandModule('CachedTools', 'v1');
    await onPort(8085, async () => {
      tools.register();
      await sandbox.server.start({ port: 8085, modules: [tools.module] });
      expect(await sandbox.server.call('hello')).toBe('v1');
      const builds = bundleCache.stats.builds;

      // Only an import changed, to the same length: built again, and a new server serves it.
      await writeFile(tools.helper, "export const greeting = 'v2';\n");
      await sandbox.server.start({ port: 8085, modules: [tools.module] });
      expect(await sandbox.server.call('hello')).toBe('v2');
      expect(bundleCache.stats.builds).toBe(builds + 1);

      // The unchanged fixture class comes from the cache.
      register();
      const hits = bundleCache.stats.memoryHits + bundleCache.stats.diskHits;
      await sandbox.server.start({ port: 8086, commands: [SandboxCommands] });
      await sandbox.server.stop();
      expect(bundleCache.stats.builds).toBe(builds + 1);
      expect(bundleCache.stats.memoryHits + bundleCache.stats.diskHits).toBe(hits + 1);
    }).finally(() => rm(tools.dir, { recursive: true, force: true }));
  });

  test('the bundle is uploaded once to a content-addressed path, and again when damaged', async () => {
    register();
    const writes: string[] = [];
    const write = sandbox.files.write.bind(sandbox.files);
    sandbox.files.write = ((path: string, data: string) => {
      if (path.includes('/bundles/')) writes.push(path);
      return write(path, data);
    }) as typeof sandbox.files.write;
    try {
      await sandbox.server.start({ commands: [SandboxCommands], restart: true });
      expect(writes).toEqual([]);
      const server = (await sandbox.commands.list()).find(
        (p) => p.running && p.cmd.includes('--port 8080 '),
      );
      const path = /--load (\S+)/.exec(server?.cmd ?? '')?.[1] as string;
      expect(path).toMatch(/^\/home\/user\/\.abx\/server\/bundles\/[0-9a-f]{64}\.cjs$/);

      await sandbox.files.remove(path);
      await sandbox.server.start({ commands: [SandboxCommands], restart: true });
      expect(writes).toEqual([path]);

      // Same name, other bytes: the server refuses it (exit 3) and the client uploads it again.
      await sandbox.files.write(path, 'module.exports = {};');
      writes.length = 0;
      await sandbox.server.start({ commands: [SandboxCommands], restart: true });
      expect(writes).toEqual([path]);
      expect(await sandbox.server.call('add', { x: 1 })).toBe(3);
    } finally {
      sandbox.files.write = write;
    }
  });

  test("start() waits on the server's listening line: no request reaches the port before it", async () => {
    const tools = await commandModule('SlowTools', 'slow', 1500);
    const portClient = sandbox.portClient.bind(sandbox);
    const early: string[] = [];
    let started = false;
    sandbox.portClient = (port, timeoutMs) => {
      const client = portClient(port, timeoutMs);
      if (port !== 8087) return client;
      const send = client.send.bind(client);
      client.send = (method, path, options) => {
        if (!started) early.push(`${method} ${path}`);
        return send(method, path, options);
      };
      return client;
    };
    try {
      await onPort(8087, async () => {
        tools.register();
        await sandbox.server.start({ port: 8087, modules: [tools.module] });
        started = true;
        expect(early).toEqual([]);
        expect(await sandbox.server.call('hello')).toBe('slow');
      });
    } finally {
      sandbox.portClient = portClient;
      await rm(tools.dir, { recursive: true, force: true });
    }
  });

  test('a server that does not listen within timeoutMs is killed; the error has its output', async () => {
    const tools = await commandModule('SlowerTools', 'slower', 5000);
    try {
      tools.register();
      const error = await sandbox.server
        .start({ port: 8088, modules: [tools.module], timeoutMs: 300 })
        .catch((e) => e);
      expect(error).toBeInstanceOf(SandboxError);
      expect(error.message).toMatch(
        /^the command server did not start listening within 300 ms; its output ends:\n/,
      );
      // The kill is sent; envd notices the exit a moment later.
      const running = async () =>
        (await sandbox.commands.list()).filter((p) => p.running && p.cmd.includes('--port 8088 '));
      for (let i = 0; i < 50 && (await running()).length > 0; i++) {
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect(await running()).toEqual([]);
      expect(await sandbox.server.attach(8088)).toBe(false);
    } finally {
      await sandbox.server.attach(8080);
      await rm(tools.dir, { recursive: true, force: true });
    }
  });
});

describe('server lifecycle errors', () => {
  test('a template without ports is refused at once', async () => {
    const plain = await Sandbox.create({ home });
    try {
      await expect(plain.server.start({ commands: [SandboxCommands] })).rejects.toThrow(
        CapabilityError,
      );
    } finally {
      await plain.kill();
    }
  });

  test('a server that cannot start reports the tail of its log', async () => {
    const error = await sandbox.server
      .start({ port: 8090, modules: [join(ROOT, 'test', 'fixtures', 'throwing-module.ts')] })
      .catch((e) => e);
    expect(error).toBeInstanceOf(SandboxError);
    expect(error.message).toMatch(
      /the command server exited \(code \d+\) before answering; its output ends:/,
    );
    expect(error.message).toContain('boom at import');
  });

  test('after stop, calls say no server runs', async () => {
    await sandbox.server.stop();
    await expect(sandbox.server.call('add', { x: 1 })).rejects.toThrow(
      `no command server runs in sandbox ${sandbox.sandboxId} on port 8080`,
    );
  });
});
