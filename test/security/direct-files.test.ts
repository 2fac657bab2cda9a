import { existsSync, readdirSync } from 'node:fs';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { attach } from '../compat/e2b/attach.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { withEnvdStopped } from '../helpers/envd-stopped.js';
import { startRootlessDaemon } from '../helpers/rootless.js';

// The gateway serves native uploads and downloads of a local sandbox's files itself, with no hop
// through envd (src/control/gateway-files.ts, src/providers/local/sandbox-files.ts). A hostile
// sandbox owns every directory on those paths: here it lays links, FIFOs, devices, locked files
// and swaps a parent for a link mid-transfer, against a root daemon (which must never act as
// root in the sandbox) and a rootless one. Each case must end as it does through envd: the
// sandbox's own files, as its user may use them, never the host's.

const IS_ROOT = process.getuid?.() === 0;

const modes: [string, () => Promise<{ home: string; close(): Promise<void> }>][] = [
  ['root daemon', () => createAbxHome()],
  ['rootless daemon', () => startRootlessDaemon()],
];

/** A body that sends `first`, waits for `between`, then sends `rest`: an upload in flight. */
function slowBody(first: Buffer, between: () => Promise<void>, rest: Buffer): Readable {
  return Readable.from(
    (async function* () {
      yield first;
      await between();
      yield rest;
    })(),
  );
}

/** A 21 MiB upload body that sends its first MiB, then holds the rest until `release`. */
function heldUpload(): { body: Readable; release: () => void } {
  let release: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => {
    release = resolve;
  });
  return {
    body: slowBody(Buffer.alloc(1024 * 1024, 1), () => gate, Buffer.alloc(20 * 1024 * 1024, 2)),
    release,
  };
}

/** The error a promise rejects with (fails the test when it resolves). */
async function failure(promise: Promise<unknown>): Promise<{ status?: number; message: string }> {
  try {
    await promise;
  } catch (error) {
    return error as { status?: number; message: string };
  }
  throw new Error('expected a refusal');
}

