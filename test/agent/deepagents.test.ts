import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type BaseMessage, ToolMessage } from '@langchain/core/messages';
import {
  createDeepAgent,
  createFilesystemMiddleware,
  isSandboxBackend,
  type SandboxBackendProtocolV2,
} from 'deepagents';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  type DeepAgentsBackend,
  deepAgentsBackend,
  InvalidArgumentError,
  LocalShellSandbox,
  Sandbox,
} from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { ScriptedChatModel } from './deepagents-scripted-model.js';

// Behaviours of deepagents JS's sandbox standard tests (lifecycle, command execution, file
// operations, write, read, edit, ls, grep, glob, initial files, integration), checked here on a
// real sandbox through the adapter with no options (real paths: the file tools and `execute` see
// one file system), then its opt-in virtual root, then deepagents' own tools and a deepagents
// agent. scripts/deepagents-standard-tests.sh runs deepagents' own copy of those tests.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let sandbox: Sandbox;
/** The sandbox's working directory (where `execute` runs, relative paths start). */
let home: string;
let backend: DeepAgentsBackend;
/** What this test needs of a LangChain tool (kept structural). */
interface LangChainTool {
  name: string;
  invoke(call: unknown): Promise<unknown>;
}
type MessageContent = string | ({ text: string } | Record<string, unknown>)[];
let tools: LangChainTool[];

beforeAll(async () => {
  abx = await createAbxHome();
  sandbox = await Sandbox.create({ home: abx.home });
  home = (await sandbox.execute('pwd')).output.trim();
  backend = deepAgentsBackend(sandbox);
  // deepagents' own file tools, as its agents get them for a sandbox backend.
  tools = (createFilesystemMiddleware({ backend }).tools ?? []) as LangChainTool[];
}, 300_000);

afterAll(async () => {
  await sandbox?.kill().catch(() => undefined);
  await abx?.close();
});

type Failure = { error: string };

/** The result of a backend call that must succeed (its error, if any, fails the test). */
async function ok<T extends object>(pending: Promise<T | Failure>): Promise<Exclude<T, Failure>> {
  const result = await pending;
  if ('error' in result && typeof result.error === 'string') throw new Error(result.error);
  return result as Exclude<T, Failure>;
}

/** The error of a backend call that must fail. */
async function failure(pending: Promise<object>): Promise<string> {
  const result = (await pending) as Partial<Failure>;
  if (typeof result.error !== 'string')
    throw new Error(`expected an error: ${JSON.stringify(result)}`);
  return result.error;
}

/** A file's text as the sandbox has it (an absolute path). */
async function cat(path: string): Promise<string> {
  return sandbox.files.read(path);
}

async function text(path: string, on: DeepAgentsBackend = backend): Promise<string> {
  const page = await ok(on.read(path));
  return typeof page.content === 'string' ? page.content : '';
}

async function paths(pending: Promise<{ files: { path: string }[] } | Failure>) {
  return (await ok(pending)).files.map((f) => f.path).sort();
}

describe('deepAgentsBackend(sandbox)', () => {
  test('is a deepagents sandbox backend (type and runtime check) with the sandbox id', () => {
    const typed: SandboxBackendProtocolV2 = backend;
    expect(isSandboxBackend(typed)).toBe(true);
    expect(backend.id).toBe(sandbox.sandboxId);
    expect(tools.map((t) => t.name)).toEqual(
      expect.arrayContaining([
        'ls',
        'read_file',
        'write_file',
        'edit_file',
        'glob',
        'grep',
        'execute',
      ]),
    );
  });
});

describe('real paths (the default): the file tools and execute see one file system', () => {
  test("write_file('/app/main.py') then execute('python3 /app/main.py') runs that file", async () => {
    await ok(backend.write('/app/main.py', 'print("hello from /app")\n'));
    expect(await cat('/app/main.py')).toBe('print("hello from /app")\n');
    expect(await backend.execute('python3 /app/main.py')).toEqual({
      output: 'hello from /app\n',
      exitCode: 0,
      truncated: false,
    });
    // And the other way: what a command writes, the file tools read at the same path.
    await backend.execute('mkdir -p /srv/made && echo "by the shell" > /srv/made/out.txt');
    expect(await text('/srv/made/out.txt')).toBe('by the shell');
    expect(await paths(backend.ls('/srv/made'))).toEqual(['/srv/made/out.txt']);
    await ok(backend.edit('/app/main.py', '/app', '/app, edited'));
    expect((await backend.execute('python3 /app/main.py')).output).toBe(
      'hello from /app, edited\n',
    );
  });

  test('relative paths start at the working directory, where execute runs; ~ is $HOME', async () => {
    expect((await backend.execute('pwd')).output).toBe(`${home}\n`);
    await ok(backend.write('rel/one.txt', 'one'));
    expect(await cat(`${home}/rel/one.txt`)).toBe('one');
    expect((await backend.execute('cat rel/one.txt')).output).toBe('one');
    expect(await text('./rel/../rel/one.txt')).toBe('one');
    expect(await text('~/rel/one.txt')).toBe('one');
    // Asked with a relative path, the answers are relative too (as `find rel` prints them).
    expect(await paths(backend.ls('rel'))).toEqual(['rel/one.txt']);
    expect((await ok(backend.grep('one', 'rel'))).matches.map((m) => m.path)).toEqual([
      'rel/one.txt',
    ]);
    expect(await paths(backend.glob('*.txt', 'rel'))).toEqual(['one.txt']);
    expect(await backend.uploadFiles([['rel/two.txt', new TextEncoder().encode('two')]])).toEqual([
      { path: 'rel/two.txt', error: null },
    ]);
    expect((await backend.execute('cat rel/two.txt')).output).toBe('two');
    expect(await backend.downloadFiles(['rel/two.txt'])).toEqual([
      { path: 'rel/two.txt', content: new TextEncoder().encode('two'), error: null },
    ]);
  });

  test('absolute paths are the real ones, normalized; / is the whole sandbox', async () => {
    await ok(backend.write('/tmp/da-real//a/../b.txt', 'b'));
    expect(await cat('/tmp/da-real/b.txt')).toBe('b');
    expect(await text(`${home}/../..${home}/rel/one.txt`)).toBe('one');
    expect(await paths(backend.ls('/'))).toEqual(
      expect.arrayContaining(['/app/', '/home/', '/tmp/', '/usr/']),
    );
  });

  test('a path that cannot be one is invalid_path; deleting / is refused', async () => {
    const good = new TextEncoder().encode('fine');
    expect(
      await backend.uploadFiles([
        ['', good],
        ['/tmp/nul\0byte.txt', good],
        ['/tmp/da-real/fine.txt', good],
      ]),
    ).toEqual([
      { path: '', error: 'invalid_path' },
      { path: '/tmp/nul\0byte.txt', error: 'invalid_path' },
      { path: '/tmp/da-real/fine.txt', error: null },
    ]);
    expect(await backend.downloadFiles([''])).toEqual([
      { path: '', content: null, error: 'invalid_path' },
    ]);
    expect(await failure(backend.read(''))).toBe(
      "Error reading file '': invalid path (empty, or holding a NUL byte)",
    );
    expect(await failure(backend.delete('/'))).toContain('root folder is not deleted');
    expect(await failure(backend.delete('/tmp/..'))).toContain('root folder is not deleted');
    expect((await backend.execute(`test -d ${home} && test -d /usr`)).exitCode).toBe(0);
  });

  test('works for any BaseSandbox: a LocalShellSandbox, relative to its folder', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'abx-deepagents-'));
    try {
      const local = deepAgentsBackend(new LocalShellSandbox({ root: folder }));
      await ok(local.write('notes/a.md', 'local'));
      expect(await readFile(join(folder, 'notes/a.md'), 'utf8')).toBe('local');
      expect((await local.execute('cat notes/a.md')).output).toBe('local');
      expect(await paths(local.ls(join(folder, 'notes')))).toEqual([join(folder, 'notes/a.md')]);
      expect(await paths(local.glob('**/*.md', folder))).toEqual(['notes/a.md']);
    } finally {
      await rm(folder, { recursive: true, force: true });
    }
  });
});

