import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { NotFoundError, Sandbox, SandboxError, type WatchEvent } from '../../src/index.js';
import { createAbxHome } from '../helpers/abx-home.js';

// The SDK's files.watch against a real sandbox (bubblewrap) through the daemon's gateway: envd's
// GET /files/watch as the SDK user sees it.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let sandbox: Sandbox;

beforeAll(async () => {
  abx = await createAbxHome();
  sandbox = await Sandbox.create({ home: abx.home });
}, 300_000);

afterAll(async () => {
  await sandbox?.kill().catch(() => undefined);
  await abx?.close();
});

/** Resolves when `events` holds one of `type` for `name` (checked as events arrive). */
function until(events: WatchEvent[], type: string, name: string): Promise<void> {
  return new Promise((resolve) => {
    const check = () => {
      if (events.some((e) => e.type === type && e.name === name)) resolve();
      else setTimeout(check, 20);
    };
    check();
  });
}

describe('files.watch', () => {
  test('reports writes, commands and nested changes until stop(); onExit once', async () => {
    await sandbox.files.makeDir('watched/deep');
    const events: WatchEvent[] = [];
    const exits: (Error | undefined)[] = [];
    const handle = await sandbox.files.watch('watched', (e) => void events.push(e), {
      recursive: true,
      onExit: (error) => void exits.push(error),
    });
    expect(handle.path).toMatch(/\/watched$/);
    await sandbox.files.write('watched/a.txt', 'hello');
    await until(events, 'write', 'a.txt');
    expect(events.find((e) => e.name === 'a.txt')).toMatchObject({
      type: 'create',
      path: `${handle.path}/a.txt`,
      entry: { type: 'file', size: 5 },
    });
    await sandbox.commands.run('echo x > watched/deep/b.txt && rm watched/a.txt');
    await until(events, 'create', 'deep/b.txt');
    await until(events, 'remove', 'a.txt');
    await handle.stop();
    expect(exits).toEqual([undefined]);
    const count = events.length;
    await sandbox.files.write('watched/late.txt', 'late');
    await sandbox.commands.run('sleep 0.5');
    expect(events).toHaveLength(count);
  });

  test('the directory removed ends the watch with NotFoundError', async () => {
    await sandbox.files.makeDir('doomed');
    let exited: (error?: Error) => void = () => {};
    const ended = new Promise<Error | undefined>((resolve) => {
      exited = resolve;
    });
    await sandbox.files.watch('doomed', () => {}, { onExit: (error) => exited(error) });
    await sandbox.commands.run('rm -r doomed');
    const error = await ended;
    expect(error).toBeInstanceOf(NotFoundError);
    expect(error?.message).toMatch(/doomed was removed/);
  });

  test('a missing directory, a file and an unreadable directory are refused', async () => {
    await expect(sandbox.files.watch('nowhere', () => {})).rejects.toBeInstanceOf(NotFoundError);
    await sandbox.files.write('plain.txt', 'x');
    await expect(sandbox.files.watch('plain.txt', () => {})).rejects.toThrow(/not a directory/);
    await sandbox.commands.run('mkdir -p locked && chmod 000 locked');
    const locked = await sandbox.files.watch('locked', () => {}).catch((e: unknown) => e);
    expect(locked).toBeInstanceOf(SandboxError);
    expect((locked as SandboxError).status).toBe(403);
  });
});
