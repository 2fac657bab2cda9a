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
// real sandbox through the adapter and its virtual root, then through deepagents' own tools and a
// deepagents agent.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let sandbox: Sandbox;
/** The sandbox's working directory: the default root. */
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

/** A file's text as the sandbox has it, by the model's path under the default root. */
async function cat(modelPath: string): Promise<string> {
  return sandbox.files.read(`${home}${modelPath}`);
}

async function text(modelPath: string): Promise<string> {
  const page = await ok(backend.read(modelPath));
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

describe('the virtual root', () => {
  test("the model's / is the working directory; relative paths start there too", async () => {
    await ok(backend.write('/vr/a.txt', 'alpha\n'));
    await ok(backend.write('vr/b.txt', 'beta\n'));
    expect(await sandbox.files.read(`${home}/vr/a.txt`)).toBe('alpha\n');
    expect(await sandbox.files.read(`${home}/vr/b.txt`)).toBe('beta\n');
    expect(await text('/vr/b.txt')).toBe('beta');
    // `..` inside the root is fine.
    expect(await text('/vr/sub/../a.txt')).toBe('alpha');
  });

  test('/ lists, finds and searches the root only, never the system image', async () => {
    await ok(backend.write('/vr/a.txt', 'needle\n'));
    const listed = await paths(backend.ls('/'));
    expect(listed).toContain('/vr/');
    expect(listed.filter((p) => /^\/(usr|etc|proc|bin)\b/.test(p))).toEqual([]);
    const found = await paths(backend.glob('**/*.txt'));
    expect(found).toContain('vr/a.txt');
    expect(found.every((p) => !p.startsWith('usr/') && !p.startsWith('/'))).toBe(true);
    // deepagents' grep tool passes '/' by default; the protocol allows no path at all.
    for (const path of ['/', undefined, null]) {
      const { matches } = await ok(backend.grep('needle', path));
      expect(matches.map((m) => m.path)).toEqual(['/vr/a.txt']);
    }
  });

  test('paths that climb out of the root are refused by every method', async () => {
    const escapes = ['/..', '../etc/passwd', '/vr/../../etc/passwd'];
    for (const path of escapes) {
      for (const error of [
        await failure(backend.ls(path)),
        await failure(backend.read(path)),
        await failure(backend.readRaw(path)),
        await failure(backend.write(path, 'x')),
        await failure(backend.edit(path, 'a', 'b')),
        await failure(backend.delete(path)),
        await failure(backend.grep('root', path)),
        await failure(backend.glob('*', path)),
      ]) {
        expect(error).toContain('Path traversal not allowed');
        expect(error).toContain(`'${path}'`);
      }
      expect(await backend.uploadFiles([[path, new Uint8Array([1])]])).toEqual([
        { path, error: 'invalid_path' },
      ]);
      expect(await backend.downloadFiles([path])).toEqual([
        { path, content: null, error: 'invalid_path' },
      ]);
    }
    // The ones inside still go through, in order, around a refused one.
    const answers = await backend.uploadFiles([
      ['/vr/u1.txt', new TextEncoder().encode('1')],
      ['../u2.txt', new TextEncoder().encode('2')],
      ['/vr/u3.txt', new TextEncoder().encode('3')],
    ]);
    expect(answers).toEqual([
      { path: '/vr/u1.txt', error: null },
      { path: '../u2.txt', error: 'invalid_path' },
      { path: '/vr/u3.txt', error: null },
    ]);
    expect(await cat('/vr/u3.txt')).toBe('3');
  });

  test("errors name the model's paths, not the sandbox's", async () => {
    const error = await failure(backend.read('/vr/none.txt'));
    expect(error).toBe("File '/vr/none.txt' not found");
    expect(await failure(backend.edit('/vr/none.txt', 'a', 'b'))).toBe(
      "Error: File '/vr/none.txt' not found",
    );
    await ok(backend.write('/vr/dir/f.txt', 'x'));
    expect(await failure(backend.read('/vr/dir'))).not.toContain(home);
    expect(await failure(backend.write('/vr/dir', 'x'))).not.toContain(home);
  });

  test('relative paths come back relative: the same in the file tools and in execute', async () => {
    await ok(backend.write('rel/one.txt', 'one'));
    expect(await paths(backend.ls('rel'))).toEqual(['rel/one.txt']);
    expect((await ok(backend.grep('one', 'rel'))).matches.map((m) => m.path)).toEqual([
      'rel/one.txt',
    ]);
    expect((await backend.execute('cat rel/one.txt')).output).toBe('one');
  });

  test('execute runs in the root folder', async () => {
    expect(await backend.execute('pwd')).toEqual({
      output: `${home}\n`,
      exitCode: 0,
      truncated: false,
    });
  });

  test('{ root } picks another folder (created if missing); deleting / empties it', async () => {
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

  test("{ root: '/' } shows the sandbox with its real paths", async () => {
    const whole = deepAgentsBackend(sandbox, { root: '/' });
    await ok(whole.write(`${home}/vr/real.txt`, 'real'));
    expect(await paths(whole.ls(`${home}/vr`))).toContain(`${home}/vr/real.txt`);
    expect((await ok(whole.grep('real', `${home}/vr`))).matches[0]?.path).toBe(
      `${home}/vr/real.txt`,
    );
    expect(await paths(whole.ls('/'))).toEqual(expect.arrayContaining(['/usr/', '/home/']));
  });

  test('a root that cannot be a folder fails the first call, naming it', async () => {
    const broken = deepAgentsBackend(sandbox, { root: '/etc/passwd/project' });
    await expect(broken.ls('/')).rejects.toThrow(InvalidArgumentError);
    await expect(broken.ls('/')).rejects.toThrow("'/etc/passwd/project'");
  });

  test('works for any BaseSandbox: a LocalShellSandbox is rooted at its folder', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'abx-deepagents-'));
    try {
      const local = deepAgentsBackend(new LocalShellSandbox({ root: folder }));
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
        ['/fo/a.bin', bytes],
        ['/fo/b.txt', new TextEncoder().encode('Content 2')],
        ['/fo/c.txt', new TextEncoder().encode('Content 3')],
      ]),
    ).toEqual([
      { path: '/fo/a.bin', error: null },
      { path: '/fo/b.txt', error: null },
      { path: '/fo/c.txt', error: null },
    ]);
    expect((await backend.execute('cat fo/b.txt fo/c.txt')).output).toBe('Content 2Content 3');
    expect(await backend.downloadFiles(['/fo/a.bin', '/fo/none.txt'])).toEqual([
      { path: '/fo/a.bin', content: bytes, error: null },
      { path: '/fo/none.txt', content: null, error: 'file_not_found' },
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
    const path = `/wt/${name.replaceAll(' ', '-')}.txt`;
    expect(await backend.write(path, content)).toEqual({ path, filesUpdate: null });
    expect(await cat(path)).toBe(content);
  });

  test('creates parents, overwrites, takes spaces and repeated slashes', async () => {
    await ok(backend.write('/wt/deep/nested/dir/file.txt', 'Nested'));
    expect(await cat('/wt/deep/nested/dir/file.txt')).toBe('Nested');
    await ok(backend.write('/wt/over.txt', 'First content'));
    await ok(backend.write('/wt/over.txt', 'Second content'));
    expect(await cat('/wt/over.txt')).toBe('Second content');
    await ok(backend.write('/wt/dir with spaces/file name.txt', 'spaced'));
    expect(await cat('/wt/dir with spaces/file name.txt')).toBe('spaced');
    await ok(backend.write('/wt//slashes///file.txt', 'Content'));
    expect(await cat('/wt/slashes/file.txt')).toBe('Content');
  });
});