describe("searching / (deepagents' default path)", () => {
  // At most 15 characters: also the name of a process (its /proc/PID/status says `Name:\tMARKER`).
  const marker = `abxm${Math.random().toString(36).slice(2, 10)}`;
  let pid = '';
  let running: Awaited<ReturnType<Sandbox['commands']['start']>> | undefined;
  /** A search with time to walk all of / (its names; it reads only the files the glob picks). */
  let patient: DeepAgentsBackend;

  beforeAll(async () => {
    patient = deepAgentsBackend(sandbox, { searchTimeBudgetMs: 120_000 });
    const files = [
      `${home}/search/found.py`,
      `${home}/search/status`,
      `${home}/search/null`,
      '/dev/shm/found.py',
    ];
    const written = await backend.uploadFiles(
      files.map((path) => [path, new TextEncoder().encode(`${marker}\n`)]),
    );
    expect(written.map((w) => w.error)).toEqual(files.map(() => null));
    running = await sandbox.commands.start(
      `cp /bin/sleep /tmp/${marker} && echo $$ > /tmp/marker.pid && exec /tmp/${marker} 300`,
    );
    for (let i = 0; i < 100 && !pid; i++) {
      pid = (await sandbox.execute('cat /tmp/marker.pid 2>/dev/null')).output.trim();
      if (!pid) await new Promise((resolve) => setTimeout(resolve, 50));
    }
  });

  afterAll(async () => {
    await running?.kill().catch(() => undefined);
  });

  test('grep finds the sandbox’s files with no path or /, never walking into /proc, /sys, /dev', async () => {
    // The marker is in /proc and /dev: searched there when asked for by name...
    expect((await ok(backend.grep(marker, `/proc/${pid}/status`))).matches).toEqual([
      { path: `/proc/${pid}/status`, line: 1, text: `Name:\t${marker}` },
    ]);
    expect((await ok(backend.grep(marker, '/dev/shm'))).matches.map((m) => m.path)).toEqual([
      '/dev/shm/found.py',
    ]);
    // ...but a search of / does not walk into them.
    for (const path of [undefined, null, '/']) {
      const { matches } = await ok(backend.grep(marker, path));
      expect(matches.map((m) => m.path)).toContain(`${home}/search/found.py`);
      expect(matches.filter((m) => /^\/(proc|sys|dev)\//.test(m.path))).toEqual([]);
    }
    expect(await patient.grep(marker, '/', '{status,found.py}')).toEqual({
      matches: [
        { path: `${home}/search/found.py`, line: 1, text: marker },
        { path: `${home}/search/status`, line: 1, text: marker },
      ],
      truncated: false,
    });
  });

  test('glob finds files under / and none in /proc, /sys or /dev', async () => {
    expect(await paths(backend.glob('status', `/proc/${pid}`))).toEqual(['status']);
    const found = await ok(patient.glob('**/{status,null,found.py}', '/'));
    expect(found.truncated).toBe(false);
    const shown = found.files.map((f) => f.path);
    const mine = `${home.slice(1)}/search`;
    expect(shown).toEqual(
      expect.arrayContaining([`${mine}/found.py`, `${mine}/null`, `${mine}/status`]),
    );
    expect(shown.filter((p) => /^(proc|sys|dev)\//.test(p))).toEqual([]);
    // With deepagents' default budget too: the working directory comes before /usr.
    expect(await paths(backend.glob('**/found.py', '/'))).toContain(`${mine}/found.py`);
  });

  test('a search stopped at a bound says truncated: the match cap, the result cap, the time', async () => {
    await backend.execute(
      'mkdir -p trunc && cd trunc && for i in $(seq 1 1001); do echo hit > f$i.txt; done',
    );
    // grep: at max_count, when more matches exist.
    const capped = await ok(backend.grep('hit', `${home}/trunc`, null, 5));
    expect(capped.matches).toHaveLength(5);
    expect(capped.truncated).toBe(true);
    expect(await backend.grep('hit', `${home}/trunc`, 'f1.txt', 1)).toEqual({
      matches: [{ path: `${home}/trunc/f1.txt`, line: 1, text: 'hit' }],
      truncated: false,
    });
    // glob: at 1000 results.
    const many = await ok(backend.glob('*.txt', `${home}/trunc`));
    expect(many.files).toHaveLength(1000);
    expect(many.truncated).toBe(true);
    // Both: at the time budget (0: at once).
    const hasty = deepAgentsBackend(sandbox, { searchTimeBudgetMs: 0 });
    expect(await hasty.grep('hit', `${home}/trunc`)).toEqual({ matches: [], truncated: true });
    expect(await hasty.glob('*.txt', `${home}/trunc`)).toEqual({ files: [], truncated: true });
    // deepagents' grep tool tells the model.
    expect(await call('grep', { pattern: 'hit', path: `${home}/trunc`, max_count: 2 })).toContain(
      'the search stopped early',
    );
  });
});

describe('{ root }: a virtual root (opt-in)', () => {
  let virtual: DeepAgentsBackend;
  beforeAll(() => {
    virtual = deepAgentsBackend(sandbox, { root: `${home}/vroot` });
  });
  const inRoot = (path: string) => cat(`${home}/vroot${path}`);

  test("the model's / is the root; relative paths start there too", async () => {
    await ok(virtual.write('/vr/a.txt', 'alpha\n'));
    await ok(virtual.write('vr/b.txt', 'beta\n'));
    expect(await inRoot('/vr/a.txt')).toBe('alpha\n');
    expect(await inRoot('/vr/b.txt')).toBe('beta\n');
    expect(await text('/vr/b.txt', virtual)).toBe('beta');
    // `..` inside the root is fine.
    expect(await text('/vr/sub/../a.txt', virtual)).toBe('alpha');
  });

  test('/ lists, finds and searches the root only, never the system image', async () => {
    await ok(virtual.write('/vr/a.txt', 'needle\n'));
    const listed = await paths(virtual.ls('/'));
    expect(listed).toContain('/vr/');
    expect(listed.filter((p) => /^\/(usr|etc|proc|bin)\b/.test(p))).toEqual([]);
    const found = await paths(virtual.glob('**/*.txt'));
    expect(found).toContain('vr/a.txt');
    expect(found.every((p) => !p.startsWith('usr/') && !p.startsWith('/'))).toBe(true);
    // deepagents' grep tool passes '/' by default; the protocol allows no path at all.
    for (const path of ['/', undefined, null]) {
      const { matches } = await ok(virtual.grep('needle', path));
      expect(matches.map((m) => m.path)).toEqual(['/vr/a.txt']);
    }
  });

  test('paths that climb out of the root are refused by every method', async () => {
    const escapes = ['/..', '../etc/passwd', '/vr/../../etc/passwd'];
    for (const path of escapes) {
      for (const error of [
        await failure(virtual.ls(path)),
        await failure(virtual.read(path)),
        await failure(virtual.readRaw(path)),
        await failure(virtual.write(path, 'x')),
        await failure(virtual.edit(path, 'a', 'b')),
        await failure(virtual.delete(path)),
        await failure(virtual.grep('root', path)),
        await failure(virtual.glob('*', path)),
      ]) {
        expect(error).toContain('Path traversal not allowed');
        expect(error).toContain(`'${path}'`);
      }
      expect(await virtual.uploadFiles([[path, new Uint8Array([1])]])).toEqual([
        { path, error: 'invalid_path' },
      ]);
      expect(await virtual.downloadFiles([path])).toEqual([
        { path, content: null, error: 'invalid_path' },
      ]);
    }
    // The ones inside still go through, in order, around a refused one.
    const answers = await virtual.uploadFiles([
      ['/vr/u1.txt', new TextEncoder().encode('1')],
      ['../u2.txt', new TextEncoder().encode('2')],
      ['/vr/u3.txt', new TextEncoder().encode('3')],
    ]);
    expect(answers).toEqual([
      { path: '/vr/u1.txt', error: null },
      { path: '../u2.txt', error: 'invalid_path' },
      { path: '/vr/u3.txt', error: null },
    ]);
    expect(await inRoot('/vr/u3.txt')).toBe('3');
  });

  test("errors name the model's paths, not the sandbox's", async () => {
    const error = await failure(virtual.read('/vr/none.txt'));
    expect(error).toBe("File '/vr/none.txt' not found");
    expect(await failure(virtual.edit('/vr/none.txt', 'a', 'b'))).toBe(
      "Error: File '/vr/none.txt' not found",
    );
    await ok(virtual.write('/vr/dir/f.txt', 'x'));
    expect(await failure(virtual.read('/vr/dir'))).not.toContain(home);
    expect(await failure(virtual.write('/vr/dir', 'x'))).not.toContain(home);
  });

  test('execute runs in the root, but is not confined to it (the documented caveat)', async () => {
    expect((await virtual.execute('pwd')).output).toBe(`${home}/vroot\n`);
    await ok(virtual.write('/tool.py', 'print("ran")\n'));
    // Relative paths agree with the file tools...
    expect((await virtual.execute('python3 tool.py')).output).toBe('ran\n');
    // ...an absolute one is the shell's real path, not the model's.
    const real = await virtual.execute('python3 /tool.py');
    expect(real.exitCode).not.toBe(0);
    expect((await virtual.execute('cat /etc/hostname')).exitCode).toBe(0);
  });

  test('relative paths come back relative: the same in the file tools and in execute', async () => {
    await ok(virtual.write('rel/one.txt', 'one'));
    expect(await paths(virtual.ls('rel'))).toEqual(['rel/one.txt']);
    expect((await ok(virtual.grep('one', 'rel'))).matches.map((m) => m.path)).toEqual([
      'rel/one.txt',
    ]);
    expect((await virtual.execute('cat rel/one.txt')).output).toBe('one');
  });

  test('the root is created if missing; deleting / empties it', async () => {
    const other = deepAgentsBackend(sandbox, { root: '/tmp/da-project/' });
    expect((await other.execute('pwd')).output).toBe('/tmp/da-project\n');
    await ok(other.write('/src/app.py', 'print(1)\n'));
    expect(await sandbox.files.read('/tmp/da-project/src/app.py')).toBe('print(1)\n');
    expect(await paths(other.ls('/'))).toEqual(['/src/']);
    expect(await paths(other.glob('**/*.py'))).toEqual(['src/app.py']);
    expect(await ok(other.delete('/'))).toEqual({ path: '/', filesUpdate: null });
    expect(await paths(other.ls('/'))).toEqual([]);
    expect((await sandbox.execute('test -d /tmp/da-project')).exitCode).toBe(0);
  });

  test('a root that cannot be a folder fails the first call, naming it', async () => {
    const broken = deepAgentsBackend(sandbox, { root: '/etc/passwd/project' });
    await expect(broken.ls('/')).rejects.toThrow(InvalidArgumentError);
    await expect(broken.ls('/')).rejects.toThrow("'/etc/passwd/project'");
  });

  test('works for any BaseSandbox: a LocalShellSandbox', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'abx-deepagents-'));
    try {
      const local = deepAgentsBackend(new LocalShellSandbox({ root: folder }), { root: '.' });
      await ok(local.write('/notes/a.md', 'local'));
      expect(await readFile(join(folder, 'notes/a.md'), 'utf8')).toBe('local');
      expect(await paths(local.ls('/notes'))).toEqual(['/notes/a.md']);
      expect(await paths(local.glob('**/*.md'))).toEqual(['notes/a.md']);
    } finally {
      await rm(folder, { recursive: true, force: true });
    }
  });
});

describe('command execution', () => {
  test('echo, exit codes, multiline output, environment variables, unknown commands', async () => {
    expect(await backend.execute('echo "hello"')).toEqual({
      output: 'hello\n',
      exitCode: 0,
      truncated: false,
    });
    expect((await backend.execute('exit 42')).exitCode).toBe(42);
    expect((await backend.execute('echo line1 && echo line2 && echo line3')).output).toBe(
      'line1\nline2\nline3\n',
    );
    expect((await backend.execute('export MY_VAR="test_value" && echo $MY_VAR')).output).toBe(
      'test_value\n',
    );
    const missing = await backend.execute('nonexistent_command_12345');
    expect(missing.exitCode).toBe(127);
    expect(missing.output).toMatch(/^\[stderr\] .*nonexistent_command_12345.*not found/);
  });

  test('each line of standard error is marked [stderr]; stdout and the exit code stay', async () => {
    const result = await backend.execute(
      "echo out; printf 'e1\\ne2\\n' >&2; echo out2; printf 'last' >&2; exit 3",
    );
    expect(result.exitCode).toBe(3);
    expect(result.output.split('\n').sort()).toEqual(
      ['out', 'out2', '[stderr] e1', '[stderr] e2', '[stderr] last'].sort(),
    );
    // A syntax error of the command is the command's own (marked), not the wrapper's.
    const syntax = await backend.execute('echo "unbalanced');
    expect(syntax.exitCode).toBe(2);
    expect(syntax.output).toMatch(/^\[stderr\] .*(Unterminated|unexpected EOF)/);
    // exit, heredocs and parentheses in the command work as in a plain shell.
    expect((await backend.execute('cat <<EOF\n(x) $((1 + 2))\nEOF\nexit 0')).output).toBe(
      '(x) 3\n',
    );
  });
});

describe('file operations', () => {
  test('upload, download, round trip, several at once, a missing file', async () => {
    const bytes = Uint8Array.from([0, 1, 2, 250, 255, 10]);
    expect(
      await backend.uploadFiles([
        [`${home}/fo/a.bin`, bytes],
        [`${home}/fo/b.txt`, new TextEncoder().encode('Content 2')],
        [`${home}/fo/c.txt`, new TextEncoder().encode('Content 3')],
      ]),
    ).toEqual([
      { path: `${home}/fo/a.bin`, error: null },
      { path: `${home}/fo/b.txt`, error: null },
      { path: `${home}/fo/c.txt`, error: null },
    ]);
    expect((await backend.execute('cat fo/b.txt fo/c.txt')).output).toBe('Content 2Content 3');
    expect(await backend.downloadFiles([`${home}/fo/a.bin`, `${home}/fo/none.txt`])).toEqual([
      { path: `${home}/fo/a.bin`, content: bytes, error: null },
      { path: `${home}/fo/none.txt`, content: null, error: 'file_not_found' },
    ]);
  });
});

describe('write', () => {
  test.each([
    ['basic content', 'Hello, sandbox!\nLine 2\nLine 3'],
    [
      'shell metacharacters',
      'Special chars: $VAR, `command`, $(subshell)\nTab\there\nBackslash: \\',
    ],
    ['nothing', ''],
    ['unicode', 'Hello 👋 世界 مرحبا Привет 🌍\nLine with émojis 🎉'],
    ['only newlines', '\n\n\n\n\n'],
    ['1000 lines', Array.from({ length: 1000 }, (_, i) => `Line ${i}`).join('\n')],
  ])('writes %s exactly', async (name, content) => {
    const path = `${home}/wt/${name.replaceAll(' ', '-')}.txt`;
    expect(await backend.write(path, content)).toEqual({ path, filesUpdate: null });
    expect(await cat(path)).toBe(content);
  });

  test('creates parents, overwrites, takes spaces and repeated slashes', async () => {
    await ok(backend.write(`${home}/wt/deep/nested/dir/file.txt`, 'Nested'));
    expect(await cat(`${home}/wt/deep/nested/dir/file.txt`)).toBe('Nested');
    await ok(backend.write(`${home}/wt/over.txt`, 'First content'));
    await ok(backend.write(`${home}/wt/over.txt`, 'Second content'));
    expect(await cat(`${home}/wt/over.txt`)).toBe('Second content');
    await ok(backend.write(`${home}/wt/dir with spaces/file name.txt`, 'spaced'));
    expect(await cat(`${home}/wt/dir with spaces/file name.txt`)).toBe('spaced');
    await ok(backend.write(`${home}/wt//slashes///file.txt`, 'Content'));
    expect(await cat(`${home}/wt/slashes/file.txt`)).toBe('Content');
  });
});

describe('read', () => {
  const rows = (n: number) =>
    Array.from({ length: n }, (_, i) => `Row_${i + 1}_content`).join('\n');

  test('whole files, unicode, long lines, an empty file, a missing one', async () => {
    await ok(backend.write(`${home}/rd/basic.txt`, 'Line 1\nLine 2\nLine 3'));
    expect(await ok(backend.read(`${home}/rd/basic.txt`))).toMatchObject({
      content: 'Line 1\nLine 2\nLine 3',
      mimeType: 'text/plain',
      startLine: 1,
      endLine: 3,
    });
    const unicode = 'Hello 👋 世界\nПривет мир\nمرحبا العالم';
    await ok(backend.write(`${home}/rd/unicode.txt`, unicode));
    expect(await text(`${home}/rd/unicode.txt`)).toBe(unicode);
    await ok(
      backend.write(`${home}/rd/long.txt`, `Short line\n${'x'.repeat(3000)}\nAnother short line`),
    );
    expect(await text(`${home}/rd/long.txt`)).toContain('Short line');
    await ok(backend.write(`${home}/rd/empty.txt`, ''));
    expect(await backend.read(`${home}/rd/empty.txt`)).not.toHaveProperty('error');
    expect(await failure(backend.read(`${home}/rd/nonexistent.txt`))).toContain('not found');
  });

  test('offset and limit page by lines; beyond the end nothing comes back', async () => {
    await ok(backend.write(`${home}/rd/rows.txt`, rows(20)));
    const page = async (o: number, l: number) => {
      const result = await backend.read(`${home}/rd/rows.txt`, o, l);
      return 'content' in result && typeof result.content === 'string' ? result.content : '';
    };
    expect(await page(5, 500)).toMatch(/^Row_6_content\n/);
    expect(await page(0, 5)).toBe(rows(5));
    expect(await page(10, 5)).toBe(rows(15).split('\n').slice(10).join('\n'));
    expect(await page(0, 0)).toBe('');
    expect(await page(100, 10)).toBe('');
    expect(await page(20, 10)).toBe('');
    expect(await ok(backend.read(`${home}/rd/rows.txt`, 10, 5))).toMatchObject({
      totalLines: 20,
      startLine: 11,
      endLine: 15,
      nextOffset: 15,
    });
    expect(await ok(backend.read(`${home}/rd/rows.txt`, 15, 5))).not.toHaveProperty('nextOffset');
  });

  test('a large file in chunks', async () => {
    const lines = Array.from({ length: 1000 }, (_, i) => `Line_${String(i).padStart(4, '0')}`);
    await ok(backend.write(`${home}/rd/chunked.txt`, lines.join('\n')));
    for (const start of [0, 500, 900]) {
      expect((await ok(backend.read(`${home}/rd/chunked.txt`, start, 100))).content).toBe(
        lines.slice(start, start + 100).join('\n'),
      );
    }
  });

  test('binary files come back as bytes with a MIME type (read and readRaw)', async () => {
    const png = Uint8Array.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 1, 2]);
    await sandbox.files.write(`${home}/rd/pixel.png`, png);
    expect(await backend.read(`${home}/rd/pixel.png`)).toEqual({
      content: png,
      mimeType: 'image/png',
    });
    expect(await backend.readRaw(`${home}/rd/pixel.png`)).toMatchObject({
      data: { content: png, mimeType: 'image/png' },
    });
    expect(await backend.readRaw(`${home}/rd/basic.txt`)).toMatchObject({
      data: { content: 'Line 1\nLine 2\nLine 3', mimeType: 'text/plain' },
    });
    expect(await failure(backend.readRaw(`${home}/rd/none.png`))).toBe(
      `File '${home}/rd/none.png' not found`,
    );
  });
});

