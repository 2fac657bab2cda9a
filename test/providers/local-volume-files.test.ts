import { execFileSync } from 'node:child_process';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { text } from 'node:stream/consumers';
import { afterEach, beforeEach, describe, expect, test } from 'vitest';
import { LocalVolumeFiles } from '../../src/providers/local/volume-files.js';
import type { VolumeSpec } from '../../src/providers/provider.js';

// The local provider's volume files from the daemon's side (E2B's volume content API), on a
// plain folder: what a sandbox may leave in a volume (links out of it, pipes, `..` in paths)
// must never lead the daemon outside it.

let base: string;
let root: string;
let outside: string;
let files: LocalVolumeFiles;
const volume: VolumeSpec = { id: 'vol_test', name: 'test', sizeBytes: 1024 ** 2, dir: '/unused' };
const owner = { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 };

beforeEach(() => {
  base = mkdtempSync(join(tmpdir(), 'abx-volume-files-'));
  root = join(base, 'volume');
  outside = join(base, 'outside');
  mkdirSync(root);
  mkdirSync(outside);
  writeFileSync(join(outside, 'secret'), 'not yours');
  files = new LocalVolumeFiles(async () => root, owner);
});

afterEach(() => {
  rmSync(base, { recursive: true, force: true });
});

async function* chunks(...parts: string[]) {
  for (const part of parts) yield Buffer.from(part);
}

async function read(path: string): Promise<string> {
  return text((await files.read(volume, path)).stream);
}

/** What `outside` holds, so a test can say nothing there changed. */
function outsideNow() {
  return {
    names: readdirSync(outside).sort(),
    secret: readFileSync(join(outside, 'secret'), 'utf8'),
    mode: lstatSync(join(outside, 'secret')).mode,
  };
}

