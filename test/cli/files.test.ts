import { randomBytes } from 'node:crypto';
import {
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createAbxHome } from '../helpers/abx-home.js';
import { abxIn, CLI, inPty, sh } from './abx.js';

interface Entry {
  name: string;
  path: string;
  type: string;
  size: number;
}

let home: Awaited<ReturnType<typeof createAbxHome>>;
let cli: ReturnType<typeof abxIn>;
let id: string;
let local: string;

beforeAll(async () => {
  home = await createAbxHome();
  cli = abxIn(home.home);
  id = (await cli.abx(['create', '-q'])).stdout.trim();
  local = mkdtempSync(join(tmpdir(), 'abx-cli-files-'));
});

afterAll(async () => {
  if (local) rmSync(local, { recursive: true, force: true });
  await home?.close();
});

describe('abx cp, ls, cat', () => {
  test('a file goes in and comes back byte for byte; ls and cat see it', async () => {
    const bytes = randomBytes(100_000);
    writeFileSync(join(local, 'blob.bin'), bytes);
    const up = await cli.json<{ to: string; type: string; bytes: number }>([
      'cp',
      join(local, 'blob.bin'),
      `${id}:/home/user/in/blob.bin`,
    ]);
    expect(up).toMatchObject({ to: `${id}:/home/user/in/blob.bin`, type: 'file', bytes: 100_000 });

    const entries = await cli.json<Entry[]>(['ls', id, 'in']);
    expect(entries.map((e) => [e.name, e.type, e.size])).toEqual([['blob.bin', 'file', 100_000]]);
    const table = await cli.abx(['ls', id, '/home/user']);
    expect(table.stdout).toMatch(/^MODE\s+SIZE\s+MODIFIED\s+NAME\n.*\sin\/\n$/);

    // Into an existing local directory: the copy keeps its name.
    const down = await cli.abx(['cp', `${id}:in/blob.bin`, `${local}/`]);
    expect(down.code).toBe(0);
    expect(down.stdout).toBe(
      `copied file ${id}:in/blob.bin → ${join(local, 'blob.bin')} (97.7 KiB transferred)\n`,
    );
    expect(readFileSync(join(local, 'blob.bin')).equals(bytes)).toBe(true);

    writeFileSync(join(local, 'text.txt'), 'line 1\nline 2\n');
    await cli.abx(['cp', join(local, 'text.txt'), `${id}:/home/user/`]);
    const cat = await cli.abx(['cat', id, 'text.txt', '/home/user/text.txt']);
    expect(cat).toEqual({ code: 0, stdout: 'line 1\nline 2\n'.repeat(2), stderr: '' });
  });

  test('a directory tree goes in and comes back, cp -r style', async () => {
    mkdirSync(join(local, 'tree', 'sub', 'deeper'), { recursive: true });
    writeFileSync(join(local, 'tree', 'a.txt'), 'a');
    writeFileSync(join(local, 'tree', 'sub', 'deeper', 'b.txt'), "b with 'quotes' and $dollars");
    // Into an existing remote directory: lands as /home/user/tree.
    const up = await cli.abx(['cp', join(local, 'tree'), `${id}:/home/user`]);
    expect(up.code).toBe(0);
    const found = await cli.abx(['exec', id, '--', 'cd /home/user/tree && find . -type f | sort']);
    expect(found.stdout).toBe('./a.txt\n./sub/deeper/b.txt\n');

    // To a new local path: the copy is created under that name.
    const target = join(local, 'copy-of-tree');
    const down = await cli.json<{ type: string; to: string }>(['cp', `${id}:tree`, target]);
    expect(down).toMatchObject({ type: 'directory', to: target });
    expect(readFileSync(join(target, 'a.txt'), 'utf8')).toBe('a');
    expect(readFileSync(join(target, 'sub', 'deeper', 'b.txt'), 'utf8')).toBe(
      "b with 'quotes' and $dollars",
    );
  });

  test('a directory round-trips: contents, nested and empty folders, symlinks, empty files, modes', async () => {
    const src = join(local, 'round');
    mkdirSync(join(src, 'nested', 'deeper'), { recursive: true });
    mkdirSync(join(src, 'empty-dir'));
    writeFileSync(join(src, 'nested', 'deeper', 'data.bin'), randomBytes(70_000));
    writeFileSync(join(src, 'empty.txt'), '');
    writeFileSync(join(src, 'run.sh'), '#!/bin/sh\necho run\n', { mode: 0o755 });
    writeFileSync(join(src, 'private.txt'), 'mine', { mode: 0o600 });
    symlinkSync('nested/deeper/data.bin', join(src, 'relative-link'));
    symlinkSync('/etc/hostname', join(src, 'absolute-link'));
    symlinkSync('does/not/exist', join(src, 'dangling'));
    const up = await cli.abx(['cp', src, `${id}:/home/user/round`]);
    expect(up.code, up.stderr).toBe(0);
    const ran = await cli.abx(['exec', id, '--', './round/run.sh']);
    expect(ran.stdout).toBe('run\n');

    const back = join(local, 'round-back');
    const down = await cli.json<{ type: string; to: string }>(['cp', `${id}:round`, back]);
    expect(down).toMatchObject({ type: 'directory', to: back });
    const describeTree = (root: string) => {
      const out: string[] = [];
      const visit = (dir: string) => {
        for (const name of readdirSync(dir).sort()) {
          const path = join(dir, name);
          const s = lstatSync(path);
          const rel = path.slice(root.length + 1);
          const mode = (s.mode & 0o7777).toString(8);
          if (s.isSymbolicLink()) out.push(`${rel} -> ${readlinkSync(path)}`);
          else if (s.isDirectory()) {
            out.push(`${rel}/ ${mode}`);
            visit(path);
          } else out.push(`${rel} ${mode} ${readFileSync(path).toString('base64')}`);
        }
      };
      visit(root);
      return out;
    };
    expect(describeTree(back)).toEqual(describeTree(src));
    expect(lstatSync(join(back, 'run.sh')).mode & 0o777).toBe(0o755);
  });

  test('a large directory download shows a progress bar with its size on a terminal', async () => {
    await cli.abx(['exec', id, '--', 'mkdir -p big && head -c 3000000 /dev/urandom > big/blob']);
    const tty = await inPty(
      `${sh(process.execPath)} ${sh(CLI)} cp ${id}:big ${sh(join(local, 'big-back'))}`,
      { env: { ABX_HOME: home.home } },
    );
    expect(tty.code).toBe(0);
    expect(tty.screen).toMatch(/← big .*\d+% [\d.]+ (B|KiB|MiB)\/2\.9 MiB/);
    expect(tty.screen).toContain(`copied directory ${id}:big → ${join(local, 'big-back')}`);
  });

  test('errors: a missing file exits 1; cp needs exactly one remote side (exit 2)', async () => {
    const cat = await cli.abx(['cat', id, 'missing.txt']);
    expect(cat.code).toBe(1);
    expect(cat.stderr).toMatch(/^abx: NotFoundError: cannot read \/home\/user\/missing.txt/);
    const down = await cli.abx(['cp', `${id}:missing.txt`, local]);
    expect(down.code).toBe(1);
    expect(down.stderr).toMatch(/^abx: NotFoundError: /);
    const up = await cli.abx(['cp', join(local, 'nope'), `${id}:x`]);
    expect(up.code).toBe(1);
    expect(up.stderr).toBe(
      `abx: NotFoundError: ${join(local, 'nope')}: no such file or directory\n`,
    );

    const both = await cli.abx(['cp', 'a.txt', 'b.txt']);
    expect(both).toEqual({
      code: 2,
      stdout: '',
      stderr:
        'abx: UsageError: exactly one side of cp must be in a sandbox, written ID:PATH\nhint: see `abx cp --help`\n',
    });
  });

  test('a large transfer shows a progress bar on a terminal only', async () => {
    writeFileSync(join(local, 'large.bin'), randomBytes(3 * 1024 * 1024));
    const piped = await cli.abx(['cp', join(local, 'large.bin'), `${id}:large.bin`]);
    expect(piped.code).toBe(0);
    expect(piped.stderr).toBe('');

    const tty = await inPty(
      `${sh(process.execPath)} ${sh(CLI)} cp ${sh(join(local, 'large.bin'))} ${id}:large2.bin`,
      { env: { ABX_HOME: home.home } },
    );
    expect(tty.code).toBe(0);
    expect(tty.screen).toMatch(/→ large2\.bin .*\d+% [\d.]+ (KiB|MiB)\/3\.0 MiB/);
    expect(tty.screen).toContain(`copied file ${join(local, 'large.bin')} → ${id}:large2.bin`);
  });
});