describe('read', () => {
  const rows = (n: number) =>
    Array.from({ length: n }, (_, i) => `Row_${i + 1}_content`).join('\n');

  test('whole files, unicode, long lines, an empty file, a missing one', async () => {
    await ok(backend.write('/rd/basic.txt', 'Line 1\nLine 2\nLine 3'));
    expect(await ok(backend.read('/rd/basic.txt'))).toMatchObject({
      content: 'Line 1\nLine 2\nLine 3',
      mimeType: 'text/plain',
      startLine: 1,
      endLine: 3,
    });
    const unicode = 'Hello 👋 世界\nПривет мир\nمرحبا العالم';
    await ok(backend.write('/rd/unicode.txt', unicode));
    expect(await text('/rd/unicode.txt')).toBe(unicode);
    await ok(backend.write('/rd/long.txt', `Short line\n${'x'.repeat(3000)}\nAnother short line`));
    expect(await text('/rd/long.txt')).toContain('Short line');
    await ok(backend.write('/rd/empty.txt', ''));
    expect(await backend.read('/rd/empty.txt')).not.toHaveProperty('error');
    expect(await failure(backend.read('/rd/nonexistent.txt'))).toContain('not found');
  });

  test('offset and limit page by lines; beyond the end nothing comes back', async () => {
    await ok(backend.write('/rd/rows.txt', rows(20)));
    const page = async (o: number, l: number) => {
      const result = await backend.read('/rd/rows.txt', o, l);
      return 'content' in result && typeof result.content === 'string' ? result.content : '';
    };
    expect(await page(5, 500)).toMatch(/^Row_6_content\n/);
    expect(await page(0, 5)).toBe(rows(5));
    expect(await page(10, 5)).toBe(rows(15).split('\n').slice(10).join('\n'));
    expect(await page(0, 0)).toBe('');
    expect(await page(100, 10)).toBe('');
    expect(await page(20, 10)).toBe('');
    expect(await ok(backend.read('/rd/rows.txt', 10, 5))).toMatchObject({
      totalLines: 20,
      startLine: 11,
      endLine: 15,
      nextOffset: 15,
    });
    expect(await ok(backend.read('/rd/rows.txt', 15, 5))).not.toHaveProperty('nextOffset');
  });

  test('a large file in chunks', async () => {
    const lines = Array.from({ length: 1000 }, (_, i) => `Line_${String(i).padStart(4, '0')}`);
    await ok(backend.write('/rd/chunked.txt', lines.join('\n')));
    for (const start of [0, 500, 900]) {
      expect((await ok(backend.read('/rd/chunked.txt', start, 100))).content).toBe(
        lines.slice(start, start + 100).join('\n'),
      );
    }
  });

  test('binary files come back as bytes with a MIME type (read and readRaw)', async () => {
    const png = Uint8Array.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 1, 2]);
    await sandbox.files.write(`${home}/rd/pixel.png`, png);
    expect(await backend.read('/rd/pixel.png')).toEqual({ content: png, mimeType: 'image/png' });
    expect(await backend.readRaw('/rd/pixel.png')).toMatchObject({
      data: { content: png, mimeType: 'image/png' },
    });
    expect(await backend.readRaw('/rd/basic.txt')).toMatchObject({
      data: { content: 'Line 1\nLine 2\nLine 3', mimeType: 'text/plain' },
    });
    expect(await failure(backend.readRaw('/rd/none.png'))).toBe("File '/rd/none.png' not found");
  });
});