describe('edit', () => {
  async function edited(
    content: string,
    oldString: string,
    newString: string,
    replaceAll?: boolean,
  ) {
    const path = `${home}/ed/${Math.random().toString(36).slice(2)}.txt`;
    await ok(backend.write(path, content));
    const result = await backend.edit(path, oldString, newString, replaceAll);
    return { result, after: await cat(path), path };
  }

  test.each([
    [
      'one occurrence',
      'Hello world\nGoodbye world',
      'Goodbye',
      'Farewell',
      'Hello world\nFarewell world',
    ],
    [
      'regex metacharacters',
      'Price: $100.00 [a-z]*',
      '$100.00 [a-z]*',
      '$200.00 [0-9]+',
      'Price: $200.00 [0-9]+',
    ],
    ['several lines', 'Line 1\nLine 2\nLine 3', 'Line 1\nLine 2', 'Combined', 'Combined\nLine 3'],
    [
      'deletion',
      'Keep this\nDelete this part\nKeep this too',
      'Delete this part\n',
      '',
      'Keep this\nKeep this too',
    ],
    ['identical strings', 'Same text', 'Same text', 'Same text', 'Same text'],
    [
      'unicode',
      'Hello 👋 world\n世界 is beautiful',
      '👋',
      '🌍',
      'Hello 🌍 world\n世界 is beautiful',
    ],
    ['whitespace only', 'Line1    Line2', '    ', ' ', 'Line1 Line2'],
    [
      'long strings',
      `Start\n${'x'.repeat(1000)}\nEnd`,
      'x'.repeat(1000),
      'y'.repeat(1000),
      `Start\n${'y'.repeat(1000)}\nEnd`,
    ],
    [
      'a line, keeping line endings',
      'Line 1\nLine 2\nLine 3\n',
      'Line 2',
      'Modified Line 2',
      'Line 1\nModified Line 2\nLine 3\n',
    ],
    ['a substring', 'The quick brown fox jumps', 'brown fox', 'red cat', 'The quick red cat jumps'],
  ])('replaces %s', async (_name, content, oldString, newString, expected) => {
    const { result, after, path } = await edited(content, oldString, newString);
    expect(result).toEqual({ path, filesUpdate: null, occurrences: 1 });
    expect(after).toBe(expected);
  });

  test("several occurrences: deepagents' 'multiple' error and an unchanged file, or replaceAll", async () => {
    const content = 'apple\nbanana\napple\norange\napple';
    const refused = await edited(content, 'apple', 'pear', false);
    expect(refused.result).toEqual({
      error:
        "Error: String 'apple' has multiple occurrences (appears 3 times) in file. Use replace_all=True to replace all instances, or provide a more specific string with surrounding context.",
    });
    expect(refused.after).toBe(content);
    const all = await edited(content, 'apple', 'pear', true);
    expect(all.result).toMatchObject({ occurrences: 3 });
    expect(all.after).toBe('pear\nbanana\npear\norange\npear');
  });

  test('a string or a file that is not there', async () => {
    const { result } = await edited('Hello world', 'nonexistent', 'replacement');
    expect((result as Failure).error.toLowerCase()).toContain('not found');
    expect(
      (await failure(backend.edit(`${home}/ed/none.txt`, 'old', 'new'))).toLowerCase(),
    ).toContain('not found');
  });
});

