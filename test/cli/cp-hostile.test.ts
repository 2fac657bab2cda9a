import { spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  rmSync,
  type Stats,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { createServer, type Server } from 'node:http';
import { createServer as createNetServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, sep } from 'node:path';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { Header } from 'tar';
import { afterAll, test as base, beforeAll, describe, expect } from 'vitest';
import { ARCHIVE } from '../../runtime/envd/archive.js';
import { entryHeader } from '../../runtime/envd/tar-format.js';
import { CORE } from '../../runtime/server/groups/core.js';
import { SandboxServer } from '../../runtime/server/server.js';
import { downloadDirectory } from '../../src/cli/transfer.js';
import { SandboxError } from '../../src/errors.js';
import { Filesystem } from '../../src/sandbox/filesystem.js';
import { HttpClient } from '../../src/sandbox/http-client.js';
import { Sandbox } from '../../src/sandbox/sandbox.js';
import { ArchiveError, extractTar } from '../../src/util/safe-extract.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { archive, type Crafted, END, entry, header, pax } from '../helpers/crafted-tar.js';
import { abxIn, sh } from './abx.js';

// `abx cp ID:dir dest` as an attacker inside the sandbox would attack it (issue 13: a swapped
// temporary archive gave a root-owned mode-4755 file on the host). The archive now comes from
// envd itself, so the attacks are made at two levels: archives crafted byte by byte and fed to
// the host's extractor (what a sandbox that took over its envd could send), and a real sandbox
// whose user plants set-user-ID files, FIFOs, sockets, hard links, links to host paths, hostile
// names, a fake `tar` first on PATH and a tree that changes under the copy.

const UID = process.getuid?.() ?? 0;
const GID = process.getgid?.() ?? 0;
const UMASK = Number.parseInt(
  /^Umask:\s*(\d+)/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '22',
  8,
);

interface Scratch {
  /** Where archives are extracted. */
  dest: string;
  /** A sibling that must stay empty: anything in it escaped the destination. */
  outside: string;
}

const test = base.extend<{ scratch: Scratch }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  scratch: async ({}, use) => {
    const dir = mkdtempSync(join(tmpdir(), 'abx-cp-hostile-'));
    const scratch = { dest: join(dir, 'dest'), outside: join(dir, 'outside') };
    mkdirSync(scratch.outside);
    try {
      await use(scratch);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
});

/** Feeds bytes to the extractor in chunks of `chunk` bytes (all at once by default). */
function extract(bytes: Buffer, dest: string, chunk = bytes.length || 1) {
  const chunks: Buffer[] = [];
  for (let i = 0; i < bytes.length; i += chunk) chunks.push(bytes.subarray(i, i + chunk));
  return extractTar(Readable.from(chunks), dest);
}

/** Everything under `root`, by relative path, from lstat (links are not followed). */
function scan(root: string): Map<string, Stats> {
  const found = new Map<string, Stats>();
  if (!existsSync(root)) return found;
  const visit = (dir: string) => {
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      const stats = lstatSync(path);
      found.set(path.slice(root.length + 1), stats);
      if (stats.isDirectory()) visit(path);
    }
  };
  visit(root);
  return found;
}

/**
 * What must hold for anything extracted from a sandbox, whatever it sent: only files,
 * directories and symbolic links; no set-user-ID, set-group-ID or sticky bit; owned by us;
 * inside the destination; the outside untouched.
 */
function expectSafe(scratch: Scratch): void {
  expect(readdirSync(scratch.outside)).toEqual([]);
  if (!existsSync(scratch.dest)) return;
  const real = realpathSync(scratch.dest);
  for (const [rel, stats] of scan(scratch.dest)) {
    const where = `${rel}: mode 0${(stats.mode & 0o7777).toString(8)}`;
    expect(stats.isFile() || stats.isDirectory() || stats.isSymbolicLink(), where).toBe(true);
    expect(stats.mode & 0o7000, where).toBe(0);
    expect([stats.uid, stats.gid], where).toEqual([UID, GID]);
    if (!stats.isSymbolicLink()) {
      expect(realpathSync(join(scratch.dest, rel)).startsWith(real + sep), where).toBe(true);
    }
  }
}

function sha(path: string): string {
  return createHash('sha256').update(readFileSync(path)).digest('hex');
}

