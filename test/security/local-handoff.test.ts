import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';
import { withEnvdStopped } from '../helpers/envd-stopped.js';
import { startRootlessDaemon } from '../helpers/rootless.js';

// A local client's file handed to the gateway by descriptor (src/control/local-handoff.ts):
// `files.upload` and `files.download` copy at the disk's speed with no byte on a socket, and the
// gateway uses only a descriptor the requesting process itself holds, in the mode it holds it.
// The attacks come from a process of uid 65534 on this host (an O_PATH descriptor of a file it
// cannot read, another process's descriptor, a write-only or FIFO one, a path envd must take),
// against a root daemon and a rootless one: each is refused, and the sandbox's file is what it was.

const IS_ROOT = process.getuid?.() === 0;

const modes: [string, () => Promise<{ home: string; uid?: number; close(): Promise<void> }>][] = [
  ['root daemon', () => createAbxHome()],
  ['rootless daemon', () => startRootlessDaemon()],
];

/**
 * An attacker on this host: Python as uid 65534 that opens what `setup` says, then sends one
 * handoff request itself (so it holds the connection) naming `{pid}/{fd}` as `name` builds it.
 * Prints the status and the answer's body.
 */
function attacker(
  box: Sandbox,
  request: { method: 'PUT' | 'GET'; path: string; root?: boolean },
  setup: string,
  name = '{os.getpid()}/{fd}',
  uid = 65534,
): { status: number; body: { code?: string; error?: string; size?: number } } {
  const gateway = new URL(box.getUrl(49983));
  const script = [
    'import http.client, json, os, sys',
    setup,
    `c = http.client.HTTPConnection('${gateway.hostname}', ${gateway.port}, timeout=20)`,
    `headers = {'x-sandbox-id': '${box.sandboxId}', 'x-sandbox-port': '49983', 'x-access-token': os.environ['TOKEN'], 'x-abx-local-file': f'${name}', 'content-length': '0'}`,
    request.root ? "headers['x-abx-user'] = 'root'" : '',
    `c.request('${request.method}', '/files/${request.method === 'PUT' ? 'write' : 'read'}?path=${request.path}', headers=headers)`,
    'r = c.getresponse()',
    'print(r.status)',
    "print(r.read().decode('utf8', 'replace'))",
  ].join('\n');
  const run = spawnSync(
    'setpriv',
    [
      '--reuid',
      String(uid),
      '--regid',
      String(uid),
      '--clear-groups',
      '/usr/bin/python3',
      '-c',
      script,
    ],
    { encoding: 'utf8', env: { TOKEN: box.accessToken, PATH: '/usr/bin:/bin' }, timeout: 30_000 },
  );
  const [status, ...rest] = run.stdout.trim().split('\n');
  if (!status) throw new Error(`the attacker printed nothing: ${run.stderr}`);
  return { status: Number(status), body: JSON.parse(rest.join('\n')) };
}

