import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  apply,
  changes,
  diff,
  type WorkspaceChanges,
  WorkspaceRefusedError,
} from '../../src/workspace/index.js';
import { snapshot } from './fixture.js';

const isRoot = process.getuid?.() === 0;
const tmp = mkdtempSync(join(tmpdir(), 'abx-workspace-refusals-'));
const base = join(tmp, 'base');
const view = join(tmp, 'view');
const outside = join(tmp, 'outside');
let server: Server | undefined;

afterAll(async () => {
  await new Promise<void>((r) => (server ? server.close(() => r()) : r()));
  rmSync(tmp, { recursive: true, force: true });
});

async function refusalsOf(ch: WorkspaceChanges, options: Parameters<typeof apply>[1]) {
  const err = await apply(ch, options).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(WorkspaceRefusedError);
  return Object.fromEntries((err as WorkspaceRefusedError).refusals.map((r) => [r.path, r.reason]));
}

describe('apply() refuses, by name, before writing anything', () => {
  let ch: WorkspaceChanges;
  let since: number;

  beforeAll(async () => {
    mkdirSync(outside);
    writeFileSync(join(outside, 'secret'), 'host secret\n');
    mkdirSync(base);
    writeFileSync(join(base, 'a.txt'), 'a\n');
    symlinkSync(outside, join(base, 'outlink'));
    execFileSync('cp', ['-a', base, view]);
    since = Date.now();
    // What a hostile agent leaves in the view.
    symlinkSync('../../outside/secret', join(view, 'link-out'));
    symlinkSync('/etc/passwd', join(view, 'link-abs'));
    symlinkSync('outlink/secret', join(view, 'link-through'));
    symlinkSync('a.txt', join(view, 'link-ok'));
    execFileSync('mkfifo', [join(view, 'fifo')]);
    server = createServer();
    await new Promise<void>((r) => server?.listen(join(view, 'sock'), r));
    if (isRoot) execFileSync('mknod', [join(view, 'dev'), 'c', '1', '3']);
    writeFileSync(join(view, 'suid'), '#!/bin/sh\n');
    chmodSync(join(view, 'suid'), 0o4755);
    writeFileSync(join(view, 'big'), Buffer.alloc(2048, 'x'));
    writeFileSync(join(view, 'ok.txt'), 'fine\n');
    writeFileSync(join(view, 'a.txt'), 'changed\n');
    ch = await changes(base, view);
  });

  it('lists every kind, and diff() says what a patch cannot carry', async () => {
    expect(ch.entries.map((c) => [c.status, c.path, c.after?.kind])).toEqual([
      ['modified', 'a.txt', 'file'],
      ['added', 'big', 'file'],
      ...(isRoot ? [['added', 'dev', 'char-device']] : []),
      ['added', 'fifo', 'fifo'],
      ['added', 'link-abs', 'symlink'],
      ['added', 'link-ok', 'symlink'],
      ['added', 'link-out', 'symlink'],
      ['added', 'link-through', 'symlink'],
      ['added', 'ok.txt', 'file'],
      ['added', 'sock', 'socket'],
      ['added', 'suid', 'file'],
    ]);
    const d = await diff(ch);
    expect(d.complete).toBe(false);
    expect(d.omitted.map((o) => o.path)).toEqual([
      ...(isRoot ? ['dev'] : []),
      'fifo',
      'sock',
      'suid',
    ]);
    expect(d.patch.toString()).not.toContain('diff --git a/fifo');
  });

  it('refuses links out, special files, set-id bits and files over the limit; the base is untouched', async () => {
    const before = snapshot(tmp);
    const refused = await refusalsOf(ch, { since, maxFileBytes: 1024 });
    expect(Object.keys(refused).sort()).toEqual(
      [
        'big',
        ...(isRoot ? ['dev'] : []),
        'fifo',
        'link-abs',
        'link-out',
        'link-through',
        'sock',
        'suid',
      ].sort(),
    );
    expect(refused['link-out']).toMatch(/^links outside the folder/);
    expect(refused['link-abs']).toMatch(/^links outside the folder/);
    expect(refused['link-through']).toMatch(/goes through the link outlink/);
    expect(refused.fifo).toBe('a fifo is never applied');
    expect(refused.sock).toBe('a socket is never applied');
    if (isRoot) expect(refused.dev).toBe('a char-device is never applied');
    expect(refused.suid).toMatch(/^set-uid\/set-gid bits/);
    expect(refused.big).toBe('2048 bytes, over the limit of 1024');
    expect(snapshot(tmp)).toEqual(before);
  });

  it('refuses options it cannot follow', async () => {
    await expect(apply(ch, { since: Number.NaN })).rejects.toThrow(
      'since must be a Date or epoch milliseconds',
    );
    await expect(apply(ch, { since, maxFileBytes: -1 })).rejects.toThrow(
      'maxFileBytes must be a whole number of bytes, 0 or more',
    );
    const refused = await refusalsOf(ch, { since, paths: ['nothing/here'] });
    expect(refused).toEqual({ 'nothing/here': 'no change at this path' });
  });

  it('applies the rest when only those are left out', async () => {
    const result = await apply(ch, { since, paths: ['a.txt', 'ok.txt', 'link-ok'] });
    expect(result.applied.map((c) => c.path)).toEqual(['a.txt', 'link-ok', 'ok.txt']);
    expect((await changes(base, view)).entries.map((c) => c.path)).not.toContain('ok.txt');
  });

  it('refuses hand-made paths that climb out, are absolute, go through a link, or are in .git', async () => {
    const content = Buffer.from('x\n');
    const after = {
      kind: 'file' as const,
      mode: 0o644,
      size: content.length,
      sha256: createHash('sha256').update(content).digest('hex'),
    };
    const entry = (path: string) => ({
      status: 'added' as const,
      path,
      after,
      contentChanged: true,
      modeChanged: false,
      binary: false,
    });
    const before = snapshot(tmp);
    const refused = await refusalsOf(
      {
        base,
        view,
        entries: [
          entry('../escape'),
          entry('/etc/cron.d/x'),
          entry('d/../../x'),
          entry('outlink/secret'),
          entry('.git/hooks/post-commit'),
          { ...entry('no-before'), status: 'modified' },
        ],
      },
      { since },
    );
    expect(refused).toEqual({
      '../escape': 'climbs or has an empty component (`..`, `.`, `//`)',
      '/etc/cron.d/x': 'not a relative path',
      'd/../../x': 'climbs or has an empty component (`..`, `.`, `//`)',
      'outlink/secret': 'climbs through the link outlink in the base',
      '.git/hooks/post-commit': 'inside a .git folder',
      'no-before': 'not a change changes() makes (status "modified" with these sides)',
    });
    expect(snapshot(tmp)).toEqual(before);
  });

  it('refuses what the sandbox changed after the review', async () => {
    writeFileSync(join(view, 'late.txt'), 'reviewed\n');
    const reviewed = await changes(base, view);
    writeFileSync(join(view, 'late.txt'), 'swapped!\n');
    const refused = await refusalsOf(reviewed, { since, paths: ['late.txt'] });
    expect(refused).toEqual({
      'late.txt': 'changed in the sandbox since changes(); review it again',
    });
  });
});

describe('changes() on names it cannot carry', () => {
  it('fails on a file name that is not UTF-8 rather than missing it', async () => {
    const dir = mkdtempSync(join(tmp, 'names-'));
    mkdirSync(join(dir, 'b'));
    mkdirSync(join(dir, 'v'));
    writeFileSync(Buffer.concat([Buffer.from(join(dir, 'v/')), Buffer.from([0x66, 0xff])]), 'x\n');
    await expect(changes(join(dir, 'b'), join(dir, 'v'))).rejects.toThrow(
      /v\/f.*: a file name that is not UTF-8 is not supported$/,
    );
  });
});