describe('edit', () => {
  async function edited(
    content: string,
    oldString: string,
    newString: string,
    replaceAll?: boolean,
  ) {
    const path = `/ed/${Math.random().toString(36).slice(2)}.txt`;
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
    expect((await failure(backend.edit('/ed/none.txt', 'old', 'new'))).toLowerCase()).toContain(
      'not found',
    );
  });
});

describe('ls', () => {
  test('files and folders (folders with a trailing / and is_dir), sizes, hidden files', async () => {
    await ok(backend.write('/li/file1.txt', 'content1'));
    await ok(backend.write('/li/.hidden', 'hidden'));
    await backend.execute('mkdir -p li/subdir');
    const { files } = await ok(backend.ls('/li'));
    expect(files.map(({ path, is_dir, size }) => ({ path, is_dir, size }))).toEqual([
      { path: '/li/.hidden', is_dir: false, size: 6 },
      { path: '/li/file1.txt', is_dir: false, size: 8 },
      { path: '/li/subdir/', is_dir: true, size: expect.any(Number) },
    ]);
    expect(files.every((f) => !Number.isNaN(Date.parse(f.modified_at ?? '')))).toBe(true);
    // A trailing slash on the folder asked for changes nothing.
    expect(await paths(backend.ls('/li/'))).toEqual(files.map((f) => f.path));
  });

  test('an empty folder, a missing one and a file list as empty', async () => {
    await backend.execute('mkdir -p li-empty');
    expect(await backend.ls('/li-empty')).toEqual({ files: [] });
    expect(await backend.ls('/li-does-not-exist-12345')).toEqual({ files: [] });
    await ok(backend.write('/li-file.txt', 'x'));
    expect(await backend.ls('/li-file.txt')).toEqual({ files: [] });
  });

  test('spaces, unicode and special characters in names; 50 entries', async () => {
    const names = ['file with spaces.txt', '测试文件.txt', 'файл.txt', 'file(1).txt', 'file-3.txt'];
    for (const name of names) await ok(backend.write(`/li-names/${name}`, 'content'));
    await backend.execute("mkdir -p 'li-names/dir with spaces'");
    expect(await paths(backend.ls('/li-names'))).toEqual(
      [...names.map((n) => `/li-names/${n}`), '/li-names/dir with spaces/'].sort(),
    );
    await backend.execute(
      "mkdir -p li-large && cd li-large && for i in $(seq 0 49); do echo c > file_$(printf '%03d' $i).txt; done",
    );
    const large = await paths(backend.ls('/li-large'));
    expect(large).toHaveLength(50);
    expect(large[0]).toBe('/li-large/file_000.txt');
    expect(large[49]).toBe('/li-large/file_049.txt');
  });
});