describe('ls', () => {
  test('files and folders (folders with a trailing / and is_dir), sizes, hidden files', async () => {
    await ok(backend.write(`${home}/li/file1.txt`, 'content1'));
    await ok(backend.write(`${home}/li/.hidden`, 'hidden'));
    await backend.execute('mkdir -p li/subdir');
    const { files } = await ok(backend.ls(`${home}/li`));
    expect(files.map(({ path, is_dir, size }) => ({ path, is_dir, size }))).toEqual([
      { path: `${home}/li/.hidden`, is_dir: false, size: 6 },
      { path: `${home}/li/file1.txt`, is_dir: false, size: 8 },
      { path: `${home}/li/subdir/`, is_dir: true, size: expect.any(Number) },
    ]);
    expect(files.every((f) => !Number.isNaN(Date.parse(f.modified_at ?? '')))).toBe(true);
    // A trailing slash on the folder asked for changes nothing.
    expect(await paths(backend.ls(`${home}/li/`))).toEqual(files.map((f) => f.path));
  });

  test('an empty folder, a missing one and a file list as empty', async () => {
    await backend.execute('mkdir -p li-empty');
    expect(await backend.ls(`${home}/li-empty`)).toEqual({ files: [] });
    expect(await backend.ls(`${home}/li-does-not-exist-12345`)).toEqual({ files: [] });
    await ok(backend.write(`${home}/li-file.txt`, 'x'));
    expect(await backend.ls(`${home}/li-file.txt`)).toEqual({ files: [] });
  });

  test('spaces, unicode and special characters in names; 50 entries', async () => {
    const names = ['file with spaces.txt', '测试文件.txt', 'файл.txt', 'file(1).txt', 'file-3.txt'];
    for (const name of names) await ok(backend.write(`${home}/li-names/${name}`, 'content'));
    await backend.execute("mkdir -p 'li-names/dir with spaces'");
    expect(await paths(backend.ls(`${home}/li-names`))).toEqual(
      [...names.map((n) => `${home}/li-names/${n}`), `${home}/li-names/dir with spaces/`].sort(),
    );
    await backend.execute(
      "mkdir -p li-large && cd li-large && for i in $(seq 0 49); do echo c > file_$(printf '%03d' $i).txt; done",
    );
    const large = await paths(backend.ls(`${home}/li-large`));
    expect(large).toHaveLength(50);
    expect(large[0]).toBe(`${home}/li-large/file_000.txt`);
    expect(large[49]).toBe(`${home}/li-large/file_049.txt`);
  });
});

