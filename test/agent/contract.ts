import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { BaseSandbox } from '../../src/index.js';

/** What a backend under test provides. */
export interface ContractBackend {
  sandbox: BaseSandbox;
  /** An absolute folder the suite may fill; each test works in its own subfolder. */
  base: string;
  /** An existing directory in which this backend cannot create files. */
  unwritableDir: string;
  /**
   * True when read, edit, ls, grep, glob and delete do not run programs through execute() (a
   * native tool runner, such as `Sandbox`'s envd one): they then need no interpreter.
   */
  nativeFileTools?: boolean;
  /** Stops what `setup` started; runs even when tests fail. */
  close(): Promise<void>;
}

const text = (s: string) => new TextEncoder().encode(s);
const decode = (b: Uint8Array | null) => new TextDecoder().decode(b ?? new Uint8Array());

/** Content that breaks naive quoting: quotes, `$VAR`, `$(...)`, backticks, backslashes, tabs. */
const TRICKY = `it's "quoted" $HOME $(echo no) \`echo no\` back\\slash \\n\ttab 😀 ü\nline2\n`;

/**
 * The BaseSandbox contract (deepagents' protocol in TypeScript form), written once and run
 * against every backend.
 */
export function describeBaseSandboxContract(
  name: string,
  setup: () => Promise<ContractBackend>,
): void {
  describe(`BaseSandbox contract: ${name}`, () => {
    let backend: ContractBackend | undefined;
    let box: BaseSandbox;
    let counter = 0;

    beforeAll(async () => {
      backend = await setup();
      box = backend.sandbox;
    }, 300_000);

    afterAll(async () => {
      await backend?.close();
    });

    /** A fresh folder for one test (created on demand by writes). */
    const folder = (label: string) => `${backend?.base}/${++counter}-${label}`;

    /** Runs a setup command that must succeed. */
    async function sh(command: string): Promise<string> {
      const result = await box.execute(command);
      expect(result.exitCode, result.output).toBe(0);
      return result.output;
    }

    async function put(path: string, content: string | Uint8Array): Promise<void> {
      const [response] = await box.uploadFiles([
        [path, typeof content === 'string' ? text(content) : content],
      ]);
      expect(response?.error).toBeNull();
    }

    async function get(path: string): Promise<Uint8Array | null> {
      const [response] = await box.downloadFiles([path]);
      return response?.content ?? null;
    }

    describe('execute', () => {
      test('combines stdout and stderr and returns a non-zero exit as a result', async () => {
        const result = await box.execute('echo out; echo err >&2; exit 3');
        expect(result.exitCode).toBe(3);
        expect(result.output).toContain('out\n');
        expect(result.output).toContain('err\n');
        expect(result.truncated).toBe(false);
      });

      test('a command past its timeout is killed and reported as exit code 124', async () => {
        const result = await box.execute('echo started; sleep 30', { timeoutMs: 500 });
        expect(result.exitCode).toBe(124);
        expect(result.output).toContain('started');
        expect(result.output).toMatch(/timed out/);
      });
    });

    describe('uploadFiles / downloadFiles', () => {
      test('round-trip any bytes, create parents, answer in input order', async () => {
        const dir = folder('transfer');
        const bytes = new Uint8Array(256).map((_, i) => i);
        const uploads = await box.uploadFiles([
          [`${dir}/deep/er/all.bin`, bytes],
          [`${dir}/b.txt`, text('b')],
        ]);
        expect(uploads).toEqual([
          { path: `${dir}/deep/er/all.bin`, error: null },
          { path: `${dir}/b.txt`, error: null },
        ]);
        const downloads = await box.downloadFiles([
          `${dir}/b.txt`,
          `${dir}/missing.txt`,
          `${dir}/deep/er/all.bin`,
        ]);
        expect(downloads.map((d) => [d.path, d.error])).toEqual([
          [`${dir}/b.txt`, null],
          [`${dir}/missing.txt`, 'file_not_found'],
          [`${dir}/deep/er/all.bin`, null],
        ]);
        expect(decode(downloads[0]?.content ?? null)).toBe('b');
        expect(downloads[1]?.content).toBeNull();
        expect(downloads[2]?.content).toEqual(bytes);
      });

      test('per-file errors: is_directory, invalid_path, permission_denied, never a throw', async () => {
        const dir = folder('errors');
        await sh(`mkdir -p '${dir}/sub'`);
        const uploads = await box.uploadFiles([
          [`${dir}/sub`, text('x')],
          ['', text('x')],
          [`${dir}/nul\0byte`, text('x')],
          [`${backend?.unwritableDir}/abx-contract-denied.txt`, text('x')],
          [`${dir}/ok.txt`, text('fine')],
        ]);
        expect(uploads.map((u) => u.error)).toEqual([
          'is_directory',
          'invalid_path',
          'invalid_path',
          'permission_denied',
          null,
        ]);
        const downloads = await box.downloadFiles([`${dir}/sub`, '', `${dir}/ok.txt`]);
        expect(downloads.map((d) => d.error)).toEqual(['is_directory', 'invalid_path', null]);
        // Upload under a path whose parent is a file: an error for that file only.
        const [underFile] = await box.uploadFiles([[`${dir}/ok.txt/child`, text('x')]]);
        expect(underFile?.error).not.toBeNull();
      });

      test('download of an unreadable file is permission_denied', async (ctx) => {
        const dir = folder('unreadable');
        await put(`${dir}/secret.txt`, 'secret');
        await sh(`chmod 000 '${dir}/secret.txt'`);
        // Root reads anything; the rule is then not observable on this backend.
        if ((await box.execute(`cat '${dir}/secret.txt'`)).exitCode === 0) ctx.skip();
        const [download] = await box.downloadFiles([`${dir}/secret.txt`]);
        expect(download).toEqual({
          path: `${dir}/secret.txt`,
          content: null,
          error: 'permission_denied',
        });
        const read = await box.read(`${dir}/secret.txt`);
        expect(read.error).toMatch(/Permission denied/);
      });
    });

    describe('write', () => {
      test('creates parents and writes any content byte-exact', async () => {
        const path = `${folder('write')}/a/b/c.txt`;
        expect(await box.write(path, TRICKY)).toEqual({ path });
        expect(decode(await get(path))).toBe(TRICKY);
      });

      test('overwrites an existing file', async () => {
        const path = `${folder('overwrite')}/f.txt`;
        await box.write(path, 'first version, longer');
        await box.write(path, 'second');
        expect(decode(await get(path))).toBe('second');
      });

      test('a directory in the way is an error', async () => {
        const dir = folder('write-dir');
        await sh(`mkdir -p '${dir}/taken'`);
        const result = await box.write(`${dir}/taken`, 'x');
        expect(result.path).toBeUndefined();
        expect(result.error).toMatch(/is a directory/);
      });
    });

    describe('read', () => {
      const numbered = (n: number) => Array.from({ length: n }, (_, i) => `line ${i + 1}`);

      test('returns the requested page, without line numbers, with its position', async () => {
        const path = `${folder('read')}/ten.txt`;
        await put(path, `${numbered(10).join('\n')}\n`);
        expect(await box.read(path, { offset: 2, limit: 3 })).toEqual({
          fileData: { content: 'line 3\nline 4\nline 5', encoding: 'utf-8' },
          totalLines: 10,
          startLine: 3,
          endLine: 5,
          nextOffset: 5,
        });
        expect(await box.read(path, { offset: 7 })).toEqual({
          fileData: { content: 'line 8\nline 9\nline 10', encoding: 'utf-8' },
          totalLines: 10,
          startLine: 8,
          endLine: 10,
          nextOffset: null,
        });
        const whole = await box.read(path);
        expect(whole.fileData?.content).toBe(numbered(10).join('\n'));
        expect(whole.nextOffset).toBeNull();
      });

      test('negative offset and limit are clamped to 0; limit 0 reads nothing', async () => {
        const path = `${folder('clamp')}/f.txt`;
        await put(path, 'a\nb\n');
        const fromStart = await box.read(path, { offset: -5 });
        expect(fromStart.fileData?.content).toBe('a\nb');
        expect(fromStart.startLine).toBe(1);
        for (const limit of [0, -3]) {
          expect(await box.read(path, { limit })).toEqual({
            fileData: { content: '', encoding: 'utf-8' },
            noLinesRequested: true,
          });
        }
      });

      test('an empty file gives the reminder text', async () => {
        const path = `${folder('empty')}/empty.txt`;
        await put(path, '');
        expect(await box.read(path)).toEqual({
          fileData: {
            content: 'System reminder: File exists but has empty contents',
            encoding: 'utf-8',
          },
        });
      });

      test('CRLF comes back as LF', async () => {
        const path = `${folder('crlf')}/dos.txt`;
        await put(path, 'one\r\ntwo\r\nthree');
        const result = await box.read(path);
        expect(result.fileData?.content).toBe('one\ntwo\nthree');
        expect(result.totalLines).toBe(3);
      });

      test('media files and non-UTF-8 files come back whole as base64', async () => {
        const dir = folder('binary');
        const png = text('not really a png, but the name says image');
        await put(`${dir}/pic.png`, png);
        const bytes = new Uint8Array([0xff, 0xfe, 0x00, 0x41, 0x80, 0x0a, 0x42]);
        await put(`${dir}/blob.dat`, bytes);
        expect(await box.read(`${dir}/pic.png`, { offset: 5, limit: 1 })).toEqual({
          fileData: { content: Buffer.from(png).toString('base64'), encoding: 'base64' },
        });
        expect(await box.read(`${dir}/blob.dat`)).toEqual({
          fileData: { content: Buffer.from(bytes).toString('base64'), encoding: 'base64' },
        });
      });

      test('a multi-byte character cut by the 8 KiB probe does not make text binary', async () => {
        const path = `${folder('utf8-edge')}/accents.txt`;
        const content = `${'a'.repeat(8191)}é and more\n`;
        await put(path, content);
        const result = await box.read(path);
        expect(result.fileData).toEqual({ content: content.slice(0, -1), encoding: 'utf-8' });
      });

      test('binary content over 500 KiB is an error', async () => {
        const path = `${folder('big-binary')}/big.bin`;
        await put(path, new Uint8Array(600 * 1024).fill(0xff));
        const result = await box.read(path);
        expect(result.fileData).toBeUndefined();
        expect(result.error).toMatch(/exceeds the maximum preview size/);
      });

      test('a page is capped near 500 KiB with a note on how to continue', async () => {
        const path = `${folder('big-text')}/big.txt`;
        const line = 'x'.repeat(999);
        await put(path, `${Array.from({ length: 800 }, () => line).join('\n')}\n`);
        const result = await box.read(path);
        const content = result.fileData?.content ?? '';
        expect(Buffer.byteLength(content)).toBeLessThan(520 * 1024);
        expect(Buffer.byteLength(content)).toBeGreaterThan(400 * 1024);
        expect(content).toMatch(/truncated.*Continue reading with offset \d+/s);
        expect(result.totalLines).toBe(800);
        expect(result.nextOffset).toBe(result.endLine);
        expect(result.endLine).toBeLessThan(800);
        const next = await box.read(path, { offset: result.nextOffset ?? 0 });
        expect(next.fileData?.content.startsWith(line)).toBe(true);
      });

      test('offset at or past the end is an error naming the file length', async () => {
        const path = `${folder('past-end')}/f.txt`;
        await put(path, 'a\nb\nc\n');
        for (const offset of [3, 50]) {
          expect(await box.read(path, { offset })).toEqual({
            error: `Line offset ${offset} exceeds file length (3 lines)`,
          });
        }
      });

      test('missing file and directory are distinct errors', async () => {
        const dir = folder('read-errors');
        await sh(`mkdir -p '${dir}/d'`);
        const missing = await box.read(`${dir}/nope.txt`);
        const directory = await box.read(`${dir}/d`);
        expect(missing.error).toMatch(/not found/);
        expect(directory.error).toMatch(/is a directory/);
        expect(missing.fileData).toBeUndefined();
      });
    });

    describe('edit', () => {
      test('replaces one occurrence on the sandbox side; replacement text is literal', async () => {
        const path = `${folder('edit')}/f.txt`;
        await put(path, 'alpha beta gamma\n');
        const replacement = `$& $1 $$ \\ "q" 'q' \`b\``;
        expect(await box.edit(path, 'beta', replacement)).toEqual({ path, occurrences: 1 });
        expect(decode(await get(path))).toBe(`alpha ${replacement} gamma\n`);
      });

      test('no match is an error and leaves the file unchanged', async () => {
        const path = `${folder('edit-miss')}/f.txt`;
        await put(path, 'hello\n');
        const result = await box.edit(path, 'absent', 'x');
        expect(result.error).toMatch(/String not found/);
        expect(result.occurrences).toBeUndefined();
        expect(decode(await get(path))).toBe('hello\n');
      });

      test('several matches need replaceAll; with it every one is replaced', async () => {
        const path = `${folder('edit-many')}/f.txt`;
        await put(path, 'a-a-a\n');
        const refused = await box.edit(path, 'a', 'b');
        expect(refused.error).toMatch(/appears 3 times.*replaceAll/);
        expect(decode(await get(path))).toBe('a-a-a\n');
        expect(await box.edit(path, 'a', 'bb', { replaceAll: true })).toEqual({
          path,
          occurrences: 3,
        });
        expect(decode(await get(path))).toBe('bb-bb-bb\n');
      });

      test('LF text matches a CRLF file, which stays CRLF', async () => {
        const path = `${folder('edit-crlf')}/dos.txt`;
        await put(path, 'one\r\ntwo\r\nthree\r\n');
        const result = await box.edit(path, 'one\ntwo\n', 'uno\ndos\nmas\n');
        expect(result).toEqual({ path, occurrences: 1 });
        expect(decode(await get(path))).toBe('uno\r\ndos\r\nmas\r\nthree\r\n');
      });

      test('a large edit works and leaves no temp files behind', async () => {
        const path = `${folder('edit-large')}/big.txt`;
        const oldText = `${'o'.repeat(40_000)}\n`;
        const newText = `${'n'.repeat(40_000)}\n`;
        await put(path, `head\n${oldText}tail\n`);
        const before = await box.execute('ls -a /tmp');
        expect(await box.edit(path, oldText, newText)).toEqual({ path, occurrences: 1 });
        expect(decode(await get(path))).toBe(`head\n${newText}tail\n`);
        const missing = await box.edit(path, `${'z'.repeat(60_000)}`, 'x');
        expect(missing.error).toMatch(/String not found/);
        const after = await box.execute('ls -a /tmp');
        const edits = (listing: string) =>
          listing.split('\n').filter((name) => name.startsWith('.abx-edit-'));
        expect(edits(after.output)).toEqual(edits(before.output));
      });

      test('missing file, directory and non-text file are distinct errors', async () => {
        const dir = folder('edit-errors');
        await sh(`mkdir -p '${dir}/d'`);
        await put(`${dir}/bin.dat`, new Uint8Array([0xff, 0xfe, 0x61]));
        const errors = [
          (await box.edit(`${dir}/nope.txt`, 'a', 'b')).error,
          (await box.edit(`${dir}/d`, 'a', 'b')).error,
          (await box.edit(`${dir}/bin.dat`, 'a', 'b')).error,
        ];
        expect(errors[0]).toMatch(/not found/);
        expect(errors[1]).toMatch(/is a directory/);
        expect(errors[2]).toMatch(/not a text file/);
        expect(decode(await get(`${dir}/bin.dat`))).toBe(
          decode(new Uint8Array([0xff, 0xfe, 0x61])),
        );
      });
    });

    describe('delete', () => {
      test('deletes files and whole directory trees', async () => {
        const dir = folder('delete');
        await put(`${dir}/tree/a/b.txt`, 'b');
        await put(`${dir}/single.txt`, 's');
        expect(await box.delete(`${dir}/single.txt`)).toEqual({ path: `${dir}/single.txt` });
        expect(await box.delete(`${dir}/tree`)).toEqual({ path: `${dir}/tree` });
        expect((await box.ls(dir)).entries).toEqual([]);
      });

      test('a missing path is an error; a broken symlink is deleted', async () => {
        const dir = folder('delete-errors');
        await sh(`mkdir -p '${dir}' && ln -s '${dir}/nowhere' '${dir}/dangling'`);
        expect((await box.delete(`${dir}/ghost`)).error).toContain(`'${dir}/ghost' not found`);
        expect(await box.delete(`${dir}/dangling`)).toEqual({ path: `${dir}/dangling` });
        expect((await box.ls(dir)).entries).toEqual([]);
      });
    });

    describe('ls', () => {
      test('one level, hidden entries included, absolute paths without trailing slash', async () => {
        const dir = folder('ls');
        await put(`${dir}/file.txt`, '12345');
        await put(`${dir}/.hidden`, '');
        await put(`${dir}/sub/inner.txt`, 'not listed');
        const result = await box.ls(`${dir}/`);
        expect(result.error).toBeUndefined();
        expect(result.entries?.map((e) => [e.path, e.isDir])).toEqual([
          [`${dir}/.hidden`, false],
          [`${dir}/file.txt`, false],
          [`${dir}/sub`, true],
        ]);
        const file = result.entries?.find((e) => e.path.endsWith('file.txt'));
        expect(file?.size).toBe(5);
        expect(Number.isNaN(Date.parse(file?.modifiedAt ?? ''))).toBe(false);
      });

      test('missing path and not-a-directory are distinct errors', async () => {
        const dir = folder('ls-errors');
        await put(`${dir}/file.txt`, 'x');
        const missing = await box.ls(`${dir}/nope`);
        const notDir = await box.ls(`${dir}/file.txt`);
        expect(missing.error).toMatch(/not found/);
        expect(notDir.error).toMatch(/not a directory/);
        expect(missing.entries).toBeUndefined();
      });
    });

    describe('grep', () => {
      test('a literal, case-sensitive substring with absolute paths and 1-based lines', async () => {
        const dir = folder('grep');
        await put(`${dir}/a.txt`, 'first\nuse a.c( here\nabc( is not it\nA.C( neither\n');
        await put(`${dir}/sub/b.txt`, 'a.c(\n');
        const result = await box.grep('a.c(', { path: dir });
        expect(result).toEqual({
          matches: [
            { path: `${dir}/a.txt`, line: 2, text: 'use a.c( here' },
            { path: `${dir}/sub/b.txt`, line: 1, text: 'a.c(' },
          ],
          truncated: false,
        });
      });

      test('a glob without / matches base names at any depth; with / paths from the root', async () => {
        const dir = folder('grep-glob');
        await put(`${dir}/top.py`, 'needle\n');
        await put(`${dir}/src/deep/mod.py`, 'needle\n');
        await put(`${dir}/src/notes.md`, 'needle\n');
        const byName = await box.grep('needle', { path: dir, glob: '*.py' });
        expect(byName.matches?.map((m) => m.path)).toEqual([
          `${dir}/src/deep/mod.py`,
          `${dir}/top.py`,
        ]);
        const byPath = await box.grep('needle', { path: dir, glob: 'src/**/*.py' });
        expect(byPath.matches?.map((m) => m.path)).toEqual([`${dir}/src/deep/mod.py`]);
      });

      test('file names containing ":" stay intact; a single file can be searched', async () => {
        const dir = folder('grep-colon');
        await put(`${dir}/a:b:c.txt`, 'x\nneedle: 1:2\n');
        const result = await box.grep('needle', { path: dir });
        expect(result.matches).toEqual([
          { path: `${dir}/a:b:c.txt`, line: 2, text: 'needle: 1:2' },
        ]);
        expect((await box.grep('needle', { path: `${dir}/a:b:c.txt` })).matches).toHaveLength(1);
      });

      test('maxCount caps matches; truncated only when more existed', async () => {
        const dir = folder('grep-max');
        await put(`${dir}/f.txt`, 'hit\nhit\nhit\n');
        const capped = await box.grep('hit', { path: dir, maxCount: 2 });
        expect(capped.matches?.map((m) => m.line)).toEqual([1, 2]);
        expect(capped.truncated).toBe(true);
        const exact = await box.grep('hit', { path: dir, maxCount: 3 });
        expect(exact.matches).toHaveLength(3);
        expect(exact.truncated).toBe(false);
      });

      test('timeBudgetMs stops grep and glob early with truncated (0: at once)', async () => {
        const dir = folder('grep-budget');
        await put(`${dir}/sub/f.txt`, 'hit\n');
        expect(await box.grep('hit', { path: dir, timeBudgetMs: 0 })).toEqual({
          matches: [],
          truncated: true,
        });
        expect(await box.glob('**/*.txt', { path: dir, timeBudgetMs: 0 })).toEqual({
          matches: [],
          truncated: true,
        });
        // A budget the search fits in changes nothing.
        expect(await box.grep('hit', { path: dir, timeBudgetMs: 60_000 })).toEqual({
          matches: [{ path: `${dir}/sub/f.txt`, line: 1, text: 'hit' }],
          truncated: false,
        });
      });

      test('the glob filter selects exactly the files glob() finds', async () => {
        const dir = folder('grep-glob-dots');
        for (const name of ['a.py', '.venv/lib/b.py', 'src/.hidden.py', 'src/c.py', 'src/d.md']) {
          await put(`${dir}/${name}`, 'needle\n');
        }
        for (const glob of ['*.py', '**/*.py', '.venv/**/*.py', '{*.md,src/*.py}']) {
          const grep = await box.grep('needle', { path: dir, glob });
          const files = await box.glob(glob, { path: dir });
          expect(
            grep.matches?.map((m) => m.path),
            glob,
          ).toEqual(files.matches?.map((m) => m.path));
        }
        const byName = await box.grep('needle', { path: dir, glob: '*.py' });
        expect(byName.matches?.map((m) => m.path)).toEqual([
          `${dir}/.venv/lib/b.py`,
          `${dir}/a.py`,
          `${dir}/src/.hidden.py`,
          `${dir}/src/c.py`,
        ]);
      });

      test('a missing path is an error', async () => {
        const result = await box.grep('x', { path: `${folder('grep-missing')}/nope` });
        expect(result.error).toMatch(/not found/);
        expect(result.matches).toBeUndefined();
      });
    });

    describe('glob', () => {
      test('regular files only, sorted, absolute; no / matches base names at any depth', async () => {
        const dir = folder('glob');
        await put(`${dir}/b.ts`, '');
        await put(`${dir}/a.ts`, '');
        await put(`${dir}/lib/c.ts`, '');
        await put(`${dir}/lib/readme.md`, '');
        await sh(`mkdir -p '${dir}/dir.ts'`);
        const result = await box.glob('*.ts', { path: dir });
        expect(result.error).toBeUndefined();
        expect(result.truncated).toBe(false);
        expect(result.matches?.map((m) => [m.path, m.isDir])).toEqual([
          [`${dir}/a.ts`, false],
          [`${dir}/b.ts`, false],
          [`${dir}/lib/c.ts`, false],
        ]);
        expect(result.matches?.[0]?.size).toBe(0);
      });

      test('with / the pattern is relative to the root and ** skips dot-directories', async () => {
        const dir = folder('glob-slash');
        await put(`${dir}/src/x.ts`, '');
        await put(`${dir}/src/a/b/y.ts`, '');
        await put(`${dir}/src/.cache/z.ts`, '');
        await put(`${dir}/other/w.ts`, '');
        await put(`${dir}/.github/ci.yml`, '');
        const tree = await box.glob('src/**/*.ts', { path: dir });
        expect(tree.matches?.map((m) => m.path)).toEqual([
          `${dir}/src/a/b/y.ts`,
          `${dir}/src/x.ts`,
        ]);
        const top = await box.glob('src/*.ts', { path: dir });
        expect(top.matches?.map((m) => m.path)).toEqual([`${dir}/src/x.ts`]);
        const named = await box.glob('.github/*.yml', { path: dir });
        expect(named.matches?.map((m) => m.path)).toEqual([`${dir}/.github/ci.yml`]);
      });

      test('without / base names match at any depth, under dot-directories and dot-files too', async () => {
        const dir = folder('glob-dots');
        for (const name of ['a.py', '.venv/lib/b.py', 'src/.hidden.py', 'src/c.py', 'src/d.md']) {
          await put(`${dir}/${name}`, '');
        }
        // A symlinked directory is not entered (a link to a parent would loop).
        await sh(`ln -s '${dir}/src' '${dir}/src-link' && ln -s '${dir}' '${dir}/src/up'`);
        const paths = async (pattern: string) =>
          (await box.glob(pattern, { path: dir })).matches?.map((m) => m.path);
        expect(await paths('*.py')).toEqual([
          `${dir}/.venv/lib/b.py`,
          `${dir}/a.py`,
          `${dir}/src/.hidden.py`,
          `${dir}/src/c.py`,
        ]);
        expect(await paths('b.py')).toEqual([`${dir}/.venv/lib/b.py`]);
        expect(await paths('.*')).toEqual([`${dir}/src/.hidden.py`]);
        // With / the old rule stays: wildcards skip dot-names unless the segment names them.
        expect(await paths('**/*.py')).toEqual([`${dir}/a.py`, `${dir}/src/c.py`]);
        expect(await paths('.venv/**/*.py')).toEqual([`${dir}/.venv/lib/b.py`]);
        expect(await paths('src/.*.py')).toEqual([`${dir}/src/.hidden.py`]);
        expect(await paths('{*.md,src/c.*}')).toEqual([`${dir}/src/c.py`, `${dir}/src/d.md`]);
      });

      test('{a,b} and [!x] work', async () => {
        const dir = folder('glob-syntax');
        for (const name of ['a.ts', 'b.js', 'c.md', 'x1.txt', 'y1.txt']) {
          await put(`${dir}/${name}`, '');
        }
        const braces = await box.glob('*.{ts,js}', { path: dir });
        expect(braces.matches?.map((m) => m.path)).toEqual([`${dir}/a.ts`, `${dir}/b.js`]);
        const negated = await box.glob('[!x]1.txt', { path: dir });
        expect(negated.matches?.map((m) => m.path)).toEqual([`${dir}/y1.txt`]);
      });

      test('.. segments are invalid_pattern; a missing root is a clear error', async () => {
        const dir = folder('glob-errors');
        await sh(`mkdir -p '${dir}'`);
        const outside = await box.glob('../*', { path: dir });
        expect(outside.error).toMatch(/invalid_pattern/);
        expect(outside.matches).toBeUndefined();
        expect((await box.glob('a/../../b/*', { path: dir })).error).toMatch(/invalid_pattern/);
        const missing = await box.glob('*', { path: `${dir}/nope` });
        expect(missing.error).toMatch(/not found/);
      });

      test('includeDirs and relative: folders are matches too, paths relative to the root', async () => {
        const dir = folder('glob-dirs');
        for (const name of ['a.py', 'pkg.py/x.txt', 'src/b.py', 'src/sub/c.txt', '.venv/d.py']) {
          await put(`${dir}/${name}`, 'hi');
        }
        const shown = async (pattern: string, options: Record<string, unknown> = {}) =>
          (await box.glob(pattern, { path: dir, ...options })).matches?.map((m) =>
            m.isDir ? `${m.path}/` : m.path,
          );
        expect(await shown('*.py', { includeDirs: true, relative: true })).toEqual([
          '.venv/d.py',
          'a.py',
          'pkg.py/',
          'src/b.py',
        ]);
        expect(await shown('src/*', { includeDirs: true, relative: true })).toEqual([
          'src/b.py',
          'src/sub/',
        ]);
        expect(await shown('src/**', { includeDirs: true, relative: true })).toEqual([
          'src/b.py',
          'src/sub/',
          'src/sub/c.txt',
        ]);
        // Without includeDirs a folder never matches; without relative paths are absolute.
        expect(await shown('*.py', { relative: true })).toEqual(['.venv/d.py', 'a.py', 'src/b.py']);
        expect(await shown('src/*', { includeDirs: true })).toEqual([
          `${dir}/src/b.py`,
          `${dir}/src/sub/`,
        ]);
        const file = (await box.glob('a.py', { path: dir, relative: true })).matches?.[0];
        expect(file).toMatchObject({ path: 'a.py', isDir: false, size: 2 });
      });

      test("style 'path': the whole relative path matches, wildcards take dot-names", async () => {
        const dir = folder('glob-path-style');
        for (const name of ['a.py', '.b.py', 'src/c.py', '.venv/lib/d.py', 'src/e.md']) {
          await put(`${dir}/${name}`, '');
        }
        const shown = async (pattern: string, includeDirs = false) =>
          (
            await box.glob(pattern, { path: dir, style: 'path', relative: true, includeDirs })
          ).matches?.map((m) => (m.isDir ? `${m.path}/` : m.path));
        // No base-name rule: `*.py` is the top level only, and `*` takes a leading dot.
        expect(await shown('*.py')).toEqual(['.b.py', 'a.py']);
        expect(await shown('**/*.py')).toEqual(['.b.py', '.venv/lib/d.py', 'a.py', 'src/c.py']);
        expect(await shown('*', true)).toEqual(['.b.py', '.venv/', 'a.py', 'src/']);
        expect(await shown('src/*.{py,md}')).toEqual(['src/c.py', 'src/e.md']);
        expect(await shown('/src/?.py')).toEqual(['src/c.py']);
        expect(await shown('**/lib', true)).toEqual(['.venv/lib/']);
        const bad = await box.glob('[z-a]', { path: dir, style: 'path' });
        expect(bad.errorCode).toBe('invalid_pattern');
        expect(bad.error).toMatch(/\[z-a\]/);
        const unknown = await box.glob('*', {
          path: dir,
          style: 'regex' as unknown as 'path',
        });
        expect(unknown.error).toMatch(/style must be 'reference' or 'path', not "regex"/);
      });

      test('the result count is bounded and says so', async () => {
        const dir = folder('glob-many');
        await sh(
          `mkdir -p '${dir}' && cd '${dir}' && i=0; while [ $i -lt 1005 ]; do : > "f$i.txt"; i=$((i+1)); done`,
        );
        const result = await box.glob('*.txt', { path: dir });
        expect(result.matches).toHaveLength(1000);
        expect(result.truncated).toBe(true);
      });
    });

    describe('executeWithOffload', () => {
      const bigOutput = 'i=1; while [ $i -le 3000 ]; do echo "row $i"; i=$((i+1)); done';

      test('disabled (the default): plain execute, nothing offloaded', async () => {
        expect(box.enableCaptureOffload).toBe(false);
        const capturePath = `${folder('offload-off')}/out.log`;
        const result = await box.executeWithOffload(`${bigOutput}; exit 4`, {
          capturePath,
          maxInlineBytes: 100,
        });
        expect(result.offloaded).toBe(false);
        expect(result.response.exitCode).toBe(4);
        expect(result.response.output.split('\n')).toHaveLength(3001);
        expect((await box.downloadFiles([capturePath]))[0]?.error).toBe('file_not_found');
      });

      describe('enabled', () => {
        beforeAll(() => {
          box.enableCaptureOffload = true;
        });
        afterAll(() => {
          box.enableCaptureOffload = false;
        });

        test('small output comes back inline with the exit code; no file remains', async () => {
          const capturePath = `${folder('offload-small')}/out.log`;
          const result = await box.executeWithOffload('echo hi; echo err >&2; exit 3', {
            capturePath,
            maxInlineBytes: 1000,
          });
          expect(result.offloaded).toBe(false);
          expect(result.response.exitCode).toBe(3);
          expect(result.response.output.split('\n').sort()).toEqual(['', 'err', 'hi']);
          expect((await box.downloadFiles([capturePath]))[0]?.error).toBe('file_not_found');
        });

        test('large output stays in the file; a head/tail preview comes back', async () => {
          const capturePath = `${folder('offload-large')}/nested/out.log`;
          const result = await box.executeWithOffload(`${bigOutput}; exit 2`, {
            capturePath,
            maxInlineBytes: 1000,
          });
          expect(result.offloaded).toBe(true);
          expect(result.response.exitCode).toBe(2);
          expect(result.response.truncated).toBe(false);
          const preview = result.response.output;
          expect(preview).toMatch(/^row 1\nrow 2\n/);
          expect(preview).toMatch(/\.\.\. \[2990 lines omitted\] \.\.\./);
          expect(preview).toMatch(/row 2999\nrow 3000$/);
          const saved = decode(await get(capturePath));
          expect(saved.split('\n')).toHaveLength(3001);
          expect(saved.startsWith('row 1\n')).toBe(true);
        });

        test('capture stops at maxCaptureBytes without killing the command', async () => {
          const capturePath = `${folder('offload-cap')}/out.log`;
          const result = await box.executeWithOffload(`${bigOutput}; echo done >&2; exit 5`, {
            capturePath,
            maxInlineBytes: 100,
            maxCaptureBytes: 5000,
          });
          expect(result.offloaded).toBe(true);
          expect(result.response.truncated).toBe(true);
          expect(result.response.exitCode).toBe(5);
          expect(await get(capturePath)).toHaveLength(5000);
        });
      });
    });

    describe('values never reach a shell unquoted', () => {
      test('hostile names and text stay data in every method', async () => {
        const dir = folder('quoting');
        const name = `it's "$(touch PWNED)" \`touch PWNED\` $HOME;touch PWNED.txt`;
        const path = `${dir}/${name}`;
        expect((await box.write(path, TRICKY)).error).toBeUndefined();
        expect((await box.read(path)).fileData?.content).toBe(TRICKY.slice(0, -1));
        expect((await box.edit(path, '$HOME', '$(touch PWNED)')).occurrences).toBe(1);
        expect((await box.ls(dir)).entries?.map((e) => e.path)).toEqual([path]);
        expect((await box.grep('$(touch PWNED)', { path: dir })).matches).toHaveLength(1);
        expect((await box.glob(`*PWNED*`, { path: dir })).matches?.[0]?.path).toBe(path);
        expect((await box.grep('x', { path: dir, glob: `'; touch PWNED; '` })).matches).toEqual([]);
        expect(await box.delete(path)).toEqual({ path });
        const leftovers = await box.execute(
          `ls -a '${dir}'; ls PWNED PWNED.txt 2>/dev/null | wc -l`,
        );
        expect(leftovers.output.trim().split('\n')).toEqual(['.', '..', '0']);
      });
    });

    describe('a missing interpreter', () => {
      test('gives a clear error naming it, not garbage (execute() path)', async (ctx) => {
        if (backend?.nativeFileTools) ctx.skip();
        const dir = folder('no-interpreter');
        await put(`${dir}/f.txt`, 'abc\n');
        const saved = box.interpreter;
        box.interpreter = 'abx-no-such-interpreter';
        try {
          const results = [
            (await box.read(`${dir}/f.txt`)).error,
            (await box.edit(`${dir}/f.txt`, 'abc', 'x')).error,
            (await box.ls(dir)).error,
            (await box.grep('abc', { path: dir })).error,
            (await box.glob('*', { path: dir })).error,
            (await box.delete(`${dir}/f.txt`)).error,
          ];
          for (const error of results) {
            expect(error).toMatch(/no 'abx-no-such-interpreter' on its PATH/);
          }
          // write needs no interpreter: it goes through uploadFiles.
          expect((await box.write(`${dir}/g.txt`, 'ok')).error).toBeUndefined();
        } finally {
          box.interpreter = saved;
        }
        expect(decode(await get(`${dir}/f.txt`))).toBe('abc\n');
      });

      test('native file tools do not need one', async (ctx) => {
        if (!backend?.nativeFileTools) ctx.skip();
        const dir = folder('no-interpreter-native');
        const path = `${dir}/f.txt`;
        await put(path, 'abc\n');
        const saved = box.interpreter;
        box.interpreter = 'abx-no-such-interpreter';
        try {
          expect((await box.read(path)).fileData?.content).toBe('abc');
          expect(await box.edit(path, 'abc', 'xyz')).toEqual({ path, occurrences: 1 });
          expect((await box.ls(dir)).entries?.map((e) => e.path)).toEqual([path]);
          expect((await box.grep('xyz', { path: dir })).matches).toEqual([
            { path, line: 1, text: 'xyz' },
          ]);
          expect((await box.glob('*.txt', { path: dir })).matches?.map((m) => m.path)).toEqual([
            path,
          ]);
          expect(await box.delete(path)).toEqual({ path });
        } finally {
          box.interpreter = saved;
        }
      });
    });
  });
}
