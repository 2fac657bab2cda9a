import { type Sandbox as E2bSandbox, InvalidArgumentError, NotFoundError, SandboxError } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../../src/index.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { attach } from './attach.js';

// The unmodified `e2b` SDK's file calls that go over Connect (filesystem.Filesystem) against a
// real abx sandbox through the daemon's gateway. Files are made with commands (E2B's /files
// upload is tested below, through the SDK's files.write and files.read).

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let native: Sandbox;
let sbx: E2bSandbox;

beforeAll(async () => {
  abx = await createAbxHome();
  native = await Sandbox.create({ home: abx.home });
  sbx = attach(new URL(native.getUrl(49983)).origin, native.sandboxId, native.accessToken);
  await sbx.commands.run(
    'rm -rf /tmp/fs && mkdir -p /tmp/fs/a/b && printf hello > /tmp/fs/a/b/c.txt && printf 12 > /tmp/fs/top.txt && chmod 640 /tmp/fs/top.txt && ln -s top.txt /tmp/fs/link',
  );
}, 300_000);

afterAll(async () => {
  await native?.kill().catch(() => undefined);
  await abx?.close();
});

describe('files over Connect through the e2b SDK', () => {
  test('getInfo and exists', async () => {
    const info = await sbx.files.getInfo('/tmp/fs/top.txt');
    expect(info).toMatchObject({
      name: 'top.txt',
      type: 'file',
      path: '/tmp/fs/top.txt',
      size: 2,
      mode: 0o640,
      permissions: '-rw-r-----',
    });
    expect(info.modifiedTime?.getTime()).toBeGreaterThan(Date.now() - 600_000);
    expect(await sbx.files.getInfo('/tmp/fs/a')).toMatchObject({ type: 'dir', name: 'a' });
    expect(await sbx.files.exists('/tmp/fs/a/b/c.txt')).toBe(true);
    expect(await sbx.files.exists('/tmp/fs/nothing')).toBe(false);
    await expect(sbx.files.getInfo('/tmp/fs/nothing')).rejects.toBeInstanceOf(NotFoundError);
  });

  test('list, with depth', async () => {
    const one = await sbx.files.list('/tmp/fs');
    expect(one.map((e) => [e.name, e.type])).toEqual([
      ['a', 'dir'],
      ['link', 'symlink'],
      ['top.txt', 'file'],
    ]);
    // Depth first, each directory by name, as E2B's envd walks: not level by level.
    const three = await sbx.files.list('/tmp/fs', { depth: 3 });
    expect(three.map((e) => e.path)).toEqual([
      '/tmp/fs/a',
      '/tmp/fs/a/b',
      '/tmp/fs/a/b/c.txt',
      '/tmp/fs/link',
      '/tmp/fs/top.txt',
    ]);
    // A symlink says where it leads, as an absolute path, in a listing and in getInfo.
    expect(three.find((e) => e.name === 'link')?.symlinkTarget).toBe('/tmp/fs/top.txt');
    expect((await sbx.files.getInfo('/tmp/fs/link')).symlinkTarget).toBe('/tmp/fs/top.txt');
    await expect(sbx.files.list('/tmp/fs/top.txt')).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(sbx.files.list('/tmp/fs/nothing')).rejects.toBeInstanceOf(NotFoundError);
  });

  test('makeDir: true when made, false when it exists', async () => {
    expect(await sbx.files.makeDir('/tmp/fs/new/deep')).toBe(true);
    expect(await sbx.files.makeDir('/tmp/fs/new/deep')).toBe(false);
    expect((await sbx.files.getInfo('/tmp/fs/new/deep')).type).toBe('dir');
  });

  test('rename moves, replacing a file as rename(2) does; remove takes a whole tree', async () => {
    const moved = await sbx.files.rename('/tmp/fs/a/b/c.txt', '/tmp/fs/moved.txt');
    expect(moved).toMatchObject({ path: '/tmp/fs/moved.txt', type: 'file', size: 5 });
    expect(await sbx.files.exists('/tmp/fs/a/b/c.txt')).toBe(false);
    await sbx.files.remove('/tmp/fs/a');
    expect(await sbx.files.exists('/tmp/fs/a')).toBe(false);
    // Removing what is not there is done already (E2B's envd: os.RemoveAll).
    await expect(sbx.files.remove('/tmp/fs/a')).resolves.toBeUndefined();
    const check = await sbx.commands.run('cat /tmp/fs/moved.txt');
    expect(check.stdout).toBe('hello');
  });

  test('a path the sandbox user may not read or write is refused, and nothing changes', async () => {
    const shadow = await sbx.files.read('/tmp/../etc/shadow').catch((e: unknown) => e);
    expect(shadow).toBeInstanceOf(SandboxError);
    expect((shadow as Error).message).toMatch(/^403: .*\/etc\/shadow/);
    const written = await sbx.files.write('/usr/abx-e2b.txt', 'x').catch((e: unknown) => e);
    expect(written).toBeInstanceOf(SandboxError);
    expect((written as Error).message).toMatch(/^403: /);
    expect(await sbx.files.exists('/usr/abx-e2b.txt')).toBe(false);
    const made = await sbx.files.makeDir('/usr/abx-e2b-dir').catch((e: unknown) => e);
    expect((made as Error).message).toMatch(/permission_denied/);
  });

  test('user root is refused', async () => {
    const asRoot = await sbx.files.list('/tmp/fs', { user: 'root' }).catch((e: unknown) => e);
    expect(asRoot).toBeInstanceOf(SandboxError);
    expect((asRoot as Error).message).toMatch(/permission_denied.*root/);
  });
});