describe('grep', () => {
  beforeAll(async () => {
    await backend.uploadFiles(
      Object.entries({
        [`${home}/gr/file1.txt`]: 'Hello world\nGoodbye world',
        [`${home}/gr/file2.py`]: 'Hello there\npattern_match',
        [`${home}/gr/fruits.txt`]: 'apple\nbanana\napple\norange\napple',
        [`${home}/gr/case.txt`]: 'Hello\nhello\nHELLO',
        [`${home}/gr/special.txt`]: 'Price: $100\nPattern: [a-z]*\ntest123',
        [`${home}/gr/unicode.txt`]: 'Hello 世界\nПривет мир',
        [`${home}/gr/sub1/sub2/level2.txt`]: 'target_nested here',
        [`${home}/gr/long.txt`]: Array.from({ length: 100 }, (_, i) => `Line ${i + 1}`).join('\n'),
      }).map(([path, content]) => [path, new TextEncoder().encode(content)]),
    );
    await backend.execute('mkdir -p gr-empty');
  });

  const found = async (pattern: string, path = `${home}/gr`, glob?: string) =>
    (await ok(backend.grep(pattern, path, glob))).matches;

  test('a literal, case-sensitive substring, with its line numbers, recursively', async () => {
    expect(await found('apple')).toEqual(
      [1, 3, 5].map((line) => ({
        path: `${home}/gr/fruits.txt`,
        line,
        text: 'apple',
      })),
    );
    expect(await found('Hello')).toHaveLength(4);
    expect((await found('Hello', `${home}/gr`, '*.py')).map((m) => m.path)).toEqual([
      `${home}/gr/file2.py`,
    ]);
    expect(await found('$100')).toEqual([
      { path: `${home}/gr/special.txt`, line: 1, text: 'Price: $100' },
    ]);
    expect((await found('[a-z]*')).map((m) => m.text)).toEqual(['Pattern: [a-z]*']);
    expect((await found('test123')).map((m) => m.line)).toEqual([3]);
    expect((await found('世界')).map((m) => m.text)).toEqual(['Hello 世界']);
    expect((await found('HELLO')).map((m) => m.path)).toEqual([`${home}/gr/case.txt`]);
    expect(await found('target_nested')).toEqual([
      { path: `${home}/gr/sub1/sub2/level2.txt`, line: 1, text: 'target_nested here' },
    ]);
    expect(await found('Line 50')).toEqual([
      { path: `${home}/gr/long.txt`, line: 50, text: 'Line 50' },
    ]);
  });

  test('nothing found: no match, an empty folder, a missing folder', async () => {
    expect(await backend.grep('nonexistent_str', `${home}/gr`)).toEqual({
      matches: [],
      truncated: false,
    });
    expect(await backend.grep('anything', `${home}/gr-empty`)).toEqual({
      matches: [],
      truncated: false,
    });
    expect(await backend.grep('anything', `${home}/gr-missing`)).toEqual({
      matches: [],
      truncated: false,
    });
  });

  test('maxCount caps the matches and says so', async () => {
    expect(await backend.grep('apple', `${home}/gr`, null, 2)).toEqual({
      matches: [
        { path: `${home}/gr/fruits.txt`, line: 1, text: 'apple' },
        { path: `${home}/gr/fruits.txt`, line: 3, text: 'apple' },
      ],
      truncated: true,
    });
  });
});

