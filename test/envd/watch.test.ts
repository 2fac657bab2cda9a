import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, test as base, describe, expect } from 'vitest';
import { type WatchLimits, watchGroup } from '../../runtime/envd/watch.js';
import { CORE } from '../../runtime/server/groups/core.js';
import { FILE_OPS } from '../../runtime/server/groups/files.js';
import { SandboxServer } from '../../runtime/server/server.js';
import { type Answer, call, eventually } from '../server/harness.js';
import { type Event, lines } from './harness.js';

// envd's WATCH group served in-process on loopback (with FILE_OPS, whose atomic writes the watch
// must report as one file written), watching real directories with real inotify.

const TOKEN = 'envd-watch-token';
const dir = mkdtempSync(join(tmpdir(), 'abx-envd-watch-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Served {
  call(path: string, options?: Parameters<typeof call>[2]): Promise<Answer>;
  /** Opens GET /files/watch; its lines as they come, and an abort for the stream. */
  watch(query: string): Promise<{ next(): Promise<Event>; stop(): void }>;
  count(): number;
}

const LIMITS: Partial<WatchLimits> = { watches: 3, directories: 4, events: 5 };

const test = base.extend<{ envd: Served }>({
  // biome-ignore lint/correctness/noEmptyPattern: vitest fixtures must destructure their first argument
  envd: async ({}, use) => {
    const group = watchGroup(LIMITS);
    const server = new SandboxServer({ token: TOKEN, catalog: [CORE, FILE_OPS, group] });
    const { host, port } = await server.start();
    const url = `http://${host}:${port}`;
    const aborts: AbortController[] = [];
    try {
      await use({
        call: (path, options = {}) => call(url, path, { token: TOKEN, ...options }),
        count: () => group.count(),
        watch: async (query) => {
          const abort = new AbortController();
          aborts.push(abort);
          const response = await request(`${url}/files/watch?${query}`, {
            headers: { authorization: `Bearer ${TOKEN}` },
            signal: abort.signal,
          });
          if (response.statusCode !== 200) {
            const text = await response.body.text();
            throw Object.assign(new Error(`${response.statusCode}: ${text}`), {
              status: response.statusCode,
              body: JSON.parse(text),
            });
          }
          const iterator = lines(response.body)[Symbol.asyncIterator]();
          return {
            next: async () => {
              const item = await iterator.next();
              if (item.done) throw new Error('the watch stream ended');
              return item.value;
            },
            stop: () => abort.abort(),
          };
        },
      });
    } finally {
      for (const abort of aborts) abort.abort();
      group.closeAll();
      await server.stop();
    }
  },
});

/** Reads events (skipping keepalives) until `count` events came; the events read. */
async function eventsOf(
  stream: { next(): Promise<Event> },
  wanted: (seen: Event[]) => boolean,
): Promise<Event[]> {
  const seen: Event[] = [];
  while (!wanted(seen)) {
    const line = await stream.next();
    if (line.keepalive) continue;
    seen.push(line);
  }
  return seen;
}

const brief = (events: Event[]) =>
  events.filter((e) => e.event).map((e) => `${e.event.type} ${e.event.name}`);

describe('GET /files/watch', () => {
  test('reports create, write, chmod, rename and remove, relative to the directory', async ({
    envd,
  }) => {
    const root = join(dir, 'flat');
    mkdirSync(join(root, 'sub'), { recursive: true });
    writeFileSync(join(root, 'old.txt'), 'old');
    const stream = await envd.watch(`path=${encodeURIComponent(root)}`);
    expect(await stream.next()).toEqual({
      start: { id: expect.any(String), path: root, recursive: false },
    });

    // envd's own atomic write (a temporary file renamed over): one file, created with content.
    const written = await envd.call(
      `/files/write?path=${encodeURIComponent(join(root, 'a.txt'))}`,
      {
        method: 'PUT',
        body: Buffer.from('hello'),
        headers: { 'content-type': 'application/octet-stream' },
      },
    );
    expect(written.status).toBe(200);
    let events = await eventsOf(stream, (seen) => brief(seen).includes('write a.txt'));
    expect(brief(events)).toEqual(['create a.txt', 'write a.txt']);
    expect(events[0].event).toMatchObject({
      path: join(root, 'a.txt'),
      entry: { type: 'file', size: 5, path: join(root, 'a.txt') },
    });

    // Overwriting through envd replaces the file: its content changed.
    await envd.call(`/files/write?path=${encodeURIComponent(join(root, 'a.txt'))}`, {
      method: 'PUT',
      body: Buffer.from('hello again'),
      headers: { 'content-type': 'application/octet-stream' },
    });
    events = await eventsOf(stream, (seen) => seen.length >= 1);
    expect(brief(events)).toEqual(['write a.txt']);

    chmodSync(join(root, 'a.txt'), 0o600);
    events = await eventsOf(stream, (seen) => seen.length >= 1);
    expect(brief(events)).toEqual(['chmod a.txt']);
    expect(events[0].event.entry.mode).toBe('0600');

    renameSync(join(root, 'old.txt'), join(root, 'new.txt'));
    events = await eventsOf(stream, (seen) => seen.length >= 2);
    expect(brief(events)).toEqual(['rename old.txt', 'create new.txt']);
    expect(events[0].event.entry).toBeUndefined();

    rmSync(join(root, 'new.txt'));
    events = await eventsOf(stream, (seen) => seen.length >= 1);
    expect(brief(events)).toEqual(['remove new.txt']);

    // Not recursive: a file in a subdirectory is not reported, the next change at the top is.
    writeFileSync(join(root, 'sub', 'deep.txt'), 'x');
    writeFileSync(join(root, 'b.txt'), 'x');
    events = await eventsOf(stream, (seen) => brief(seen).includes('write b.txt'));
    expect(brief(events)).toEqual(['create b.txt', 'write b.txt']);
  });

  test('recursive: new directories are followed, names are relative paths', async ({ envd }) => {
    const root = join(dir, 'tree');
    mkdirSync(join(root, 'x'), { recursive: true });
    const stream = await envd.watch(`path=${encodeURIComponent(root)}&recursive=true`);
    expect((await stream.next()).start).toMatchObject({ recursive: true });
    writeFileSync(join(root, 'x', 'in-x.txt'), 'x');
    let events = await eventsOf(stream, (seen) => brief(seen).includes('write x/in-x.txt'));
    expect(brief(events)).toEqual(['create x/in-x.txt', 'write x/in-x.txt']);
    // `mkdir -p` of two levels and a file at once: what was made before envd looked is reported.
    execFileSync('/bin/sh', ['-c', `mkdir -p ${root}/n1/n2 && printf 1 > ${root}/n1/n2/f.txt`]);
    events = await eventsOf(stream, (seen) => brief(seen).includes('create n1/n2/f.txt'));
    expect(brief(events)).toEqual(expect.arrayContaining(['create n1', 'create n1/n2']));
    writeFileSync(join(root, 'n1', 'n2', 'f.txt'), 'changed');
    events = await eventsOf(stream, (seen) => brief(seen).includes('write n1/n2/f.txt'));
    // A directory past the bound (4) ends the watch, saying why.
    mkdirSync(join(root, 'n3'));
    mkdirSync(join(root, 'n4'));
    events = await eventsOf(stream, (seen) => seen.some((e) => e.end));
    expect(events.at(-1).end).toEqual({
      reason: 'limit',
      message: expect.stringContaining('reached 4 directories'),
    });
  });

  test('the directory itself removed ends the stream; a closed stream ends the watch', async ({
    envd,
  }) => {
    const root = join(dir, 'gone');
    mkdirSync(root);
    const stream = await envd.watch(`path=${encodeURIComponent(root)}`);
    await stream.next();
    expect(envd.count()).toBe(1);
    rmSync(root, { recursive: true });
    const events = await eventsOf(stream, (seen) => seen.some((e) => e.end));
    expect(events.at(-1).end).toEqual({
      reason: 'removed',
      message: `the watched directory ${root} was removed`,
    });
    await eventually(() => envd.count() === 0);

    mkdirSync(root);
    const second = await envd.watch(`path=${encodeURIComponent(root)}`);
    await second.next();
    expect(envd.count()).toBe(1);
    second.stop();
    await eventually(() => envd.count() === 0);
  });

  test('bad paths and too many watches are refused, changing nothing', async ({ envd }) => {
    const missing = await envd.call(`/files/watch?path=${encodeURIComponent(join(dir, 'none'))}`);
    expect(missing.status).toBe(404);
    expect(missing.json).toMatchObject({ type: 'NotFoundError', code: 'ENOENT' });
    writeFileSync(join(dir, 'file.txt'), 'x');
    const file = await envd.call(`/files/watch?path=${encodeURIComponent(join(dir, 'file.txt'))}`);
    expect(file.status).toBe(400);
    expect(file.json).toMatchObject({ error: expect.stringMatching(/is not a directory/) });
    const empty = await envd.call('/files/watch?path=');
    expect(empty.status).toBe(400);
    // A tree over the directory bound is refused before anything is watched.
    const big = join(dir, 'big');
    for (const name of ['a', 'b', 'c', 'd']) mkdirSync(join(big, name), { recursive: true });
    const tooBig = await envd.call(`/files/watch?path=${encodeURIComponent(big)}&recursive=true`);
    expect(tooBig.status).toBe(400);
    expect(tooBig.json).toMatchObject({ error: expect.stringMatching(/reached 4 directories/) });
    expect(envd.count()).toBe(0);
    // Three watches at most (the test's bound).
    const made: string[] = [];
    for (let i = 0; i < 3; i++) {
      const answer = await envd.call('/files/watch', { body: { path: dir } });
      expect(answer.status).toBe(200);
      made.push((answer.json as { id: string }).id);
    }
    const fourth = await envd.call('/files/watch', { body: { path: dir } });
    expect(fourth.status).toBe(429);
    expect(fourth.json).toMatchObject({ type: 'LimitExceededError' });
    for (const id of made) {
      expect((await envd.call(`/files/watch/${id}`, { method: 'DELETE' })).status).toBe(200);
    }
    expect(envd.count()).toBe(0);
  });
});

describe('polled watchers: POST, GET and DELETE /files/watch/{id}', () => {
  test('keep events between reads, bounded, until removed', async ({ envd }) => {
    const root = join(dir, 'polled');
    mkdirSync(root);
    const made = await envd.call('/files/watch', { body: { path: root, recursive: true } });
    expect(made.status).toBe(200);
    const { id } = made.json as { id: string };
    expect(made.json).toEqual({ id, path: root, recursive: true });
    writeFileSync(join(root, 'one.txt'), '1');
    let read: Answer | undefined;
    await eventually(async () => {
      read = await envd.call(`/files/watch/${id}`);
      return (read.json as { events: unknown[] }).events.length >= 2;
    });
    expect(read?.json).toMatchObject({
      id,
      dropped: 0,
      events: [
        { type: 'create', name: 'one.txt' },
        { type: 'write', name: 'one.txt' },
      ],
    });
    expect((await envd.call(`/files/watch/${id}`)).json).toEqual({ id, events: [], dropped: 0 });

    // Past the bound (5) the oldest events go, and the next read says how many.
    for (let i = 0; i < 10; i++) writeFileSync(join(root, `f${i}.txt`), '');
    await eventually(async () => {
      read = await envd.call(`/files/watch/${id}`);
      return (read.json as { dropped: number }).dropped > 0;
    });
    const { events, dropped } = (read as Answer).json as { events: Event[]; dropped: number };
    expect(events).toHaveLength(5);
    expect(events.length + dropped).toBe(10);
    expect(events.at(-1)).toMatchObject({ type: 'create', name: 'f9.txt' });

    expect((await envd.call(`/files/watch/${id}`, { method: 'DELETE' })).json).toEqual({
      id,
      removed: true,
    });
    expect(envd.count()).toBe(0);
    const gone = await envd.call(`/files/watch/${id}`);
    expect(gone.status).toBe(404);
    expect(gone.json).toMatchObject({ error: expect.stringMatching(/no watcher/) });
    expect((await envd.call(`/files/watch/${id}`, { method: 'DELETE' })).status).toBe(404);
  });
});
