import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  type Sandbox as E2bSandbox,
  type FilesystemEvent,
  FilesystemEventType,
  InvalidArgumentError,
} from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../../src/index.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { attach } from './attach.js';
import { rawRequest } from './raw-request.js';

// File metadata (`files.write(path, data, { metadata })`, E2B's X-Metadata-* headers) through the
// unmodified `e2b` SDK against a real abx sandbox: kept by envd with the file, shown by the write's
// answer, getInfo and list, through renames, deletes, overwrites and a daemon killed and replaced.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let native: Sandbox;
let sbx: E2bSandbox;
let gatewayUrl: string;

const daemonPid = () =>
  (JSON.parse(readFileSync(join(abx.home, 'daemon.json'), 'utf8')) as { pid: number }).pid;

beforeAll(async () => {
  abx = await createAbxHome();
  native = await Sandbox.create({ home: abx.home });
  gatewayUrl = new URL(native.getUrl(49983)).origin;
  sbx = attach(gatewayUrl, native.sandboxId, native.accessToken);
  await sbx.commands.run('rm -rf /tmp/meta && mkdir -p /tmp/meta');
}, 300_000);

afterAll(async () => {
  await native?.kill().catch(() => undefined);
  await abx?.close();
});

describe('file metadata through the e2b SDK', () => {
  test('a write with metadata: the answer, getInfo and list show it (multipart and octet-stream)', async () => {
    const written = await sbx.files.write('/tmp/meta/a.txt', 'hello', {
      metadata: { Owner: 'alice', 'run-id': 'r 42' },
    });
    expect(written).toMatchObject({
      path: '/tmp/meta/a.txt',
      metadata: { owner: 'alice', 'run-id': 'r 42' },
    });
    expect((await sbx.files.getInfo('/tmp/meta/a.txt')).metadata).toEqual({
      owner: 'alice',
      'run-id': 'r 42',
    });
    const streamed = await sbx.files.write('/tmp/meta/b.bin', new Uint8Array([1, 2, 3]).buffer, {
      metadata: { kind: 'octet' },
      useOctetStream: true,
    });
    expect(streamed.metadata).toEqual({ kind: 'octet' });
    // Several files in one upload each get the set.
    const many = await sbx.files.write(
      [
        { path: '/tmp/meta/m1.txt', data: '1' },
        { path: '/tmp/meta/m2.txt', data: '2' },
      ],
      { metadata: { batch: 'yes' } },
    );
    expect(many.map((entry) => entry.metadata)).toEqual([{ batch: 'yes' }, { batch: 'yes' }]);
    const listed = await sbx.files.list('/tmp/meta');
    expect(Object.fromEntries(listed.map((entry) => [entry.name, entry.metadata]))).toEqual({
      'a.txt': { owner: 'alice', 'run-id': 'r 42' },
      'b.bin': { kind: 'octet' },
      'm1.txt': { batch: 'yes' },
      'm2.txt': { batch: 'yes' },
    });
    // The content is the content: the metadata is not in the file.
    expect(await sbx.files.read('/tmp/meta/a.txt')).toBe('hello');
    // A write without metadata answers without it, as E2B's envd.
    expect((await sbx.files.write('/tmp/meta/plain.txt', 'p')).metadata).toBeUndefined();
    expect((await sbx.files.getInfo('/tmp/meta/plain.txt')).metadata).toBeUndefined();
  });

  test('rename (the SDK or mv) keeps it; remove then create again drops it', async () => {
    await sbx.files.write('/tmp/meta/r.txt', 'r', { metadata: { tag: 'moved' } });
    const renamed = await sbx.files.rename('/tmp/meta/r.txt', '/tmp/meta/sub/r2.txt');
    expect(renamed.metadata).toEqual({ tag: 'moved' });
    await sbx.commands.run(
      'mv /tmp/meta/sub/r2.txt /tmp/meta/r3.txt && echo more >> /tmp/meta/r3.txt',
    );
    expect((await sbx.files.getInfo('/tmp/meta/r3.txt')).metadata).toEqual({ tag: 'moved' });
    // cp makes a new file, without it (as cp without --preserve=xattr).
    await sbx.commands.run('cp /tmp/meta/r3.txt /tmp/meta/copy.txt');
    expect((await sbx.files.getInfo('/tmp/meta/copy.txt')).metadata).toBeUndefined();
    await sbx.files.remove('/tmp/meta/r3.txt');
    await sbx.files.write('/tmp/meta/r3.txt', 'again');
    expect((await sbx.files.getInfo('/tmp/meta/r3.txt')).metadata).toBeUndefined();
    // Deleted and made again by the sandbox's processes (the inode number may be reused).
    await sbx.files.write('/tmp/meta/s.txt', 's', { metadata: { tag: 'gone' } });
    await sbx.commands.run('rm /tmp/meta/s.txt && echo new > /tmp/meta/s.txt');
    expect((await sbx.files.getInfo('/tmp/meta/s.txt')).metadata).toBeUndefined();
  });

  test('an overwrite replaces the set; one without metadata clears it', async () => {
    await sbx.files.write('/tmp/meta/o.txt', '1', { metadata: { a: '1', b: '2' } });
    const again = await sbx.files.write('/tmp/meta/o.txt', '2', { metadata: { b: '3' } });
    expect(again.metadata).toEqual({ b: '3' });
    expect((await sbx.files.getInfo('/tmp/meta/o.txt')).metadata).toEqual({ b: '3' });
    await sbx.files.write('/tmp/meta/o.txt', '3');
    expect((await sbx.files.getInfo('/tmp/meta/o.txt')).metadata).toBeUndefined();
  });

  test('bad metadata is refused with a 400 in E2B shape, and nothing is written', async () => {
    await sbx.files.write('/tmp/meta/bad.txt', 'old', { metadata: { keep: 'me' } });
    // Over the per-file limit: the SDK does not check it, the face does.
    const big = await sbx.files
      .write('/tmp/meta/bad.txt', 'new', { metadata: { big: 'v'.repeat(5000) } })
      .catch((error: unknown) => error);
    expect(big).toBeInstanceOf(InvalidArgumentError);
    expect(String((big as Error).message)).toMatch(/over the limit of 4096 per file/);
    // What the SDK refuses before sending, sent raw: a value that is not printable ASCII.
    const raw = await rawRequest(gatewayUrl, {
      method: 'POST',
      path: '/files?path=/tmp/meta/bad.txt',
      headers: {
        'e2b-sandbox-id': native.sandboxId,
        'e2b-sandbox-port': '49983',
        'x-access-token': native.accessToken,
        'content-type': 'application/octet-stream',
        'x-metadata-latin': 'caf\u00e9',
      },
      body: 'new',
    });
    expect(raw.status).toBe(400);
    expect(JSON.parse(raw.body.toString())).toEqual({
      code: 400,
      message: expect.stringMatching(
        /^invalid metadata: metadata value for key "latin" is not printable US-ASCII/,
      ),
    });
    expect(await sbx.files.read('/tmp/meta/bad.txt')).toBe('old');
    expect((await sbx.files.getInfo('/tmp/meta/bad.txt')).metadata).toEqual({ keep: 'me' });
    // Keys and values the SDK itself refuses never leave it.
    await expect(
      sbx.files.write('/tmp/meta/bad2.txt', 'x', { metadata: { 'no space': 'v' } }),
    ).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(await sbx.files.exists('/tmp/meta/bad2.txt')).toBe(false);
  });

  test('hostile paths: odd names, a directory in the way, a store file swapped for a symlink', async () => {
    const odd = '/tmp/meta/dir with space/ünï cödé\'s "name".txt';
    expect((await sbx.files.write(odd, 'x', { metadata: { odd: 'yes' } })).metadata).toEqual({
      odd: 'yes',
    });
    expect((await sbx.files.getInfo(odd)).metadata).toEqual({ odd: 'yes' });
    // A directory where the file should go: refused, and the directory has no metadata.
    await sbx.files.makeDir('/tmp/meta/a-dir');
    await expect(
      sbx.files.write('/tmp/meta/a-dir', 'x', { metadata: { k: 'v' } }),
    ).rejects.toThrow();
    expect((await sbx.files.getInfo('/tmp/meta/a-dir')).metadata).toBeUndefined();
    // The sandbox's processes replace envd's store with a symlink to a file of theirs: envd's
    // next save replaces the link, never writing through it.
    await sbx.commands.run(
      'printf precious > /tmp/meta/precious && ln -sf /tmp/meta/precious ~/.abx/envd/file-metadata.json',
    );
    await sbx.files.write('/tmp/meta/after-link.txt', 'x', { metadata: { k: 'v' } });
    expect(await sbx.files.read('/tmp/meta/precious')).toBe('precious');
    const kind = await sbx.commands.run('stat -c %F ~/.abx/envd/file-metadata.json');
    expect(kind.stdout.trim()).toBe('regular file');
  });

  test("a recursive watch of the home does not see envd's store change", async () => {
    await sbx.commands.run('mkdir -p /home/user/watched');
    // The store's folder exists once a file has had metadata (its creation, `.abx`, is seen once).
    await sbx.files.write('/tmp/meta/before-watch.txt', 'b', { metadata: { b: '1' } });
    const events: FilesystemEvent[] = [];
    let marked: () => void = () => undefined;
    const marker = new Promise<void>((resolve) => {
      marked = resolve;
    });
    const handle = await sbx.files.watchDir(
      '/home/user',
      (event) => {
        events.push(event);
        if (event.name === 'watched/marker.txt' && event.type === FilesystemEventType.WRITE)
          marked();
      },
      { recursive: true },
    );
    try {
      await sbx.files.write('/home/user/watched/tagged.txt', 't', { metadata: { w: '1' } });
      // Written after the store was saved (before the answer): once its event came, any event of
      // the store would have come before it.
      await sbx.files.write('/home/user/watched/marker.txt', 'm');
      await marker;
    } finally {
      await handle.stop();
    }
    const names = [...new Set(events.map((event) => event.name))].sort();
    expect(names).toEqual(['watched/marker.txt', 'watched/tagged.txt']);
    // The store is there all the same.
    const kind = await sbx.commands.run('stat -c %F /home/user/.abx/envd/file-metadata.json');
    expect(kind.stdout.trim()).toBe('regular file');
  });

  test('a daemon killed and replaced: the new gateway reads the same metadata from envd', async () => {
    await sbx.files.write('/tmp/meta/keep.txt', 'k', { metadata: { survives: 'daemon' } });
    const old = daemonPid();
    process.kill(old, 'SIGKILL');
    for (let i = 0; i < 200; i++) {
      try {
        process.kill(old, 0);
        await new Promise((resolve) => setTimeout(resolve, 10));
      } catch {
        break;
      }
    }
    // The next SDK call starts a daemon, which adopts the sandbox.
    const again = await Sandbox.connect(native.sandboxId, { home: abx.home });
    expect(daemonPid()).not.toBe(old);
    gatewayUrl = new URL(again.getUrl(49983)).origin;
    sbx = attach(gatewayUrl, again.sandboxId, again.accessToken);
    expect((await sbx.files.getInfo('/tmp/meta/keep.txt')).metadata).toEqual({
      survives: 'daemon',
    });
    expect((await sbx.files.getInfo('/tmp/meta/o.txt')).metadata).toBeUndefined();
  });
});