describe('glob', () => {
  beforeAll(async () => {
    const files = [
      'file1.txt',
      'file2.txt',
      'file10.txt',
      'fileA.txt',
      'file3.py',
      'README.md',
      '.hidden1',
      '.hidden2',
      'sub1/nested1.txt',
      'sub2/nested2.txt',
      'a/b/c/d/deep.txt',
      'a/b/other.txt',
    ];
    await backend.uploadFiles(files.map((f) => [`${home}/gl/${f}`, new TextEncoder().encode('c')]));
    await backend.execute('mkdir -p gl/emptydir');
  });

  const globbed = (pattern: string, path = `${home}/gl`) => paths(backend.glob(pattern, path));

  test('paths relative to the folder searched; * and ? stay within it', async () => {
    expect(await globbed('*.txt')).toEqual(['file1.txt', 'file10.txt', 'file2.txt', 'fileA.txt']);
    expect(await globbed('file?.txt')).toEqual(['file1.txt', 'file2.txt', 'fileA.txt']);
    expect(await globbed('file[1-2].txt')).toEqual(['file1.txt', 'file2.txt']);
    expect(await globbed('file[!1-3].txt')).toEqual(['fileA.txt']);
    expect(await globbed('*.py')).toEqual(['file3.py']);
    expect(await globbed('*.{py,md}')).toEqual(['README.md', 'file3.py']);
    expect(await globbed('.*')).toEqual(['.hidden1', '.hidden2']);
    expect(await globbed('*.rs')).toEqual([]);
  });

  test('** spans folders; a leading / is the folder searched', async () => {
    expect(await globbed('**/*.txt')).toEqual([
      'a/b/c/d/deep.txt',
      'a/b/other.txt',
      'file1.txt',
      'file10.txt',
      'file2.txt',
      'fileA.txt',
      'sub1/nested1.txt',
      'sub2/nested2.txt',
    ]);
    expect(await globbed('**/deep.txt')).toEqual(['a/b/c/d/deep.txt']);
    expect(await globbed('/a/**/*.txt')).toEqual(['a/b/c/d/deep.txt', 'a/b/other.txt']);
    expect(await globbed('*.txt', `${home}/gl/a/b`)).toEqual(['other.txt']);
  });

  test('folders are results too, with is_dir, sizes and times', async () => {
    const { files, truncated } = await ok(backend.glob('*', `${home}/gl/a`));
    expect(truncated).toBe(false);
    expect(files).toEqual([
      { path: 'b', is_dir: true, size: expect.any(Number), modified_at: expect.any(String) },
    ]);
    const top = await ok(backend.glob('*', home));
    expect(top.files.find((f) => f.path === 'gl')).toMatchObject({ is_dir: true });
    const dirs = (await ok(backend.glob('*', `${home}/gl`))).files.filter((f) => f.is_dir);
    expect(dirs.map((f) => f.path).sort()).toEqual(['a', 'emptydir', 'sub1', 'sub2']);
    const file = (await ok(backend.glob('file1.txt', `${home}/gl`))).files[0];
    expect(file).toMatchObject({ path: 'file1.txt', is_dir: false, size: 1 });
  });

  test('runs no program in the sandbox (envd walks the tree), and says when a pattern is bad', async () => {
    const interpreter = sandbox.interpreter;
    sandbox.interpreter = '/no/such/node';
    try {
      expect(await globbed('**/deep.txt')).toEqual(['a/b/c/d/deep.txt']);
      expect(await failure(backend.glob('file[z-a].txt', `${home}/gl`))).toBe(
        "Error finding files: invalid glob pattern 'file[z-a].txt'",
      );
    } finally {
      sandbox.interpreter = interpreter;
    }
  });

  test('a missing folder or a file finds nothing', async () => {
    expect(await backend.glob('*', `${home}/gl-missing`)).toEqual({ files: [], truncated: false });
    expect(await backend.glob('*', `${home}/gl/file1.txt`)).toEqual({
      files: [],
      truncated: false,
    });
  });
});