describe('the host extractor, fed archives crafted byte by byte', () => {
  test('set-user-ID, set-group-ID and sticky bits are dropped; owners in the archive are ignored', async ({
    scratch,
  }) => {
    await extract(
      archive([
        { name: 'suid-root', mode: 0o4755, uid: 0, gid: 0, body: '#!/bin/sh\nid\n' },
        { name: 'sgid-dir/', type: '5', mode: 0o2775, uid: 4321, gid: 4321 },
        { name: 'sgid-dir/both', mode: 0o6777, uid: 4321, gid: 4321, body: 'x' },
        { name: 'sticky/', type: '5', mode: 0o1777 },
        // A pax `mode` record is one more way to say 4755.
        pax({ mode: '2541', uid: '4321' }),
        { name: 'pax-mode', mode: 0o4755, body: 'y' },
      ]),
      scratch.dest,
    );
    expectSafe(scratch);
    const mode = (rel: string) => lstatSync(join(scratch.dest, rel)).mode & 0o7777;
    expect(mode('suid-root')).toBe(0o755 & ~UMASK);
    expect(mode('sgid-dir')).toBe(0o775 & ~UMASK);
    expect(mode('sgid-dir/both')).toBe(0o777 & ~UMASK);
    expect(mode('sticky')).toBe(0o777 & ~UMASK);
    expect(readFileSync(join(scratch.dest, 'suid-root'), 'utf8')).toBe('#!/bin/sh\nid\n');
  });

  test.for<[string, Crafted, RegExp]>([
    [
      'a character device',
      { name: 'null', type: '3', devmajor: 1, devminor: 3 },
      /character device/,
    ],
    ['a block device', { name: 'sda', type: '4', devmajor: 8, devminor: 0 }, /block device/],
    ['a FIFO', { name: 'fifo', type: '6' }, /FIFO/],
    ['a hard link to /etc/passwd', { name: 'pw', type: '1', link: '/etc/passwd' }, /hard link/],
    ['a hard link outside', { name: 'pw', type: '1', link: '../outside/x' }, /hard link/],
    ['a hard link inside', { name: 'pw', type: '1', link: 'first' }, /hard link/],
    ['an unknown type', { name: 'odd', type: 'Z' }, /unsupported kind/],
    ['a GNU sparse file', { name: 'sparse', type: 'S', size: 0 }, /unsupported kind/],
  ])('%s is refused with an error naming it', async ([, hostile, message], { scratch }) => {
    const bytes = archive([{ name: 'first', body: 'kept' }, hostile, { name: 'after', body: 'z' }]);
    const error = await extract(bytes, scratch.dest).catch((e: Error) => e);
    expect(error).toBeInstanceOf(ArchiveError);
    expect((error as Error).message).toMatch(message);
    expectSafe(scratch);
    // What came before the bad entry stays; nothing of it or after it was created.
    expect([...scan(scratch.dest).keys()]).toEqual(['first']);
    expect(lstatSync('/etc/passwd').nlink).toBe(1);
  });

  test("pax records cannot change an entry's kind or mode (node-tar ignores both)", async ({
    scratch,
  }) => {
    await extract(
      archive([pax({ type: '3', mode: '2541' }), { name: 'dev', mode: 0o644, body: '' }]),
      scratch.dest,
    );
    expect(lstatSync(join(scratch.dest, 'dev')).isFile()).toBe(true);
    expect(lstatSync(join(scratch.dest, 'dev')).mode & 0o7777).toBe(0o644 & ~UMASK);
    expectSafe(scratch);
  });

  test('a header whose numbers are invalid base-256 is an error, not a crash', async ({
    scratch,
  }) => {
    const bad = header({ name: 'x', body: 'y' });
    bad[124] = 0x80; // base-256 size...
    bad.fill(0xff, 125, 136); // ...that does not fit in a safe integer
    for (const bytes of [
      Buffer.concat([bad, Buffer.alloc(512), END]),
      Buffer.concat([entry({ name: 'ok', body: 'fine' }), bad, Buffer.alloc(512), END]),
    ]) {
      const error = await extract(bytes, scratch.dest).catch((e: Error) => e);
      expect(error).toBeInstanceOf(ArchiveError);
      expectSafe(scratch);
    }
  });

  test.for<[string, RegExp]>([
    ['../escape', /'\.\.'/],
    ['a/../../escape', /'\.\.'/],
    ['a/b/../../../outside/escape', /'\.\.'/],
    ['/abs/path', /absolute path/],
  ])('the name %s never leaves the destination', async ([name, message], { scratch }) => {
    const names = [name, name.startsWith('/') ? `${scratch.outside}/abs` : name];
    for (const hostile of names) {
      const bytes = archive([{ name: hostile, body: 'escaped' }]);
      await expect(extract(bytes, scratch.dest)).rejects.toThrow(message);
      expectSafe(scratch);
    }
    expect(existsSync('/abs')).toBe(false);
    expect(existsSync(join(scratch.dest, '..', 'escape'))).toBe(false);
  });

  test('nothing is written through a symbolic link the archive made', async ({ scratch }) => {
    const link: Crafted = { name: 'link', type: '2', link: scratch.outside };
    for (const through of [
      { name: 'link/owned', body: 'pwned' },
      { name: 'link/sub/', type: '5' },
      { name: 'link/x', type: '2', link: '/etc/passwd' },
    ]) {
      await expect(extract(archive([link, through]), scratch.dest)).rejects.toThrow(
        /through the archive's own symbolic link "link"/,
      );
      expectSafe(scratch);
    }
    // Links come last, so a failed extraction made none.
    expect(existsSync(join(scratch.dest, 'link'))).toBe(false);
  });

  test('nor through a symbolic link already in the destination (from an earlier copy)', async ({
    scratch,
  }) => {
    await extract(archive([{ name: 'link', type: '2', link: scratch.outside }]), scratch.dest);
    expect(readlinkSync(join(scratch.dest, 'link'))).toBe(scratch.outside);
    for (const through of [
      { name: 'link/owned', body: 'pwned' },
      { name: 'link/sub/', type: '5' },
      { name: 'link/deep/er/file', body: 'pwned' },
    ]) {
      await expect(extract(archive([through]), scratch.dest)).rejects.toThrow(
        /through the symbolic link "link" in .*never followed/,
      );
      expectSafe(scratch);
    }
  });

  test('a file replaces a link of its name without following it; link targets stay as they are', async ({
    scratch,
  }) => {
    const passwd = sha('/etc/passwd');
    writeFileSync(join(scratch.outside, 'target'), 'original');
    mkdirSync(scratch.dest);
    symlinkSync(join(scratch.outside, 'target'), join(scratch.dest, 'planted'));
    await extract(
      archive([
        { name: 'x', type: '2', link: '/etc/passwd' },
        { name: 'x', body: 'mine' },
        { name: 'planted', body: 'new' },
        { name: 'abs', type: '2', link: '/etc/passwd' },
        { name: 'rel', type: '2', link: '../../../../etc/shadow' },
      ]),
      scratch.dest,
    );
    expect(readFileSync(join(scratch.dest, 'x'), 'utf8')).toBe('mine');
    expect(readFileSync(join(scratch.dest, 'planted'), 'utf8')).toBe('new');
    expect(lstatSync(join(scratch.dest, 'planted')).isFile()).toBe(true);
    expect(readFileSync(join(scratch.outside, 'target'), 'utf8')).toBe('original');
    expect(readlinkSync(join(scratch.dest, 'abs'))).toBe('/etc/passwd');
    expect(readlinkSync(join(scratch.dest, 'rel'))).toBe('../../../../etc/shadow');
    expect(sha('/etc/passwd')).toBe(passwd);
    rmSync(join(scratch.outside, 'target'));
    expectSafe(scratch);
  });

  test('a huge declared size with a truncated body fails at once, leaving no partial file', async ({
    scratch,
  }) => {
    const started = Date.now();
    const bytes = archive(
      [
        { name: 'ok', body: 'fine' },
        { name: 'big', size: 2 ** 40, body: randomBytes(1000) },
      ],
      { end: false },
    );
    await expect(extract(bytes, scratch.dest, 333)).rejects.toThrow(/malformed.*Truncated input/);
    expect([...scan(scratch.dest).keys()]).toEqual(['ok']);
    expect(Date.now() - started).toBeLessThan(5000);
  });

  test.for<[string, Buffer, RegExp]>([
    ['random bytes', randomBytes(4096), /not a tar archive/],
    ['nothing at all', Buffer.alloc(0), /0 bytes long: not a tar archive/],
    ['half a header', archive([{ name: 'a', body: 'b' }]).subarray(0, 300), /not a tar archive/],
    ['zero blocks only', END, /not a tar archive/],
    [
      'a gzip-compressed archive',
      gzipSync(archive([{ name: 'a', body: 'b' }])),
      /not a tar archive/,
    ],
    [
      'entries without the end marker',
      archive([{ name: 'a', body: 'b' }], { end: false }),
      /end-of-archive marker/,
    ],
    [
      'a later header with a bad checksum',
      archive([
        { name: 'a', body: 'b' },
        { name: 'c', body: 'd', badChecksum: true },
      ]),
      /malformed.*checksum/,
    ],
    [
      'garbage after a good entry',
      Buffer.concat([entry({ name: 'a', body: 'b' }), randomBytes(2048)]),
      /malformed/,
    ],
  ])('%s: a clear error, never a hang', async ([, bytes, message], { scratch }) => {
    const error = await extract(bytes, scratch.dest, 100).catch((e: Error) => e);
    expect(error).toBeInstanceOf(ArchiveError);
    expect((error as Error).message).toMatch(message);
    expectSafe(scratch);
  });

  test('hostile names are extracted as names, and quoted in messages', async ({ scratch }) => {
    const names = ['new\nline', '\u001b[31mred', '..dots', '-rf', 'back\\slash', ' space '];
    await extract(archive(names.map((name) => ({ name, body: name }))), scratch.dest);
    expect(readdirSync(scratch.dest).sort()).toEqual([...names].sort());
    for (const name of names) expect(readFileSync(join(scratch.dest, name), 'utf8')).toBe(name);
  });

  test('an error about a hostile name shows it escaped, so it cannot drive the terminal', async ({
    scratch,
  }) => {
    const error = await extract(
      archive([{ name: '\u001b]0;pwned\u0007', type: '6' }]),
      scratch.dest,
    )
      .then(() => undefined)
      .catch((e: Error) => e);
    expect(error?.message).toContain('"\\u001b]0;pwned\\u0007"');
    expect(error?.message).not.toContain('\u001b');
  });

  test('a directory with no permissions still receives its content; the same archive twice is fine', async ({
    scratch,
  }) => {
    const bytes = archive([
      { name: 'locked/', type: '5', mode: 0o000 },
      { name: 'locked/inside', mode: 0o600, body: 'in' },
      { name: 'exe', mode: 0o755, body: '#!/bin/sh\n' },
      { name: 'link', type: '2', link: 'exe' },
    ]);
    for (const chunk of [1, 7, 512, bytes.length]) await extract(bytes, scratch.dest, chunk);
    expect(lstatSync(join(scratch.dest, 'locked')).mode & 0o777).toBe(0o700);
    expect(readFileSync(join(scratch.dest, 'locked', 'inside'), 'utf8')).toBe('in');
    expect(lstatSync(join(scratch.dest, 'exe')).mode & 0o777).toBe(0o755 & ~UMASK);
    expect(readlinkSync(join(scratch.dest, 'link'))).toBe('exe');
    expectSafe(scratch);
  });

  test('many deep entries extract quickly; a link over a directory and overlong names are refused', async ({
    scratch,
  }) => {
    const deep = Array.from({ length: 200 }, (_, i) => `d${i}`).join('/');
    const entries: Crafted[] = [];
    for (let i = 0; i < 2000; i++)
      entries.push(pax({ path: `${deep}/f${i}` }), { name: 'x', body: 'x' });
    const started = Date.now();
    const summary = await extract(archive(entries), scratch.dest, 64 * 1024);
    expect(summary.files).toBe(2000);
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(readdirSync(join(scratch.dest, ...deep.split('/'))).length).toBe(2000);

    await expect(
      extract(archive([{ name: 'd0', type: '2', link: scratch.outside }]), scratch.dest),
    ).rejects.toThrow(/symbolic link "d0" would replace a directory/);
    await expect(
      extract(archive([pax({ path: 'n/'.repeat(2100) }), { name: 'x', body: 'x' }]), scratch.dest),
    ).rejects.toThrow(/over 4096 characters/);
    expectSafe(scratch);
  }, 30_000);

  test('a destination that is a file is an error, not a replacement', async ({ scratch }) => {
    writeFileSync(scratch.dest, 'a file');
    await expect(extract(archive([{ name: 'a', body: 'b' }]), scratch.dest)).rejects.toThrow(
      /cannot extract into/,
    );
    expect(readFileSync(scratch.dest, 'utf8')).toBe('a file');
  });
});