describe.runIf(IS_ROOT).each(modes)('direct file transfers against a %s', (_mode, install) => {
  let abx: { home: string; close(): Promise<void> };
  let box: Sandbox;
  const sh = (command: string) =>
    box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });

  beforeAll(async () => {
    abx = await install();
    box = await Sandbox.create({ home: abx.home });
  }, 120_000);

  afterAll(async () => {
    await box?.kill().catch(() => undefined);
    await abx?.close();
  });

  test('a plain upload and download skip envd (they complete with envd stopped), owned by the sandbox user', async () => {
    const data = Buffer.alloc(3 * 1024 * 1024 + 17, 'abc');
    const read = await withEnvdStopped(box.sandboxId, async () => {
      const written = await box.files.write('/home/user/direct.bin', Readable.from([data]));
      expect(written.size).toBe(data.length);
      expect(written.path).toBe('/home/user/direct.bin');
      return box.files.read('/home/user/direct.bin', { format: 'bytes' });
    });
    expect(Buffer.from(read).equals(data)).toBe(true);
    const seen = await sh(
      'stat -c "%U:%G %a %s" /home/user/direct.bin; ls -a /home/user | grep -c "\\.tmp$"',
    );
    expect(seen.stdout).toBe(`user:user 644 ${data.length}\n0\n`);
  }, 60_000);

  test("a browser's direct upload and download carry envd's CORS headers (the dashboard reads them)", async () => {
    const gateway = new URL(box.getUrl(49983)).origin;
    const headers = {
      'x-sandbox-id': box.sandboxId,
      'x-sandbox-port': '49983',
      'x-access-token': box.accessToken,
      origin: 'http://dashboard.example',
    };
    const [put, get] = await withEnvdStopped(box.sandboxId, async () => {
      const put = await fetch(`${gateway}/files/write?path=/home/user/cors.txt`, {
        method: 'PUT',
        headers: { ...headers, 'content-type': 'application/octet-stream' },
        body: 'from a page',
      });
      await put.text();
      const get = await fetch(`${gateway}/files/read?path=/home/user/cors.txt`, { headers });
      return [put, { response: get, text: await get.text() }] as const;
    });
    expect(put.status).toBe(200);
    expect(put.headers.get('access-control-allow-origin')).toBe('*');
    expect(get.text).toBe('from a page');
    expect(get.response.headers.get('access-control-allow-origin')).toBe('*');
    expect(get.response.headers.get('access-control-expose-headers')).toBe('*');
  }, 60_000);

  test("E2B's download is served directly too; its refusals stay E2B's", async () => {
    const e2b = attach(new URL(box.getUrl(49983)).origin, box.sandboxId, box.accessToken);
    const data = Buffer.alloc(2 * 1024 * 1024 + 5, 'e');
    await box.files.write('/home/user/e2b.bin', Readable.from([data]));
    const read = await withEnvdStopped(box.sandboxId, () =>
      e2b.files.read('/home/user/e2b.bin', { format: 'bytes' }),
    );
    expect(Buffer.from(read).equals(data)).toBe(true);
    // A missing file and a locked one go to envd: E2B's NotFoundError, and its 403 as E2B words it.
    await expect(e2b.files.read('/home/user/missing.bin')).rejects.toThrow(/not found|No such/i);
    await sh('echo s > /home/user/e2b-locked && chmod 000 /home/user/e2b-locked');
    await expect(e2b.files.read('/home/user/e2b-locked')).rejects.toThrow(/permission|denied/i);
  }, 60_000);

  test('links on the path go to envd: the sandbox own files, never the host', async () => {
    await sh('ln -sfn / /tmp/slash && ln -sfn /etc /home/user/etc-link');
    const ownHostname = (await sh('cat /etc/hostname')).stdout;
    expect(await box.files.read('/tmp/slash/etc/hostname')).toBe(ownHostname);
    expect(await box.files.read('/tmp/../../../etc/hostname')).toBe(ownHostname);
    // Writing through a link to /etc: refused as envd refuses the sandbox user, nothing on the host.
    const refused = await failure(box.files.write('/home/user/etc-link/abx-direct-x', 'x'));
    expect(refused.status).toBe(403);
    expect(existsSync('/etc/abx-direct-x')).toBe(false);
    // A link as the file itself: followed inside the sandbox by envd, as before.
    await sh('echo linked > /tmp/real && ln -sfn /tmp/real /tmp/alias');
    expect(await box.files.read('/tmp/alias')).toBe('linked\n');
  }, 60_000);

  test('what the daemon must not take goes to envd: with envd stopped, it waits for envd', async () => {
    await sh(
      'ln -sfn / /tmp/slash2 && mkfifo /tmp/fifo2 && echo s > /tmp/locked2 && chmod 000 /tmp/locked2 && echo t > /tmp/plain',
    );
    const answered: Promise<unknown>[] = [];
    const waits = (promise: Promise<unknown>) => {
      const settled = promise.then(
        () => 'answered',
        () => 'answered',
      );
      answered.push(settled);
      return Promise.race([settled, new Promise((r) => setTimeout(() => r('waits'), 1500))]);
    };
    const reads = {
      link: '/tmp/slash2/etc/hostname',
      proc: '/proc/self/status',
      dev: '/dev/zero',
      fifo: '/tmp/fifo2',
      locked: '/tmp/locked2',
      relative: 'plain',
      plain: '/tmp/plain',
    };
    // All at once, each on a connection of its own: one wait of 1.5 s, not one per path.
    const seen = await withEnvdStopped(box.sandboxId, async () =>
      Object.fromEntries(
        await Promise.all(
          Object.entries(reads).map(async ([name, path]) => [
            name,
            await waits(box.files.read(path)),
          ]),
        ),
      ),
    );
    await Promise.all(answered);
    expect(seen).toEqual({
      link: 'waits',
      proc: 'waits',
      dev: 'waits',
      fifo: 'waits',
      locked: 'waits',
      relative: 'waits',
      plain: 'answered',
    });
  }, 60_000);

  test('a small upload to a full disk fails with ENOSPC (written at once, on the event loop), and leaves no file', async () => {
    const before = (await sh('ls -A /home/user')).stdout;
    await sh('dd if=/dev/zero of=/home/user/fill bs=1M status=none; sync');
    try {
      // A root daemon writes as root, which ext4 lets use the clusters it keeps back from users
      // (at most 16 MiB): uploads of shrinking sizes take them first, until the smallest fails.
      let taken = 0;
      for (const size of [1024 * 1024, 64 * 1024, 4096]) {
        for (;;) {
          const body = Readable.from([Buffer.alloc(size, 1)]);
          const ok = await box.files.write(`/home/user/rest-${taken}`, body).then(
            () => true,
            () => false,
          );
          if (!ok) break;
          taken += 1;
          expect(taken).toBeLessThan(300);
        }
      }
      const refused = await failure(
        withEnvdStopped(box.sandboxId, () =>
          box.files.write('/home/user/small.txt', 'x'.repeat(40_000)),
        ),
      );
      expect(refused.message).toMatch(/no space left|ENOSPC/i);
      // No file by the name, nor its temporary one.
      const names = (await sh('ls -A /home/user')).stdout.split('\n');
      expect(names.filter((name) => !/^rest-\d+$/.test(name)).sort()).toEqual(
        `${before}fill\n`.split('\n').sort(),
      );
    } finally {
      await sh('rm -f /home/user/fill /home/user/rest-*');
    }
    expect((await box.files.write('/home/user/small.txt', 'after')).size).toBe(5);
    expect(await box.files.read('/home/user/small.txt')).toBe('after');
    await sh('rm -f /home/user/small.txt');
  });

  test('FIFOs and devices are refused at once, never opened by the daemon', async () => {
    await sh('mkfifo /tmp/fifo');
    const started = Date.now();
    for (const path of ['/tmp/fifo', '/dev/zero', '/dev/tty']) {
      const error = await failure(box.files.read(path));
      expect(error.status, path).toBeGreaterThanOrEqual(400);
    }
    expect(Date.now() - started).toBeLessThan(10_000);
  }, 30_000);

  test('modes hold as for the sandbox user: a locked file, an unsearchable or read-only folder', async () => {
    await sh(
      'echo secret > /tmp/locked && chmod 000 /tmp/locked && mkdir -p /tmp/closed && echo s > /tmp/closed/f && chmod 000 /tmp/closed && mkdir -p /tmp/ro && chmod 555 /tmp/ro',
    );
    expect((await failure(box.files.read('/tmp/locked'))).status).toBe(403);
    expect((await failure(box.files.read('/tmp/closed/f'))).status).toBe(403);
    const big = Buffer.alloc(2 * 1024 * 1024, 'z');
    expect((await failure(box.files.write('/tmp/ro/x', Readable.from([big])))).status).toBe(403);
    expect((await sh('ls -A /tmp/ro | wc -l')).stdout.trim()).toBe('0');
    // A hard link to the locked file is the same locked inode.
    await sh('ln /tmp/locked /tmp/hard');
    expect((await failure(box.files.read('/tmp/hard'))).status).toBe(403);
  }, 60_000);

  test('a parent swapped for a link to /etc mid-upload: the file lands in the folder first opened', async () => {
    await sh('rm -rf /home/user/up /home/user/up.old && mkdir /home/user/up');
    const first = Buffer.alloc(1024 * 1024, 'a');
    const rest = Buffer.alloc(1024 * 1024, 'b');
    const swap = async () => {
      // The temporary file is there: the daemon holds the folder; now it is moved and replaced.
      for (let i = 0; i < 50; i++) {
        const listed = (await sh('ls -A /home/user/up')).stdout;
        if (listed.includes('.tmp')) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      await sh('mv /home/user/up /home/user/up.old && ln -s /etc /home/user/up');
    };
    await box.files.write('/home/user/up/out.bin', slowBody(first, swap, rest));
    expect((await sh('stat -c "%U %s" /home/user/up.old/out.bin')).stdout).toBe(
      `user ${first.length + rest.length}\n`,
    );
    expect((await sh('test -e /etc/out.bin; echo $?')).stdout).toBe('1\n');
    expect(existsSync('/etc/out.bin')).toBe(false);
    expect(readdirSync('/etc').some((name) => name.startsWith('.out.bin.'))).toBe(false);
  }, 60_000);

  test('a download whose file is swapped for a link mid-read keeps the file it opened', async () => {
    const data = Buffer.alloc(16 * 1024 * 1024, 'q');
    await box.files.write('/home/user/down.bin', Readable.from([data]));
    const stream = (await box.files.read('/home/user/down.bin', { format: 'stream' })) as Readable;
    await sh('mv /home/user/down.bin /home/user/down.old && ln -s /etc/shadow /home/user/down.bin');
    const chunks: Buffer[] = [];
    for await (const chunk of stream) chunks.push(chunk as Buffer);
    expect(Buffer.concat(chunks).equals(data)).toBe(true);
    // Read again now: the link goes to envd, which reads as the sandbox user (/etc/shadow: 403 or 404).
    expect((await failure(box.files.read('/home/user/down.bin'))).status).toBeGreaterThanOrEqual(
      400,
    );
  }, 60_000);

  test('a pause mid-upload stops it before the freeze: no byte more reaches the frozen disk; resumed, uploads are direct again', async () => {
    const victim = await Sandbox.create({ home: abx.home });
    try {
      const { body, release } = heldUpload();
      const upload = victim.files.write('/home/user/p.bin', body);
      upload.catch(() => undefined);
      await new Promise((resolve) => setTimeout(resolve, 1000));
      // The pause waits for the daemon's own transfer to stop (a fence), then freezes.
      expect(await victim.pause()).toBe(true);
      release();
      await expect(upload).rejects.toThrow();
      expect(await victim.resume()).toBe(true);
      const left = await victim.commands.run(
        'ls -a /home/user | grep -c "\\.tmp$"; test -e /home/user/p.bin && echo there || echo absent',
        { allowNonZeroExit: true },
      );
      expect(left.stdout).toBe('0\nabsent\n');
      // Thawed, the fence is lifted: an upload completes with envd stopped, so it was direct.
      const written = await withEnvdStopped(victim.sandboxId, () =>
        victim.files.write('/home/user/after.bin', 'again'),
      );
      expect(written.size).toBe(5);
    } finally {
      await victim.kill().catch(() => undefined);
    }
  }, 90_000);

  test('a sandbox killed mid-upload: the upload fails, no answer claims the file', async () => {
    const victim = await Sandbox.create({ home: abx.home });
    try {
      const { body, release } = heldUpload();
      const upload = victim.files.write('/home/user/k.bin', body);
      upload.catch(() => undefined);
      await new Promise((resolve) => setTimeout(resolve, 1000));
      await victim.kill();
      release();
      await expect(upload).rejects.toThrow();
    } finally {
      await victim.kill().catch(() => undefined);
    }
  }, 60_000);
});