describe('local volume files', () => {
  test('write, read, stat, list, make folders, update and remove, as the sandbox user', async () => {
    const written = await files.write(volume, '/notes/a.txt', chunks('hello ', 'volume'), {
      overwrite: true,
    });
    expect(written).toMatchObject({
      name: 'a.txt',
      path: '/notes/a.txt',
      type: 'file',
      size: 12,
      mode: 0o644,
      uid: 1000,
      gid: 1000,
    });
    expect(await read('/notes/a.txt')).toBe('hello volume');
    // `..` stops at the volume's root, as E2B's server cleans paths.
    expect(await read('/../../notes/./a.txt')).toBe('hello volume');
    expect(readFileSync(join(root, 'notes', 'a.txt'), 'utf8')).toBe('hello volume');

    const made = await files.makeDir(volume, '/notes/deep/er', { parents: true, mode: 0o700 });
    expect(made).toMatchObject({ path: '/notes/deep/er', type: 'directory', mode: 0o700 });
    expect(lstatSync(join(root, 'notes', 'deep')).mode & 0o777).toBe(0o755);
    // force: a folder there already is the answer; without it, a conflict.
    expect((await files.makeDir(volume, '/notes', { parents: true })).type).toBe('directory');
    await expect(files.makeDir(volume, '/notes', { parents: false })).rejects.toMatchObject({
      status: 409,
      code: 'EEXIST',
    });
    await expect(files.makeDir(volume, '/none/x', { parents: false })).rejects.toMatchObject({
      status: 404,
    });

    expect((await files.list(volume, '/', 1)).map((e) => e.path)).toEqual(['/notes']);
    expect((await files.list(volume, '/', 3)).map((e) => e.path)).toEqual([
      '/notes',
      '/notes/a.txt',
      '/notes/deep',
      '/notes/deep/er',
    ]);
    expect(await files.stat(volume, '/')).toMatchObject({ name: '/', type: 'directory' });

    const updated = await files.update(volume, '/notes/a.txt', { mode: 0o600, uid: 1000 });
    expect(updated.mode).toBe(0o600);
    expect(lstatSync(join(root, 'notes', 'a.txt')).mode & 0o777).toBe(0o600);

    await files.remove(volume, '/notes');
    expect(readdirSync(root)).toEqual([]);
    await expect(files.remove(volume, '/notes')).rejects.toMatchObject({ status: 404 });
    await expect(files.remove(volume, '/')).rejects.toMatchObject({ status: 400 });
  });

  test('a write without overwrite never replaces; a failed write leaves nothing', async () => {
    await files.write(volume, '/f', chunks('first'), { overwrite: false });
    await expect(
      files.write(volume, '/f', chunks('second'), { overwrite: false }),
    ).rejects.toMatchObject({ status: 409 });
    expect(await read('/f')).toBe('first');
    // Without overwrite, a missing folder is not made (E2B's `force` makes it).
    await expect(
      files.write(volume, '/dir/f', chunks('x'), { overwrite: false }),
    ).rejects.toMatchObject({ status: 404 });

    async function* broken() {
      yield Buffer.from('half');
      throw new Error('the client went away');
    }
    await expect(files.write(volume, '/g', broken(), { overwrite: true })).rejects.toThrow(
      'the client went away',
    );
    await expect(files.write(volume, '/f', broken(), { overwrite: true })).rejects.toThrow(
      'the client went away',
    );
    expect(readdirSync(root)).toEqual(['f']);
    expect(await read('/f')).toBe('first');
  });

  test('owners other than the sandbox user and modes past 0o777 are refused, naming why', async () => {
    await expect(
      files.write(volume, '/f', chunks('x'), { overwrite: true, uid: 0 }),
    ).rejects.toMatchObject({ status: 400, message: expect.stringContaining('uid 1000') });
    await expect(files.makeDir(volume, '/d', { parents: false, gid: 9090 })).rejects.toMatchObject({
      status: 400,
    });
    await expect(
      files.makeDir(volume, '/d', { parents: false, mode: 0o4755 }),
    ).rejects.toMatchObject({ status: 400, message: expect.stringContaining('0o777') });
    expect(readdirSync(root)).toEqual([]);
  });

  test('a link a sandbox left, to a folder outside, is never followed', async () => {
    symlinkSync(outside, join(root, 'out'));
    const before = outsideNow();
    const refused = { status: 400, code: 'ELOOP' };

    await expect(read('/out/secret')).rejects.toMatchObject(refused);
    await expect(files.list(volume, '/out', 1)).rejects.toMatchObject(refused);
    await expect(files.stat(volume, '/out/secret')).rejects.toMatchObject(refused);
    await expect(
      files.write(volume, '/out/new', chunks('x'), { overwrite: true }),
    ).rejects.toMatchObject(refused);
    await expect(
      files.write(volume, '/out/secret', chunks('x'), { overwrite: true }),
    ).rejects.toMatchObject(refused);
    await expect(
      files.makeDir(volume, '/out/made/deeper', { parents: true }),
    ).rejects.toMatchObject(refused);
    await expect(files.update(volume, '/out/secret', { mode: 0o777 })).rejects.toMatchObject(
      refused,
    );
    await expect(files.update(volume, '/out', { mode: 0o777 })).rejects.toMatchObject(refused);
    await expect(files.remove(volume, '/out/secret')).rejects.toMatchObject(refused);
    expect(outsideNow()).toEqual(before);

    // The link itself is the volume's: shown as a link, and removed as one.
    expect(await files.stat(volume, '/out')).toMatchObject({ type: 'symlink', target: outside });
    expect((await files.list(volume, '/', 2)).map((e) => [e.path, e.type])).toEqual([
      ['/out', 'symlink'],
    ]);
    await files.remove(volume, '/out');
    expect(existsSync(join(root, 'out'))).toBe(false);
    expect(outsideNow()).toEqual(before);
  });

  test('a link to a file outside is not read or written through; an overwrite replaces the link', async () => {
    symlinkSync(join(outside, 'secret'), join(root, 'secret'));
    const before = outsideNow();
    await expect(read('/secret')).rejects.toMatchObject({ status: 400, code: 'ELOOP' });
    await expect(files.update(volume, '/secret', { mode: 0o666 })).rejects.toMatchObject({
      status: 400,
    });
    await expect(
      files.write(volume, '/secret', chunks('mine'), { overwrite: false }),
    ).rejects.toMatchObject({ status: 409 });
    await files.write(volume, '/secret', chunks('mine'), { overwrite: true });
    expect(lstatSync(join(root, 'secret')).isFile()).toBe(true);
    expect(await read('/secret')).toBe('mine');
    expect(outsideNow()).toEqual(before);
  });

  test('removing a folder removes the links in it, never what they point to', async () => {
    mkdirSync(join(root, 'tree', 'sub'), { recursive: true });
    writeFileSync(join(root, 'tree', 'sub', 'file'), 'x');
    symlinkSync(outside, join(root, 'tree', 'sub', 'out'));
    symlinkSync(join(outside, 'secret'), join(root, 'tree', 'secret'));
    const before = outsideNow();
    await files.remove(volume, '/tree');
    expect(readdirSync(root)).toEqual([]);
    expect(outsideNow()).toEqual(before);
  });

  test('a pipe a sandbox left is refused, not waited on', async () => {
    execFileSync('mkfifo', [join(root, 'pipe')]);
    await expect(read('/pipe')).rejects.toMatchObject({ status: 400, code: 'ENXIO' });
    expect(await files.stat(volume, '/pipe')).toMatchObject({ type: 'unknown' });
    await expect(read('/')).rejects.toMatchObject({ status: 400, code: 'EISDIR' });
  });

  test('a path through a file is a 400 naming it, an unknown path a 404', async () => {
    writeFileSync(join(root, 'file'), 'x');
    await expect(files.stat(volume, '/file/inner')).rejects.toMatchObject({
      status: 400,
      code: 'ENOTDIR',
      message: expect.stringContaining('/file is a file'),
    });
    await expect(files.list(volume, '/file', 1)).rejects.toMatchObject({ status: 400 });
    await expect(files.stat(volume, '/nothing')).rejects.toMatchObject({ status: 404 });
    await expect(files.stat(volume, 'a\0b')).rejects.toMatchObject({ status: 400 });
  });
});