describe('integration', () => {
  test('write, read, edit, read; then list, find and search a tree', async () => {
    await ok(backend.write(`${home}/intg/workflow.txt`, 'Original content'));
    expect(await text(`${home}/intg/workflow.txt`)).toBe('Original content');
    await ok(backend.edit(`${home}/intg/workflow.txt`, 'Original', 'Modified'));
    expect(await text(`${home}/intg/workflow.txt`)).toBe('Modified content');

    await ok(backend.write(`${home}/intg/tree/root.txt`, 'root file'));
    await ok(backend.write(`${home}/intg/tree/subdir1/file1.txt`, 'file 1'));
    await ok(backend.write(`${home}/intg/tree/subdir1/file2.py`, 'file 2'));
    await ok(backend.write(`${home}/intg/tree/subdir2/file3.txt`, 'file 3'));
    expect(await paths(backend.ls(`${home}/intg/tree`))).toEqual([
      `${home}/intg/tree/root.txt`,
      `${home}/intg/tree/subdir1/`,
      `${home}/intg/tree/subdir2/`,
    ]);
    expect(await paths(backend.glob('**/*.txt', `${home}/intg/tree`))).toHaveLength(3);
    expect((await ok(backend.grep('file', `${home}/intg/tree`))).matches).toHaveLength(4);
  });
});

let calls = 0;

/** Runs one of deepagents' tools as its agent loop does: a tool call in, text out. */
async function call(name: string, args: Record<string, unknown>): Promise<string> {
  const found = tools.find((t) => t.name === name);
  if (!found) throw new Error(`deepagents has no tool ${name}`);
  calls += 1;
  const result: unknown = await found.invoke({
    id: `call-${calls}`,
    name,
    args,
    type: 'tool_call',
  });
  return contentText(
    typeof result === 'string' ? result : (result as { content: MessageContent }).content,
  );
}