/** An HTTP server that answers every request with `respond` (a stand-in for a hostile envd). */
async function fakeEnvd(respond: Parameters<typeof createServer>[1]) {
  const server: Server = createServer(respond);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return {
    /** A sandbox whose files go to this server, with a short request timeout. */
    sandbox: {
      files: new Filesystem(new HttpClient(`http://127.0.0.1:${port}`, {}, 1000, 'fake envd')),
    } as unknown as Sandbox,
    close: () => {
      server.closeAllConnections();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

describe('the download path, when envd itself is hostile', () => {
  const hostile = archive([
    { name: 'suid', mode: 0o4755, body: 'x' },
    { name: 'fifo', type: '6' },
  ]);

  test('a hostile archive: refused, with what was extracted said plainly', async ({ scratch }) => {
    const envd = await fakeEnvd((_, res) => {
      res.writeHead(200, { 'x-archive-size': String(hostile.length) });
      res.end(hostile);
    });
    try {
      const error = await downloadDirectory(envd.sandbox, '/home/user/d', scratch.dest).catch(
        (e: Error) => e,
      );
      expect(error).toBeInstanceOf(ArchiveError);
      expect((error as Error).message).toMatch(
        new RegExp(
          `"fifo" is a FIFO.*; entries extracted before the failure stay in ${scratch.dest}$`,
        ),
      );
      expectSafe(scratch);
      expect(lstatSync(join(scratch.dest, 'suid')).mode & 0o7777).toBe(0o755 & ~UMASK);
    } finally {
      await envd.close();
    }
  });

  test('a stream cut part way is an error naming it', async ({ scratch }) => {
    const envd = await fakeEnvd((_, res) => {
      res.writeHead(200);
      res.write(entry({ name: 'big', size: 100_000, body: randomBytes(10_000) }));
      setTimeout(() => res.destroy(), 50);
    });
    try {
      const error = await downloadDirectory(envd.sandbox, 'd', scratch.dest).catch((e: Error) => e);
      expect(error).toBeInstanceOf(SandboxError);
      expect((error as Error).message).toMatch(
        /^the archive of d broke off \(.+\); entries extracted/,
      );
      expect(scan(scratch.dest).size).toBe(0);
    } finally {
      await envd.close();
    }
  });

  test('a stream that stalls ends with a timeout, not a hang', async ({ scratch }) => {
    const envd = await fakeEnvd((_, res) => {
      res.writeHead(200);
      res.write(entry({ name: 'slow', size: 100_000, body: randomBytes(1024) }));
    });
    try {
      const started = Date.now();
      const error = await downloadDirectory(envd.sandbox, 'd', scratch.dest).catch((e: Error) => e);
      expect((error as Error).message).toMatch(/broke off \(.*[Tt]imeout.*\)/);
      expect(Date.now() - started).toBeLessThan(10_000);
      expect(scan(scratch.dest).size).toBe(0);
    } finally {
      await envd.close();
    }
  });
});

describe('envd packs a tree (served in-process)', () => {
  let server: SandboxServer;
  let files: Filesystem;
  let dir: string;

  beforeAll(async () => {
    server = new SandboxServer({ token: 't', catalog: [CORE, ARCHIVE] });
    const { host, port } = await server.start();
    files = new Filesystem(
      new HttpClient(`http://${host}:${port}`, { authorization: 'Bearer t' }, 10_000, 'envd'),
    );
    dir = mkdtempSync(join(tmpdir(), 'abx-pack-'));
  });

  afterAll(async () => {
    await server?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  async function bytesOf(path: string) {
    const { stream, estimatedBytes } = await files.readArchive(path);
    const chunks: Buffer[] = [];
    for await (const chunk of stream) chunks.push(chunk as Buffer);
    return { bytes: Buffer.concat(chunks), estimatedBytes };
  }

  test('GNU tar reads it; only directories, files and links; the extractor round-trips it', async () => {
    const tree = join(dir, 'tree');
    const longName = `${'n'.repeat(120)}\nline`;
    const longTarget = `/${'t'.repeat(150)}`;
    mkdirSync(join(tree, 'a', 'b'), { recursive: true });
    mkdirSync(join(tree, 'empty-dir'));
    writeFileSync(join(tree, 'a', 'b', 'deep.txt'), 'deep');
    writeFileSync(join(tree, 'empty'), '');
    writeFileSync(join(tree, 'run.sh'), '#!/bin/sh\n', { mode: 0o755 });
    writeFileSync(join(tree, 'suid'), 'x', { mode: 0o4755 });
    writeFileSync(join(tree, longName), 'long');
    writeFileSync(Buffer.from(join(tree, 'latin1-\xe9'), 'latin1'), 'not utf-8');
    symlinkSync('/etc/passwd', join(tree, 'abs-link'));
    symlinkSync(longTarget, join(tree, 'long-link'));
    spawnSync('mkfifo', [join(tree, 'fifo')]);
    spawnSync('ln', [join(tree, 'run.sh'), join(tree, 'hard')]);
    const socket = createNetServer().listen(join(tree, 'sock'));
    await new Promise((resolve) => socket.once('listening', resolve));
    try {
      const { bytes, estimatedBytes } = await bytesOf(tree);
      expect(estimatedBytes).toBe(bytes.length);

      const listed = spawnSync('tar', ['-tvf', '-'], { input: bytes });
      expect(listed.status, listed.stderr.toString()).toBe(0);
      const lines = listed.stdout.toString().trim().split('\n');
      expect(lines.filter((l) => /^[^-dl]/.test(l))).toEqual([]); // no p, s, c, b, h
      expect(lines.find((l) => l.endsWith(' suid'))).toMatch(/^-rwsr-xr-x /); // as it is
      expect(lines.find((l) => l.includes(' long-link -> '))).toContain(`-> ${longTarget}`);

      const gnu = join(dir, 'gnu-out');
      mkdirSync(gnu);
      expect(spawnSync('tar', ['-xf', '-', '-C', gnu], { input: bytes }).status).toBe(0);
      expect(readFileSync(join(gnu, longName), 'utf8')).toBe('long');
      expect(readFileSync(Buffer.from(join(gnu, 'latin1-\xe9'), 'latin1'), 'utf8')).toBe(
        'not utf-8',
      );

      const ours = join(dir, 'ours');
      await extract(bytes, ours);
      const got = scan(ours);
      expect([...got.keys()].sort()).toEqual(
        [
          'a',
          'a/b',
          'a/b/deep.txt',
          'abs-link',
          'empty',
          'empty-dir',
          'hard',
          'latin1-\ufffd', // node-tar decodes names as UTF-8
          'long-link',
          longName,
          'run.sh',
          'suid',
        ].sort(),
      );
      expect(got.get('run.sh')?.mode).toBe(got.get('hard')?.mode);
      expect((got.get('run.sh')?.mode ?? 0) & 0o7777).toBe(0o755 & ~UMASK);
      expect((got.get('suid')?.mode ?? 0) & 0o7777).toBe(0o755 & ~UMASK);
      expect(readlinkSync(join(ours, 'long-link'))).toBe(longTarget);
      expect(readFileSync(join(ours, longName), 'utf8')).toBe('long');
      expect(readFileSync(join(ours, 'a', 'b', 'deep.txt'), 'utf8')).toBe('deep');
    } finally {
      socket.close();
    }
  });

  test('numbers too large for octal fields use base-256, which readers take', () => {
    const size = 9 * 1024 ** 3;
    const block = entryHeader({
      name: Buffer.from('huge'),
      type: '0',
      mode: 0o644,
      uid: 1000,
      gid: 1000,
      size,
      mtime: 1_700_000_000,
    });
    const header = new Header(block);
    expect([header.cksumValid, header.size, header.path, header.type]).toEqual([
      true,
      size,
      'huge',
      'File',
    ]);
  });

  test('a missing path or a file is an error answer before any byte of archive', async () => {
    writeFileSync(join(dir, 'plain'), 'x');
    await expect(files.readArchive(join(dir, 'missing'))).rejects.toMatchObject({
      name: 'NotFoundError',
    });
    await expect(files.readArchive(join(dir, 'plain'))).rejects.toThrow(/is not a directory/);
  });
});

describe('abx cp from a real sandbox whose user attacks the copy', () => {
  let home: Awaited<ReturnType<typeof createAbxHome>>;
  let cli: ReturnType<typeof abxIn>;
  let id: string;
  let work: string;

  /** Runs a shell line in the sandbox; fails the test unless it exits 0. */
  async function inSandbox(line: string, input?: string): Promise<string> {
    const result = await cli.abx(
      input === undefined ? ['exec', id, '--', line] : ['exec', '-i', id, '--', line],
      {
        input,
      },
    );
    expect(result.code, result.stderr).toBe(0);
    return result.stdout;
  }

  // A fake `tar` that answers every call with a chosen hostile archive: what issue 13's attacker
  // would plant if the copy still ran the sandbox's tar. `TAR_ATTACK` picks the archive.
  const FAKE_TAR = String.raw`#!/usr/bin/python3
import io, os, sys, tarfile
open('/home/user/fake-tar-ran', 'a').write(' '.join(sys.argv) + '\n')
out = sys.stdout.buffer
def add(name, kind=tarfile.REGTYPE, mode=0o644, data=b'', link='', uid=0, size=None):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid, info.linkname = kind, mode, uid, 0, link
    info.size = len(data) if size is None else size
    info.devmajor, info.devminor = (1, 3) if kind == tarfile.CHRTYPE else (0, 0)
    out.write(info.tobuf(tarfile.GNU_FORMAT))
    out.write(data[:info.size])
    out.write(b'\0' * (-len(data[:info.size]) % 512))
attack = os.environ.get('TAR_ATTACK', 'all')
add('setuid-root', mode=0o4755, data=b'#!/bin/sh\nid\n')
add('setgid-dir', tarfile.DIRTYPE, mode=0o2775)
if attack == 'chardev': add('null', tarfile.CHRTYPE)
if attack == 'fifo': add('fifo', tarfile.FIFOTYPE)
if attack == 'hardlink': add('passwd', tarfile.LNKTYPE, link='/etc/passwd')
if attack == 'dotdot': add('../escape', data=b'escaped')
if attack == 'absolute': add(os.environ['OUTSIDE'] + '/abs', data=b'escaped')
if attack == 'symlink': add('link', tarfile.SYMTYPE, link=os.environ['OUTSIDE']); add('link/owned', data=b'pwned')
if attack == 'truncated':
    add('huge', data=b'A' * 1000, size=1 << 40)
    out.flush(); os._exit(0)
if attack == 'garbage': out.write(os.urandom(4096))
out.write(b'\0' * 1024)
`;

  beforeAll(async () => {
    home = await createAbxHome();
    cli = abxIn(home.home);
    work = mkdtempSync(join(tmpdir(), 'abx-cp-attack-'));
    // The template puts the user's own bin first on PATH, as issue 13's attacker did.
    writeFileSync(
      join(work, 'template.yaml'),
      'name: cp-hostile\nenv:\n  PATH: /home/user/bin:/usr/local/bin:/usr/bin:/bin\n',
    );
    const built = await cli.abx(['template', 'build', join(work, 'template.yaml')]);
    expect(built.code, built.stderr).toBe(0);
    const created = await cli.abx(['create', '-q', '--template', 'cp-hostile', '--timeout', '10m']);
    expect(created.code, created.stderr).toBe(0);
    id = created.stdout.trim();
    await inSandbox('mkdir -p bin && cat > bin/tar && chmod 755 bin/tar', FAKE_TAR);
  }, 180_000);

  afterAll(async () => {
    if (work) rmSync(work, { recursive: true, force: true });
    await home?.close();
  });

  test("the sandbox's fake tar makes hostile archives; the host extractor refuses each", async ({
    scratch,
  }) => {
    expect((await inSandbox('command -v tar')).trim()).toBe('/home/user/bin/tar');
    const cases: [string, RegExp][] = [
      ['chardev', /"null" is a character device/],
      ['fifo', /"fifo" is a FIFO/],
      ['hardlink', /"passwd" is a hard link/],
      ['dotdot', /"\.\.\/escape" climbs out/],
      ['absolute', /absolute path/],
      ['symlink', /"link\/owned" would be written through the archive's own symbolic link/],
      ['truncated', /Truncated input/],
      ['garbage', /malformed/],
    ];
    for (const [attack, message] of cases) {
      await inSandbox(
        `TAR_ATTACK=${attack} OUTSIDE=${sh(scratch.outside)} tar -cf - . > attack.tar`,
      );
      const copied = await cli.abx([
        'cp',
        `${id}:attack.tar`,
        join(scratch.dest, '..', `${attack}.tar`),
      ]);
      expect(copied.code, copied.stderr).toBe(0);
      const bytes = readFileSync(join(scratch.dest, '..', `${attack}.tar`));
      const into = join(scratch.dest, attack);
      const error = await extract(bytes, into).catch((e: Error) => e);
      expect(error, attack).toBeInstanceOf(ArchiveError);
      expect((error as Error).message, attack).toMatch(message);
      expectSafe(scratch);
      // The entries before the attack were extracted, without their special bits.
      expect(lstatSync(join(into, 'setuid-root')).mode & 0o7777, attack).toBe(0o755 & ~UMASK);
    }
  }, 120_000);

  test('abx cp never runs the sandbox tar: a planted one changes nothing', async ({ scratch }) => {
    await inSandbox('rm -f fake-tar-ran && mkdir -p plain/sub && echo hello > plain/sub/hi.txt');
    const copied = await cli.json<{ type: string }>(['cp', `${id}:plain`, scratch.dest]);
    expect(copied.type).toBe('directory');
    expect(readFileSync(join(scratch.dest, 'sub', 'hi.txt'), 'utf8')).toBe('hello\n');
    expect((await inSandbox('ls fake-tar-ran 2>&1 || true')).trim()).toMatch(/No such file/);
    expectSafe(scratch);
  }, 60_000);

  test('what the sandbox user can plant arrives safe: no set-ID bits, FIFOs, sockets; links kept as links', async ({
    scratch,
  }) => {
    const passwd = sha('/etc/passwd');
    await inSandbox(
      [
        'set -e; rm -rf tree; mkdir -p tree/nested/deeper tree/sgid-dir tree/sticky tree/empty-dir',
        'echo secret > tree/nested/deeper/file.txt',
        "printf '#!/bin/sh\\necho hi\\n' > tree/suid && chmod 4755 tree/suid",
        'chmod 2775 tree/sgid-dir && echo x > tree/sgid-dir/inner && chmod 6755 tree/sgid-dir/inner',
        'chmod 1777 tree/sticky && : > tree/empty',
        'mkfifo tree/fifo',
        `python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("tree/sock")'`,
        'ln tree/nested/deeper/file.txt tree/hardlink',
        'ln -s /etc/passwd tree/to-passwd',
        `ln -s ${sh(scratch.outside)} tree/to-outside`,
        'ln -s ../../../../../.. tree/up',
        `touch "tree/new\nline" tree/..dots "tree/$(printf '\\033[31mred')"`,
        'ls -la tree',
      ].join('\n'),
    );
    const result = await cli.json<{ type: string; bytes: number }>([
      'cp',
      `${id}:tree`,
      scratch.dest,
    ]);
    expect(result.type).toBe('directory');
    expectSafe(scratch);
    const got = scan(scratch.dest);
    expect([...got.keys()].sort()).toEqual(
      [
        '\u001b[31mred',
        '..dots',
        'empty',
        'empty-dir',
        'hardlink',
        'nested',
        'nested/deeper',
        'nested/deeper/file.txt',
        'new\nline',
        'sgid-dir',
        'sgid-dir/inner',
        'sticky',
        'suid',
        'to-outside',
        'to-passwd',
        'up',
      ].sort(),
    );
    const mode = (rel: string) => (got.get(rel)?.mode ?? 0) & 0o7777;
    expect([mode('suid'), mode('sgid-dir/inner'), mode('sgid-dir'), mode('sticky')]).toEqual([
      0o755 & ~UMASK,
      0o755 & ~UMASK,
      0o775 & ~UMASK,
      0o777 & ~UMASK,
    ]);
    expect(readFileSync(join(scratch.dest, 'hardlink'), 'utf8')).toBe('secret\n');
    expect(got.get('hardlink')?.nlink).toBe(1);
    expect(readlinkSync(join(scratch.dest, 'to-passwd'))).toBe('/etc/passwd');
    expect(readlinkSync(join(scratch.dest, 'to-outside'))).toBe(scratch.outside);
    expect(readlinkSync(join(scratch.dest, 'up'))).toBe('../../../../../..');
    expect(sha('/etc/passwd')).toBe(passwd);

    // One file alone goes through a new temporary file (O_EXCL) with permission bits only.
    const single = join(scratch.dest, '..', 'single-suid');
    const one = await cli.abx(['cp', `${id}:tree/suid`, single]);
    expect(one.code, one.stderr).toBe(0);
    expect(lstatSync(single).mode & 0o7777).toBe(0o666 & ~UMASK);
    expect(lstatSync(single).uid).toBe(UID);

    // A second copy into the same folder, after the sandbox turned the link into a directory
    // holding a file: the link from the first copy is replaced (unlinked, never followed).
    await inSandbox(
      'rm tree/to-outside && mkdir tree/to-outside && echo pwned > tree/to-outside/owned',
    );
    const sandbox = await Sandbox.connect(id, { home: home.home });
    await downloadDirectory(sandbox, 'tree', scratch.dest);
    expectSafe(scratch);
    expect(lstatSync(join(scratch.dest, 'to-outside')).isDirectory()).toBe(true);
    expect(readFileSync(join(scratch.dest, 'to-outside', 'owned'), 'utf8')).toBe('pwned\n');
  }, 60_000);

  test('an unreadable file is an error before anything is written', async ({ scratch }) => {
    await inSandbox(
      'rm -rf locked && mkdir -p locked && echo s > locked/secret && chmod 000 locked/secret',
    );
    const result = await cli.abx(['cp', `${id}:locked`, scratch.dest]);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/cannot read \/home\/user\/locked\/secret: EACCES/);
    expect(existsSync(scratch.dest)).toBe(false);
  }, 60_000);

  test('a tree changing under the copy (files and directories swapped for links) never gets out', async ({
    scratch,
  }) => {
    // In the background while the copies run: `race/f` flips between a set-user-ID file and a link
    // to /etc/shadow, `race/d` between a directory and a link, to the host's outside folder or to
    // another folder of the sandbox.
    const loop = `
import os, sys, time
os.makedirs('race/d', exist_ok=True)
os.makedirs('elsewhere', exist_ok=True)
open('race/d/inner', 'w').write('inner')
open('elsewhere/other', 'w').write('other')
end = time.time() + 90
while time.time() < end:
    for target in (sys.argv[1], '/home/user/elsewhere'):
        os.rename('race/d', 'race/d.real'); os.symlink(target, 'race/d')
        os.unlink('race/d'); os.rename('race/d.real', 'race/d')
    os.symlink('/etc/shadow', 'race/f.new'); os.rename('race/f.new', 'race/f')
    open('race/f.new', 'w').write('safe'); os.chmod('race/f.new', 0o4755); os.rename('race/f.new', 'race/f')
`;
    await inSandbox('rm -rf race elsewhere && mkdir race && cat > race.py', loop);
    await inSandbox(
      `nohup python3 race.py ${sh(scratch.outside)} >/dev/null 2>&1 & echo $! > race.pid`,
    );
    try {
      for (let i = 0; i < 10; i++) {
        const into = join(scratch.dest, String(i));
        const result = await cli.abx(['cp', `${id}:race`, into]);
        expect(result.code, result.stderr).toBe(0);
        expectSafe(scratch);
        const f = lstatSync(join(into, 'f'), { throwIfNoEntry: false });
        if (f?.isSymbolicLink()) expect(readlinkSync(join(into, 'f'))).toBe('/etc/shadow');
        else if (f) expect(readFileSync(join(into, 'f'), 'utf8')).toBe('safe');
      }
    } finally {
      await inSandbox('kill $(cat race.pid) 2>/dev/null || true');
    }
  }, 120_000);
});
