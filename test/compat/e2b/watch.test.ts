import type { FilesystemEvent } from 'e2b';
import {
  type Sandbox as E2bSandbox,
  FilesystemEventType,
  InvalidArgumentError,
  NotFoundError,
  SandboxError,
  TimeoutError,
} from 'e2b';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../../src/index.js';
import { createAbxHome } from '../../helpers/abx-home.js';
import { attach } from './attach.js';

// The unmodified `e2b` SDK's files.watchDir against a real abx sandbox through the daemon's
// gateway (filesystem.Filesystem/WatchDir over envd's native GET /files/watch), and the polled
// watcher trio (CreateWatcher, GetWatcherEvents, RemoveWatcher) as raw Connect calls: the JS SDK
// does not use them (Python's synchronous SDK does).

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let native: Sandbox;
let sbx: E2bSandbox;
let gateway: string;

beforeAll(async () => {
  abx = await createAbxHome();
  native = await Sandbox.create({ home: abx.home });
  gateway = new URL(native.getUrl(49983)).origin;
  sbx = attach(gateway, native.sandboxId, native.accessToken);
}, 300_000);

afterAll(async () => {
  await native?.kill().catch(() => undefined);
  await abx?.close();
});

/** Events of a watch, and a promise for the first that satisfies `wanted`. */
function collector() {
  const events: FilesystemEvent[] = [];
  const waiters: { wanted: (e: FilesystemEvent) => boolean; resolve: () => void }[] = [];
  return {
    events,
    onEvent: (event: FilesystemEvent) => {
      events.push(event);
      for (const waiter of waiters) if (waiter.wanted(event)) waiter.resolve();
    },
    seen: (type: FilesystemEventType, name: string) =>
      new Promise<void>((resolve) => {
        const wanted = (e: FilesystemEvent) => e.type === type && e.name === name;
        if (events.some(wanted)) resolve();
        else waiters.push({ wanted, resolve });
      }),
  };
}

