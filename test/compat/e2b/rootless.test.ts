import { readdirSync, readFileSync } from 'node:fs';
import { type Sandbox as E2bSandbox, FilesystemEventType, SandboxError } from 'e2b';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { Sandbox } from '../../../src/index.js';
import { type RootlessDaemon, startRootlessDaemon } from '../../helpers/rootless.js';
import { attach } from './attach.js';

// envd's E2B face under a rootless daemon: what E2B's SDK starts runs as the daemon's
// unprivileged host uid, never host root, and `root` stays refused.

let daemon: RootlessDaemon;
let native: Sandbox;
let sbx: E2bSandbox;

/** Host uids of the processes whose command line holds `marker`. */
function hostUidsOf(marker: string): number[] {
  const uids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (!readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(marker)) continue;
      const status = readFileSync(`/proc/${entry}/status`, 'utf8');
      uids.push(Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]));
    } catch {
      // ended meanwhile
    }
  }
  return uids;
}

beforeAll(async () => {
  daemon = await startRootlessDaemon();
  native = await Sandbox.create({ home: daemon.home });
  sbx = attach(new URL(native.getUrl(49983)).origin, native.sandboxId, native.accessToken);
}, 300_000);

afterAll(async () => {
  await native?.kill().catch(() => undefined);
  await daemon?.close();
});

describe('E2B envd face under a rootless daemon', () => {
  test("a command E2B starts runs as the daemon's unprivileged uid on the host", async () => {
    const marker = `e2b-rootless-${Date.now()}`;
    const handle = await sbx.commands.run(`exec -a ${marker} sleep 60`, {
      background: true,
      timeoutMs: 0,
    });
    let uids: number[] = [];
    for (let i = 0; i < 100 && uids.length === 0; i++) {
      uids = hostUidsOf(marker);
      if (uids.length === 0) await new Promise((resolve) => setTimeout(resolve, 100));
    }
    expect(uids.length).toBeGreaterThan(0);
    for (const uid of uids) {
      expect(uid).not.toBe(0);
      expect(uid).toBe(daemon.uid);
    }
    expect(await sbx.commands.kill(handle.pid)).toBe(true);
  });

  test('a watch sees a file a command makes (inotify in a sandbox of a rootless daemon)', async () => {
    await sbx.files.makeDir('/tmp/rootless-watch');
    const names: string[] = [];
    let seen: () => void = () => {};
    const created = new Promise<void>((resolve) => {
      seen = resolve;
    });
    const handle = await sbx.files.watchDir('/tmp/rootless-watch', (event) => {
      names.push(`${event.type} ${event.name}`);
      if (event.type === FilesystemEventType.WRITE && event.name === 'made.txt') seen();
    });
    await sbx.commands.run('echo made > /tmp/rootless-watch/made.txt');
    await created;
    expect(names).toContain('create made.txt');
    await handle.stop();
  });

  test('file metadata in a tmpfs home: kept through mv, not inherited after rm', async () => {
    const home = (await sbx.commands.run('stat -f -c %T /home/user')).stdout.trim();
    await sbx.files.write('/home/user/tagged.txt', 't', { metadata: { fs: home } });
    await sbx.commands.run('mv /home/user/tagged.txt /home/user/moved.txt');
    expect((await sbx.files.getInfo('/home/user/moved.txt')).metadata).toEqual({ fs: home });
    await sbx.commands.run('rm /home/user/moved.txt && echo new > /home/user/moved.txt');
    expect((await sbx.files.getInfo('/home/user/moved.txt')).metadata).toBeUndefined();
  });

  test('root is refused here too', async () => {
    const failure = await sbx.commands.run('id -u', { user: 'root' }).catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(SandboxError);
    expect((failure as Error).message).toMatch(/permission_denied/);
  });
});

describe("E2B's code interpreter under a rootless daemon", () => {
  test('@e2b/code-interpreter creates through the control API and runs cells, never as root', async () => {
    const { Sandbox: CodeSandbox } = await import('@e2b/code-interpreter');
    const info = JSON.parse(readFileSync(`${daemon.home}/daemon.json`, 'utf8'));
    const apiKey = readFileSync(`${daemon.home}/api-key`, 'utf8').trim();
    const code = await CodeSandbox.create({
      apiKey,
      apiUrl: info.gatewayUrl,
      sandboxUrl: info.gatewayUrl,
      requestTimeoutMs: 60_000,
    });
    try {
      await code.runCode('import os\nuid = os.getuid()');
      const cell = await code.runCode('uid');
      expect(cell.error).toBeUndefined();
      expect(Number(cell.text)).toBeGreaterThan(0);
    } finally {
      await code.kill();
    }
  }, 120_000);
});