describe.runIf(IS_ROOT).each(modes)(
  'a local file handed over by descriptor, %s',
  (mode, install) => {
    let abx: { home: string; uid?: number; close(): Promise<void> };
    let box: Sandbox;
    let dir: string;
    const sh = (command: string) =>
      box.commands.run(command, { timeoutMs: 30_000, allowNonZeroExit: true });

    beforeAll(async () => {
      dir = mkdtempSync(join(tmpdir(), 'abx-handoff-'));
      // What an earlier run that failed left of the attacker's files.
      for (const name of ['w.txt', 'r.txt', 'a.txt', 'fifo', 'ok.txt', 'own.txt', 'free.txt']) {
        rmSync(`/tmp/abx-handoff-${name}`, { force: true });
      }
      abx = await install();
      box = await Sandbox.create({ home: abx.home });
      await box.files.write('/home/user/kept.txt', 'the sandbox its own');
    }, 120_000);

    afterAll(async () => {
      await box?.kill().catch(() => undefined);
      await abx?.close();
      rmSync(dir, { recursive: true, force: true });
    });

    test.runIf(mode === 'root daemon')(
      'upload and download copy by descriptor (envd stopped), as the sandbox user, nothing left over',
      async () => {
        const data = Buffer.alloc(9 * 1024 * 1024 + 3, 'xyz');
        writeFileSync(join(dir, 'up.bin'), data);
        const [up, down] = await withEnvdStopped(box.sandboxId, async () => {
          const up = await box.files.upload(join(dir, 'up.bin'), '/home/user/up.bin');
          const down = await box.files.download('/home/user/up.bin', join(dir, 'down.bin'));
          return [up, down];
        });
        expect(up).toMatchObject({ name: 'up.bin', path: '/home/user/up.bin', size: data.length });
        expect(down).toEqual({ path: '/home/user/up.bin', size: data.length });
        expect(readFileSync(join(dir, 'down.bin')).equals(data)).toBe(true);
        const seen = await sh(
          'stat -c "%U:%G %a %s" /home/user/up.bin; ls -a /home/user | grep -c "\\.tmp$"',
        );
        expect(seen.stdout).toBe(`user:user 644 ${data.length}\n0\n`);
        // A download over a longer local file leaves exactly the sandbox's bytes.
        writeFileSync(join(dir, 'long.bin'), Buffer.alloc(data.length * 2, 1));
        await box.files.download('/home/user/up.bin', join(dir, 'long.bin'));
        expect(statSync(join(dir, 'long.bin')).size).toBe(data.length);
        // The audit trail has the upload with its size.
        const { audit } = await box.audit({ kind: ['file.written'], limit: 100 });
        expect(
          audit.find((row) => (row.data.paths as string[])[0] === '/home/user/up.bin')?.data.bytes,
        ).toBe(data.length);
      },
      60_000,
    );

    test.runIf(mode === 'rootless daemon')(
      "the daemon's own user hands its file over; root's file, the daemon cannot open: the SDK sends the bytes",
      async () => {
        const uid = abx.uid as number;
        // The request carries no byte: the file's 11 bytes in the sandbox came by descriptor.
        const got = attacker(
          box,
          { method: 'PUT', path: '/home/user/by-fd.txt' },
          "p = '/tmp/abx-handoff-own.txt'; open(p, 'w').write('handed over'); fd = os.open(p, os.O_RDONLY)",
          '{os.getpid()}/{fd}',
          uid,
        );
        rmSync('/tmp/abx-handoff-own.txt', { force: true });
        expect(got).toEqual({ status: 200, body: { path: '/home/user/by-fd.txt', size: 11 } });
        expect(await box.files.read('/home/user/by-fd.txt')).toBe('handed over');
        // This test runs as root: a rootless daemon may not open root's descriptors, so the SDK
        // falls back to sending the bytes, and the result is the same.
        const data = Buffer.alloc(3 * 1024 * 1024, 'r');
        writeFileSync(join(dir, 'up.bin'), data);
        expect((await box.files.upload(join(dir, 'up.bin'), '/home/user/up.bin')).size).toBe(
          data.length,
        );
        expect((await box.files.download('/home/user/up.bin', join(dir, 'down.bin'))).size).toBe(
          data.length,
        );
        expect(readFileSync(join(dir, 'down.bin')).equals(data)).toBe(true);
      },
      60_000,
    );

    test('where the gateway cannot, the SDK sends the bytes: a relative path, a path envd must make, root', async () => {
      writeFileSync(join(dir, 'small.txt'), 'by the stream');
      expect((await box.files.upload(join(dir, 'small.txt'), 'rel.txt')).size).toBe(13);
      expect(await box.files.read('rel.txt')).toBe('by the stream');
      // A missing parent: envd makes parents, the gateway does not.
      await box.files.upload(join(dir, 'small.txt'), '/home/user/new/deep/file.txt');
      expect(await box.files.read('/home/user/new/deep/file.txt')).toBe('by the stream');
      await box.files.download('/home/user/new/deep/file.txt', join(dir, 'back.txt'));
      expect(readFileSync(join(dir, 'back.txt'), 'utf8')).toBe('by the stream');
    }, 60_000);

    test("an O_PATH descriptor of a file the client cannot read is refused; the sandbox's file stays", async () => {
      const got = attacker(
        box,
        { method: 'PUT', path: '/home/user/kept.txt' },
        "fd = os.open('/etc/shadow', os.O_PATH)",
      );
      expect(got.status).toBe(400);
      expect(got.body.code).toBe('local_file_unavailable');
      if (mode === 'root daemon') expect(got.body.error).toContain('O_PATH');
      expect(await box.files.read('/home/user/kept.txt')).toBe('the sandbox its own');
    });

    test("another process's descriptor (root's, or a process not holding the connection) is refused", async () => {
      const asRoot = attacker(
        box,
        { method: 'PUT', path: '/home/user/kept.txt' },
        'fd = 0',
        `${process.pid}/0`,
      );
      expect(asRoot.status).toBe(400);
      expect(asRoot.body.code).toBe('local_file_unavailable');
      // A child of the attacker's, its own user, holding a readable file but not the connection.
      const sibling = attacker(
        box,
        { method: 'PUT', path: '/home/user/kept.txt' },
        [
          'import subprocess',
          "open('/tmp/abx-handoff-free.txt', 'w').write('free')",
          "child = subprocess.Popen(['/usr/bin/python3', '-c', 'import time,sys; f=open(\"/tmp/abx-handoff-free.txt\"); time.sleep(5)'], close_fds=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
          'import time; time.sleep(0.5)',
          'fd = 3',
        ].join('\n'),
        '{child.pid}/{fd}',
      );
      expect(sibling.status).toBe(400);
      expect(sibling.body.code).toBe('local_file_unavailable');
      if (mode === 'root daemon') expect(sibling.body.error).toContain('does not hold');
      rmSync('/tmp/abx-handoff-free.txt', { force: true });
      spawnSync('pkill', ['-f', 'abx-handoff-free']);
      expect(await box.files.read('/home/user/kept.txt')).toBe('the sandbox its own');
    });

    test('a descriptor in the wrong mode, or a FIFO, is refused', async () => {
      const writeOnly = attacker(
        box,
        { method: 'PUT', path: '/home/user/kept.txt' },
        "fd = os.open('/tmp/abx-handoff-w.txt', os.O_WRONLY | os.O_CREAT, 0o600)",
      );
      expect(writeOnly.body.code).toBe('local_file_unavailable');
      const readOnlyTarget = attacker(
        box,
        { method: 'GET', path: '/home/user/kept.txt' },
        "open('/tmp/abx-handoff-r.txt', 'w').write('mine'); fd = os.open('/tmp/abx-handoff-r.txt', os.O_RDONLY)",
      );
      expect(readOnlyTarget.body.code).toBe('local_file_unavailable');
      expect(readFileSync('/tmp/abx-handoff-r.txt', 'utf8')).toBe('mine');
      // Append-only (a log some privileged process handed it): never written over.
      const appendOnly = attacker(
        box,
        { method: 'GET', path: '/home/user/kept.txt' },
        "open('/tmp/abx-handoff-a.txt', 'w').write('log line'); fd = os.open('/tmp/abx-handoff-a.txt', os.O_WRONLY | os.O_APPEND)",
      );
      expect(appendOnly.body.code).toBe('local_file_unavailable');
      expect(readFileSync('/tmp/abx-handoff-a.txt', 'utf8')).toBe('log line');
      const fifo = attacker(
        box,
        { method: 'PUT', path: '/home/user/kept.txt' },
        "os.mkfifo('/tmp/abx-handoff-fifo'); fd = os.open('/tmp/abx-handoff-fifo', os.O_RDWR | os.O_NONBLOCK)",
      );
      expect(fifo.body.code).toBe('local_file_unavailable');
      if (mode === 'root daemon') {
        expect(writeOnly.body.error).toContain('not open for reading');
        expect(readOnlyTarget.body.error).toContain('not open for writing');
        expect(appendOnly.body.error).toContain('appending only');
        expect(fifo.body.error).toContain('not a regular file');
      }
      for (const name of ['w.txt', 'r.txt', 'a.txt', 'fifo'])
        rmSync(`/tmp/abx-handoff-${name}`, { force: true });
      expect(await box.files.read('/home/user/kept.txt')).toBe('the sandbox its own');
    });

    test("a browser's request never names a local file: refused with an Origin, and the preflight does not allow the header", async () => {
      const gateway = new URL(box.getUrl(49983)).origin;
      const headers = {
        'x-sandbox-id': box.sandboxId,
        'x-sandbox-port': '49983',
        'x-access-token': box.accessToken,
      };
      // The browser's own process holds the connection: this process stands for it here.
      const { openSync, closeSync } = await import('node:fs');
      writeFileSync(join(dir, 'cookies.db'), 'secret cookies');
      const fd = openSync(join(dir, 'cookies.db'), 'r+');
      try {
        const browsers: Record<string, string>[] = [
          { origin: 'http://8080-x.localhost' },
          { 'sec-fetch-mode': 'cors' },
        ];
        for (const extra of browsers) {
          const put = await fetch(`${gateway}/files/write?path=/home/user/stolen.txt`, {
            method: 'PUT',
            headers: { ...headers, ...extra, 'x-abx-local-file': `${process.pid}/${fd}` },
          });
          const body = (await put.json()) as { code?: string; error?: string };
          expect(put.status).toBe(400);
          expect(body.code).toBe('local_file_unavailable');
          expect(body.error).toContain("a browser's request");
        }
        expect((await sh('test -e /home/user/stolen.txt; echo $?')).stdout).toBe('1\n');
        expect(readFileSync(join(dir, 'cookies.db'), 'utf8')).toBe('secret cookies');
      } finally {
        closeSync(fd);
      }
      const preflight = await fetch(`${gateway}/files/read?path=/x`, {
        method: 'OPTIONS',
        headers: {
          origin: 'http://8080-x.localhost',
          'access-control-request-method': 'GET',
          'access-control-request-headers': 'x-access-token, x-abx-local-file',
        },
      });
      await preflight.text();
      expect(preflight.headers.get('access-control-allow-headers')).toBe('x-access-token');
    });

    test("a handoff envd would have to serve (root's files) is refused, never sent on with its empty body", async () => {
      const got = attacker(
        box,
        { method: 'PUT', path: '/home/user/kept.txt', root: true },
        "open('/tmp/abx-handoff-ok.txt', 'w').write('ok'); fd = os.open('/tmp/abx-handoff-ok.txt', os.O_RDONLY)",
      );
      rmSync('/tmp/abx-handoff-ok.txt', { force: true });
      // Refused before or at the gateway's own check: never a 200 for an empty file.
      expect(got.status).toBeGreaterThanOrEqual(400);
      expect(await box.files.read('/home/user/kept.txt')).toBe('the sandbox its own');
    });
  },
);