/** One unary Connect call to the face, as E2B's SDKs send it. */
async function unary(method: string, body: unknown) {
  const response = await request(`${gateway}/filesystem.Filesystem/${method}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'connect-protocol-version': '1',
      'e2b-sandbox-id': native.sandboxId,
      'e2b-sandbox-port': '49983',
      'x-access-token': native.accessToken,
    },
    body: JSON.stringify(body),
  });
  return { status: response.statusCode, json: (await response.body.json()) as never };
}

describe('files.watchDir through the e2b SDK', () => {
  test('sees files.write and commands.run, relative names, and stop() ends it', async () => {
    await sbx.files.makeDir('/tmp/w1');
    await sbx.files.write('/tmp/w1/existing.txt', 'first');
    const seen = collector();
    const handle = await sbx.files.watchDir('/tmp/w1', seen.onEvent);
    // E2B's own test: a write over an existing file is WRITE of its name.
    await sbx.files.write('/tmp/w1/existing.txt', 'second');
    await seen.seen(FilesystemEventType.WRITE, 'existing.txt');
    await sbx.files.write('/tmp/w1/new.txt', 'made');
    await seen.seen(FilesystemEventType.CREATE, 'new.txt');
    await seen.seen(FilesystemEventType.WRITE, 'new.txt');
    // One command per change: changes within one batch of kernel notices are seen together.
    await sbx.commands.run('printf x > /tmp/w1/cmd.txt');
    await seen.seen(FilesystemEventType.CREATE, 'cmd.txt');
    await sbx.commands.run('chmod 600 /tmp/w1/cmd.txt');
    await seen.seen(FilesystemEventType.CHMOD, 'cmd.txt');
    await sbx.commands.run('mv /tmp/w1/cmd.txt /tmp/w1/moved.txt && rm /tmp/w1/new.txt');
    await seen.seen(FilesystemEventType.RENAME, 'cmd.txt');
    await seen.seen(FilesystemEventType.CREATE, 'moved.txt');
    await seen.seen(FilesystemEventType.REMOVE, 'new.txt');
    expect(seen.events.every((e) => e.entry === undefined)).toBe(true);

    await handle.stop();
    const count = seen.events.length;
    await sbx.files.write('/tmp/w1/after-stop.txt', 'late');
    await sbx.commands.run('sleep 1');
    expect(seen.events.length).toBe(count);
    expect(seen.events.some((e) => e.name === 'after-stop.txt')).toBe(false);
  });

  test('recursive: a nested write and a new directory, with entries', async () => {
    await sbx.files.makeDir('/tmp/w2/nested');
    await sbx.files.write('/tmp/w2/nested/f.txt', 'one');
    const seen = collector();
    const handle = await sbx.files.watchDir('/tmp/w2', seen.onEvent, {
      recursive: true,
      includeEntry: true,
    });
    await sbx.files.write('/tmp/w2/nested/f.txt', 'two');
    await seen.seen(FilesystemEventType.WRITE, 'nested/f.txt');
    await sbx.files.makeDir('/tmp/w2/later');
    await seen.seen(FilesystemEventType.CREATE, 'later');
    await sbx.files.write('/tmp/w2/later/g.txt', 'three');
    await seen.seen(FilesystemEventType.WRITE, 'later/g.txt');
    const write = seen.events.find((e) => e.name === 'later/g.txt');
    expect(write?.entry).toMatchObject({
      name: 'g.txt',
      type: 'file',
      path: '/tmp/w2/later/g.txt',
      size: 5,
    });
    await handle.stop();
  });

  test('timeoutMs ends the watch with onExit(TimeoutError)', async () => {
    await sbx.files.makeDir('/tmp/w3');
    const ended = new Promise<Error | undefined>((resolve) => {
      void sbx.files.watchDir('/tmp/w3', () => {}, { timeoutMs: 1500, onExit: resolve });
    });
    const err = await ended;
    expect(err).toBeInstanceOf(TimeoutError);
  });

  test('a missing directory, a file, an unreadable directory and root are refused', async () => {
    const missing = await sbx.files.watchDir('/tmp/none-here', () => {}).catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(NotFoundError);
    await sbx.files.write('/tmp/plain.txt', 'x');
    const file = await sbx.files.watchDir('/tmp/plain.txt', () => {}).catch((e: unknown) => e);
    expect(file).toBeInstanceOf(InvalidArgumentError);
    expect((file as Error).message).toMatch(/not a directory/);
    await sbx.commands.run('mkdir -p /tmp/locked && chmod 000 /tmp/locked');
    const locked = await sbx.files.watchDir('/tmp/locked', () => {}).catch((e: unknown) => e);
    expect(locked).toBeInstanceOf(SandboxError);
    expect((locked as Error).message).toMatch(/permission_denied.*EACCES/);
    const root = await sbx.files
      .watchDir('/tmp', () => {}, { user: 'root' })
      .catch((e: unknown) => e);
    expect((root as Error).message).toMatch(/permission_denied.*root/);
  });
});

describe('CreateWatcher, GetWatcherEvents, RemoveWatcher (raw Connect)', () => {
  test('events are kept between polls until the watcher is removed', async () => {
    await sbx.files.makeDir('/tmp/w4/sub');
    const made = await unary('CreateWatcher', {
      path: '/tmp/w4',
      recursive: true,
      includeEntry: true,
    });
    expect(made.status).toBe(200);
    const { watcherId } = made.json as { watcherId: string };
    expect(watcherId).toMatch(/\S/);
    await sbx.files.write('/tmp/w4/sub/p.txt', 'polled');
    let events: { name: string; type: string; entry?: { path: string } }[] = [];
    for (let i = 0; i < 200 && !events.some((e) => e.type === 'EVENT_TYPE_WRITE'); i++) {
      const polled = await unary('GetWatcherEvents', { watcherId });
      expect(polled.status).toBe(200);
      events = events.concat((polled.json as { events?: typeof events }).events ?? []);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    expect(events).toEqual([
      expect.objectContaining({ name: 'sub/p.txt', type: 'EVENT_TYPE_CREATE' }),
      expect.objectContaining({
        name: 'sub/p.txt',
        type: 'EVENT_TYPE_WRITE',
        entry: expect.objectContaining({ path: '/tmp/w4/sub/p.txt', type: 'FILE_TYPE_FILE' }),
      }),
    ]);
    expect((await unary('GetWatcherEvents', { watcherId })).json).toEqual({});
    expect(await unary('RemoveWatcher', { watcherId })).toEqual({ status: 200, json: {} });
    const gone = await unary('GetWatcherEvents', { watcherId });
    expect(gone.status).toBe(404);
    expect(gone.json).toMatchObject({
      code: 'not_found',
      message: expect.stringMatching(/no watcher/),
    });
    expect((await unary('RemoveWatcher', { watcherId })).status).toBe(404);
    expect((await unary('RemoveWatcher', { watcherId: '' })).json).toMatchObject({
      code: 'invalid_argument',
    });
    const missing = await unary('CreateWatcher', { path: '/tmp/none-here' });
    expect(missing).toMatchObject({ status: 404, json: { code: 'not_found' } });
  });
});
