import { execFileSync } from 'node:child_process';
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
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;
let sandbox: Sandbox;

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
  await Templates.build(join(ROOT, 'test', 'fixtures', 'templates', 'server-e2e.yaml'), { home });
  sandbox = await Sandbox.create({ home, template: 'server-e2e' });
}, 300_000);

afterAll(async () => {
  await sandbox?.kill().catch(() => undefined);
  await abx?.close();
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
