import { execFileSync } from 'node:child_process';
import {
  appendFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { FileMetadataStore } from '../../runtime/server/file-metadata.js';
import { CORE } from '../../runtime/server/groups/core.js';
import { FILE_OPS, fileOps } from '../../runtime/server/groups/files.js';
import { SandboxServer } from '../../runtime/server/server.js';
import { type Answer, call } from '../server/harness.js';

// envd's file metadata (E2B's X-Metadata-*): FILE_OPS with a FileMetadataStore, served in-process
// on loopback over real files. A "restart" is a new server and store over the same store file.

const TOKEN = 'envd-metadata-token';
const dir = mkdtempSync(join(tmpdir(), 'abx-envd-metadata-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Envd {
  call(path: string, options?: Parameters<typeof call>[2]): Promise<Answer>;
  write(path: string, body: string, metadata?: Record<string, string>): Promise<Answer>;
  stop(): Promise<void>;
}

const running = new Set<SandboxServer>();
afterAll(async () => {
  for (const server of running) await server.stop();
});

async function serve(
  storeFile: string,
  options: ConstructorParameters<typeof FileMetadataStore>[1] = {},
  group = fileOps({ metadata: new FileMetadataStore(storeFile, options) }),
): Promise<Envd> {
  const server = new SandboxServer({ token: TOKEN, catalog: [CORE, group] });
  running.add(server);
  const { host, port } = await server.start();
  const url = `http://${host}:${port}`;
  const envd: Envd = {
    call: (path, opts = {}) => call(url, path, { token: TOKEN, ...opts }),
    write: (path, body, metadata = {}) =>
      envd.call(`/files/write?path=${encodeURIComponent(path)}`, {
        method: 'PUT',
        body,
        headers: Object.fromEntries(
          Object.entries(metadata).map(([k, v]) => [`x-metadata-${k}`, v]),
        ),
      }),
    stop: async () => {
      running.delete(server);
      await server.stop();
    },
  };
  return envd;
}

const statOf = async (envd: Envd, path: string) =>
  (await envd.call(`/files/stat?path=${encodeURIComponent(path)}`)).json as {
    metadata?: Record<string, string>;
  };

const listOf = async (envd: Envd, path: string) =>
  (
    (await envd.call(`/files/list?path=${encodeURIComponent(path)}`)).json as {
      entries: { name: string; metadata?: Record<string, string> }[];
    }
  ).entries;

describe('envd file metadata', () => {
  const store = join(dir, 'state', 'file-metadata.json');
  const files = join(dir, 'files');
  mkdirSync(files);

  test('a write keeps X-Metadata-* headers: the answer, stat and list show them, keys lowercased', async () => {
    const envd = await serve(store);
    try {
      const path = join(files, 'a.txt');
      const written = await envd.write(path, 'hello', { Owner: 'Alice', 'build.id': '42 x' });
      expect(written.status).toBe(200);
      expect(written.json).toEqual({
        path,
        size: 5,
        metadata: { owner: 'Alice', 'build.id': '42 x' },
      });
      expect((await statOf(envd, path)).metadata).toEqual({ owner: 'Alice', 'build.id': '42 x' });
      const listed = await listOf(envd, files);
      expect(listed.find((e) => e.name === 'a.txt')?.metadata).toEqual({
        owner: 'Alice',
        'build.id': '42 x',
      });
      // Kept on disk, not in the file: the content is what was written.
      expect(readFileSync(path, 'utf8')).toBe('hello');
      expect(existsSync(store)).toBe(true);
      // A file written without metadata has none, and the answer says nothing of it.
      const plain = await envd.write(join(files, 'plain.txt'), 'p');
      expect(plain.json).toEqual({ path: join(files, 'plain.txt'), size: 1 });
      expect(await statOf(envd, join(files, 'plain.txt'))).not.toHaveProperty('metadata');
    } finally {
      await envd.stop();
    }
  });

  test('the metadata follows the file: renamed by envd or by a process, appended to in place, linked to', async () => {
    const envd = await serve(store);
    try {
      const path = join(files, 'r1.txt');
      await envd.write(path, 'x', { k: 'v' });
      const moved = await envd.call('/files/move', {
        body: { from: path, to: join(files, 'sub', 'r2.txt') },
      });
      expect(moved.status).toBe(200);
      expect((await statOf(envd, join(files, 'sub', 'r2.txt'))).metadata).toEqual({ k: 'v' });
      // A rename envd did not do (a process of the sandbox: mv).
      renameSync(join(files, 'sub', 'r2.txt'), join(files, 'r3.txt'));
      expect((await statOf(envd, join(files, 'r3.txt'))).metadata).toEqual({ k: 'v' });
      // Written in place (same inode), as an xattr it stays.
      appendFileSync(join(files, 'r3.txt'), 'more');
      expect((await statOf(envd, join(files, 'r3.txt'))).metadata).toEqual({ k: 'v' });
      // A symlink shows its target's, as an xattr read through the link's path does.
      symlinkSync('r3.txt', join(files, 'r3.link'));
      expect((await statOf(envd, join(files, 'r3.link'))).metadata).toEqual({ k: 'v' });
      // A copy is a new file: no metadata (as cp without --preserve=xattr).
      await envd.call('/files/copy', {
        body: { from: join(files, 'r3.txt'), to: join(files, 'r4.txt') },
      });
      expect(await statOf(envd, join(files, 'r4.txt'))).not.toHaveProperty('metadata');
    } finally {
      await envd.stop();
    }
  });

  test('deleted then made again, even on the same inode, a file has no metadata', async () => {
    const envd = await serve(store);
    try {
      const path = join(files, 'gone.txt');
      await envd.write(path, 'x', { k: 'v' });
      const before = statSync(path);
      // Deleted by a process, not envd: envd never hears of it.
      rmSync(path);
      let reused = false;
      // File systems hand a freed inode number to the next file (ext4 does at once): try for it.
      for (let i = 0; i < 100 && !reused; i++) {
        writeFileSync(path, 'new');
        reused = statSync(path).ino === before.ino;
        if (!reused) rmSync(path);
      }
      if (!reused) writeFileSync(path, 'new');
      expect(await statOf(envd, path)).not.toHaveProperty('metadata');
      // Deleted through envd: the same.
      await envd.write(path, 'y', { k: 'w' });
      expect((await envd.call('/files/delete', { body: { path } })).status).toBe(200);
      writeFileSync(path, 'again');
      expect(await statOf(envd, path)).not.toHaveProperty('metadata');
    } finally {
      await envd.stop();
    }
  });

  test('an overwrite replaces the whole set; one without metadata clears it (as E2B)', async () => {
    const envd = await serve(store);
    try {
      const path = join(files, 'over.txt');
      await envd.write(path, '1', { a: '1', b: '2' });
      await envd.write(path, '2', { b: '3', c: '4' });
      expect((await statOf(envd, path)).metadata).toEqual({ b: '3', c: '4' });
      await envd.write(path, '3');
      expect(await statOf(envd, path)).not.toHaveProperty('metadata');
    } finally {
      await envd.stop();
    }
  });

  test('bad metadata is a 400 naming the fault, and nothing is written', async () => {
    const envd = await serve(store);
    try {
      const path = join(files, 'bad.txt');
      await envd.write(path, 'old', { keep: 'me' });
      const cases: [Record<string, string>, RegExp][] = [
        [{ ['k'.repeat(247)]: 'v' }, /over the limit of 246/],
        [{ tab: 'a\tb' }, /not printable US-ASCII/],
        [{ latin: 'caf\u00e9' }, /not printable US-ASCII/],
        [{ big: 'v'.repeat(4096) }, /over the limit of 4096 per file/],
      ];
      for (const [metadata, message] of cases) {
        const answer = await envd.write(path, 'new', metadata);
        expect(answer.status).toBe(400);
        expect(answer.json).toMatchObject({ type: 'BadRequestError' });
        expect((answer.json as { error: string }).error).toMatch(message);
        expect(readFileSync(path, 'utf8')).toBe('old');
        expect((await statOf(envd, path)).metadata).toEqual({ keep: 'me' });
      }
      // A new path is not even made.
      expect((await envd.write(join(files, 'never.txt'), 'x', { t: 'a\tb' })).status).toBe(400);
      expect(existsSync(join(files, 'never.txt'))).toBe(false);
    } finally {
      await envd.stop();
    }
  });

  test('a restarted envd has the metadata (the store file); a hostile store file is not trusted', async () => {
    const path = join(files, 'kept.txt');
    const first = await serve(store);
    await first.write(path, 'x', { survives: 'yes' });
    await first.stop();
    const second = await serve(store);
    try {
      expect((await statOf(second, path)).metadata).toEqual({ survives: 'yes' });
    } finally {
      await second.stop();
    }
    // A FIFO where the store should be: read without waiting, and refused.
    const fifoStore = join(dir, 'fifo-store.json');
    execFileSync('mkfifo', [fifoStore]);
    const warnings: string[] = [];
    const fifo = await serve(fifoStore, { warn: (m) => warnings.push(m) });
    try {
      expect(await statOf(fifo, path)).not.toHaveProperty('metadata');
      expect(warnings.join('\n')).toMatch(/not a regular file/);
    } finally {
      await fifo.stop();
    }
    // Entries that a write could not have made are dropped, the rest kept.
    const forged = join(dir, 'forged.json');
    const s = statSync(path, { bigint: true });
    const identity = { dev: String(s.dev), ino: String(s.ino), btime: String(s.birthtimeNs) };
    writeFileSync(
      forged,
      JSON.stringify({
        files: [
          // An earlier file on the same inode (born before this one): not this file's.
          { ...identity, btime: String(s.birthtimeNs - 1n), path, metadata: { earlier: 'file' } },
          { ...identity, path, metadata: { ok: 'yes', bad: 'a\u0000' } },
          { ...identity, ino: 'x', path, metadata: { a: 'b' } },
          { dev: '1', ino: '2', btime: '3', path: '/x', metadata: { a: 'b' } },
        ],
      }),
    );
    const forgedWarnings: string[] = [];
    const third = await serve(forged, { warn: (m) => forgedWarnings.push(m) });
    try {
      expect(await statOf(third, path)).not.toHaveProperty('metadata');
      expect(forgedWarnings.join('\n')).toMatch(/2 entries dropped/);
    } finally {
      await third.stop();
    }
  });

  test('the store is bounded: a write over its limit is a 400 naming it; files gone make room', async () => {
    const small = join(dir, 'small-store.json');
    const envd = await serve(small, { maxFiles: 2 });
    try {
      await envd.write(join(files, 'l1'), 'x', { k: '1' });
      await envd.write(join(files, 'l2'), 'x', { k: '2' });
      // Overwriting one that has metadata replaces its entry: still two.
      expect((await envd.write(join(files, 'l2'), 'x', { k: '2b' })).status).toBe(200);
      const refused = await envd.write(join(files, 'l3'), 'x', { k: '3' });
      expect(refused.status).toBe(400);
      expect((refused.json as { error: string }).error).toMatch(
        /keeps metadata of at most 2 files .*remove files that carry metadata/,
      );
      expect(existsSync(join(files, 'l3'))).toBe(false);
      // Removed by a process: envd finds it gone when it needs the room.
      rmSync(join(files, 'l1'));
      expect((await envd.write(join(files, 'l3'), 'x', { k: '3' })).status).toBe(200);
      expect((await statOf(envd, join(files, 'l3'))).metadata).toEqual({ k: '3' });
    } finally {
      await envd.stop();
    }
  });

  test('the command server keeps none: a write with metadata is refused, not silently dropped', async () => {
    const server = await serve(store, {}, FILE_OPS);
    try {
      const answer = await server.write(join(files, 'cs.txt'), 'x', { k: 'v' });
      expect(answer.status).toBe(400);
      expect((answer.json as { error: string }).error).toMatch(/keeps no file metadata/);
      expect(existsSync(join(files, 'cs.txt'))).toBe(false);
    } finally {
      await server.stop();
    }
  });
});
