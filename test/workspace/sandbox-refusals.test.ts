import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { InvalidArgumentError, Sandbox } from '../../src/index.js';
import { startDaemon } from '../../src/installation/daemon-connection.js';
import { createAbxHome } from '../helpers/abx-home.js';

// Every kind apply refuses, made by an agent inside a real sandbox (root daemon) next to one
// plain edit: apply refuses them all by name and writes nothing, not even the plain edit; the
// host folder stays byte for byte as it was. A device node cannot even be made in there.
const isRoot = process.getuid?.() === 0;

let abx: Awaited<ReturnType<typeof createAbxHome>> | undefined;
let home: string;
let repo: string;

/** Every entry of the host folder with its type, mode and content hash. */
function tree(): string {
  return execFileSync(
    'sh',
    ['-c', 'find . -printf "%y %m %p %l\\n" | sort; find . -type f -exec sha256sum {} + | sort'],
    { cwd: repo, encoding: 'utf8' },
  );
}

beforeAll(async () => {
  if (!isRoot) return;
  abx = await createAbxHome();
  home = abx.home;
  repo = mkdtempSync(join(tmpdir(), 'abx-ws-hostile-'));
  mkdirSync(join(repo, 'src'));
  writeFileSync(join(repo, 'src', 'a.txt'), 'one\n');
  writeFileSync(join(repo, 'tool'), '#!/bin/sh\necho hi\n', { mode: 0o755 });
  await startDaemon(home);
}, 120_000);

afterAll(async () => {
  await abx?.close();
  if (repo) rmSync(repo, { recursive: true, force: true });
}, 60_000);

describe.skipIf(!isRoot)("what an agent may not write back into the host's folder", () => {
  test('links out, a FIFO, a socket, set-id bits and a file over the limit: all refused, nothing written', async () => {
    const before = tree();
    const box = await Sandbox.create({ home, workspace: { from: repo } });
    try {
      const run = (cmd: string) => box.commands.run(cmd, { cwd: '/home/user/workspace' });
      const made = await run(
        [
          'echo two > src/a.txt',
          'ln -s /etc/shadow shadow-link',
          'ln -s ../../../../etc/passwd src/climb-link',
          'mkfifo pipe',
          'python3 -c \'import socket; socket.socket(socket.AF_UNIX).bind("sock")\'',
          'chmod u+s tool',
          'head -c 104857601 /dev/zero > big.bin',
        ].join(' && '),
      );
      expect(made.exitCode).toBe(0);
      // A device node cannot be made at all.
      const device = await run('mknod dev c 1 3').catch((error: { exitCode?: number }) => error);
      expect((device as { exitCode?: number }).exitCode).not.toBe(0);

      const refused = await box.workspace.apply().catch((error: Error) => error);
      expect(refused).toBeInstanceOf(InvalidArgumentError);
      const message = (refused as Error).message;
      for (const [path, why] of [
        ['shadow-link', /outside|out of/],
        ['src/climb-link', /outside|out of|climb/],
        ['pipe', /fifo is never applied/],
        ['sock', /socket is never applied/],
        ['tool', /set-uid\/set-gid bits/],
        ['big.bin', /over the limit/],
      ] as const) {
        expect(message).toContain(`${path}:`);
        const reason = message.slice(message.indexOf(`${path}:`)).split(';')[0] ?? '';
        expect(reason, path).toMatch(why);
      }
      // Nothing was written, not even the plain edit.
      expect(tree()).toBe(before);
      expect(readFileSync(join(repo, 'src', 'a.txt'), 'utf8')).toBe('one\n');
      // The plain edit alone applies.
      const done = await box.workspace.apply({ paths: ['src/a.txt'] });
      expect(done.applied.map((c) => c.path)).toEqual(['src/a.txt']);
      expect(readFileSync(join(repo, 'src', 'a.txt'), 'utf8')).toBe('two\n');
    } finally {
      await box.kill();
    }
  }, 120_000);
});