describe('/files through the e2b SDK', () => {
  test('write and read text, bytes and a stream (multipart, octet-stream)', async () => {
    const info = await sbx.files.write('/tmp/up/hello.txt', 'héllo\n');
    expect(info).toMatchObject({ name: 'hello.txt', path: '/tmp/up/hello.txt', type: 'file' });
    expect(await sbx.files.read('/tmp/up/hello.txt')).toBe('héllo\n');
    const bytes = new Uint8Array(256).map((_, i) => i);
    await sbx.files.write('/tmp/up/all.bin', bytes.buffer as ArrayBuffer);
    expect(Buffer.from(await sbx.files.read('/tmp/up/all.bin', { format: 'bytes' }))).toEqual(
      Buffer.from(bytes),
    );
    await sbx.files.write('/tmp/up/octet.txt', 'as a stream', { useOctetStream: true });
    const stream = await sbx.files.read('/tmp/up/octet.txt', { format: 'stream' });
    const chunks: Uint8Array[] = [];
    for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) chunks.push(chunk);
    expect(Buffer.concat(chunks).toString()).toBe('as a stream');
    expect(await sbx.files.read('/tmp/up/empty.txt').catch((e: unknown) => e)).toBeInstanceOf(
      NotFoundError,
    );
    await sbx.files.write('/tmp/up/empty.txt', '');
    expect(await sbx.files.read('/tmp/up/empty.txt')).toBe('');
  });

  test('several files in one form, and a gzip upload', async () => {
    const written = await sbx.files.write([
      { path: '/tmp/up/many/one.txt', data: '1' },
      { path: '/tmp/up/many/two.txt', data: '22' },
    ]);
    expect(written.map((w) => w.path)).toEqual(['/tmp/up/many/one.txt', '/tmp/up/many/two.txt']);
    expect(await sbx.files.read('/tmp/up/many/two.txt')).toBe('22');
    const big = 'abc'.repeat(100_000);
    await sbx.files.write('/tmp/up/zipped.txt', big, { gzip: true });
    expect(await sbx.files.read('/tmp/up/zipped.txt')).toBe(big);
  });

  test('bad input: root, a directory, a broken form; nothing is written', async () => {
    const asRoot = await sbx.files
      .write('/tmp/up/root.txt', 'x', { user: 'root' })
      .catch((e: unknown) => e);
    expect(asRoot).toBeInstanceOf(SandboxError);
    expect((asRoot as Error).message).toMatch(/root/);
    expect(await sbx.files.exists('/tmp/up/root.txt')).toBe(false);
    const dir = await sbx.files.read('/tmp/up').catch((e: unknown) => e);
    expect(dir).toBeInstanceOf(SandboxError);
    const gateway = new URL(native.getUrl(49983)).origin;
    const broken = await fetch(`${gateway}/files?path=/tmp/up/broken.txt`, {
      method: 'POST',
      headers: {
        'e2b-sandbox-id': native.sandboxId,
        'e2b-sandbox-port': '49983',
        'x-access-token': native.accessToken,
        'content-type': 'multipart/form-data; boundary=xyz',
      },
      body: '--xyz\r\nContent-Disposition: form-data; name="file"\r\n\r\nno closing boundary',
    });
    expect(broken.status).toBe(400);
    expect(await broken.json()).toMatchObject({
      code: 400,
      message: expect.stringMatching(/multipart/),
    });
    expect(await sbx.files.exists('/tmp/up/broken.txt')).toBe(false);
  });
});