describe('grep', () => {
  beforeAll(async () => {
    await backend.uploadFiles(
      Object.entries({
        '/gr/file1.txt': 'Hello world\nGoodbye world',
        '/gr/file2.py': 'Hello there\npattern_match',
        '/gr/fruits.txt': 'apple\nbanana\napple\norange\napple',
        '/gr/case.txt': 'Hello\nhello\nHELLO',
        '/gr/special.txt': 'Price: $100\nPattern: [a-z]*\ntest123',
        '/gr/unicode.txt': 'Hello 世界\nПривет мир',
        '/gr/sub1/sub2/level2.txt': 'target_nested here',
        '/gr/long.txt': Array.from({ length: 100 }, (_, i) => `Line ${i + 1}`).join('\n'),
      }).map(([path, content]) => [path, new TextEncoder().encode(content)]),
    );
    await backend.execute('mkdir -p gr-empty');
  });

  const found = async (pattern: string, path = '/gr', glob?: string) =>
    (await ok(backend.grep(pattern, path, glob))).matches;

  test('a literal, case-sensitive substring, with its line numbers, recursively', async () => {
    expect(await found('apple')).toEqual(
      [1, 3, 5].map((line) => ({
        path: '/gr/fruits.txt',
        line,
        text: 'apple',
      })),
    );
    expect(await found('Hello')).toHaveLength(4);
    expect((await found('Hello', '/gr', '*.py')).map((m) => m.path)).toEqual(['/gr/file2.py']);
    expect(await found('$100')).toEqual([
      { path: '/gr/special.txt', line: 1, text: 'Price: $100' },
    ]);
    expect((await found('[a-z]*')).map((m) => m.text)).toEqual(['Pattern: [a-z]*']);
    expect((await found('test123')).map((m) => m.line)).toEqual([3]);
    expect((await found('世界')).map((m) => m.text)).toEqual(['Hello 世界']);
    expect((await found('HELLO')).map((m) => m.path)).toEqual(['/gr/case.txt']);
    expect(await found('target_nested')).toEqual([
      { path: '/gr/sub1/sub2/level2.txt', line: 1, text: 'target_nested here' },
    ]);
    expect(await found('Line 50')).toEqual([{ path: '/gr/long.txt', line: 50, text: 'Line 50' }]);
  });

  test('nothing found: no match, an empty folder, a missing folder', async () => {
    expect(await backend.grep('nonexistent_str', '/gr')).toEqual({ matches: [], truncated: false });
    expect(await backend.grep('anything', '/gr-empty')).toEqual({ matches: [], truncated: false });
    expect(await backend.grep('anything', '/gr-missing')).toEqual({
      matches: [],
      truncated: false,
    });
  });

  test('maxCount caps the matches and says so', async () => {
    expect(await backend.grep('apple', '/gr', null, 2)).toEqual({
      matches: [
        { path: '/gr/fruits.txt', line: 1, text: 'apple' },
        { path: '/gr/fruits.txt', line: 3, text: 'apple' },
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
    await backend.uploadFiles(files.map((f) => [`/gl/${f}`, new TextEncoder().encode('c')]));
    await backend.execute('mkdir -p gl/emptydir');
  });

  const globbed = (pattern: string, path = '/gl') => paths(backend.glob(pattern, path));

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
    expect(await globbed('*.txt', '/gl/a/b')).toEqual(['other.txt']);
  });

  test('folders are results too, with is_dir, sizes and times', async () => {
    const { files, truncated } = await ok(backend.glob('*', '/gl/a'));
    expect(truncated).toBe(false);
    expect(files).toEqual([
      { path: 'b', is_dir: true, size: expect.any(Number), modified_at: expect.any(String) },
    ]);
    const top = await ok(backend.glob('*'));
    expect(top.files.find((f) => f.path === 'gl')).toMatchObject({ is_dir: true });
    const dirs = (await ok(backend.glob('*', '/gl'))).files.filter((f) => f.is_dir);
    expect(dirs.map((f) => f.path).sort()).toEqual(['a', 'emptydir', 'sub1', 'sub2']);
    const file = (await ok(backend.glob('file1.txt', '/gl'))).files[0];
    expect(file).toMatchObject({ path: 'file1.txt', is_dir: false, size: 1 });
  });

  test('runs no program in the sandbox (envd walks the tree), and says when a pattern is bad', async () => {
    const interpreter = sandbox.interpreter;
    sandbox.interpreter = '/no/such/node';
    try {
      expect(await globbed('**/deep.txt')).toEqual(['a/b/c/d/deep.txt']);
      expect(await failure(backend.glob('file[z-a].txt', '/gl'))).toBe(
        "Error finding files: invalid glob pattern 'file[z-a].txt'",
      );
    } finally {
      sandbox.interpreter = interpreter;
    }
  });

  test('a missing folder or a file finds nothing', async () => {
    expect(await backend.glob('*', '/gl-missing')).toEqual({ files: [], truncated: false });
    expect(await backend.glob('*', '/gl/file1.txt')).toEqual({ files: [], truncated: false });
  });
});

describe('integration', () => {
  test('write, read, edit, read; then list, find and search a tree', async () => {
    await ok(backend.write('/intg/workflow.txt', 'Original content'));
    expect(await text('/intg/workflow.txt')).toBe('Original content');
    await ok(backend.edit('/intg/workflow.txt', 'Original', 'Modified'));
    expect(await text('/intg/workflow.txt')).toBe('Modified content');

    await ok(backend.write('/intg/tree/root.txt', 'root file'));
    await ok(backend.write('/intg/tree/subdir1/file1.txt', 'file 1'));
    await ok(backend.write('/intg/tree/subdir1/file2.py', 'file 2'));
    await ok(backend.write('/intg/tree/subdir2/file3.txt', 'file 3'));
    expect(await paths(backend.ls('/intg/tree'))).toEqual([
      '/intg/tree/root.txt',
      '/intg/tree/subdir1/',
      '/intg/tree/subdir2/',
    ]);
    expect(await paths(backend.glob('**/*.txt', '/intg/tree'))).toHaveLength(3);
    expect((await ok(backend.grep('file', '/intg/tree'))).matches).toHaveLength(4);
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
    expect(await call('write_file', { file_path: '/da/notes.md', content: 'alpha\nbeta\n' })).toBe(
      "Successfully wrote to '/da/notes.md'",
    );
    expect(await cat('/da/notes.md')).toBe('alpha\nbeta\n');
    expect(
      await call('edit_file', {
        file_path: '/da/notes.md',
        old_string: 'beta',
        new_string: 'gamma',
      }),
    ).toBe("Successfully replaced 1 occurrence(s) in '/da/notes.md'");
    expect(await cat('/da/notes.md')).toBe('alpha\ngamma\n');

    const read = await call('read_file', { file_path: '/da/notes.md' });
    expect(read).toContain('alpha\ngamma');

    await sandbox.files.write(`${home}/da/sub/deep.md`, 'gamma ray\n');
    expect((await call('ls', { path: '/da' })).split('\n').sort()).toEqual([
      '/da/notes.md (12 bytes)',
      '/da/sub/ (directory)',
    ]);
    expect((await call('glob', { pattern: '**/*.md', path: '/da' })).split('\n')).toEqual([
      'notes.md',
      'sub/deep.md',
    ]);
    expect(
      (
        await call('grep', { pattern: 'gamma', path: '/da', output_mode: 'files_with_matches' })
      ).split('\n'),
    ).toEqual(['/da/notes.md', '/da/sub/deep.md']);
    expect(await call('execute', { command: 'cat da/sub/deep.md; echo oops >&2; exit 4' })).toBe(
      'gamma ray\n[stderr] oops\n\n[Command failed with exit code 4]',
    );
    expect(await call('delete', { file_path: '/da/sub' })).toBe('Deleted /da/sub');
    expect(await sandbox.execute(`test -e ${home}/da/sub`)).toMatchObject({ exitCode: 1 });
  });

  test('failures come back to the model as text, not exceptions', async () => {
    expect(await call('read_file', { file_path: '/none.txt' })).toBe(
      "Error: File '/none.txt' not found",
    );
    expect(
      await call('edit_file', { file_path: '/da/notes.md', old_string: 'absent', new_string: 'x' }),
    ).toContain('not found');
    await call('write_file', { file_path: '/da/twice.md', content: 'a a' });
    expect(
      await call('edit_file', { file_path: '/da/twice.md', old_string: 'a', new_string: 'b' }),
    ).toContain('multiple occurrences');
    expect(await call('ls', { path: '/none' })).toBe('No files found in /none');
    expect(await call('glob', { pattern: '*.md', path: '/none' })).toBe(
      "No files found matching pattern '*.md'",
    );
    expect(await call('read_file', { file_path: '/../etc/passwd' })).toContain(
      'Path traversal not allowed',
    );
  });
});

describe('a deepagents agent (scripted model) working in the sandbox', () => {
  test('its tool calls write, edit, list, find, search, read and run in the root folder', async () => {
    const model = new ScriptedChatModel([
      [['write_file', { file_path: '/app/notes.md', content: 'alpha\nbeta\n' }]],
      [['edit_file', { file_path: '/app/notes.md', old_string: 'beta', new_string: 'gamma' }]],
      [
        ['ls', {}],
        ['glob', { pattern: '**/*.md', path: '/app' }],
        ['grep', { pattern: 'gamma', path: '/app' }],
        ['read_file', { file_path: '/app/notes.md' }],
        ['execute', { command: 'wc -l < app/notes.md; echo warn >&2; exit 3' }],
        ['read_file', { file_path: '/../../etc/passwd' }],
      ],
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
    // ls with no path: the root folder, not the machine image.
    expect(answers.get(id(3))?.split('\n')).toContain('/app/ (directory)');
    expect(answers.get(id(3))).not.toMatch(/\/usr\/|\/etc\//);
    expect(answers.get(id(4))).toBe('notes.md');
    expect(answers.get(id(5))).toBe('/app/notes.md:\n  2: gamma');
    expect(answers.get(id(6))).toContain('alpha\ngamma');
    expect(answers.get(id(7))).toBe('2\n[stderr] warn\n\n[Command failed with exit code 3]');
    expect(answers.get(id(8))).toContain('Path traversal not allowed');
    // The model saw every answer before it finished.
    expect(model.seen).toHaveLength(4);
    expect(result.messages.at(-1)?.content).toBe('done');
  });
});
