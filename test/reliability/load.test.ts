import { createHash, randomFillSync } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { commandRegistry, Sandbox, Templates } from '../../src/index.js';
import { SandboxCommands } from '../fixtures/sandbox-commands.js';
import { createAbxHome, processesMentioning, sandboxProcesses } from '../helpers/abx-home.js';
import { ROOT } from '../helpers/build.js';
import { daemonInfo, openFds, rssBytes, SOAK, scale, settle } from './helpers.js';

// Load: many concurrent calls, many sandboxes, one large file. No errors, and afterwards no
// leaked processes, sockets or file descriptors in the daemon, and bounded daemon memory.
// The default run uses the call count and smaller sandbox/file counts; `npm run soak`
// (ABX_SOAK=1) runs 200 sandboxes and a 1 GiB file.

let abx: Awaited<ReturnType<typeof createAbxHome>>;
let home: string;

beforeAll(async () => {
  abx = await createAbxHome();
  home = abx.home;
  await Templates.build(join(ROOT, 'test', 'fixtures', 'templates', 'server-e2e.yaml'), { home });
}, 300_000);

afterAll(async () => {
  await abx?.close();
});

const MiB = 1024 * 1024;
/** Slack for sockets the daemon keeps open on purpose (kept-alive connections to envd). */
const FD_SLACK = 40;

/** The daemon's resources once things have settled (kept-alive sockets time out after 5 s). */
async function daemonUsage() {
  const pid = daemonInfo(home).pid;
  return { pid, ...openFds(pid), rss: rssBytes(pid) };
}

/** Processes of this installation other than the daemon and the given sandboxes. */
function strayProcesses(keep: string[]): string[] {
  const daemon = daemonInfo(home).pid;
  // Sandboxes' command lines name no host folder: find them by the ids this home has folders for.
  const sandboxIds = readdirSync(join(home, 'sandboxes')).filter((id) => !keep.includes(id));
  return [...processesMentioning(home), ...sandboxIds.flatMap((id) => sandboxProcesses(id))]
    .filter((pid) => pid !== daemon)
    .map((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
      } catch {
        return '';
      }
    })
    .filter((cmd) => cmd !== '');
}

describe('load', () => {
  test('1 000 concurrent server calls over the gateway', { timeout: 180_000 }, async () => {
    const box = await Sandbox.create({ home, template: 'server-e2e' });
    try {
      commandRegistry().registerClass(SandboxCommands);
      await box.server.start({ commands: [SandboxCommands] });
      // Warm up, so kept-alive connections are part of the baseline.
      await Promise.all(Array.from({ length: 50 }, (_, i) => box.server.call('add', { x: i })));
      const before = await daemonUsage();
      const count = scale(1000, 5000);
      const started = Date.now();
      const results = await Promise.all(
        Array.from({ length: count }, (_, i) => box.server.call('add', { x: i, y: 1 })),
      );
      console.log(`${count} concurrent calls: ${Date.now() - started} ms`);
      expect(results).toEqual(Array.from({ length: count }, (_, i) => i + 1));
      const after = await daemonUsage();
      console.log('daemon before/after', before, after);
      // Connections the gateway opened for the burst are closed again.
      expect(
        await settle(() => openFds(before.pid).total <= before.total + FD_SLACK, 200, 50),
      ).toBe(true);
      expect(after.rss - before.rss).toBeLessThan(256 * MiB);
      // The server is fine afterwards.
      expect(await box.server.call('add', { x: 1 })).toBe(3);
    } finally {
      await box.kill();
    }
  });

  test(`${SOAK ? 200 : 20} sandboxes created and killed in a loop`, {
    timeout: 600_000,
  }, async () => {
    // One round first: the warm pool's sandbox and the daemon's caches are part of the baseline.
    await (await Sandbox.create({ home })).kill();
    const before = await daemonUsage();
    const count = scale(20, 200);
    const started = Date.now();
    for (let i = 0; i < count; i += 4) {
      await Promise.all(
        Array.from({ length: Math.min(4, count - i) }, async () => {
          const box = await Sandbox.create({ home });
          try {
            expect((await box.commands.run('echo ok')).stdout).toBe('ok\n');
          } finally {
            expect(await box.kill()).toBe(true);
          }
        }),
      );
    }
    console.log(`${count} sandboxes: ${Date.now() - started} ms`);
    // The warm pool refills in the background (more after a burst): a sandbox it is starting
    // now is pooled a moment later, so the pool is read again on each try.
    const noStrays = async () => {
      const pooled = (await Sandbox.list({ home, state: 'pooled' })).map((s) => s.sandboxId);
      return strayProcesses(pooled).length === 0;
    };
    expect(await settle(noStrays, 100, 100)).toBe(true);
    const after = await daemonUsage();
    console.log('daemon before/after', before, after);
    expect(await settle(() => openFds(before.pid).total <= before.total + FD_SLACK, 200, 50)).toBe(
      true,
    );
    expect(after.rss - before.rss).toBeLessThan(256 * MiB);
  });

  test(`a ${SOAK ? '1 GiB' : '256 MiB'} file up and down, streamed, hashes equal`, {
    timeout: 600_000,
  }, async () => {
    const size = scale(256, 1024) * MiB;
    const box = await Sandbox.create({ home });
    try {
      const before = await daemonUsage();
      const testRss = process.memoryUsage().rss;
      const sent = createHash('sha256');
      let produced = 0;
      // Random 1 MiB blocks made as they are sent and hashed on the way: nothing holds the file.
      const source = Readable.from(
        (function* () {
          while (produced < size) {
            const chunk = randomFillSync(Buffer.allocUnsafe(MiB));
            produced += chunk.length;
            sent.update(chunk);
            yield chunk;
          }
        })(),
      );
      let started = Date.now();
      const info = await box.files.write('big.bin', source);
      console.log(`upload ${size / MiB} MiB: ${Date.now() - started} ms`);
      expect(info.size).toBe(size);
      started = Date.now();
      const received = createHash('sha256');
      let got = 0;
      for await (const chunk of await box.files.read('big.bin', { format: 'stream' })) {
        received.update(chunk as Buffer);
        got += (chunk as Buffer).length;
      }
      console.log(`download ${size / MiB} MiB: ${Date.now() - started} ms`);
      expect(got).toBe(size);
      const hash = sent.digest('hex');
      expect(received.digest('hex')).toBe(hash);
      // Inside, the file on disk has the same bytes.
      const { stdout } = await box.commands.run('sha256sum big.bin | cut -c1-64');
      expect(stdout.trim()).toBe(hash);
      const after = await daemonUsage();
      console.log('daemon before/after', before, after);
      // Streamed through the gateway: neither the daemon nor this process held the file.
      expect(after.rss - before.rss).toBeLessThan(Math.min(size / 2, 256 * MiB));
      expect(process.memoryUsage().rss - testRss).toBeLessThan(Math.min(size / 2, 256 * MiB));
    } finally {
      await box.kill();
    }
  });
});