function contentText(content: MessageContent): string {
  if (typeof content === 'string') return content;
  return content
    .map((block) => (typeof block.text === 'string' ? block.text : JSON.stringify(block)))
    .join('');
}

describe("deepagents' file tools on the backend", () => {
  test('write, edit, read, list, find, search, run and delete, in the model’s paths', async () => {
    expect(
      await call('write_file', { file_path: `${home}/da/notes.md`, content: 'alpha\nbeta\n' }),
    ).toBe(`Successfully wrote to '${home}/da/notes.md'`);
    expect(await cat(`${home}/da/notes.md`)).toBe('alpha\nbeta\n');
    expect(
      await call('edit_file', {
        file_path: `${home}/da/notes.md`,
        old_string: 'beta',
        new_string: 'gamma',
      }),
    ).toBe(`Successfully replaced 1 occurrence(s) in '${home}/da/notes.md'`);
    expect(await cat(`${home}/da/notes.md`)).toBe('alpha\ngamma\n');

    const read = await call('read_file', { file_path: `${home}/da/notes.md` });
    expect(read).toContain('alpha\ngamma');

    await sandbox.files.write(`${home}/da/sub/deep.md`, 'gamma ray\n');
    expect((await call('ls', { path: `${home}/da` })).split('\n').sort()).toEqual([
      `${home}/da/notes.md (12 bytes)`,
      `${home}/da/sub/ (directory)`,
    ]);
    expect((await call('glob', { pattern: '**/*.md', path: `${home}/da` })).split('\n')).toEqual([
      'notes.md',
      'sub/deep.md',
    ]);
    expect(
      (
        await call('grep', {
          pattern: 'gamma',
          path: `${home}/da`,
          output_mode: 'files_with_matches',
        })
      ).split('\n'),
    ).toEqual([`${home}/da/notes.md`, `${home}/da/sub/deep.md`]);
    expect(await call('execute', { command: 'cat da/sub/deep.md; echo oops >&2; exit 4' })).toBe(
      'gamma ray\n[stderr] oops\n\n[Command failed with exit code 4]',
    );
    expect(await call('delete', { file_path: `${home}/da/sub` })).toBe(`Deleted ${home}/da/sub`);
    expect(await sandbox.execute(`test -e ${home}/da/sub`)).toMatchObject({ exitCode: 1 });
  });

  test('failures come back to the model as text, not exceptions', async () => {
    expect(await call('read_file', { file_path: '/none.txt' })).toBe(
      "Error: File '/none.txt' not found",
    );
    expect(
      await call('edit_file', {
        file_path: `${home}/da/notes.md`,
        old_string: 'absent',
        new_string: 'x',
      }),
    ).toContain('not found');
    await call('write_file', { file_path: `${home}/da/twice.md`, content: 'a a' });
    expect(
      await call('edit_file', {
        file_path: `${home}/da/twice.md`,
        old_string: 'a',
        new_string: 'b',
      }),
    ).toContain('multiple occurrences');
    expect(await call('ls', { path: `${home}/none` })).toBe(`No files found in ${home}/none`);
    expect(await call('glob', { pattern: '*.md', path: `${home}/none` })).toBe(
      "No files found matching pattern '*.md'",
    );
    expect(await call('read_file', { file_path: '/tmp' })).toMatch(/^Error: .*directory/);
  });
});

describe('a deepagents agent (scripted model) working in the sandbox', () => {
  test('its files and its commands share the real paths', async () => {
    const model = new ScriptedChatModel([
      [['write_file', { file_path: '/app/notes.md', content: 'alpha\nbeta\n' }]],
      [['edit_file', { file_path: '/app/notes.md', old_string: 'beta', new_string: 'gamma' }]],
      [
        ['ls', {}],
        ['glob', { pattern: '**/*.md', path: '/app' }],
        ['grep', { pattern: 'gamma', path: '/app' }],
        ['read_file', { file_path: '/app/notes.md' }],
        ['execute', { command: 'wc -l < /app/notes.md; echo warn >&2; exit 3' }],
        [
          'write_file',
          { file_path: '/app/main.py', content: 'print(open("/app/notes.md").read())' },
        ],
      ],
      [['execute', { command: 'python3 /app/main.py' }]],
    ]);
    const agent = createDeepAgent({ model, backend: deepAgentsBackend(sandbox) });
    const result = await agent.invoke({ messages: [{ role: 'user', content: 'take notes' }] });

    expect(await cat('/app/notes.md')).toBe('alpha\ngamma\n');
    const answers = new Map(
      (result.messages as BaseMessage[])
        .filter((m): m is ToolMessage => ToolMessage.isInstance(m))
        .map((m) => [m.tool_call_id, contentText(m.content as MessageContent)]),
    );
    const id = (n: number) => `call-${n}`;
    expect(answers.get(id(1))).toBe("Successfully wrote to '/app/notes.md'");
    expect(answers.get(id(2))).toBe("Successfully replaced 1 occurrence(s) in '/app/notes.md'");
    // ls with no path: the sandbox's /, as the shell sees it.
    expect(answers.get(id(3))?.split('\n')).toEqual(
      expect.arrayContaining(['/app/ (directory)', '/usr/ (directory)']),
    );
    expect(answers.get(id(4))).toBe('notes.md');
    expect(answers.get(id(5))).toBe('/app/notes.md:\n  2: gamma');
    expect(answers.get(id(6))).toContain('alpha\ngamma');
    expect(answers.get(id(7))).toBe('2\n[stderr] warn\n\n[Command failed with exit code 3]');
    expect(answers.get(id(8))).toBe("Successfully wrote to '/app/main.py'");
    expect(answers.get(id(9))).toBe('alpha\ngamma\n\n\n[Command succeeded with exit code 0]');
    // The model saw every answer before it finished.
    expect(model.seen).toHaveLength(5);
    expect(result.messages.at(-1)?.content).toBe('done');
  });
});
